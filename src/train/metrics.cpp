#include "train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.hpp"

namespace hpc::train {

namespace {

// Whether an existing file may be appended to: empty, or starting as a JSON object does.
bool holds_json_lines(FILE* f) {
  const int first = std::fgetc(f);
  return first == EOF || first == '{';
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const char* option) : path_(path), option_(option) {
  HPC_REQUIRE(!path.empty(), option, " is empty (an unset variable?)");
  // O_EXCL tells a file made here from one that was there (which stays, whatever happens).
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  created_ = fd >= 0;
  bool readable = !created_;
  if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) {  // write-only: appended to unseen
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    readable = false;
  }
  HPC_REQUIRE(fd >= 0, "cannot open ", option, " ", path, ": ", std::strerror(errno));
  file_ = ::fdopen(fd, readable ? "a+" : "a");
  if (!file_) ::close(fd);
  HPC_REQUIRE(file_, "cannot open ", option, " ", path, ": ", std::strerror(errno));
  if (readable && !holds_json_lines(file_)) {
    std::fclose(std::exchange(file_, nullptr));
    usage_error(option, " ", path, " exists and is not a JSON Lines file: not appending to it (another file "
                "named by mistake?)");
  }
  std::fseek(file_, 0, SEEK_END);  // from reading to writing, a stream needs a seek
}

MetricsWriter::~MetricsWriter() {
  if (!file_) return;
  std::fclose(file_);
  if (created_ && !written_) ::unlink(path_.c_str());
}

void MetricsWriter::write(const JsonObject& fields) {
  if (!file_) return;
  const std::string line = json_text(fields) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  written_ = true;  // even a failed write may have left part of a line: the file stays
  HPC_REQUIRE(ok, "cannot write ", option_, " ", path_, ": ", std::strerror(errno));
}

}  // namespace hpc::train
