#include "core/json.hpp"

namespace hpc {

std::string json_text(const JsonObject& j, int indent) {
  return j.dump(indent, ' ', false, JsonObject::error_handler_t::replace);
}

std::string json_string(const std::string& s) { return json_text(JsonObject(s)); }

bool is_utf8(const std::string& s) {
  try {
    (void)JsonObject(s).dump(-1, ' ', false, JsonObject::error_handler_t::strict);
    return true;
  } catch (const JsonObject::type_error&) {
    return false;
  }
}

}  // namespace hpc
