#include "train/stop/final_records.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "ckpt/store.hpp"
#include "core/signal_safe_text.hpp"

namespace hpc::train::final_records {
namespace {

// Filled only under a Writing, read only once the writes are closed and those in flight ended
// (write_at_once): one record each, never read while it changes.
std::atomic<int> g_writing{0};
std::atomic<bool> g_closed{false}, g_armed{false};
int g_metrics_fd = -1;
int64_t g_step = 0, g_started_ns = 0;
bool g_started = false;
char g_prom_target[4096], g_prom_tmp[4096];
char g_prom_body[32768], g_prom_exit[1024], g_prom_time[1024];
bool g_prom_ready = false;
// made_empty's files: fixed buffers, as a signal's side reads them (never while they change:
// only under a Writing, read after the writes in flight ended). A slot is taken by exchange: two
// writers may be made at once on two threads.
struct MadeEmpty {
  char path[4096];
  std::atomic<bool> used{false};
};
MadeEmpty g_made_empty[4];

// The text of a last word, built async-signal-safely.
struct Text {
  char buf[36864];
  size_t n = 0;
  void add(const char* s) { signal_safe::append(buf, sizeof buf, &n, s); }
  void add(int64_t v) { signal_safe::append(buf, sizeof buf, &n, v); }
  void add_seconds(int64_t ns) {  // to the millisecond, as the metrics file's unix_time
    const int64_t ms = ns / 1000000;
    add(ms / 1000);
    add(".");
    const int64_t frac = ms % 1000;
    if (frac < 100) add("0");
    if (frac < 10) add("0");
    add(frac);
  }
};

int64_t now_ns(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

bool copy(char* to, size_t size, const std::string& from) {
  if (from.size() >= size) return false;
  std::memcpy(to, from.c_str(), from.size() + 1);
  return true;
}

// As the run's own "stopped" event (trainer.cpp's write_stopped_event), in its keys' order.
void write_stopped_event(const char* signal_name, int exit_code) {
  if (g_metrics_fd < 0) return;
  static Text t;
  t.n = 0;
  t.add("{\"event\":\"stopped\",\"step\":");
  t.add(g_step);
  t.add(",\"signal\":\"");
  t.add(signal_name);
  t.add("\",\"checkpointed\":false,\"exit_code\":");
  t.add(static_cast<int64_t>(exit_code));
  if (g_started) {
    t.add(",\"elapsed_seconds\":");
    t.add_seconds(now_ns(CLOCK_MONOTONIC) - g_started_ns);
  }
  t.add(",\"unix_time\":");
  t.add_seconds(now_ns(CLOCK_REALTIME));
  t.add("}\n");
  signal_safe::write_whole(g_metrics_fd, t.buf, t.n);  // O_APPEND: after every whole line written before
}

// As PrometheusTextfile::write: a temporary file beside the target, then a rename over it. Its
// name is this process's own (mkstemp is not async-signal-safe); O_EXCL never follows a link.
void write_prometheus(int exit_code) {
  if (!g_prom_ready) return;
  static Text t;
  t.n = 0;
  t.add(g_prom_body);
  t.add(g_prom_exit);
  t.add(static_cast<int64_t>(exit_code));
  t.add("\n");
  t.add(g_prom_time);
  t.add_seconds(now_ns(CLOCK_REALTIME));
  t.add("\n");
  ::unlink(g_prom_tmp);
  const int fd = ::open(g_prom_tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::fchmod(fd, 0644);  // node_exporter reads it as another user
    const bool whole = signal_safe::write_whole(fd, t.buf, t.n);
    if (::close(fd) == 0 && whole && ::rename(g_prom_tmp, g_prom_target) == 0) return;
    ::unlink(g_prom_tmp);
  }
  ckpt::overwrite_in_place(g_prom_target, t.buf, t.n);  // a full disk: "stopped", not "training" for ever
}

}  // namespace

Writing::Writing() { g_writing.fetch_add(1); }
Writing::~Writing() { g_writing.fetch_sub(1); }
bool Writing::closed() { return g_closed.load(); }

void metrics_file(int fd) {
  g_metrics_fd = fd;
}

void run_started(std::chrono::steady_clock::time_point at) {
  const Writing w;
  // steady_clock is CLOCK_MONOTONIC (libstdc++), which the signal's side reads.
  g_started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  g_started = true;
}

void steps_done(int64_t step) {
  const Writing w;
  g_step = step;
}

void prometheus_file(const std::string& target, const std::string& body, const std::string& exit_code_prefix,
                     const std::string& time_prefix) {
  const std::filesystem::path p(target);
  std::string tmp = ".";
  tmp += p.filename().string();
  tmp += ".tmp.stopped." + std::to_string(::getpid());
  g_prom_ready = copy(g_prom_target, sizeof g_prom_target, target) &&
                 copy(g_prom_tmp, sizeof g_prom_tmp, (p.parent_path() / tmp).string()) &&
                 copy(g_prom_body, sizeof g_prom_body, body) && copy(g_prom_exit, sizeof g_prom_exit, exit_code_prefix) &&
                 copy(g_prom_time, sizeof g_prom_time, time_prefix);
}

int made_empty(const std::string& path) {
  for (int i = 0; i < static_cast<int>(std::size(g_made_empty)); ++i) {
    MadeEmpty& m = g_made_empty[i];
    if (path.size() >= sizeof m.path || m.used.exchange(true)) continue;
    copy(m.path, sizeof m.path, path);
    return i;
  }
  return -1;
}

void release(int slot) {
  if (slot >= 0) g_made_empty[slot].used.store(false);
}

void arm() { g_armed.store(true); }
void disarm() { g_armed.store(false); }

void remove_made_empty() {
  g_closed.store(true);
  // A write that still hangs after a second (storage that does not answer) is let be: what is
  // read then may be half-changed text of a gauge, never memory out of bounds.
  const timespec one_ms{0, 1000000};
  for (int ms = 0; ms < 1000 && g_writing.load() > 0; ++ms) ::nanosleep(&one_ms, nullptr);
  for (const MadeEmpty& m : g_made_empty)
    if (m.used.load()) ::unlink(m.path);
}

void write_at_once(const char* signal_name, int exit_code) {
  remove_made_empty();
  if (!g_armed.load()) return;  // not a training run's, or its own last words came meanwhile
  write_stopped_event(signal_name, exit_code);
  write_prometheus(exit_code);
}

}  // namespace hpc::train::final_records
