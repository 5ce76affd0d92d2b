// The scheduler behind cuda_emu.hpp, and the CUDA runtime calls the kernels and their tests make,
// on the CPU: one emulated device whose memory is the host's.
#include "emu/cuda_emu.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define HPC_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HPC_EMU_ASAN 1
#endif
#endif
#ifdef HPC_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace hpc::emu {

uint3 g_thread_idx{}, g_block_idx{};
uint64_t g_block_serial = 0;
dim3 g_block_dim, g_grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // a fiber's stack (a kernel's frames are small)
constexpr size_t kGuardBytes = 64 * 1024;   // below it, none to touch: an overflow faults there
constexpr unsigned kMaxThreads = 1024;      // a block's threads, as on every GPU since Fermi
constexpr unsigned kWarp = 32;

struct Trap {  // thrown by __trap (or a misuse the emulation sees) inside a fiber, caught where it began
  const char* why;
};

// A barrier of the block, or of one warp. The last of `expected` live threads to arrive releases
// the rest; a thread that ends leaves it (as an exited GPU thread no longer holds a barrier up).
struct Barrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
  int any = 0, result[2] = {0, 0};  // __syncthreads_or's flag: gathered, then kept per generation
  uint64_t slots[kWarp] = {};       // a warp's shuffle: each lane's value,
  uint64_t offered[kWarp] = {};     // and the generation it was offered in, plus one
};

// Switching between fibers: the callee-saved registers and the floating-point control words on
// the stack being left, its pointer saved, the other's loaded (x86-64 System V). glibc's
// swapcontext also saves the signal mask, a system call each way: with it the emulated tests
// ran about thirty times slower (ConvertBetweenEveryPair 14.0 s against 0.5 s).
extern "C" void hpc_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl hpc_emu_switch
  .type hpc_emu_switch, @function
hpc_emu_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size hpc_emu_switch, .-hpc_emu_switch
)");

// AddressSanitizer follows the switches (the checked builds run the emulation too): each side
// says where it goes, and where it arrived from once there.
#ifdef HPC_EMU_ASAN
const void* g_scheduler_bottom = nullptr;  // the scheduler's stack, as the first arrival in a fiber learns it
size_t g_scheduler_size = 0;
#endif

// Leaving for a fiber's stack (or the scheduler's: stack null), keeping this side's state in
// *keep (null: this side never runs again); then, back here, arrived.
void leaving(void** keep, const void* stack, size_t size) {
#ifdef HPC_EMU_ASAN
  if (!stack) stack = g_scheduler_bottom, size = g_scheduler_size;
  __sanitizer_start_switch_fiber(keep, stack, size);
#else
  (void)keep, (void)stack, (void)size;
#endif
}
void arrived(void* kept) {
#ifdef HPC_EMU_ASAN
  const void* from = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(kept, &from, &size);
  if (!g_scheduler_bottom) g_scheduler_bottom = from, g_scheduler_size = size;
#else
  (void)kept;
#endif
}

// A fiber's stack: kStackBytes above kGuardBytes that the process may not touch, so that a
// thread that overflows it faults (named by on_fault) instead of writing over another's.
// Mapped, so only the pages a thread uses are ever touched.
class FiberStack {
 public:
  FiberStack() {
    void* m = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    mapping_ = static_cast<char*>(m);
    mprotect(mapping_, kGuardBytes, PROT_NONE);
  }
  ~FiberStack() { munmap(mapping_, kGuardBytes + kStackBytes); }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  char* bottom() const { return mapping_ + kGuardBytes; }
  bool in_guard(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p), g = reinterpret_cast<uintptr_t>(mapping_);
    return a >= g && a < g + kGuardBytes;
  }

 private:
  char* mapping_ = nullptr;
};

struct Fiber {
  void* sp = nullptr;  // where its registers were saved when it last switched away
  void* asan = nullptr;  // AddressSanitizer's state of it while it is switched away
  std::unique_ptr<FiberStack> stack;
  bool done = false;
};

