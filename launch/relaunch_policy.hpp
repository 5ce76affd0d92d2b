// What hpcrun does once an attempt has ended: finish (with which exit code and last line), or
// relaunch from the newest saved state after blacklisting the hosts the attempt lost (the job
// shrinks onto the rest until they come back). Pure (no clock, no processes, no I/O), so that its
// whole table is unit-tested (tests/unit/launch_test.cpp); the supervisor gathers the facts,
// carries out the decision, and then waits for hosts (exit_without_hosts when none come).
//
//   verdict         hpcrun signalled   otherwise
//   Success         0                  0
//   UsageError      2                  2                  (retrying cannot help)
//   StoppedOutside  75                 75                 (the job stopped itself after a checkpoint)
//   Stopped         75                 relaunch if hpcrun stopped it to grow or drain, else 1
//   Failure         130                75 if Slurm is preempting the job, else blacklist the lost
//                                      hosts, count a failure, relaunch; 1 past --max-restarts
#pragma once

#include <string>
#include <vector>

#include "analysis.hpp"

namespace hpc::launch {

// What the supervisor knows when an attempt has ended.
struct AttemptFacts {
  Verdict verdict = Verdict::Failure;
  bool membership = false;   // hpcrun stopped it to grow or drain the job
  bool interrupted = false;  // hpcrun was asked to stop (a signal)
  bool killed = false;       // a second signal: hpcrun killed the job without a checkpoint
  std::string outcome;       // the attempt's outcome line
  std::string program_error; // a usage error's own line, if the program printed one
  std::vector<std::string> failed_hosts;
  // When Slurm chose the job for preemption ("" when it did not). Asked of Slurm only where the
  // answer matters: asks_slurm().
  std::string preempted_at;
};

enum class Next { Finish, Relaunch };

struct Decision {
  Next next = Next::Finish;
  int exit_code = 0;       // Finish: hpcrun's exit code
  std::string last_line;   // Finish: the summary's last line ("" for none)
  bool failure = false;    // a failure of the job: one more towards --max-restarts
  // Hosts to blacklist before finishing or relaunching (a failure's lost hosts; the job shrinks
  // onto the others until their cooldown ends).
  std::vector<std::string> blacklist;
  std::string relaunch_line;  // Relaunch: what hpcrun says
};

// Whether the decision needs Slurm's answer (`scontrol show job`): a failure hpcrun did not cause.
bool asks_slurm(Verdict verdict, bool interrupted);

// `failures` is the number of failed attempts before this one; `max_restarts` is --max-restarts.
Decision decide_after_attempt(const AttemptFacts& facts, int failures, int max_restarts);

// No hosts with --min-np slots came within --elastic-timeout, or a signal ended the wait.
int exit_without_hosts(bool interrupted);

}  // namespace hpc::launch
