// Text built where only async-signal-safe calls may be made (a signal handler, a process that
// ends at once): no allocation, no locale, no stdio. Shared by the heartbeat's and the metrics
// and Prometheus files' last words (ckpt/store.cpp, train/stop/final_records.cpp); KeepErrno by
// every signal handler that makes a call (hpctrain's stop handler, hpcrun's and its rank wrapper's).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace hpc::signal_safe {

// Appends `text` to buf[*n..] (kept within `size`, NUL-terminated).
inline void append(char* buf, size_t size, size_t* n, const char* text) {
  for (; *text && *n + 1 < size; ++text) buf[(*n)++] = *text;
  buf[*n] = '\0';
}

// Appends v in decimal.
inline void append(char* buf, size_t size, size_t* n, int64_t v) {
  char digits[24];
  size_t k = 0;
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  do digits[k++] = static_cast<char>('0' + u % 10);
  while ((u /= 10) != 0);
  if (v < 0) digits[k++] = '-';
  char text[24];
  for (size_t i = 0; i < k; ++i) text[i] = digits[k - 1 - i];
  text[k] = '\0';
  append(buf, size, n, text);
}

// A signal handler's first line: errno is the interrupted code's, kept across the handler's own
// calls (write, kill, unlink), restored as it returns (ThreadSanitizer: "signal handler spoils errno").
class KeepErrno {
 public:
  KeepErrno() = default;
  KeepErrno(const KeepErrno&) = delete;
  KeepErrno& operator=(const KeepErrno&) = delete;
  ~KeepErrno() { errno = saved_; }

 private:
  int saved_ = errno;
};

// Writes buf[0..n) to fd whole, through interruptions; whether it all went (a full disk: not).
inline bool write_whole(int fd, const char* buf, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd, buf + done, n - done);
    if (w > 0) done += static_cast<size_t>(w);
    else if (!(w < 0 && errno == EINTR)) return false;
  }
  return true;
}

}  // namespace hpc::signal_safe
