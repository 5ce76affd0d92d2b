#include "train/observe/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"

namespace hpc::train {
namespace {

constexpr const char* kOption = "--timeline-file";
constexpr off_t kTail = 1 << 16;  // far longer than any event hpctrain writes

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Whether text is exactly one JSON object (braces balanced outside strings, ending at the last
// '}'): the test of a last event that a killed write may have cut.
bool one_whole_object(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '}') {
      depth += c == '{' ? 1 : -1;
      if (depth == 0) return i + 1 == text.size();
    }
  }
  return false;
}

std::string read_at(int fd, off_t at, off_t n) {
  std::string s(static_cast<size_t>(n), '\0');
  const ssize_t got = ::pread(fd, s.data(), s.size(), at);
  s.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return s;
}

}  // namespace

bool is_chrome_trace(const std::string& path) {
  const std::string jsonl = ".jsonl";
  return path.size() < jsonl.size() || path.compare(path.size() - jsonl.size(), jsonl.size(), jsonl) != 0;
}

// ---- the file ----------------------------------------------------------------------------------

TraceFile::TraceFile(const std::string& path) : path_(path) {
  OutputFile out = open_output(path, kOption, O_RDWR);
  fd_ = out.fd;
  file_ = std::move(out.file);  // what is removed
  created_ = out.created;
  // /dev/stdout may be a regular file (a job's redirected output) that the log shares: written
  // as a stream too, appended to, never read nor rewritten.
  stream_ = !S_ISREG(out.st.st_mode) || path.rfind("/dev/", 0) == 0 || path.rfind("/proc/", 0) == 0;
  if (stream_) return;
  if (!created_) {  // reopened to read its end, and to write anywhere in it (no O_APPEND)
    ::close(fd_);
    fd_ = ::open(file_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) usage_error("cannot open ", kOption, " ", path, ": ", std::strerror(errno));
  }
  if (!lock_against_another_run()) return;
  if (out.st.st_size > 0) find_end(out.st.st_size);
  // A new file holds an empty array from the start: a run that a signal or a crash ends before its
  // first events (written every 100 steps) left 0 bytes, which no trace viewer or JSON reader
  // loads. (Removed again at a normal end if nothing was written to it.) So does an empty file
  // given to it (mktemp's, touch's), which such a run left empty too.
  if ((created_ || out.st.st_size == 0) && ::pwrite(fd_, "[\n]\n", 4, 0) == 4) {
    end_ = 1;
    given_empty_ = !created_;
  }
}

// One run writes a trace at a time, for the file's life in this process (a write lock of the open
// file description, which the kernel drops when the process ends, however): two runs given one
// --timeline-file (a sweep's tasks, a second job started with the first's options) each wrote
// their events from the end they had found, over each other's, and the file was no JSON array any
// more; both exited 0. A run that finds it locked writes no timeline, with a warning, and goes on:
// the holder may be the run of a host that was lost, whose lock an NFS server (EFS) keeps until
// its lease ends (about 90 s), past the checkpoint directory's takeover (30 s), and a relaunch
// refused there would end the job. A file system without locks (ENOLCK) is written as before.
bool TraceFile::lock_against_another_run() {
  if (lock_whole_file(fd_) != FileLock::Held) return true;
  ::close(std::exchange(fd_, -1));
  closed_ = true;
  log::warn(kOption, " ", path_, " is being written by another process (another run given the same file, or a lost "
            "host's run whose lock its file server still keeps): this run writes no timeline and goes on; give each "
            "run a timeline file of its own");
  return false;
}

// The array's first '[' and its last whole event: the next events go after it (over the "]").
void TraceFile::find_end(off_t size) {
  const std::string head = read_at(fd_, 0, std::min(size, kTail));
  const size_t first = head.find_first_not_of(" \n\r\t");
  if (first == std::string::npos || head[first] != '[') {
    ::close(std::exchange(fd_, -1));
    usage_error(kOption, " ", path_, " exists and is not a Chrome trace (a JSON array of events): not appending to "
                "it (another file named by mistake? a name ending in .jsonl is written as JSON Lines)");
  }
  const off_t from = std::max<off_t>(0, size - kTail);
  std::string tail = read_at(fd_, from, size - from);
  while (!tail.empty() && is_space(tail.back())) tail.pop_back();
  if (!tail.empty() && tail.back() == ']') tail.pop_back();  // a clean end's: the new events replace it
  while (!tail.empty() && is_space(tail.back())) tail.pop_back();
  if (from == 0 && tail.size() == first + 1) {  // "[" alone: an empty array
    end_ = static_cast<off_t>(tail.size());
    return;
  }
  const size_t last = tail.rfind("\n{");  // every event starts a line
  HPC_REQUIRE(last != std::string::npos, kOption, " ", path_, " exists and is not a Chrome trace written by "
              "hpctrain (no event found at its end): not appending to it");
  if (!one_whole_object(tail.substr(last + 1))) {
    log::warn(kOption, " ", path_, " ends in a cut event (a run killed while writing it?): that event is dropped "
              "and this run's events follow the one before it");
    tail.resize(last);
    while (!tail.empty() && (is_space(tail.back()) || tail.back() == ',')) tail.pop_back();
  }
  end_ = from + static_cast<off_t>(tail.size());
  has_events_ = !tail.empty() && tail.back() == '}';
}

