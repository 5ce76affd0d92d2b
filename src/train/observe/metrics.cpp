#include "train/observe/metrics.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace hpc::train {

namespace {

// The first and the last byte of a regular file that is not empty (none: it is empty, or cannot
// be read: a write-only file is appended to unseen). Read through a descriptor of its own: the
// writer's is write-only, so that a FIFO that nothing reads is refused (below).
std::optional<std::pair<char, char>> ends_of(const std::string& path, off_t size) {
  const int fd = size > 0 ? ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
  if (fd < 0) return std::nullopt;
  std::pair<char, char> ends{0, 0};
  const bool read = ::pread(fd, &ends.first, 1, 0) == 1 && ::pread(fd, &ends.second, 1, size - 1) == 1;
  ::close(fd);
  return read ? std::optional(ends) : std::nullopt;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const char* option)
    : path_(path), option_(option), stamp_(std::strcmp(option, "--metrics-file") == 0) {
  HPC_REQUIRE(!path.empty(), option, " is empty (an unset variable?)");
  // O_EXCL tells a file made here from one that was there (which stays, whatever happens).
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  created_ = fd >= 0;
  // One that was there may be a stream (a pipe: /dev/stdout | cat, a FIFO, a device): O_NONBLOCK
  // makes a FIFO that nothing reads fail at once (ENXIO) where the open would wait for a reader.
  if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) {
    const int error = errno;
    HPC_REQUIRE(error != ENXIO || ::stat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode), option, " ", path,
                " is a FIFO that has no reader: start the program that reads it first");
    usage_error("cannot open ", option, " ", path, ": ", std::strerror(error));
  }
  if (::fstat(fd, &st) != 0 || !(file_ = ::fdopen(fd, "a"))) {
    const int error = errno;
    ::close(fd);
    if (created_) ::unlink(path.c_str());
    usage_error("cannot open ", option, " ", path, ": ", std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    // A stream is written as it is, never read, checked or removed; its writes wait for a slow
    // reader as the progress lines on stdout do, rather than fail.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  const auto ends = ends_of(path, st.st_size);
  if (ends && ends->first != '{') {
    std::fclose(std::exchange(file_, nullptr));
    usage_error(option, " ", path, " exists and is not a JSON Lines file: not appending to it (another file "
                "named by mistake?)");
  }
  cut_ = ends && ends->second != '\n';  // a run killed while it wrote a line
}

MetricsWriter::~MetricsWriter() {
  if (!file_) return;
  std::fclose(file_);
  if (created_ && !written_) ::unlink(path_.c_str());
}

void MetricsWriter::write(const JsonObject& fields) {
  if (!file_) return;
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
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  written_ = true;  // even a failed write may have left part of a line: the file stays
  HPC_REQUIRE(ok, "cannot write ", option_, " ", path_, ": ", std::strerror(errno));
}

}  // namespace hpc::train
