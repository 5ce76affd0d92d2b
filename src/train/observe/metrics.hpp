// The metrics file: JSON Lines, one object per event, flushed as written so a crashed or
// killed run keeps every line it finished. Keys are a contract (issue "hpctrain core").
#pragma once

#include <cstdint>
#include <string>

#include "core/json.hpp"

namespace hpc::train {

using hpc::json_string;
using hpc::json_text;
using hpc::JsonObject;

// Appends JSON lines to the file of an option (--metrics-file, --timeline-file), which every
// error names. A file that exists must be JSON Lines already (its first line, and its last whole
// one, a JSON object): appending to anything else (a dataset file, a pretty-printed JSON document
// named by mistake) would damage it; one whose last line was cut (a killed run) gets the new
// lines after a line end, with a warning. A file this writer created and never wrote to is
// removed again, so a refused run leaves nothing behind, nor one that a signal ends at once
// (final_records::made_empty). A stream (a pipe, a FIFO, a device: --metrics-file /dev/stdout |
// cat) is written as it is; a FIFO that nothing reads is refused at
// once instead of waited on. Opening is an error; a write that fails later (a full file system)
// is one warning, and the file gets no more lines, while the run goes on (OnFailure::Warn), or,
// where the lines are the program's result (evaluate's one line), a usage error (OnFailure::Fail):
// a script that reads the file then learns from the exit code that it holds nothing.
class MetricsWriter {
 public:
  enum class OnFailure { Warn, Fail };
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path, const char* option = "--metrics-file",
                         OnFailure on_failure = OnFailure::Warn);  // usage error if it cannot
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One line; in the --metrics-file, with "unix_time" (seconds since 1970, UTC, to the
  // millisecond) added last where `fields` has none. A failed write (a full disk) is one warning
  // naming the option, the file and the cause; the part of the line that reached a regular file
  // is cut off again (the file keeps whole lines only), and the file is written no more; with
  // OnFailure::Fail the same words are a usage error instead.
  void write(const JsonObject& fields);
  // Whether the file's last `tail_bytes` hold a line with each of `fields` (a whole JSON line of
  // an event that a run killed since may or may not have written). False for a stream (never read
  // back) and for a file that cannot be read.
  bool holds(const JsonObject& fields, int64_t tail_bytes) const;

 private:
  void give_up(int error, bool part_left);  // after a failed write: the warning, and no more writes

  std::string path_;
  std::string file_;  // path_, or the file a link to nothing leads to (where_a_dangling_link_leads)
  const char* option_ = "";
  int fd_ = -1;
  bool created_ = false, written_ = false;  // written_: a whole line of this run is in the file
  int made_empty_ = -1;  // created_ and no whole line yet: final_records' slot, which a stop at once removes
  bool truncatable_ = false;  // a regular file of its own (not /dev/stdout's, which the log shares)
  bool cut_ = false;  // the file's last line has no line end yet
  bool stamp_ = false;  // every event gets "unix_time" (the metrics file's, not the timeline's)
  OnFailure on_failure_ = OnFailure::Warn;
};

}  // namespace hpc::train
