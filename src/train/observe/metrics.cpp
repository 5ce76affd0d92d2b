#include "train/observe/metrics.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "train/stop/final_records.hpp"

namespace hpc::train {

namespace {

constexpr off_t kLongestLine = 1 << 20;  // far longer than any line hpctrain writes

// Whether `line` (without its line end) is one complete JSON object, as every line of a JSON
// Lines file that hpctrain appends to must be.
bool one_object(const std::string& line) {
  return nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false).is_object();
}

std::string read_at(int fd, off_t at, off_t n) {
  std::string s(static_cast<size_t>(n), '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t r = ::pread(fd, s.data() + got, s.size() - got, at + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  s.resize(got);
  return s;
}

// What a regular file that is not empty holds, as far as appending to it goes. Read through a
// descriptor of its own: the writer's is write-only, so that a FIFO that nothing reads is refused
// (below); a file that cannot be read (write-only to this user) is appended to unseen.
enum class Holds { Unread, JsonLines, CutJsonLines, Other };

Holds what_it_holds(const std::string& path, off_t size) {
  const int fd = size > 0 ? ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
  if (fd < 0) return Holds::Unread;
  // The first line must be whole, and one JSON object: a JSON document's "{" line, a dataset's
  // bytes, a log's text are not. (First and last byte alone took any pretty-printed object.)
  const std::string head = read_at(fd, 0, std::min(size, kLongestLine));
  const size_t first_end = head.find('\n');
  // The last whole line too (blank lines after it aside); what follows the last line end is a
  // line cut by a run killed while writing it (or a crashed machine's unwritten block), kept.
  const off_t from = std::max<off_t>(0, size - kLongestLine);
  const std::string tail = read_at(fd, from, size - from);
  ::close(fd);
  if (static_cast<off_t>(head.size()) != std::min(size, kLongestLine) ||
      static_cast<off_t>(tail.size()) != size - from)
    return Holds::Unread;  // a read that failed: nothing known
  // No line end at all: hpctrain's own first event cut (a run killed while writing its config
  // line), which starts as each of its events does; any other text is someone else's.
  if (first_end == std::string::npos && size < kLongestLine && head.rfind("{\"event\":\"", 0) == 0)
    return Holds::CutJsonLines;
  if (first_end == std::string::npos || !one_object(head.substr(0, first_end))) return Holds::Other;
  const bool cut = tail.back() != '\n';
  // From the last line end back: each line that ends there, until one that is not blank.
  for (size_t end = tail.rfind('\n'); end != std::string::npos;) {
    const size_t before = end == 0 ? std::string::npos : tail.rfind('\n', end - 1);
    if (before == std::string::npos && from > 0) return Holds::Other;  // longer than any line of hpctrain's
    const size_t start = before == std::string::npos ? 0 : before + 1;
    if (from == 0 && start == 0) break;  // the first line: checked above
    const std::string line = tail.substr(start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      if (!one_object(line)) return Holds::Other;
      break;
    }
    end = before;
  }
  if (from > 0 && tail.find('\n') == std::string::npos) return Holds::Other;  // a cut line longer than any
  return cut ? Holds::CutJsonLines : Holds::JsonLines;
}

bool write_all(int fd, const std::string& text, size_t& done) {
  for (done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const char* option, OnFailure on_failure)
    : path_(path), option_(option), stamp_(std::strcmp(option, "--metrics-file") == 0), on_failure_(on_failure) {
  // A file made here (O_EXCL) is removed again if nothing was written to it, also by a process
  // that ends at once (final_records::made_empty); one that was there stays, whatever happens.
  const final_records::Writing making;  // a stop at once waits for the file to be marked
  OutputFile out = open_output(path, option, O_WRONLY | O_APPEND);
  fd_ = out.fd;
  file_ = std::move(out.file);  // what is checked and removed
  created_ = out.created;
  if (created_) made_empty_ = final_records::made_empty(file_);
  // A stream (a pipe: /dev/stdout | cat, a FIFO, a device) is written as it is, never read,
  // checked or removed; its writes wait for a slow reader as the progress lines on stdout do.
  if (!S_ISREG(out.st.st_mode)) return;
  // /dev/stdout may be a regular file (a job's output) that the log appends to as well: a failed
  // write's part of a line is cut off only in a file of the writer's own.
  truncatable_ = path.rfind("/dev/", 0) != 0 && path.rfind("/proc/", 0) != 0;
  const Holds holds = what_it_holds(file_, out.st.st_size);
  if (holds == Holds::Other) {
    ::close(std::exchange(fd_, -1));
    usage_error(option, " ", path, " exists and is not a JSON Lines file: not appending to it (another file "
                "named by mistake?)");
  }
  cut_ = holds == Holds::CutJsonLines;  // a run killed while it wrote a line
}

bool MetricsWriter::holds(const JsonObject& fields, int64_t tail_bytes) const {
  if (fd_ < 0 || file_.empty()) return false;
  const int fd = ::open(file_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) return false;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // a stream: what it held is gone
    ::close(fd);
    return false;
  }
  // From the byte before the tail: whether the tail starts a line. Whole lines only: the first one
  // of a tail that starts inside a line is left out.
  const off_t from = std::max<off_t>(0, st.st_size - static_cast<off_t>(tail_bytes) - 1);
  const std::string tail = read_at(fd, from, st.st_size - from);
  ::close(fd);
  const size_t first_end = from == 0 ? std::string::npos : tail.find('\n');
  size_t start = from == 0 ? 0 : first_end == std::string::npos ? tail.size() : first_end + 1;
  while (start < tail.size()) {
    const size_t end = tail.find('\n', start);
    if (end == std::string::npos) break;  // a line cut by a kill: not written
    const JsonObject line = JsonObject::parse(tail.begin() + static_cast<ptrdiff_t>(start),
                                                      tail.begin() + static_cast<ptrdiff_t>(end), nullptr, false);
    start = end + 1;
    if (!line.is_object()) continue;
    const auto items = fields.items();
    if (std::all_of(items.begin(), items.end(), [&](const auto& f) {
          const auto it = line.find(f.key());
          return it != line.end() && *it == f.value();
        }))
      return true;
  }
  return false;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  const final_records::Writing changing;
  if (stamp_) final_records::metrics_file(-1);  // the descriptor's number may be another file's next
  final_records::release(std::exchange(made_empty_, -1));
  ::close(fd_);
  if (created_ && !written_) ::unlink(file_.c_str());
}

void MetricsWriter::write(const JsonObject& fields) {
  const final_records::Writing writing;
  // The process ends at once: its "stopped" event is the last line (final_records.hpp).
  if (fd_ < 0 || final_records::Writing::closed()) return;
  if (cut_)
    log::warn(option_, " ", path_, " ends in a cut line (a run killed while writing it?): it stays as it is, and "
              "this run's events start on a new line after it");
  std::string line = std::exchange(cut_, false) ? "\n" : "";  // appended: GCC 12 warns falsely (-Wrestrict) on +
  if (stamp_ && !fields.contains("unix_time")) {
    JsonObject stamped = fields;  // the wall-clock time of every event, last
    stamped["unix_time"] = std::round(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() * 1000) / 1000;
    line += json_text(stamped);
  } else {
    line += json_text(fields);
  }
  line += '\n';
  // Where the line starts (O_APPEND writes at the end): to cut off the part a failed write left.
  struct stat st {};
  const off_t before = truncatable_ && ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  if (write_all(fd_, line, done)) {
    written_ = true;
    final_records::release(std::exchange(made_empty_, -1));  // a whole line: the file stays
    if (stamp_) final_records::metrics_file(fd_);  // its last line whole: a stop at once appends there
    return;
  }
  const int error = errno;
  // One write of the whole line, so the part is at the file's end: cut off, the file ends in its
  // last whole line again (a reader never sees half a line); where that fails, or in a stream,
  // the part stays: a cut last line, which readers (hpctrain-plot, the next run) know.
  give_up(error, done > 0 && !(before >= 0 && ::ftruncate(fd_, before) == 0));
}

void MetricsWriter::give_up(int error, bool part_left) {
  if (stamp_) final_records::metrics_file(-1);  // under write()'s Writing
  final_records::release(std::exchange(made_empty_, -1));  // removed below, or left with a cut line
  ::close(std::exchange(fd_, -1));
  written_ = written_ || part_left;
  const bool removed = created_ && !written_ && ::unlink(file_.c_str()) == 0;  // made for this run, and empty
  const char* cut = part_left ? ": its last line is cut short" : "";
  if (on_failure_ == OnFailure::Fail)
    usage_error("cannot write ", option_, " ", path_, ": ", std::strerror(error),
                removed ? " (the file, empty, is removed)" : "", cut);
  log::warn("cannot write ", option_, " ", path_, ": ", std::strerror(error), " (said once; training goes on, and ",
            removed ? "the file, empty, is removed" : "no more lines are written to it", cut, ")");
}

}  // namespace hpc::train