struct Block {
  void* scheduler = nullptr;
  std::vector<Fiber> fibers;
  unsigned current = 0, live = 0;
  uint64_t progress = 0;  // arrivals, releases and ends: what a round without any is stuck on
  Barrier block;
  Barrier warps[kMaxThreads / kWarp];
  const std::function<void()>* body = nullptr;
  std::string failure;  // why the launch failed ("" while it has not)
};

Block& state() {
  static Block b;
  return b;
}

// Errors as the runtime keeps them: a launch that could not start is returned once (by the next
// cudaGetLastError); one that failed while it ran (a trap, a deadlock) by every call after it.
cudaError_t g_last = cudaSuccess, g_sticky = cudaSuccess;
volatile sig_atomic_t g_in_launch = 0;  // for the fault handler

cudaError_t error(cudaError_t e) {
  if (g_sticky != cudaSuccess) return g_sticky;
  return e;
}

void yield() {
  Block& b = state();
  Fiber& f = b.fibers[b.current];
  leaving(&f.asan, nullptr, 0);
  hpc_emu_switch(&f.sp, b.scheduler);
  arrived(b.fibers[b.current].asan);
}

void release(Barrier& r) {
  r.result[r.generation & 1] = r.any;
  r.any = 0;
  r.arrived = 0;
  ++r.generation;
  ++state().progress;
}

// Waits until every live thread the barrier counts has arrived; returns their flags' or.
int wait(Barrier& r, int flag) {
  Block& b = state();
  r.any |= flag;
  const uint64_t generation = r.generation;
  ++b.progress;
  if (++r.arrived == r.expected) release(r);
  else
    while (r.generation == generation) yield();
  return r.result[generation & 1];
}

void leave(Barrier& r) {
  --r.expected;
  if (r.arrived > 0 && r.arrived == r.expected) release(r);
}

std::string shown(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string shown(uint3 d) { return shown(dim3(d.x, d.y, d.z)); }

unsigned linear_thread() {
  return (g_thread_idx.z * g_block_dim.y + g_thread_idx.y) * g_block_dim.x + g_thread_idx.x;
}

// Where every fiber starts (entered by hpc_emu_switch's return); it never returns: its last
// switch goes back to the scheduler, which never resumes it again.
[[noreturn]] void fiber_main() {
  arrived(nullptr);
  Block& b = state();
  try {
    (*b.body)();
  } catch (const Trap& t) {
    if (b.failure.empty())
      b.failure = "block " + shown(g_block_idx) + " thread " + shown(g_thread_idx) + ": " + t.why;
  } catch (const std::exception& e) {
    if (b.failure.empty()) b.failure = std::string("a thread threw: ") + e.what();
  } catch (...) {
    if (b.failure.empty()) b.failure = "a thread threw";
  }
  b.fibers[b.current].done = true;
  --b.live;
  ++b.progress;
  leave(b.block);
  leave(b.warps[linear_thread() / kWarp]);
  void* unused = nullptr;
  leaving(nullptr, nullptr, 0);  // never to return
  hpc_emu_switch(&unused, b.scheduler);
  __builtin_unreachable();
}

// A fresh fiber's stack, as hpc_emu_switch leaves one: its control words, six registers, and
// fiber_main as the address to return to, above it a null return address for fiber_main
// (where an unwinder stops), 16-byte aligned as at a call.
void* fresh_stack(char* stack, size_t bytes) {
#ifdef HPC_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, bytes);  // the redzones of frames a finished fiber never popped
#endif
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* words = reinterpret_cast<uint64_t*>(top);
  words[-1] = 0;                                            // fiber_main's return address: none
  words[-2] = reinterpret_cast<uint64_t>(&fiber_main);      // where the switch returns to
  for (int r = 3; r <= 8; ++r) words[-r] = 0;               // rbp, rbx, r12 .. r15
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  words[-9] = 0;
  std::memcpy(&words[-9], &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(&words[-9]) + 4, &fpucw, 2);
  return &words[-9];
}

// The (x, y, z) of the `linear`th thread of a block, or block of a grid, of dimensions d.
uint3 coordinates(uint64_t linear, dim3 d) {
  return {static_cast<unsigned>(linear % d.x), static_cast<unsigned>(linear / d.x % d.y),
          static_cast<unsigned>(linear / (1ull * d.x * d.y))};
}

// The order blocks and threads take their turns in. A race-free kernel gives the same bits in
// any order, as a GPU runs them in any; one with a race (a thread reading what another writes
// before the barrier that should order them, a block reading another's output of the same
// launch) gives the right answer only in some. So the order changes: a launch's blocks run in
// grid order or its reverse, one launch in two; a block's threads take their turns in index order
// or its reverse, one block in two, the other way round in the next launch. A race a forward turn
// hides (a writer with a lower index than its reader), a reverse one shows, in the same run.
// HPCTRAIN_EMU_ORDER=forward keeps every turn in index order, for telling a race from other
// faults.
const bool g_forward_only = [] {
  const char* order = std::getenv("HPCTRAIN_EMU_ORDER");
  return order && std::strcmp(order, "forward") == 0;
}();
uint64_t g_launches = 0;  // launches run so far: whose parity picks the orders

// One block: its threads as fibers, round and round until every one has ended; each round in
// index order, or its reverse when `reversed`.
void run_block(Block& b, unsigned threads, bool reversed) {
  ++g_block_serial;  // its __shared__ variables garbage again
  if (b.fibers.size() < threads) b.fibers.resize(threads);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    if (!f.stack) f.stack = std::make_unique<FiberStack>();
    f.done = false;
    f.sp = fresh_stack(f.stack->bottom(), kStackBytes);
  }
  b.live = threads;
  b.block = Barrier{};
  b.block.expected = threads;
  for (unsigned w = 0; w * kWarp < threads; ++w) {
    b.warps[w] = Barrier{};
    b.warps[w].expected = std::min(kWarp, threads - w * kWarp);
  }
  while (b.live > 0 && b.failure.empty()) {
    const uint64_t before = b.progress;
    for (unsigned turn = 0; turn < threads && b.failure.empty(); ++turn) {
      const unsigned t = reversed ? threads - 1 - turn : turn;
      if (b.fibers[t].done) continue;
      b.current = t;
      g_thread_idx = coordinates(t, g_block_dim);
      void* keep = nullptr;
      leaving(&keep, b.fibers[t].stack->bottom(), kStackBytes);
      hpc_emu_switch(&b.scheduler, b.fibers[t].sp);
      arrived(keep);
    }
    if (b.live > 0 && b.progress == before)
      b.failure = "block " + shown(g_block_idx) +
                  ": a barrier that not every live thread of the block (or of a warp) reaches";
  }
}

