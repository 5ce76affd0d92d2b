// What a run that ends at once (train/stop/signals.cpp: SIGINT, a second SIGTERM, a signal left
// out of --stop-signals) leaves in rank 0's metrics file and Prometheus file, as the heartbeat's
// ckpt::write_final_heartbeat does in its: the run stopped, with its exit code. Without them the
// metrics file ended in a step or epoch line and the Prometheus file said "training" for ever,
// which a scrape takes for a run still going. Both are prepared while the run goes (the files'
// own writers keep them current) because they are written from where only async-signal-safe
// calls may be made; what they write matches the graceful stop's (its "stopped" event, its
// hpctrain_state and hpctrain_exit_code gauges).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace hpc::train::final_records {

// Counts a write of either file in flight while it lives; closed(): the process ends at once,
// so the write must write nothing (it would follow, or replace, what write_at_once wrote).
// write_at_once waits (a second at most) for the writes in flight before it writes.
class Writing {
 public:
  Writing();
  ~Writing();
  Writing(const Writing&) = delete;
  Writing& operator=(const Writing&) = delete;
  static bool closed();
};

// The metrics file: its descriptor (open for appending, its last line whole), or -1 when it
// is closed or given up; only under a Writing.
void metrics_file(int fd);
// When the run started (its events' elapsed_seconds) and the steps done so far.
void run_started(std::chrono::steady_clock::time_point at);
void steps_done(int64_t step);
// The Prometheus file as a stopped run's: `target` (where each rewrite is renamed to), the text
// of its gauges but the last two, and the last two's text up to their values (hpctrain_exit_code,
// then hpctrain_last_update_timestamp_seconds). Only under a Writing.
void prometheus_file(const std::string& target, const std::string& body, const std::string& exit_code_prefix,
                     const std::string& time_prefix);
// arm: the run trains (rank 0's step metrics are made); disarm: it wrote its own last words (its
// state, its last event), after which a stop at once writes nothing more.
void arm();
void disarm();

// An output file that a writer of lines (MetricsWriter) created for this process (none was there)
// and that holds no whole line yet: a process that ends at once removes it, as the writer's own
// end would, instead of leaving an empty file, or one with half a line, where a script looks for
// the result (evaluate's --metrics-file, stopped while it evaluates). made_empty returns its
// slot (-1: none, for a path too long or more such files at once than slots: left as before);
// release gives the slot back, after which a stop at once leaves the file to its writer: once the
// file's first whole line is in (it stays), or when the writer closes it or gives up on it (and
// removes it itself where it is still empty). Each only under a Writing.
int made_empty(const std::string& path);
void release(int slot);
// Async-signal-safe: closes the writes of both files, waits for those in flight (a second at
// most) and removes made_empty's files that are still empty. write_at_once does it first; a
// process that ends at once otherwise (a watchdog's _exit) calls it itself.
void remove_made_empty();

// Async-signal-safe: the metrics file's "stopped" event (checkpointed false, the signal's name
// and the exit code), and the Prometheus file with state "stopped" and that exit code, where
// armed; in any process, remove_made_empty first.
void write_at_once(const char* signal_name, int exit_code);

}  // namespace hpc::train::final_records
