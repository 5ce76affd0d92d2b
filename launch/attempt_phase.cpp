#include "attempt_phase.hpp"

#include <algorithm>

namespace hpc::launch {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Starting: return "starting";
    case Phase::Running: return "running";
    case Phase::Querying: return "querying";
    case Phase::Stopping: return "stopping";
    case Phase::TearingDown: return "tearing down";
    case Phase::Terminating: return "terminating";
    case Phase::Killed: return "killed";
    case Phase::Draining: return "draining";
  }
  return "?";
}

AttemptPhase::AttemptPhase(const PhaseTimeouts& timeouts, double start)
    : timeouts_(timeouts), start_(start), last_progress_(start) {
  enter(Phase::Starting, watch_deadline(Phase::Starting));
}

void AttemptPhase::enter(Phase p, double deadline) {
  phase_ = p;
  deadline_ = deadline;
}

// Until the first step, --start-timeout from the launch; then --stall-timeout from the latest step.
double AttemptPhase::watch_deadline(Phase p) const {
  if (!timeouts_.heartbeat) return p == Phase::Starting ? start_ + kStartupGrace : kNever;
  if (p == Phase::Starting) return timeouts_.start > 0 ? start_ + timeouts_.start : kNever;
  return timeouts_.stall > 0 ? std::max(start_, last_progress_) + timeouts_.stall : kNever;
}

void AttemptPhase::wait_for_end(Phase p, double deadline) {
  switch (phase_) {
    case Phase::Starting:
    case Phase::Running: return enter(p, deadline);
    case Phase::Querying:
    case Phase::Stopping:
    case Phase::TearingDown:
      if (deadline < deadline_) enter(p, deadline);
      return;
    case Phase::Terminating:
    case Phase::Killed:
    case Phase::Draining: return;  // hpcrun is ending the job already, or it is gone
  }
}

void AttemptPhase::progress(double t) {
  last_progress_ = t;
  if (phase_ == Phase::Starting || phase_ == Phase::Running) enter(Phase::Running, watch_deadline(Phase::Running));
}

void AttemptPhase::writing(double t) {
  if (phase_ == Phase::Running) progress(t);
  if (phase_ == Phase::Stopping) enter(Phase::Stopping, std::max(deadline_, t + timeouts_.stop));
}

void AttemptPhase::stop_requested(double t) {
  if (phase_ == Phase::Stopping) return enter(Phase::Stopping, t + timeouts_.stop);
  wait_for_end(Phase::Stopping, t + timeouts_.stop);
}

void AttemptPhase::failure_seen(double t) {
  if (phase_ != Phase::TearingDown) wait_for_end(Phase::TearingDown, t + timeouts_.teardown);
}

void AttemptPhase::start_held(double t) {
  if (phase_ != Phase::Starting) return;
  start_ = std::max(start_, t);
  enter(Phase::Starting, watch_deadline(Phase::Starting));
}

Action AttemptPhase::kill_requested(double t) {
  if (phase_ == Phase::Terminating || phase_ == Phase::Killed || phase_ == Phase::Draining) return Action::None;
  enter(Phase::Terminating, t + kTerminateGrace);
  return Action::Terminate;
}

void AttemptPhase::exited(double t) {
  if (phase_ != Phase::Draining) enter(Phase::Draining, t + kDrainGrace);
}

Escalation AttemptPhase::escalate(double t) {
  const Phase from = phase_;
  if (!(t > deadline_)) return {from, Action::None};
  switch (from) {
    case Phase::Starting:
      if (!timeouts_.heartbeat) {  // no heartbeat to wait for: running once past the start-up
        enter(Phase::Running, kNever);
        return {from, Action::None};
      }
      [[fallthrough]];
    case Phase::Running:  // stalled
      stalled_ = true;
      stalled_starting_ = from == Phase::Starting;
      enter(Phase::Querying, t + std::min(kQueryWait, timeouts_.teardown));
      return {from, Action::QueryLiveness};
    case Phase::Querying: enter(Phase::Terminating, t + timeouts_.teardown); return {from, Action::Terminate};
    case Phase::Stopping: enter(Phase::Terminating, t + kTerminateGrace); return {from, Action::Terminate};
    case Phase::TearingDown:
    case Phase::Terminating: enter(Phase::Killed, kNever); return {from, Action::Kill};
    case Phase::Killed: return {from, Action::None};
    case Phase::Draining: deadline_ = kNever; return {from, Action::CloseOutput};
  }
  return {from, Action::None};
}

}  // namespace hpc::launch
