// The end of hpcrun's run: the summary on the terminal and in hpcrun.log, and summary.json.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/duration.hpp"
#include "supervisor.hpp"
#include "train/metrics.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

std::string fixed(double v, int digits = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

}  // namespace

int Supervisor::finish(int code, const std::string& last_line) {
  open_logs();
  print_summary();
  write_summary_json(code);
  if (!last_line.empty()) say(last_line);
  return code;
}

void Supervisor::print_summary() {
  if (attempts_.empty()) return;
  int failed = 0, changes = 0;
  for (const AttemptRecord& a : attempts_) failed += a.verdict == Verdict::Failure, changes += a.membership;
  say("summary: " + std::to_string(attempts_.size()) + " attempt(s), " + std::to_string(failed) + " failure(s), " +
      std::to_string(changes) + " host change(s), " + show_duration(now()) + " in all");
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const AttemptRecord& a = attempts_[i];
    std::string line = "  attempt " + std::to_string(a.number) + ": " + std::to_string(a.np) + " rank(s) on " +
                       show_hosts(a.hosts) + ", " + show_duration(a.end - a.start);
    if (a.first_step >= 0) line += ", steps " + std::to_string(a.first_step) + "-" + std::to_string(a.last_step);
    line += ": " + a.outcome;
    say(line);
    if (a.verdict == Verdict::Failure && i + 1 < attempts_.size()) {
      const AttemptRecord& next = attempts_[i + 1];
      std::string lost = "  failure of attempt " + std::to_string(a.number) + ": ";
      if (next.first_step_at >= 0) {
        lost += fixed(next.first_step_at - a.failed_at) + " s from failure to the first step of attempt " + std::to_string(next.number);
        if (a.last_step >= 0 && next.first_step >= 0)
          lost += ", " + std::to_string(std::max<int64_t>(0, a.last_step - (next.first_step - 1))) + " step(s) redone";
      } else {
        lost += "attempt " + std::to_string(next.number) + " finished no step the heartbeat showed";
      }
      say(lost);
    }
  }
}

void Supervisor::write_summary_json(int exit_code) {
  const std::string path = (fs::path(o_.log_dir) / "summary.json").string(), tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  // Times of attempts are seconds since hpcrun started, at started_unix on the wall clock.
  out << "{\"exit_code\": " << exit_code << ", \"started_unix\": " << fixed(started_unix_, 3)
      << ", \"seconds\": " << fixed(now(), 3) << ", \"failures\": " << failures_
      << ", \"attempts\": [";
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const AttemptRecord& a = attempts_[i];
    const char* verdict = a.verdict == Verdict::Success ? "success" : a.verdict == Verdict::Failure ? "failure"
                          : a.verdict == Verdict::UsageError ? "usage_error" : a.membership ? "host_change" : "stopped";
    out << (i ? ", " : "") << "{\"attempt\": " << a.number << ", \"np\": " << a.np << ", \"hosts\": "
        << train::json_string(show_hosts(a.hosts)) << ", \"start\": " << fixed(a.start, 3) << ", \"end\": " << fixed(a.end, 3)
        << ", \"result\": \"" << verdict << "\", \"outcome\": " << train::json_string(a.outcome) << ", \"failed_hosts\": [";
    for (size_t k = 0; k < a.failed_hosts.size(); ++k) out << (k ? ", " : "") << train::json_string(a.failed_hosts[k]);
    out << "], \"first_step\": " << a.first_step << ", \"last_step\": " << a.last_step;
    if (a.first_step_at >= 0) out << ", \"first_step_at\": " << fixed(a.first_step_at, 3);
    if (a.verdict == Verdict::Failure) {
      out << ", \"failed_at\": " << fixed(a.failed_at, 3);
      if (i + 1 < attempts_.size() && attempts_[i + 1].first_step_at >= 0) {
        const AttemptRecord& next = attempts_[i + 1];
        out << ", \"recovery_seconds\": " << fixed(next.first_step_at - a.failed_at, 3);
        if (a.last_step >= 0 && next.first_step >= 0)
          out << ", \"steps_redone\": " << std::max<int64_t>(0, a.last_step - (next.first_step - 1));
      }
    }
    out << "}";
  }
  out << "]}\n";
  out.close();
  if (!out || ::rename(tmp.c_str(), path.c_str()) != 0) say("warning: cannot write " + path);
}

}  // namespace hpc::launch
