#include "core/crash.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace hpc::crash {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
struct sigaction g_previous[NSIG];  // zero: SIG_DFL

// A line built without allocating (the heap may be what broke).
struct Line {
  char text[1024];
  size_t n = 0;
  void add(const char* s) {
    for (; s && *s && n < sizeof text - 2; ++s) text[n++] = *s;
  }
  void hex(uintptr_t v) {
    char digits[2 + 2 * sizeof v + 1];
    size_t i = sizeof digits - 1;
    digits[i] = '\0';
    do {
      digits[--i] = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v != 0);
    digits[--i] = 'x';
    digits[--i] = '0';
    add(digits + i);
  }
  void decimal(long v) {
    char digits[24];
    size_t i = sizeof digits - 1;
    digits[i] = '\0';
    const bool negative = v < 0;
    unsigned long u = negative ? 0ul - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
    do {
      digits[--i] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) digits[--i] = '-';
    add(digits + i);
  }
  // An address as its object and offset, and its symbol where the object exports one.
  void code(uintptr_t pc) {
    Dl_info info{};
    if (pc == 0 || dladdr(reinterpret_cast<void*>(pc), &info) == 0 || !info.dli_fname) {
      hex(pc);
      return;
    }
    add(info.dli_fname);
    add("+");
    hex(pc - reinterpret_cast<uintptr_t>(info.dli_fbase));
    if (info.dli_sname) {
      add(" (");
      add(info.dli_sname);
      add("+");
      hex(pc - reinterpret_cast<uintptr_t>(info.dli_saddr));
      add(")");
    }
  }
};

const char* name_of(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    default: return "a signal";
  }
}

// The instruction that faulted and, where it is in no mapped object (a call through a null or
// stale pointer), the return address the call left: where the call came from.
void where(const ucontext_t* uc, uintptr_t* pc, uintptr_t* caller) {
  *pc = *caller = 0;
#if defined(__x86_64__)
  *pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  Dl_info info{};
  if (*pc == 0 || dladdr(reinterpret_cast<void*>(*pc), &info) == 0)
    *caller = *reinterpret_cast<const uintptr_t*>(uc->uc_mcontext.gregs[REG_RSP]);
#elif defined(__aarch64__)
  *pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
  *caller = static_cast<uintptr_t>(uc->uc_mcontext.regs[30]);  // the link register
#else
  (void)uc;
#endif
}

extern "C" void on_crash(int sig, siginfo_t* info, void* context) {
  uintptr_t pc = 0, caller = 0;
  where(static_cast<const ucontext_t*>(context), &pc, &caller);
  Line line;
  line.add("hpctrain: crashed (pid ");
  line.decimal(static_cast<long>(::getpid()));
  line.add("): ");
  line.add(name_of(sig));
  line.add(" at address ");
  line.hex(reinterpret_cast<uintptr_t>(info->si_addr));
  line.add(", instruction ");
  line.code(pc);
  if (caller != 0) {
    line.add(", called from ");
    line.code(caller);
  }
  line.text[line.n++] = '\n';
  [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, line.text, line.n);
  // The handler from before takes it: returning re-runs the faulting instruction; a signal sent
  // by kill() is raised again.
  ::sigaction(sig, &g_previous[sig], nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

}  // namespace

void install_reporter() {
  struct sigaction sa {};
  sa.sa_sigaction = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int sig : kSignals) {
    struct sigaction previous {};
    ::sigaction(sig, &sa, &previous);
    // Installed twice, it must not hand on to itself: the signal would come back for ever.
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction == on_crash) continue;
    g_previous[sig] = previous;
  }
}

void crash_if_asked() {
  const char* hook = std::getenv("HPCTRAIN_TEST_CRASH");
  if (!hook || std::strcmp(hook, "null-call") != 0) return;
  void (*volatile callback)() = nullptr;
  callback();
}

}  // namespace hpc::crash
