// JSON, written and read through nlohmann-json (Debian's nlohmann-json3-dev): the metrics lines,
// inspect --json, the shard manifests. One way to write it, here.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hpc {

// A JSON object whose keys keep the order they were given in (consumers may rely on the
// metrics lines' order; people read it).
using JsonObject = nlohmann::ordered_json;

// JSON text as hpctrain writes it: one line (or, with indent >= 0, indented); non-finite numbers
// become null (JSON has no NaN); bytes that are not UTF-8 (a path can hold any) are replaced by
// U+FFFD rather than refused.
std::string json_text(const JsonObject& j, int indent = -1);
// A JSON string literal of `s`, quotes included.
std::string json_string(const std::string& s);
// Whether `s` is UTF-8 text, which a JSON string holds as it is (no byte replaced).
bool is_utf8(const std::string& s);

}  // namespace hpc
