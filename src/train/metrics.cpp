#include "train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.hpp"

namespace hpc::train {
namespace {

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string json_string(const std::string& s) {
  std::string out;
  append_escaped(out, s);
  return out;
}

std::string json_line(const JsonFields& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    append_escaped(out, fields[i].first);
    out += ':';
    const JsonValue& v = fields[i].second;
    if (const auto* n = std::get_if<int64_t>(&v)) {
      out += std::to_string(*n);
    } else if (const auto* d = std::get_if<double>(&v)) {
      if (std::isfinite(*d)) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.10g", *d);
        out += buf;
      } else {
        out += "null";
      }
    } else {
      append_escaped(out, std::get<std::string>(v));
    }
  }
  out += '}';
  return out;
}

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

void MetricsWriter::write(const JsonFields& fields) {
  if (!file_) return;
  const std::string line = json_line(fields) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  written_ = true;  // even a failed write may have left part of a line: the file stays
  HPC_REQUIRE(ok, "cannot write ", option_, " ", path_, ": ", std::strerror(errno));
}

}  // namespace hpc::train