void run_now(dim3 grid, dim3 block, const std::function<void()>& body) {
  Block& b = state();
  g_in_launch = true;
  const unsigned threads = block.x * block.y * block.z;
  b.body = &body;
  b.failure.clear();
  g_grid_dim = grid;
  g_block_dim = block;
  const uint64_t launch = g_launches++;
  const bool backwards = !g_forward_only && launch % 2 == 1;
  const uint64_t blocks = 1ull * grid.x * grid.y * grid.z;
  for (uint64_t turn = 0; turn < blocks && b.failure.empty(); ++turn) {
    const uint64_t linear = backwards ? blocks - 1 - turn : turn;
    g_block_idx = coordinates(linear, grid);
    run_block(b, threads, !g_forward_only && (linear + launch) % 2 == 1);
  }
  g_in_launch = false;
  if (!b.failure.empty()) {
    std::fprintf(stderr, "cuda_emu: a launch of grid %s, block %s failed: %s\n", shown(grid).c_str(),
                 shown(block).c_str(), b.failure.c_str());
    g_sticky = cudaErrorLaunchFailure;
  }
}

// Streams, and what a stream being captured records.
struct Stream {
  bool capturing = false;
  std::vector<std::function<void()>> recorded;
};
struct Graph {
  std::vector<std::function<void()>> work;
};

Stream g_default_stream;

Stream& stream_of(cudaStream_t s) {
  return s ? *reinterpret_cast<Stream*>(s) : g_default_stream;
}

// Runs `work` now, or records it on a stream being captured.
void enqueue(cudaStream_t s, std::function<void()> work) {
  Stream& stream = stream_of(s);
  if (stream.capturing) stream.recorded.push_back(std::move(work));
  else work();
}

