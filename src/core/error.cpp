#include "core/error.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace hpc {

namespace {

// How many bytes at text[at] are one printable UTF-8 character: 0 for a byte that starts none (a
// stray continuation byte, a Latin-1 name's, a cut or overlong sequence, a surrogate) and for the
// C1 control characters U+0080..U+009F, which a terminal may take for an escape sequence.
size_t printable_utf8(const std::string& text, size_t at) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[at + k]); };
  const unsigned char lead = byte(0);
  const size_t n = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
  if (n == 0 || at + n > text.size()) return 0;
  uint32_t code = lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    code = code << 6 | (byte(k) & 0x3F);
  }
  const uint32_t least[] = {0, 0, 0xA0, 0x800, 0x10000};  // below: overlong, or (2 bytes) a C1 control
  if (code < least[n] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

// Beyond the control characters error.hpp names, each byte that is not printable UTF-8 is escaped:
// a reader that decodes the error as UTF-8 (a script, a log shipper) must not fail on it.
std::string one_line(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else if (const size_t n = u >= 0x80 ? printable_utf8(text, at) : 0) {
      out.append(text, at, n);
      at += n - 1;
    } else {
      // A control character, or a byte that is not UTF-8 (a file's bytes, a name from another
      // system's encoding), which came out raw: a terminal's replacement glyph, or a reader of
      // the error that decodes UTF-8 failing on it.
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

std::string one_line_unambiguous(const std::string& text) {
  std::string doubled;
  doubled.reserve(text.size());
  for (const char c : text) doubled.append(c == '\\' ? 2 : 1, c);
  return one_line(doubled);
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

namespace hpc {

std::string what_it_means(const std::exception& e) {
  const auto* failed = dynamic_cast<const std::system_error*>(&e);
  if (failed && failed->code() == std::errc::resource_unavailable_try_again)
    return std::string("cannot start a thread (") + failed->what() +
           "): this user's limit of processes and threads (ulimit -u, a cgroup's pids.max) or the process's "
           "memory (ulimit -v) is reached";
  return e.what();
}

}  // namespace hpc
