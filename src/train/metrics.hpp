// The metrics file: JSON Lines, one object per event, flushed as written so a crashed or
// killed run keeps every line it finished. Keys are a contract (issue "hpctrain core").
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace hpc::train {

using JsonValue = std::variant<int64_t, double, std::string>;
using JsonFields = std::vector<std::pair<std::string, JsonValue>>;

// A JSON string literal of `s`, quotes included.
std::string json_string(const std::string& s);

// One JSON object on one line; non-finite numbers become null (JSON has no NaN).
std::string json_line(const JsonFields& fields);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path);  // appends; usage error if it cannot
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const JsonFields& fields);

 private:
  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace hpc::train