TraceFile::~TraceFile() {
  if (fd_ < 0) return;
  try {
    close();
  } catch (const std::exception& e) {
    log::warn(e.what());
  }
  if (fd_ < 0) return;  // closed by a failed write
  // An empty file given to a run that wrote nothing to it (refused, or failed before its first
  // gather) is left empty again (failing that, an empty array: loadable still).
  [[maybe_unused]] const int emptied = given_empty_ && !written_ ? ::ftruncate(fd_, 0) : 0;
  ::close(fd_);
  if (created_ && !written_) ::unlink(file_.c_str());
}

bool TraceFile::write_at(const std::string& text, off_t at, int& error) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = stream_ ? ::write(fd_, text.data() + done, text.size() - done)
                              : ::pwrite(fd_, text.data() + done, text.size() - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      if (stream_ && done > 0) written_ = true;  // part of an event went out
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// A failed write (a full file system), said once: the file is written no more, and the run goes
// on. A regular file gets back the end it had before: its last whole event, then "]" (a new one
// that was never written to, nothing, and is removed), so that it stays a loadable JSON array.
void TraceFile::give_up(int error) {
  closed_ = true;
  bool kept_whole = stream_;  // a stream's part of an event cannot be taken back: a trace without its "]"
  if (!stream_) {
    if (end_ == 0)  // nothing of the array was there: back to empty
      kept_whole = ::ftruncate(fd_, 0) == 0;
    else  // shortened first (which frees the room), then the "]" over what the write left
      kept_whole = ::ftruncate(fd_, end_ + 3) == 0 && ::pwrite(fd_, "\n]\n", 3, end_) == 3;
    if (!kept_whole) written_ = true;  // what is left stays, to be seen
  }
  ::close(std::exchange(fd_, -1));
  const bool removed = created_ && !written_ && ::unlink(file_.c_str()) == 0;
  log::warn("cannot write ", kOption, " ", path_, ": ", std::strerror(error), " (said once; training goes on, and ",
            removed ? "the file, empty, is removed" : "no more events are written to it",
            stream_ || !kept_whole || removed ? "" : ": it is left as it was before that write",
            kept_whole ? "" : "; its end may be cut (a run that appends to it drops a cut last event)", ")");
}

void TraceFile::append(const std::string& events) {
  if (events.empty() || closed_) return;
  std::string text = (stream_ ? !written_ : end_ == 0) ? "[" : "";
  text.append(events, has_events_ ? 0 : 1);  // the array's first event follows no comma
  int error = 0;
  if (stream_) {
    if (!write_at(text, 0, error)) return give_up(error);
    written_ = has_events_ = true;
    return;
  }
  // Regular file: the events over the old "]", then a new one, then nothing after it.
  const auto events_end = end_ + static_cast<off_t>(text.size());
  text += "\n]\n";
  if (!write_at(text, end_, error)) return give_up(error);
  written_ = has_events_ = true;
  end_ = events_end;
  // Only ever shorter (a file that held more after its last event); failing, so would the tries
  if (::ftruncate(fd_, end_ + 3) != 0) give_up(errno);
}

void TraceFile::close() {
  if (std::exchange(closed_, true) || !stream_ || !written_) return;
  int error = 0;
  if (!write_at("\n]\n", 0, error)) give_up(error);
}

// ---- the events --------------------------------------------------------------------------------

Trace::Trace(dist::Communicator& comm, std::unique_ptr<TraceFile> file, const std::string& host, size_t buckets)
    : comm_(comm), file_(std::move(file)),
      max_buffer_bytes_(std::min(kMaxBufferBytes, kMaxGatherBytes / static_cast<size_t>(std::max(comm.size(), 1)))) {
  // Steps' events: step, data wait, forward, backward, optimizer, two for the statistics' average
  // and two per bucket, at most: the same bound on every rank, so every rank reaches the same period.
  // Rank 0 takes in every rank's at a gather: at most about kGatherBudget in all (so that MPI's int
  // counts carry them, and rank 0's memory holds them, on thousands of ranks too).
  const int64_t per_step = 7 + 2 * static_cast<int64_t>(buckets);
  const int64_t per_rank = std::min<int64_t>(kEventBudget, kGatherBudget / std::max(comm_.size(), 1));
  period_ = std::clamp<int64_t>(per_rank / per_step, 1, 100);
  if (const char* every = std::getenv("HPCTRAIN_TEST_TRACE_GATHER_STEPS")) period_ = std::max(1LL, std::atoll(every));
  // The events' clock: rank 0's wall clock at a barrier, in microseconds since 1970 (as PyTorch's
  // profiler writes them), then each rank's steady clock from that barrier. The ranks line up as
  // the barrier does, and a resumed run's events follow the stopped run's in the file it appends
  // to (each counted from 0, they lay over the earlier run's: a viewer drew the two runs' steps as
  // one tangle, on the same rows).
  comm_.barrier();
  zero_ = Clock::now();
  int64_t origin = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  comm_.broadcast(&origin, sizeof origin, 0);
  origin_us_ = static_cast<double>(origin);
  const int rank = comm_.rank();
  const auto meta = [&](const char* name, int tid, JsonObject args) {
    JsonObject e{{"name", name}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", std::move(args)}};
    buffer_ += ",\n" + json_text(e);
  };
  meta("process_name", 0, {{"name", "rank " + std::to_string(rank) + " (" + host + ")"}});
  meta("process_sort_index", 0, {{"sort_index", rank}});
  meta("thread_name", 0, {{"name", "step"}});
  meta("thread_name", 1, {{"name", "gradient all-reduce"}});
}

// Microseconds from `from` to t, to the nanosecond.
double Trace::micros(Clock::time_point t, Clock::time_point from) {
  return std::round(std::chrono::duration<double, std::micro>(t - from).count() * 1000) / 1000;
}

void Trace::add(const std::string& name, int tid, Clock::time_point begin, Clock::time_point end, JsonObject args) {
  if (buffer_.size() > max_buffer_bytes_) {
    if (dropped_++ == 0)
      log::warn(kOption, ": rank ", comm_.rank(), "'s buffer of trace events is full; events are dropped until the "
                "next gather (said once: a step of many tiny buckets may fill it at every one)");
    return;
  }
  JsonObject e{{"name", name}, {"ph", "X"},          {"pid", comm_.rank()},
               {"tid", tid},   {"ts", origin_us_ + micros(begin, zero_)}, {"dur", std::max(0.0, micros(end, begin))}};
  if (!args.empty()) e["args"] = std::move(args);
  buffer_ += ",\n" + json_text(e);
}

void Trace::step(int64_t step, Clock::time_point asked, double data_wait, const StepResult& r,
                 const dist::BucketTimeline& t, Clock::time_point end) {
  const JsonObject at{{"step", step}};
  add("step " + std::to_string(step), 0, asked, end, at);
  const auto after = [](Clock::time_point from, double seconds) {
    return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  add("data wait", 0, asked, after(asked, data_wait), at);
  if (const StepPhases& p = r.phases; p.known()) {
    add("forward", 0, p.forward, p.backward, at);
    add("backward", 0, p.backward, p.backward_end, at);
    add("optimizer", 0, p.optimizer, p.end, at);
  }
  const auto since = [&](double seconds) { return after(t.start, seconds); };
  // One reduction of the communication thread: its wait in the queue, then its all-reduce.
  const auto reduction = [&](const std::string& what, const dist::BucketTimeline::Bucket& k, const JsonObject& args) {
    add("queue " + what, 1, since(k.queued), since(k.started), args);
    add("allreduce " + what, 1, since(k.started), since(k.done), args);
  };
  if (t.averaged)  // the batch-norm running statistics' mean over the ranks, ahead of the buckets after it
    reduction("statistics", t.statistics,
              {{"values", t.statistics.end},
               {"bytes", t.statistics.end * static_cast<int64_t>(sizeof(float))},
               {"step", step}});
  for (size_t b = 0; b < t.buckets.size(); ++b) {
    const dist::BucketTimeline::Bucket& k = t.buckets[b];
    reduction("bucket " + std::to_string(b), k,
              {{"bucket", b},
               {"begin", k.begin},
               {"end", k.end},
               {"bytes", (k.end - k.begin) * static_cast<int64_t>(sizeof(float))},
               {"step", step}});
  }
}

void Trace::span(const char* name, Clock::time_point begin, Clock::time_point end, int64_t step) {
  add(name, 0, begin, end, {{"step", step}});
}

void Trace::at_boundary(int64_t step) {
  if (step % period_ == 0) gather();
}

void Trace::gather() {
  const std::vector<std::string> parts = comm_.gather_bytes(buffer_, 0);
  buffer_.clear();
  buffer_.shrink_to_fit();  // the peak is a period's: give it back between gathers
  if (!file_) return;
  std::string all;
  for (const std::string& p : parts) all += p;
  file_->append(all);
}

}  // namespace hpc::train
