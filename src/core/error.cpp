#include "core/error.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace hpc {

std::string one_line(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void io_error(const std::string& what, const std::string& path) {
  const int err = errno;  // before anything below could change it
  usage_error("cannot ", what, " ", path, ": ", std::strerror(err));
}

}  // namespace hpc

namespace hpc::detail {

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = concat("internal error at ", file, ":", line, ": check `", cond, "` failed");
  if (!msg.empty()) what.append(": ").append(msg);  // not `+ msg`: GCC 12 -Wrestrict false positive
  throw Error(ErrorKind::Internal, what);
}

}  // namespace hpc::detail
