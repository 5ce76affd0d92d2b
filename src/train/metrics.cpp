#include "train/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>

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

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  HPC_REQUIRE(file_ != nullptr, "cannot open metrics file ", path, ": ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const JsonFields& fields) {
  if (!file_) return;
  const std::string line = json_line(fields) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  HPC_CHECK(ok, "writing metrics file ", path_, ": ", std::strerror(errno));
}

}  // namespace hpc::train
