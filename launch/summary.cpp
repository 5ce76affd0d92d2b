// The end of hpcrun's run: the summary on the terminal and in hpcrun.log, and summary.json.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "supervisor.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

// Keys in the order they are written: the attempt's number first, as a reader looks for it.
using Json = nlohmann::ordered_json;

std::string fixed(double v, int digits = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

// Seconds to the millisecond: times taken from a clock, not measurements to 17 digits.
double ms(double seconds) { return std::round(seconds * 1000) / 1000; }

// How long a failure cost: from hpcrun learning of it to the next attempt's first step, and the
// steps the next attempt did again (from the last checkpoint). Unknown (-1) where the heartbeat
// did not show them.
struct Recovery {
  double seconds = -1;
  int64_t steps_redone = -1;
  double seconds_lost = -1;  // the redone steps at the failed attempt's pace
};

Recovery recovery(const AttemptRecord& failed, const AttemptRecord& next) {
  Recovery r;
  if (next.first_step_at < 0) return r;
  r.seconds = next.first_step_at - failed.failed_at;
  // Where the next attempt resumed, as its heartbeat says; else its first step shown.
  const int64_t resumed = next.resumed_from >= 0 ? next.resumed_from : next.first_step - 1;
  if (failed.last_step >= 0 && next.first_step >= 0) r.steps_redone = std::max<int64_t>(0, failed.last_step - resumed);
  if (r.steps_redone >= 0 && failed.last_step > failed.first_step)
    r.seconds_lost = static_cast<double>(r.steps_redone) * (failed.last_step_at - failed.first_step_at) /
                     static_cast<double>(failed.last_step - failed.first_step);
  return r;
}

const char* result_name(const AttemptRecord& a) {
  switch (a.verdict) {
    case Verdict::Success: return "success";
    case Verdict::Failure: return "failure";
    case Verdict::UsageError: return "usage_error";
    case Verdict::Stopped:
    case Verdict::StoppedOutside: return a.membership ? "host_change" : "stopped";
  }
  return "?";
}

// One attempt; `next` is the attempt after it, if any.
Json attempt_json(const AttemptRecord& a, const AttemptRecord* next) {
  Json j = {{"attempt", a.number},       {"np", a.np},
            {"hosts", show_hosts(a.hosts)}, {"start", ms(a.start)},
            {"end", ms(a.end)},           {"result", result_name(a)},
            {"outcome", a.outcome},       {"failed_hosts", a.failed_hosts},
            {"first_step", a.first_step}, {"last_step", a.last_step}};
  if (a.first_step_at >= 0) j["first_step_at"] = ms(a.first_step_at);
  if (!a.resumed_source.empty()) {
    j["resumed_from"] = a.resumed_source;
    j["resumed_from_step"] = a.resumed_from;
  }
  if (a.verdict != Verdict::Failure) return j;
  j["failed_at"] = ms(a.failed_at);
  if (!next) return j;
  const Recovery r = recovery(a, *next);
  if (r.seconds >= 0) j["recovery_seconds"] = ms(r.seconds);
  if (r.seconds >= 0 && r.steps_redone >= 0) j["steps_redone"] = r.steps_redone;
  if (r.seconds >= 0 && r.seconds_lost >= 0) j["seconds_lost"] = ms(r.seconds_lost);
  return j;
}

// Written as the checkpoints are (ckpt::write_file_atomically): whole under a temporary name of
// this process's, then renamed, so that a reader never sees half a file and two hpcruns ending at
// once on one log directory do not rename each other's; the temporary file made anew (0644 at
// most, as the logs), never written through a link planted under its name (its pid is in ps).
bool write_atomically(const std::string& path, const std::string& text) {
  try {
    ckpt::write_file_atomically(path, std::vector<ckpt::ByteSpan>{{text.data(), text.size()}});
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

int Supervisor::finish(int code, const std::string& last_line) {
  mark_membership_change(o_.checkpoint_dir, false);
  open_logs();
  // A checkpoint directory that cannot be read now (shared storage failing with the job, an NFS
  // handle gone stale) must not cost the summary or the exit code a batch script acts on: the
  // snapshots, which may be the only copy of the last steps, are then kept.
  try {
    const SnapshotsHeld held = snapshots_held(code);
    free_snapshots(code, persist_snapshots(code, held), held);
  } catch (const std::exception& e) {
    say(std::string("warning: keeping the run's snapshots in host memory: cannot tell what they hold (") + e.what() +
        ")");
    snapshots_fate_ = "kept";
  }
  print_summary();
  write_summary_json(code);
  if (!last_line.empty()) say(last_line);
  return code;
}

void Supervisor::print_summary() {
  if (attempts_.empty()) return;
  int failed = 0, changes = 0;
  for (const AttemptRecord& a : attempts_) failed += a.verdict == Verdict::Failure, changes += a.membership;
  // summary.json's "failures" counts those that spent a restart: one under a stop signal or a
  // preemption spends none, and the two counts then differ without a word.
  const std::string spent =
      failed != failures_ ? " (" + std::to_string(failures_) + " counted against --max-restarts)" : "";
  say("summary: " + std::to_string(attempts_.size()) + " attempt(s), " + std::to_string(failed) + " failure(s)" +
      spent + ", " + std::to_string(changes) + " host change(s), " + show_duration(now()) + " in all");
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const AttemptRecord& a = attempts_[i];
    std::string line = "  attempt " + std::to_string(a.number) + ": " + std::to_string(a.np) + " rank(s) on " +
                       show_hosts(a.hosts) + ", " + show_duration(a.end - a.start);
    if (a.first_step >= 0)
      line += a.first_step == a.last_step ? ", step " + std::to_string(a.first_step)
                                          : ", steps " + std::to_string(a.first_step) + "-" + std::to_string(a.last_step);
    say(line + ": " + a.outcome);
    if (a.verdict != Verdict::Failure || i + 1 == attempts_.size()) continue;
    const AttemptRecord& next = attempts_[i + 1];
    const Recovery r = recovery(a, next);
    std::string lost = "  failure of attempt " + std::to_string(a.number) + ": ";
    if (r.seconds < 0) {
      lost += "attempt " + std::to_string(next.number) + " finished no step the heartbeat showed";
    } else {
      lost += fixed(r.seconds) + " s from failure to the first step of attempt " + std::to_string(next.number);
      if (r.steps_redone >= 0) lost += ", " + std::to_string(r.steps_redone) + " step(s) redone";
      if (r.seconds_lost >= 0) lost += " (" + fixed(r.seconds_lost) + " s of work)";
      if (next.started_afresh())
        lost += "; started afresh (no saved state to resume from)";
      else if (!next.resumed_source.empty())
        lost += "; resumed from the " + next.resumed_source + " of step " + std::to_string(next.resumed_from);
    }
    say(lost);
  }
}

// Times of attempts are seconds since hpcrun started, at started_unix on the wall clock.
void Supervisor::write_summary_json(int exit_code) {
  Json attempts = Json::array();
  for (size_t i = 0; i < attempts_.size(); ++i)
    attempts.push_back(attempt_json(attempts_[i], i + 1 < attempts_.size() ? &attempts_[i + 1] : nullptr));
  Json summary = {{"exit_code", exit_code}, {"started_unix", ms(clock_.started_unix())}, {"seconds", ms(now())},
                  {"failures", failures_},   {"attempts", attempts}};
  if (persisted_step_ >= 0) summary["persisted_step"] = persisted_step_;
  if (!snapshots_fate_.empty()) summary["snapshots"] = snapshots_fate_;
  // A program's line in an outcome may hold bytes that are not UTF-8: replaced, not refused.
  const std::string text = summary.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  const std::string path = (fs::path(o_.log_dir) / "summary.json").string();
  if (!write_atomically(path, text)) say("warning: cannot write " + path);
}

}  // namespace hpc::launch
