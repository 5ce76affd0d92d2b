// --timeline-file in the Chrome trace event format (chrome://tracing and Perfetto open it; the
// format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). A file
// whose name ends in ".jsonl" keeps the older JSON Lines form (trainer.cpp: rank 0's buckets).
//
// The file is a JSON array of events, every rank's: pid = rank (named "rank N (HOST)" by "M"
// metadata events), tid 0 the main thread ("step"), tid 1 the gradient all-reduce; "X" complete
// events, ts and dur in microseconds since the run's start (this launch's: a resumed run's events
// start again near 0; each run's steps keep their own numbers, in the names and args). Names:
// "step S" (from asking the loader for the batch to the update's end), "data wait", "forward",
// "backward", "optimizer", "queue bucket N" and "allreduce bucket N" (args: bucket, begin and end
// in arena elements, bytes, step), "queue statistics" and "allreduce statistics" (a step that
// averages the batch-norm running statistics over the ranks: args values, bytes, step; the same
// thread takes it ahead of the buckets queued after it), "checkpoint" and "snapshot" (how long the main thread spent
// handing the state over; the writing itself is a background thread's). S counts steps from 1
// (after S steps, as the metrics file and the checkpoints do); buckets are numbered in the order
// they are all-reduced, arena end first.
//
// Clocks: every rank's zero is taken as one barrier returns (at the start of the run), so ranks
// on different hosts line up to within the barrier's skew, without trusting the hosts' clocks.
//
// Per rank, without a collective per step: each rank buffers its events, and rank 0 gathers
// them (Communicator::gather_bytes) only where the ranks meet anyway: every gather_period()
// steps at the step boundary (set so that a rank buffers at most about kEventBudget events, and
// rank 0 takes in at most about kGatherBudget from all ranks: the period shortens with the world), at
// each epoch's end, and at the run's end or stop. A rank on another host needs no shared storage.
// A run that fails loses the events since the last gather (its file stays valid JSON). The tests
// set the period with HPCTRAIN_TEST_TRACE_GATHER_STEPS=K (every rank must have the same K).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/json.hpp"
#include "dist/communicator.hpp"
#include "train/engine/engine.hpp"

namespace hpc::train {

// Whether --timeline-file `path` is written as a Chrome trace (any name but one ending in .jsonl).
bool is_chrome_trace(const std::string& path);

// Rank 0's trace file. Appended to across resumed runs (hpcrun relaunches a job with --resume
// auto) and kept a loadable JSON array: each write puts its events where the closing "]" was and
// ends the file with a new one, so a killed run leaves valid JSON too. A file that exists must be
// such an array already (anything else is refused: another file named by mistake); one whose last
// event was cut (a process killed in a write) loses that event, with a warning. A file this writer
// created and never wrote to is removed again. A stream (a pipe, /dev/stdout) is written as it
// comes: "[" first and "]" at close() (the format allows a trace without it: a killed run's).
// Only opening is an error: a write that fails later (a full file system) is one warning, and
// the file gets no more events (a regular file is put back as it was before that write: a
// loadable array still), while the run goes on.
class TraceFile {
 public:
  explicit TraceFile(const std::string& path);  // usage error if it cannot be opened or holds something else
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;
  // events: each event as ",\n" and its JSON object.
  void append(const std::string& events);
  void close();

 private:
  bool lock_against_another_run();  // false (said, the file closed) while another process writes it
  void find_end(off_t size);  // where the next events go in an existing file
  bool write_at(const std::string& text, off_t at, int& error);  // false: failed, with errno in error
  void give_up(int error);  // after a failed write: the warning, the file's end put back, no more writes

  std::string path_;
  std::string file_;  // path_, or the file a link to nothing leads to (where_a_dangling_link_leads)
  int fd_ = -1;
  bool stream_ = false, created_ = false, closed_ = false;
  bool written_ = false;  // the file holds something of this run's (a regular file: a whole write)
  bool given_empty_ = false;  // an existing empty file, given "[ ]" from the start (emptied again if unwritten)
  bool has_events_ = false;  // the array holds an event: the next one follows a comma
  off_t end_ = 0;            // regular file: the end of its last event (or of its "[")
};

// Every rank's events of the run (collective: every rank builds one when --timeline-file names a
// Chrome trace, and calls gather() and at_boundary() at the same points).
class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kEventBudget = 20000;  // buffered per rank between gathers (about 4 MB)
  static constexpr int64_t kGatherBudget = 1000000;  // gathered by rank 0 from all ranks at once (~150 MB)
  // Beyond a rank's share of what rank 0 may take in at once (1 GiB: MPI's int counts carry it), at
  // most 16 MB, events are dropped until the next gather: a step of tens of thousands of tiny
  // buckets, on many ranks, holds more.
  static constexpr size_t kMaxBufferBytes = 16 << 20;
  static constexpr size_t kMaxGatherBytes = size_t{1} << 30;

  // file: rank 0's (nullptr elsewhere); buckets: the engine's bucket count (the same on every rank).
  Trace(dist::Communicator& comm, std::unique_ptr<TraceFile> file, const std::string& host, size_t buckets);
  // Step `step` (counted from 1): asked for its batch at `asked`, waited data_wait seconds for it,
  // its engine's phases and buckets, and its end.
  void step(int64_t step, Clock::time_point asked, double data_wait, const StepResult& r,
            const dist::BucketTimeline& buckets, Clock::time_point end);
  // A span of the main thread at step `step`: "checkpoint", "snapshot".
  void span(const char* name, Clock::time_point begin, Clock::time_point end, int64_t step);
  // At the boundary after `step` (collective): gathers when a period is complete.
  void at_boundary(int64_t step);
  // Rank 0 writes every rank's events buffered so far (collective).
  void gather();
  int64_t gather_period() const { return period_; }

 private:
  void add(const std::string& name, int tid, Clock::time_point begin, Clock::time_point end, JsonObject args = {});
  static double micros(Clock::time_point t, Clock::time_point from);

  dist::Communicator& comm_;
  std::unique_ptr<TraceFile> file_;
  Clock::time_point zero_;
  double origin_us_ = 0;  // rank 0's wall clock at zero_, in microseconds since 1970: the events' ts
  int64_t period_;
  std::string buffer_;  // ",\n{event}" each
  int64_t dropped_ = 0;  // events dropped by this run (said at the first)
  size_t max_buffer_bytes_;  // kMaxBufferBytes, or this rank's share of kMaxGatherBytes
};

}  // namespace hpc::train