// The emulated device memory: each block mapped on its own, its end against a page that
// cannot be touched, so that an access past it faults where it happens.
struct Mapping {
  void* base;
  size_t length;
};
std::map<void*, Mapping>& mappings() {
  static auto* m = new std::map<void*, Mapping>;  // never destroyed: static allocators free at exit
  return *m;
}

// A fault inside a launch (an access past a buffer's end, most likely, or a thread's stack
// overflowed; SIGILL: a misaligned access, which the emulated code traps on, see
// tests/CMakeLists.txt): say which and where, then die of it. It runs on a stack of its own, as
// the thread's own may be the one used up.
void on_fault(int sig, siginfo_t* info, void*) {
  if (g_in_launch) {
    const Block& b = state();
    const bool overflow = b.current < b.fibers.size() && b.fibers[b.current].stack &&
                          b.fibers[b.current].stack->in_guard(info->si_addr);
    char line[256];
    char why[96];
    if (overflow) std::snprintf(why, sizeof why, "the thread's stack overflowed (the emulation gives each %zu KiB)", kStackBytes / 1024);
    else if (sig == SIGILL) std::snprintf(why, sizeof why, "a misaligned access (a GPU's 'misaligned address')");
    else std::snprintf(why, sizeof why, "an access outside device memory (past a buffer's end?)");
    const int n = std::snprintf(line, sizeof line, "cuda_emu: signal %d in a kernel, block (%u,%u,%u) thread (%u,%u,%u): %s\n",
                                sig, g_block_idx.x, g_block_idx.y, g_block_idx.z, g_thread_idx.x, g_thread_idx.y,
                                g_thread_idx.z, why);
    if (n > 0) [[maybe_unused]] ssize_t w = write(STDERR_FILENO, line, static_cast<size_t>(n));
  }
  signal(sig, SIG_DFL);  // the access runs again, and ends the process as it would have
}
const bool g_fault_handler = [] {
  static char alternate[64 * 1024];  // for the thread that runs the launches (the only one)
  stack_t s{};
  s.ss_sp = alternate;
  s.ss_size = sizeof alternate;
  sigaltstack(&s, nullptr);
  struct sigaction a {};
  a.sa_sigaction = on_fault;
  a.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&a.sa_mask);
  sigaction(SIGSEGV, &a, nullptr);
  sigaction(SIGBUS, &a, nullptr);
  sigaction(SIGILL, &a, nullptr);
  return true;
}();

// Each device tensor its own mapping, of its own size (core/caching_allocator.hpp), unless the
// environment says otherwise.
const bool g_uncached = [] { return setenv("HPCTRAIN_NO_MEMORY_CACHING", "1", 0) == 0; }();

}  // namespace

int multiprocessors() {
  static const int n = [] {
    const char* v = std::getenv("HPCTRAIN_EMU_MULTIPROCESSORS");
    if (!v) return 4;  // small grids: quick on a CPU
    char* end = nullptr;
    const long count = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || count < 1 || count > 1024) {
      std::fprintf(stderr, "cuda_emu: HPCTRAIN_EMU_MULTIPROCESSORS='%s' is not a count from 1 to 1024\n", v);
      std::exit(2);
    }
    return static_cast<int>(count);
  }();
  return n;
}

void sync_block() { wait(state().block, 0); }

int sync_block_or(int flag) { return wait(state().block, flag); }

unsigned lane_of_thread() { return linear_thread() % kWarp; }

void exchange_in_warp(const void* mine, void* theirs, size_t bytes, unsigned from) {
  Block& b = state();
  Barrier& w = b.warps[linear_thread() / kWarp];
  const uint64_t round = w.generation + 1;
  std::memcpy(&w.slots[lane_of_thread()], mine, bytes);
  w.offered[lane_of_thread()] = round;
  wait(w, 0);  // every lane has offered its value
  if (from >= kWarp || w.offered[from] != round) throw Trap{"a shuffle from a lane that did not take part in it"};
  std::memcpy(theirs, &w.slots[from], bytes);
  wait(w, 0);  // every lane has taken its partner's: the slots may be written again
}

void trap() { throw Trap{"a thread trapped (__trap)"}; }

