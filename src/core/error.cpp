#include "core/error.hpp"

namespace hpc::detail {

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = concat("internal error at ", file, ":", line, ": check `", cond, "` failed");
  if (!msg.empty()) what.append(": ").append(msg);  // not `+ msg`: GCC 12 -Wrestrict false positive
  throw Error(ErrorKind::Internal, what);
}

}  // namespace hpc::detail