void run(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, std::function<void()> body) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || shared_bytes > 48 * 1024) {
    std::fprintf(stderr, "cuda_emu: a launch of grid %s, block %s, %zu shared bytes that CUDA refuses\n",
                 shown(grid).c_str(), shown(block).c_str(), shared_bytes);
    g_last = cudaErrorInvalidConfiguration;
    return;
  }
  if (g_sticky != cudaSuccess) return;
  enqueue(stream, [grid, block, body = std::move(body)] { run_now(grid, block, body); });
}

}  // namespace hpc::emu

// ---- the runtime calls, for the one emulated device ----------------------------------------------

using hpc::emu::enqueue;
using hpc::emu::error;
using hpc::emu::g_last;
using hpc::emu::g_sticky;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return error(cudaSuccess);
}
cudaError_t cudaSetDevice(int device) { return error(device == 0 ? cudaSuccess : cudaErrorInvalidDevice); }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount: *value = hpc::emu::multiprocessors(); return error(cudaSuccess);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "%s", "CUDA kernels emulated on the CPU (tests/emu)");
  std::memcpy(p->uuid.bytes, "hpctrain-emu-gpu", sizeof p->uuid.bytes);
  p->multiProcessorCount = hpc::emu::multiprocessors();
  return error(cudaSuccess);
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = g_sticky != cudaSuccess ? g_sticky : g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_sticky != cudaSuccess ? g_sticky : g_last; }
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    default: return "an error of the emulated device";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Aligned to 16 bytes (not cudaMalloc's 256, so that the end is nearer what was asked): the
  // kernels' widest access, and what their choice of width looks at.
  const size_t rounded = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
  const size_t length = (rounded + page - 1) / page * page + page;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return cudaErrorMemoryAllocation;
  char* guard = static_cast<char*>(base) + length - page;
  mprotect(guard, page, PROT_NONE);
  char* user = guard - rounded;
  std::memset(user, 0xFF, rounded);  // NaN, -1: what a kernel reads before anybody wrote it
  hpc::emu::mappings()[user] = {base, length};
  *p = user;
  return error(cudaSuccess);
}
cudaError_t cudaFree(void* p) {
  if (!p) return error(cudaSuccess);
  auto& m = hpc::emu::mappings();
  const auto at = m.find(p);
  if (at == m.end()) return cudaErrorInvalidValue;
  munmap(at->second.base, at->second.length);
  m.erase(at);
  return error(cudaSuccess);
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? error(cudaSuccess) : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return error(cudaSuccess);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (g_sticky != cudaSuccess) return g_sticky;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  if (g_sticky != cudaSuccess) return g_sticky;
  enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (g_sticky != cudaSuccess) return g_sticky;
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (g_sticky != cudaSuccess) return g_sticky;
  enqueue(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(new hpc::emu::Stream);
  return error(cudaSuccess);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<hpc::emu::Stream*>(stream);
  return error(cudaSuccess);
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return error(cudaSuccess); }  // work runs when enqueued
cudaError_t cudaDeviceSynchronize() { return error(cudaSuccess); }

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  hpc::emu::Stream& s = hpc::emu::stream_of(stream);
  if (!stream || s.capturing) return cudaErrorInvalidValue;  // the legacy default stream cannot be captured
  s.capturing = true;
  s.recorded.clear();
  return error(cudaSuccess);
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  hpc::emu::Stream& s = hpc::emu::stream_of(stream);
  if (!s.capturing) return cudaErrorInvalidValue;
  s.capturing = false;
  *graph = reinterpret_cast<cudaGraph_t>(new hpc::emu::Graph{std::move(s.recorded)});
  s.recorded.clear();
  return error(cudaSuccess);
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(new hpc::emu::Graph(*reinterpret_cast<hpc::emu::Graph*>(graph)));
  return error(cudaSuccess);
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  for (const auto& work : reinterpret_cast<hpc::emu::Graph*>(exec)->work) enqueue(stream, work);
  return error(cudaSuccess);
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<hpc::emu::Graph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<hpc::emu::Graph*>(graph);
  return cudaSuccess;
}

}  // extern "C"
