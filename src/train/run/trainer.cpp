// The training run (run_training) as named phases, in order: set-up (setup.hpp: options,
// data, model, resume or initialisation, then the plan of steps, the engine and the checkpoint
// store), the step loop (run_epoch, train_step), the step boundary (at_step_boundary, whose
// policies live in boundary.hpp), the end of an epoch (end_epoch), and one of two ends: a stop
// on request (stop) or the finish (finish, report).
//
// Order rules: the engine is built once the initial state is final on every rank (initialised and
// broadcast), and takes the model and optimizer over: from then on the run's state is the
// engine's alone (a resumed run's checkpoint is restored into it; checkpoints and the final
// checksums are its snapshots). The checkpoint store is opened after the engine and before the
// first step, so that a stop during set-up can check the directory. A watchdog covers set-up
// (--start-timeout, from the options read), another the steps from the first on (--step-timeout).
#include "train/run/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "ckpt/store.hpp"
#include "core/cpus.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/revision.hpp"
#include "data/loader.hpp"
#include "data/sampler.hpp"
#include "dist/agree.hpp"
#include "dist/bucketer.hpp"
#include "dist/communicator.hpp"
#include "nn/gemm.hpp"  // nn::cpu_kernels
#include "optim/schedule.hpp"
#include "train/engine/engine.hpp"
#include "train/observe/metrics.hpp"
#include "train/observe/progress.hpp"
#include "train/observe/prometheus.hpp"
#include "train/observe/step_metrics.hpp"
#include "train/observe/stragglers.hpp"
#include "train/observe/trace.hpp"
#include "train/run/boundary.hpp"
#include "train/run/setup.hpp"
#include "train/state/snapshots.hpp"
#include "train/stop/signals.hpp"
#include "train/stop/final_records.hpp"
#include "train/stop/watchdog.hpp"

namespace hpc::train {
namespace {

// Whether two folders a manifest recorded are one: the same text, or the same folder once links and
// a trailing "/" are resolved (a manifest written before it recorded the folder as typed).
bool same_folder(const std::string& a, const std::string& b) {
  if (a == b) return true;
  namespace fs = std::filesystem;
  std::error_code ec, ec2;
  const fs::path x = fs::weakly_canonical(a, ec), y = fs::weakly_canonical(b, ec2);
  return !ec && !ec2 && x == y;
}

data::AugmentSpec augment_spec(const TrainOptions& o) {
  const bool cifar = o.dataset == data::DatasetKind::Cifar10 || o.dataset == data::DatasetKind::Cifar100;
  const bool shards = o.dataset == data::DatasetKind::Shards;
  const bool on = o.augment == Augment::On || (o.augment == Augment::Auto && (cifar || shards));
  if (!on) return {};
  if (shards) return {0, true, true};  // photographs: random resized crop and flip
  return {cifar ? 4 : 2, cifar};       // digits and clothes are not mirrored
}

optim::ScheduleSpec schedule_spec(const TrainOptions& o, double samples_per_epoch, double total_samples) {
  optim::ScheduleSpec s;
  s.kind = o.lr_schedule;
  s.lr = o.lr;
  s.total_samples = total_samples;
  s.warmup_samples = o.warmup_epochs * samples_per_epoch;
  for (double e : o.lr_step_epochs) s.step_samples.push_back(e * samples_per_epoch);
  s.gamma = o.lr_gamma;
  s.min_lr = o.min_lr;
  s.pct_start = o.onecycle_pct_start;
  s.div_factor = o.onecycle_div_factor;
  s.final_div_factor = o.onecycle_final_div_factor;
  s.cycle_momentum = o.cycle_momentum;
  s.base_momentum = o.onecycle_base_momentum;
  s.max_momentum = o.onecycle_max_momentum;
  return s;
}

// One line per bucket: when it was queued, started and done, and when backward ended and the
// optimizer could go on (seconds since the step began, before its forward pass); where the step
// averaged the batch-norm statistics, each line also has that call's values and times
// (statistics_values, _queued, _started, _done: one call a step, ahead of the buckets).
void write_timeline(MetricsWriter& out, int64_t step, const dist::BucketTimeline& t) {
  for (size_t b = 0; b < t.buckets.size(); ++b) {
    JsonObject line = {{"step", step},
                       {"bucket", static_cast<int64_t>(b)},
                       {"begin", t.buckets[b].begin},
                       {"end", t.buckets[b].end},
                       {"queued", t.buckets[b].queued},
                       {"started", t.buckets[b].started},
                       {"done", t.buckets[b].done},
                       {"backward_done", t.backward_done},
                       {"finished", t.finished}};
    if (t.averaged) {
      line["statistics_values"] = t.statistics.end;
      line["statistics_queued"] = t.statistics.queued;
      line["statistics_started"] = t.statistics.started;
      line["statistics_done"] = t.statistics.done;
    }
    out.write(line);
  }
}

// How the run is laid out over its steps, fixed once set-up knows the data and global batch.
struct Plan {
  std::unique_ptr<data::ShardedSampler> sampler;
  int64_t global_batch = 0, steps_per_epoch = 0, total_steps = 0;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::unique_ptr<data::BatchDecoder> decoder;  // --jpeg-decode gpu; outlives the loader
  std::unique_ptr<data::Loader> loader;
};

// The run's totals so far.
struct Tally {
  int64_t step = 0;           // global steps done
  double samples_seen = 0;    // over the whole run, resumed ones included: what the schedule follows
  double run_samples = 0, train_seconds = 0, comm_wait_seconds = 0;  // this process's part
  RunPosition here;           // after the last step
};

// When the step loop asked the loader for a step's batch, and how long it waited for it.
struct StepStart {
  Clock::time_point asked;
  double data_wait = 0;
};

// One epoch's sums on this rank.
struct EpochTally {
  Clock::time_point t0 = Clock::now();
  double sums[3] = {0, 0, 0};  // loss * samples, correct, samples; of the steps before a resume too
  int64_t global_samples = 0;  // over all ranks, of this process's steps (its images per second)
  double carried_seconds = 0;  // of an epoch ended on resume: its steps' time in the run that saved it
  bool ended = false;          // end_epoch has taken it (its sums are then all ranks')
};

class TrainingRun {
 public:
  TrainingRun(const TrainOptions& o, dist::ProcessContext& ctx)
      : o_(o), ctx_(ctx), comm_(ctx.world()), world_(ctx.world_size()), lead_(ctx.rank() == 0), hooks_(ctx.rank()) {}
  TrainResult run();

 private:
  TrainResult run_steps();
  void mark_failed(int exit_code);
  // The heartbeat with the slowest rank's lines: at most once a second, or `now` (a checkpoint's).
  void beat(int64_t step, int64_t epochs_done, bool now = false) {
    heartbeat_->beat(step, epochs_done, [this] { return stragglers_->heartbeat_lines(); }, now);
  }
  void release_directory();
  void on_write_wait(const WriteWait& w);
  std::optional<int> set_up();
  void say_stopped_in_setup(int exit_code, bool checkpointed);
  void write_stopped_event(int64_t step, int signal, bool checkpointed, int exit_code);
  void plan();
  void write_config_event();  // the metrics file's first line of the run (collective)
  void say_how_it_starts();   // --init-from's weights, evaluated; --extend-epochs' new schedule
  // The steps of a run of `epochs` epochs (--max-steps may cut them), and their learning rates.
  int64_t planned_steps(int64_t epochs) const {
    return o_.max_steps > 0 ? std::min(o_.max_steps, epochs * plan_.steps_per_epoch) : epochs * plan_.steps_per_epoch;
  }
  std::unique_ptr<optim::LrSchedule> schedule_for(int64_t epochs) const;
  void start_engine();
  void start_state_keeping();
  bool stop_for_membership(const RunPosition& at);
  bool membership_marked(bool warn_if_stale);
  bool run_epoch(int64_t epoch);
  double train_step(const data::Batch& batch, int64_t epoch, EpochTally& e, const StepStart& start);
  void record_step(const StepResult& r, double lr, int64_t global_len, int64_t epoch, const StepStart& start);
  void show_progress(const data::Batch& batch, int64_t epoch, const EpochTally& e);
  bool at_step_boundary(int64_t epoch, double loss);
  void seed_epoch(EpochTally& e) const;
  void add_saved_sums(const std::vector<double>& saved, EpochTally& e) const;
  bool end_recorded_epoch();
  RunPosition saved_position(RunPosition at);  // with the epoch's sums (collective inside an epoch)
  // checkpoints_->save, traced; `last`: the process's last (a stop's, the run's end), Checkpointer::save
  void checkpoint(const RunPosition& at, bool last = false);
  void snapshot(const RunPosition& at);
  // save: --checkpoint-each-epoch's checkpoint too (not in a stop that keeps the state in memory only).
  bool end_epoch(int64_t epoch, EpochTally& e, bool save = true);
  EvalResult evaluate_now();
  TrainResult stop();
  TrainResult finish();
  RunPosition final_position() const { return {tally_.step, o_.epochs, 0, plan_.global_batch, tally_.samples_seen}; }
  TrainResult report();
  void write_done_line(const TrainResult& r, const ckpt::Checkpoint& state, double wait_per_step, double run_steps);

  const TrainOptions& o_;
  dist::ProcessContext& ctx_;
  dist::Communicator& comm_;
  const int world_;
  const bool lead_;  // rank 0 speaks: progress, metrics, the done line
  const Clock::time_point t_start_ = Clock::now();
  Prepared p_;
  Plan plan_;
  std::optional<MetricsWriter> metrics_, timeline_;  // rank 0's; the others' write nothing
  std::unique_ptr<TraceFile> trace_file_;             // rank 0's --timeline-file as a Chrome trace
  std::unique_ptr<Trace> trace_;                      // every rank's, with a Chrome trace
  std::string kernels_;            // run_kernels: what the ranks compute with
  ModelIdentity model_id_;         // of the model the engine took over
  double train_flops_per_sample_ = 0;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ckpt::DirectoryLock> lock_;  // rank 0's; released after the checkpoints' last write
  std::unique_ptr<Checkpointer> checkpoints_;
  RunIdentity run_;
  std::unique_ptr<Snapshotter> snapshots_;
  std::optional<Heartbeat> heartbeat_;
  // heartbeat_ holds one: the watchdogs' thread, which marks it failed, reads this first (the
  // set-up watchdog may fire while the main thread makes it).
  std::atomic<bool> heartbeat_ready_{false};
  // tally_.step for mark_failed, which the watchdogs' last words run on a thread of their own while
  // the main thread may still be finishing a step (a slow one, not a stuck one): set with it.
  std::atomic<int64_t> steps_done_{0};
  const TestHooks hooks_;
  std::optional<Progress> progress_;
  // Rank 0's metrics. The main thread makes, publishes and drops them under metrics_lock_; the
  // watchdogs' thread publishes "failed" under it as it ends the run, waiting for the lock only
  // briefly (the main thread may be the one stuck, writing the file).
  std::mutex metrics_lock_;
  std::optional<StepMetrics> step_metrics_;
  template <class F>
  void with_metrics(F f) {
    const std::lock_guard hold(metrics_lock_);
    if (step_metrics_) f(*step_metrics_);
  }
  std::optional<StragglerTracker> stragglers_;
  std::unique_ptr<StepWatchdog> watchdog_;
  std::optional<Clock::time_point> write_waited_;  // since when rank 0 waits for its writer, while it does
  int write_said_ = 0;                             // info lines said of it (one a minute)
  Tally tally_;
  EpochTally epoch_;  // the epoch in progress (run_epoch's), whose sums a save inside it records
  EvalResult eval_;
  // A stop at an epoch's last step: that epoch, whose end stop() makes once the state is saved.
  struct UnendedEpoch {
    int64_t epoch;
    EpochTally tally;
  };
  std::optional<UnendedEpoch> unended_;
  bool evaluated_ = false;
};

// The heartbeat ends with the run's real state: "failed" and the exit code when an error ends
// it (a diverged loss, a checkpoint that cannot be written, the watchdog), not "training".
// From there on no watchdog of the run's runs, and the end (its objects ended, MPI's end) waits
// for the peers and the checkpoint directory: it is given --step-timeout (bound_the_end).
TrainResult TrainingRun::run() {
  const auto end_by = [this](int exit_code) {
    bound_the_end(o_.step_timeout_seconds, ctx_.where(), exit_code, world_ > 1);
  };
  try {
    TrainResult r = run_steps();
    end_by(r.exit_code);
    return r;
  } catch (const Error& e) {
    mark_failed(e.exit_code());
    release_directory();
    end_by(e.exit_code());
    throw;
  } catch (...) {
    mark_failed(kExitFailure);
    release_directory();
    end_by(kExitFailure);
    throw;
  }
}

void TrainingRun::mark_failed(int exit_code) {
  if (!heartbeat_ready_.load(std::memory_order_acquire)) return;
  const int64_t step = steps_done_.load();
  heartbeat_->last(step, plan_.steps_per_epoch ? step / plan_.steps_per_epoch : 0, "failed",
                   detail::concat("exit_code=", exit_code, "\n"));
}

// After an error: the last write finished before the lock goes, and a directory this run made
// and left empty (refused during set-up) removed.
void TrainingRun::release_directory() {
  if (!lock_) return;
  heartbeat_ready_.store(false, std::memory_order_release);
  heartbeat_.reset();  // it points into the store
  // The metrics count the writer's checkpoints: "failed" is published after the write in flight
  // ends (the writer's own error, if that failed too, is not the one this run ends with), and
  // before the writer goes.
  if (ckpt::AsyncWriter* writer = checkpoints_ ? checkpoints_->writer() : nullptr) {
    try {
      writer->wait();
    } catch (const std::exception&) {
    }
  }
  {
    const std::lock_guard hold(metrics_lock_);
    step_metrics_.reset();
  }
  checkpoints_.reset();
  lock_->release(true);
}

TrainResult TrainingRun::run_steps() {
  // A rank that stops or dies in set-up would hold its peers in set-up's agreements for ever.
  const auto expire = [this](const std::string& message) {
    StepWatchdog::print_expired(message);
    // The last words (the heartbeat's "failed", the metrics, the lock's removal) go to storage that
    // may be what does not answer (a hung NFS or EFS mount, a frozen file system): the watchdog
    // that waited on them hung there too, and the job with it, instead of ending for a relaunch.
    // Written by a thread of their own, waited for kLastWordsSeconds at most.
    const auto said = std::make_shared<std::atomic<bool>>(false);
    std::thread([this, said] {
      mark_failed(kExitStepTimeout);  // the main thread is stuck in a collective: it writes no more beats
      // A checkpoint whose write made no progress is given up: its temporary file goes, as a stop at
      // once's does (the checkpoints written before stay), not left for the next run to find.
      ckpt::remove_unfinished_files();
      // Polled with try_lock, not try_lock_for: libstdc++'s timed wait (pthread_mutex_clocklock)
      // is invisible to GCC's ThreadSanitizer, which then reports every access under it as a race.
      std::unique_lock hold(metrics_lock_, std::defer_lock);
      for (int ms = 0; ms < 500 && !hold.try_lock(); ++ms) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (hold && step_metrics_) step_metrics_->ended(RunState::Failed);
      ckpt::remove_lock_at_exit();
      said->store(true);
    }).detach();
    constexpr int kLastWordsSeconds = 5;
    for (int i = 0; i < kLastWordsSeconds * 20 && !said->load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StepWatchdog::exit_expired();
  };
  watchdog_ = std::make_unique<StepWatchdog>(o_.start_timeout_seconds, ctx_.where(), expire, StepWatchdog::Poll{},
                                             Watched::SetUp, world_ > 1);
  if (const std::optional<int> code = set_up()) {
    TrainResult stopped;
    stopped.exit_code = *code;
    return stopped;
  }
  progress_.emplace(ProgressSpec{o_.progress, o_.quiet || !lead_, o_.log_every, o_.progress_interval_seconds},
                    o_.epochs, plan_.steps_per_epoch, plan_.total_steps);
  if (lead_) {
    const std::lock_guard hold(metrics_lock_);
    final_records::run_started(t_start_);  // the elapsed_seconds of a stop at once's event
    step_metrics_.emplace(o_, world_, plan_.total_steps, p_.start.step, *metrics_, checkpoints_->writer());
  }
  tally_.step = p_.start.step;
  steps_done_.store(tally_.step);
  tally_.samples_seen = p_.start.samples_seen;
  tally_.here = p_.start;
  // From here on every wait is for the peers: a step that never ends is a hung job.
  watchdog_.reset();  // set-up's
  watchdog_ = std::make_unique<StepWatchdog>(o_.step_timeout_seconds, ctx_.where(), expire,
                                             p_.gpu ? StepWatchdog::Poll([this] { return engine_->async_error(); })
                                                    : StepWatchdog::Poll{},
                                             Watched::Steps, world_ > 1);
  watchdog_->progress(tally_.step);
  say_how_it_starts();
  if (!end_recorded_epoch()) return stop();
  for (int64_t epoch = p_.start.epoch; epoch < o_.epochs && tally_.step < plan_.total_steps; ++epoch)
    if (!run_epoch(epoch)) return stop();
  return finish();
}

// Set-up, each part ended by a chance to stop (setup.hpp): an exit code when one was taken.
std::optional<int> TrainingRun::set_up() {
  log::set_level(o_.quiet || !lead_ ? std::max(log::Level::Warn, o_.log_level) : o_.log_level);
  log::set_stamps(o_.log_timestamps);
  use_stop_signals(o_.stop_signals);  // a stop signal taken while MPI started is decided now
  require_same_options(ctx_, o_);
  // Rank 0's file, refused before anything is loaded when another program's (a rewrite replaces it).
  dist::collectively(ctx_, [&] {
    if (lead_ && !o_.prometheus_file.empty()) require_ours_or_none(o_.prometheus_file);
  });
  // First of all, before anything in the directory is read or moved: one run writes it at a time.
  bool locked = false;
  // A wait with its own limits: --checkpoint-lock-wait, and past it, for a holder that stopped
  // refreshing its lock, until the lock is stale.
  if (!o_.checkpoint_dir.empty())
    watchdog_->hold_for(o_.checkpoint_lock_wait_seconds + ckpt::DirectoryLock::stale_seconds() + 1);
  lock_ = lock_directory(ctx_, o_, &locked);
  watchdog_->progress(0);
  // Stopped while waiting for another run's lock: its directory is left as it is.
  if (auto code = stopped_in_setup(ctx_, o_, 1, "while starting", !locked)) return code;
  p_ = load_data_and_model(ctx_, o_);
  if (auto code = stopped_in_setup(ctx_, o_, 2, "while loading the dataset", false)) return code;
  run_ = run_identity(ctx_, o_);
  if (lock_) lock_->set_run_id(run_.id);
  resume_or_initialise(ctx_, o_, p_, snapshot_run_dir(o_, run_.id), run_.id);
  const char* loading = p_.resumed ? "while loading the checkpoint to resume from" : "while initialising the model";
  // A state resumed from a host's memory is newer than the directory's: a stop is taken once the
  // engine holds it and can checkpoint it (the end of set-up), not lost with the hosts.
  const bool only_in_memory = p_.source == StateSource::Snapshot;
  if (!only_in_memory)
    if (auto code = stopped_in_setup(ctx_, o_, 3, loading, false)) return code;
  plan();
  start_engine();
  start_state_keeping();
  std::function<void()> save;
  if (only_in_memory)
    save = [this] {
      checkpoint(p_.start, /*last=*/true);
      checkpoints_->wait_for_writes("stopped during set-up");
      snapshots_->remove_all();  // the checkpoint holds their state: the memory goes back, as stop()'s
    };
  const std::optional<int> code = stopped_in_setup(ctx_, o_, 4, "while preparing the training engine", true, save);
  if (code) say_stopped_in_setup(*code, only_in_memory);
  return code;
}

// A stop in set-up's last part, after the config event: the run's files end as a stopped run's
// do (the metrics file's "stopped" event, which a job script whose launcher exits 1 on a signal
// reads for "requeue me"; the heartbeat; the Prometheus state). They said nothing: the metrics
// file ended in its config event, the job script took the stop for a failure.
void TrainingRun::say_stopped_in_setup(int exit_code, bool checkpointed) {
  const StopAsked asked = stop_asked(comm_);
  if (heartbeat_ready_.load(std::memory_order_acquire))
    heartbeat_->last(p_.start.step, p_.start.epoch, "stopped");
  if (!lead_) return;
  {
    const std::lock_guard hold(metrics_lock_);
    StepMetrics published(o_, world_, plan_.total_steps, p_.start.step, *metrics_, checkpoints_->writer());
    published.ended(RunState::Stopped, exit_code);
  }
  write_stopped_event(p_.start.step, asked.signal, checkpointed && !o_.checkpoint_dir.empty(), exit_code);
}

// The last line of a stopped run: a job script that sees another launcher's code (mpirun exits 1
// on any signal it is sent) reads here that every rank stopped with this one.
void TrainingRun::write_stopped_event(int64_t step, int signal, bool checkpointed, int exit_code) {
  metrics_->write({{"event", std::string("stopped")},
                   {"step", step},
                   {"signal", signal_name(signal)},
                   {"checkpointed", checkpointed},
                   {"exit_code", static_cast<int64_t>(exit_code)},
                   {"elapsed_seconds", seconds_since(t_start_)}});
}

// The metrics file's first line of the run: what it runs with (every option, where, on what).
void TrainingRun::write_config_event() {
  if (!lead_) return;
  const std::string hosts = dist::distinct_joined(stragglers_->hosts(), ",");
  JsonObject c{{"event", std::string("config")},
               {"hpctrain_version", std::string(HPCTRAIN_VERSION)},
               {"hpctrain_revision", std::string(build_revision())},
               {"world_size", world_},
               {"hosts", hosts},
               {"host_count", static_cast<int64_t>(std::count(hosts.begin(), hosts.end(), ',') + 1)},
               {"device", std::string(p_.gpu ? "cuda" : "cpu")},
               {"cpu_model", cpus::model_name()},
               {"gpu_model", p_.gpu ? device::gpu_name(ctx_.local_rank()) : std::string()},
               {"kernels", kernels_},
               {"threads", p_.threads},
               {"global_batch_size", plan_.global_batch},
               {"steps_per_epoch", plan_.steps_per_epoch},
               {"total_steps", plan_.total_steps},
               {"resumed_from_step", p_.resumed ? p_.start.step : int64_t{-1}},
               {"resumed_from", std::string(source_name(p_.source))},
               {"run_id", run_.id}};
  for (const auto& [name, value] : all_option_values(o_)) c["option." + name] = value;
  metrics_->write(c);
  // From its config event on, the file ends as a stopped run's also where set-up's last part is cut
  // by a stop at once (SIGINT, a second SIGTERM): it ended in that event, as a run that never
  // began ("stopped" was armed only with the step metrics, after set-up).
  final_records::run_started(t_start_);
  final_records::steps_done(p_.start.step);
  final_records::arm();
}

// Whether the run resumed a checkpoint file of another directory than its --checkpoint-dir: it then
// continues none of the directory's own, whose older ones retention would otherwise delete (not
// only the newer ones, which would outrank its own), and all of them are moved aside. Without
// that, only those newer than the resumed step: the ones before it are its own lineage's.
namespace {
bool resumed_from_elsewhere(const TrainOptions& o) {
  namespace fs = std::filesystem;
  if (o.resume != ResumeFrom::File) return false;
  std::error_code ec;
  const fs::path from = fs::path(o.resume_file).parent_path();
  return !fs::equivalent(from.empty() ? fs::path(".") : from, o.checkpoint_dir, ec);
}
}  // namespace

// Where the state is kept: rank 0's checkpoints on shared storage (the store opened after the
// engine and before the first step, so that a stop during set-up can check the directory), the
// run's identity beside them, and the snapshots in every host's memory.
void TrainingRun::start_state_keeping() {
  std::unique_ptr<ckpt::CheckpointStore> store = open_store(ctx_, o_);
  if (store) store->guard_with(lock_.get());
  if (store) store->supersede_after(p_.resumed && !resumed_from_elsewhere(o_) ? p_.start.step : -1);
  dist::collectively(ctx_, [&] {
    if (lead_) record_run_identity(o_, run_);
  });
  checkpoints_ = std::make_unique<Checkpointer>(ctx_, o_, std::move(store), *engine_, model_id_,
                                               [this](const WriteWait& w) { on_write_wait(w); });
  snapshots_ = std::make_unique<Snapshotter>(ctx_, o_, *engine_, model_id_, snapshot_run_dir(o_, run_.id), run_.id,
                                             run_.previous);
  snapshots_->begins_at(p_.start.step);
  const std::string resumed = detail::concat("resumed_from=", p_.resumed ? p_.start.step : int64_t{-1},
                                             "\nresumed_source=", source_name(p_.source), "\n");
  // Under hpcrun, whose attempt writes it: hpcrun counts the beats of its running attempt only.
  heartbeat_.emplace(checkpoints_->store(),
                     resumed + ckpt::heartbeat_owner_lines(ckpt::hpcrun_token_from_env(), ckpt::hpcrun_attempt_from_env()));
  heartbeat_ready_.store(true, std::memory_order_release);
}

// A slice of the wait for rank 0's checkpoint (Checkpointer::await_writes): a chunk synced is
// progress to the watchdog and to a launcher that reads the heartbeat; the wait's end is progress.
void TrainingRun::on_write_wait(const WriteWait& w) {
  if (w.done) {
    watchdog_->progress(tally_.step);
    write_waited_.reset();
    write_said_ = 0;
    return;
  }
  watchdog_->writing(w.step, w.synced, lead_, w.progressed);
  if (!lead_) return;
  const int64_t at = std::max(tally_.step, p_.start.step);  // (set-up's stop: the step it starts at)
  if (w.progressed && heartbeat_ready_.load(std::memory_order_acquire))
    heartbeat_->writing(at, plan_.steps_per_epoch ? at / plan_.steps_per_epoch : 0, w.step, w.synced, w.total);
  if (!write_waited_) write_waited_ = Clock::now();
  const double waited = seconds_since(*write_waited_);
  if (waited < 60 * (write_said_ + 1)) return;
  ++write_said_;
  log::info("checkpoint of step ", w.step, ": ", w.synced, " of ", w.total, " bytes written and synced after ",
            static_cast<int64_t>(waited), " s; still writing (--step-timeout counts from the write's last progress)");
}

// A run that starts from --init-from's weights is evaluated before its first step (the
// checkpoint's own test loss, where the model and test set are the same); one lengthened by
// --extend-epochs says what its recomputed schedule changes. In the log and the metrics file.
void TrainingRun::say_how_it_starts() {
  if (p_.init_from && !p_.resumed) {
    const Prepared::InitialWeights& w = *p_.init_from;
    eval_ = evaluate_now();
    std::string left;  // comma-separated: the metrics lines are flat
    for (const std::string& name : w.fitted.left) left += (left.empty() ? "" : ",") + name;
    if (lead_)
      log::info("started from the weights of ", w.path, " (step ", w.step, "): ", w.fitted.copied, " of ",
                w.fitted.total, " tensors", left.empty() ? "" : "; from --seed: " + left,
                detail::concat("; before the first step: test loss ", eval_.loss, ", test accuracy ",
                               100 * eval_.accuracy, "%"));
    metrics_->write({{"event", std::string("init_from")},
                     {"checkpoint", w.path},
                     {"checkpoint_step", w.step},
                     {"tensors_copied", w.fitted.copied},
                     {"tensors", w.fitted.total},
                     {"from_seed", left},
                     {"step", tally_.step},
                     {"test_loss", eval_.loss},
                     {"test_accuracy", eval_.accuracy}});
  }
  if (p_.extended_from_epochs > 0) {
    const double before = schedule_for(p_.extended_from_epochs)->lr(tally_.samples_seen);
    const double now = plan_.schedule->lr(tally_.samples_seen);
    if (lead_)
      log::info("--extend-epochs: the run goes on from ", p_.extended_from_epochs, " to ", o_.epochs,
                " epochs; its learning-rate schedule (", name_of(optim::kScheduleNames, o_.lr_schedule),
                ") is recomputed for the new length: at step ", tally_.step, " the learning rate is ", now,
                " (the ", p_.extended_from_epochs, "-epoch schedule had ", before, ")");
    metrics_->write({{"event", std::string("extended")},
                     {"step", tally_.step},
                     {"epochs_before", p_.extended_from_epochs},
                     {"epochs", o_.epochs},
                     {"total_steps", plan_.total_steps},
                     {"lr_schedule", std::string(name_of(optim::kScheduleNames, o_.lr_schedule))},
                     {"lr_before", before},
                     {"lr", now}});
  }
}

// The learning-rate schedule over planned_steps(epochs), as the sampler lays them out.
std::unique_ptr<optim::LrSchedule> TrainingRun::schedule_for(int64_t epochs) const {
  const int64_t spe = plan_.steps_per_epoch, global_batch = plan_.global_batch, steps = planned_steps(epochs);
  const double samples_per_epoch = static_cast<double>(o_.drop_last ? spe * global_batch : p_.ds.train.count);
  optim::ScheduleSpec spec = schedule_spec(o_, samples_per_epoch, static_cast<double>(steps) * samples_per_epoch / spe);
  spec.samples_per_step = samples_per_epoch / spe;  // the global batch (less with a kept short last one)
  return std::make_unique<optim::LrSchedule>(std::move(spec));
}

// The sampler, the schedule over the planned steps, the loader and rank 0's metrics files.
void TrainingRun::plan() {
  const int64_t global_batch = plan_.global_batch = p_.start.global_batch;
  plan_.sampler = std::make_unique<data::ShardedSampler>(p_.ds.train.count, global_batch,
                                                         static_cast<uint64_t>(o_.seed),
                                                         shard_of(ctx_.rank(), world_), world_, o_.drop_last);
  plan_.steps_per_epoch = plan_.sampler->steps_per_epoch();
  if (p_.resumed)
    dist::collectively(ctx_, [&] { require_position_in_run(p_.start, plan_.steps_per_epoch, o_.epochs); });
  plan_.total_steps = planned_steps(o_.epochs);
  plan_.schedule = schedule_for(o_.epochs);
  // The GPU takes the batches as bytes and normalises them itself; or decodes their JPEGs too.
  if (p_.gpu_decode) plan_.decoder = make_gpu_decoder(device::select_gpu(ctx_.local_rank()));
  // The epochs the steps reach (--max-steps may end the run early): the loader goes on into the
  // next epoch while one ends, but not into one that no step will take.
  const int64_t spe = std::max<int64_t>(plan_.steps_per_epoch, 1);
  const int64_t epochs = std::min<int64_t>(std::max<int64_t>((plan_.total_steps + spe - 1) / spe, 1), o_.epochs);
  plan_.loader = std::make_unique<data::Loader>(p_.ds.train, p_.ds.norm, augment_spec(o_), *plan_.sampler,
                                                static_cast<uint64_t>(o_.seed), 3, p_.threads, p_.gpu,
                                                plan_.decoder.get(), epochs);
  // Rank 0's files, opened collectively: one it cannot open ends every rank with its one line.
  // The JSON Lines form (a name ending in .jsonl) is rank 0's buckets; a Chrome trace every rank's.
  const bool chrome = !o_.timeline_file.empty() && is_chrome_trace(o_.timeline_file);
  dist::collectively(ctx_, [&] {
    if (o_.metrics_file.empty() || !lead_) metrics_.emplace();
    else metrics_.emplace(o_.metrics_file);
    if (o_.timeline_file.empty() || !lead_ || chrome) timeline_.emplace();
    else timeline_.emplace(o_.timeline_file, "--timeline-file");
    if (chrome && lead_) trace_file_ = std::make_unique<TraceFile>(o_.timeline_file);
  });
  stragglers_.emplace(ctx_.rank(), host_of_each_rank(ctx_));
  const std::vector<std::string> kernels = dist::allgather_strings(
      comm_, p_.gpu ? gpu_kernels(ctx_.local_rank()) : nn::cpu_kernels());
  kernels_ = run_kernels(kernels);
  if (const auto mixed = mixed_kernels_warning(stragglers_->hosts(), kernels); mixed && lead_) log::warn(*mixed);
  write_config_event();
}

// The engine takes the model and optimizer over, as initialised and broadcast, and restores a
// resumed run's checkpoint (the same bytes on every rank).
void TrainingRun::start_engine() {
  model_id_ = ModelIdentity::of(*p_.model, p_.ds.train.class_names, training_set_digest(p_.ds.train));
  model_id_.kernels = kernels_;
  if (p_.resume && lead_)
    if (const auto other = other_kernels_warning(*p_.resume, kernels_)) log::warn(*other);
  train_flops_per_sample_ = p_.model->train_flops_per_sample();
  const std::string summary = p_.model->summary();
  const EngineSpec spec = engine_spec(o_, p_.threads);
  engine_ = p_.gpu ? make_gpu_engine(std::move(p_.model), std::move(p_.sgd), ctx_, spec)
                   : make_cpu_engine(std::move(p_.model), std::move(p_.sgd), comm_, spec);
  if (p_.resume) dist::collectively(ctx_, [&] { engine_->restore(*p_.resume); });
  p_.resume.reset();
  if (!o_.timeline_file.empty() && is_chrome_trace(o_.timeline_file))  // its clocks' zero: now, on every rank
    trace_ = std::make_unique<Trace>(comm_, std::move(trace_file_), ctx_.host(), engine_->bucket_count());
  const data::Dataset& train = p_.ds.train;
  log::info("hpctrain ", HPCTRAIN_VERSION, ": ", summary);
  const std::string source =
      o_.dataset == data::DatasetKind::Synthetic
          ? detail::concat("synthetic ", train.height, "x", train.width, " images made from a fixed seed")
          : detail::concat(data::dataset_name(o_.dataset), " from ", p_.data_dir);
  log::info("data: ", source, " (", train.count, " train, ", p_.ds.test.count, " test); ", world_,
            " rank(s), global batch ", plan_.global_batch, ", ", plan_.steps_per_epoch, " steps per epoch, ",
            plan_.total_steps, " steps; ", engine_->describe());
  // The loaders of the other datasets refuse a test set that holds the training set's records; a
  // val split packed from train's folder is the user's choice (a smoke test, a benchmark), said.
  if (lead_ && !train.packed_from.empty() && same_folder(train.packed_from, p_.ds.test.packed_from))
    log::warn("the val split in ", p_.data_dir, " was packed from the same image folder as train (",
              train.packed_from, "): the test accuracy is measured on training images");
  if (world_ > 1)
    log::info("gradients all-reduced in ", engine_->bucket_count(), " bucket(s) of up to ", o_.bucket_mb, " MB",
              o_.overlap ? ", overlapping the backward pass" : ", after the backward pass (--no-overlap)");
}

// The epoch's steps (from where a resumed run stands in it) and its end; false: stop.
bool TrainingRun::run_epoch(int64_t epoch) {
  EpochTally& e = epoch_ = EpochTally{};
  if (epoch == p_.start.epoch) seed_epoch(e);
  plan_.loader->start_epoch(epoch, epoch == p_.start.epoch ? p_.start.step_in_epoch : 0);
  while (tally_.step < plan_.total_steps) {
    StepStart start{Clock::now()};
    const data::Batch* batch = plan_.loader->next();
    if (!batch) break;
    start.data_wait = seconds_since(start.asked);
    stragglers_->step_began(start.asked);
    const double loss = train_step(*batch, epoch, e, start);
    if (at_step_boundary(epoch, loss)) {
      // A stop at the epoch's last step: the resumed run starts at the next epoch and never ends
      // this one (its evaluation, line and event); stop() ends it once the state is saved.
      if (tally_.here.epoch > epoch) unended_ = UnendedEpoch{epoch, e};
      return false;
    }
  }
  return end_epoch(epoch, e);
}

// One step on this rank's part of the global batch; its loss.
double TrainingRun::train_step(const data::Batch& batch, int64_t epoch, EpochTally& e, const StepStart& start) {
  const int64_t global_len = plan_.sampler->global_batch_length(batch.step);
  const float share = dist::batch_share(batch.size(), global_len);
  const double seen = tally_.samples_seen;
  const double lr = plan_.schedule->lr(seen);
  const StepResult r = engine_->train_step(batch, share, lr, plan_.schedule->momentum(seen, o_.momentum));
  const Clock::time_point done = Clock::now();
  tally_.comm_wait_seconds += r.comm_wait;
  stragglers_->waited(r.comm_wait);
  if (!o_.timeline_file.empty() && lead_) write_timeline(*timeline_, tally_.step, engine_->timeline());
  e.sums[1] += static_cast<double>(r.correct);
  tally_.samples_seen += static_cast<double>(global_len);
  tally_.run_samples += static_cast<double>(global_len);
  e.global_samples += global_len;
  e.sums[2] += static_cast<double>(batch.size());
  e.sums[0] += r.loss * static_cast<double>(batch.size());
  const int64_t step = ++tally_.step;
  steps_done_.store(step);
  heartbeat_->stepped(step, epoch);  // with record_step's: a stop at once's heartbeat and event agree
  if (trace_) trace_->step(step, start.asked, start.data_wait, r, engine_->timeline(), done);
  watchdog_->progress(step);
  record_step(r, lr, global_len, epoch, start);
  show_progress(batch, epoch, e);
  tally_.here = RunPosition::after_step(step, epoch, batch.step, plan_.steps_per_epoch, plan_.global_batch,
                                        tally_.samples_seen);
  return r.loss;
}

// Rank 0's figures of the step just done (tally_.step), for the step events and Prometheus.
void TrainingRun::record_step(const StepResult& r, double lr, int64_t global_len, int64_t epoch,
                              const StepStart& start) {
  if (!step_metrics_) return;
  const double seconds = seconds_since(start.asked);
  const std::optional<Straggler> slowest = stragglers_->slowest();
  const StepFigures f{tally_.step, epoch + 1, r.loss, lr, static_cast<double>(global_len) / std::max(seconds, 1e-9),
                      start.data_wait, r.comm_wait, seconds, seconds_since(t_start_), global_len, slowest,
                      slowest ? stragglers_->host(slowest->rank) : std::string()};
  with_metrics([&](StepMetrics& m) { m.after_step(f); });
}

void TrainingRun::show_progress(const data::Batch& batch, int64_t epoch, const EpochTally& e) {
  const int64_t step = tally_.step;
  const double el = seconds_since(e.t0);
  const double ips = static_cast<double>(e.global_samples) / std::max(el, 1e-9);
  // Time per step from this process's steps alone: after a resume the steps before it took
  // none of this process's time (divided by the global step, the ETA read 0s long before the end).
  const int64_t steps_here = std::max<int64_t>(step - p_.start.step, 1);
  const double eta = (tally_.train_seconds + el) / static_cast<double>(steps_here) *
                     static_cast<double>(plan_.total_steps - step);
  progress_->step(epoch, batch.step, step - 1, e.sums[0] / e.sums[2], e.sums[1] / e.sums[2], ips, eta);
}

// Between two steps: the tests' signal, the heartbeat, what every rank agrees on (a stop, a
// checkpoint by rank 0's clock, a loss that is not finite), a checkpoint when one is due, the
// tests' kill. Whether to stop.
bool TrainingRun::at_step_boundary(int64_t epoch, double loss) {
  const int64_t step = tally_.step;
  hooks_.signal_after(step, checkpoints_->writer());
  hooks_.slow_down();
  beat(step, epoch);
  const Clock::time_point reaching = Clock::now();
  const StepAgreement agreed = StepAgreement::reach(comm_, checkpoints_->due_by_clock(), snapshots_->due(step), loss,
                                                    lock_ && lock_->lost(), stragglers_->slots());
  stragglers_->agreed(seconds_since(reaching), seconds_since(t_start_));
  if (agreed.lost_directory) lost_directory(o_, lock_ ? lock_->how_lost() : "");
  if (agreed.loss_not_finite)
    diverged(o_, detail::concat("the loss of step ", step, " (epoch ", epoch + 1, ") is not finite"),
             step == 1 && !p_.resumed);
  const bool checkpoint = checkpoints_->due_at_step(step) || agreed.checkpoint_due;
  // A snapshot with every checkpoint too: the hosts' newest state is never older than the
  // directory's.
  if (checkpoint || agreed.snapshot_due) {
    const RunPosition at = saved_position(tally_.here);
    if (checkpoint) this->checkpoint(at);
    snapshot(at);
    // The checkpoint's step in the heartbeat too: a run killed without last words (SIGKILL, a lost
    // host) left its once-a-second beat, and hpcrun's account of an attempt of a second or two
    // said "step 1" and "0 steps redone" of one that had checkpointed step 10 and died at 12.
    if (checkpoint) beat(step, epoch, /*now=*/true);
  }
  if (trace_) trace_->at_boundary(step);  // where the ranks meet anyway (the agreement above)
  if (hooks_.kills_at(step)) snapshots_->wait();
  hooks_.kill_after(step, checkpoints_->writer(), comm_);
  return agreed.stop;
}

// A run resumed inside an epoch starts its tally where the saved one stood: on the same number of
// ranks each rank from its own sums, which then add up to the bits of an uninterrupted run's; on
// another, rank 0 from all of them (end_epoch adds the ranks' sums up: the same figures, but for
// the rounding).
void TrainingRun::seed_epoch(EpochTally& e) const {
  if (p_.start.step_in_epoch == 0) return;  // the saved sums there are of an unended epoch's
  add_saved_sums(p_.start.epoch_sums, e);  // none from an older checkpoint: this run's steps only
}

void TrainingRun::add_saved_sums(const std::vector<double>& saved, EpochTally& e) const {
  const size_t ranks = saved.size() / 3;
  for (size_t r = 0; r < ranks; ++r)
    if (ranks == static_cast<size_t>(world_) ? r == static_cast<size_t>(ctx_.rank()) : lead_)
      for (size_t k = 0; k < 3; ++k) e.sums[k] += saved[3 * r + k];
}

// `at` with every rank's sums of the epoch so far, where it lies inside one, or of the epoch its
// last step closed while that one is not ended yet (collective there: each rank's slot is non-zero
// on that rank only, so the all-reduce adds zeros to it, which is exact).
RunPosition TrainingRun::saved_position(RunPosition at) {
  // global_samples: the same on every rank, as the choice to all-reduce must be.
  const bool unended = at.step_in_epoch == 0 && epoch_.global_samples > 0 && !epoch_.ended;
  if (at.step_in_epoch == 0 && !unended) {
    at.epoch_sums.clear();  // a resumed run's start, whose recorded epoch end_recorded_epoch has taken
    return at;
  }
  at.epoch_sums.assign(3 * static_cast<size_t>(world_), 0.0);
  std::copy(epoch_.sums, epoch_.sums + 3, at.epoch_sums.begin() + 3 * ctx_.rank());
  if (world_ > 1) comm_.allreduce_sum(at.epoch_sums.data(), static_cast<int64_t>(at.epoch_sums.size()));
  if (unended) {
    at.epoch_images = epoch_.global_samples;
    at.epoch_seconds = seconds_since(epoch_.t0) + epoch_.carried_seconds;
  }
  return at;
}

// A run resumed where its checkpoint or snapshot was saved after an epoch's last step but before
// that epoch was ended (a kill during its evaluation; a stop at that step, which ends the epoch
// after saving): the epoch is ended now, from its recorded sums, unless rank 0's metrics file
// already holds its event (the saving run ended it before it went). Without a metrics file nothing
// tells, and the line is shown again. False: a stop asked for during the evaluation.
bool TrainingRun::end_recorded_epoch() {
  const RunPosition& at = p_.start;
  if (!p_.resumed || !at.epoch_unended() || at.epoch == 0) return true;
  // Since the save: at most the lines of one run's start, its stop, and the steps it redid.
  constexpr int64_t kTailBytes = int64_t{16} << 20;
  uint64_t held = lead_ && metrics_->holds({{"event", "epoch"}, {"epoch", at.epoch}, {"step", at.step}}, kTailBytes);
  if (world_ > 1) comm_.broadcast(&held, sizeof held, 0);
  if (held) return true;
  if (lead_) log::info("the checkpoint was saved before epoch ", at.epoch, " was ended: evaluating it now");
  EpochTally e;
  add_saved_sums(at.epoch_sums, e);
  e.global_samples = at.epoch_images;
  e.carried_seconds = at.epoch_seconds;
  return end_epoch(at.epoch - 1, e);
}

void TrainingRun::checkpoint(const RunPosition& at, bool last) {
  const int64_t before = checkpoints_->written();
  const Clock::time_point t0 = Clock::now();
  checkpoints_->save(at, last);
  if (trace_ && checkpoints_->written() > before) trace_->span("checkpoint", t0, Clock::now(), at.step);
}

void TrainingRun::snapshot(const RunPosition& at) {
  const int64_t before = snapshots_->taken();
  const Clock::time_point t0 = Clock::now();
  snapshots_->take(at);
  if (trace_ && snapshots_->taken() > before) trace_->span("snapshot", t0, Clock::now(), at.step);
}

EvalResult TrainingRun::evaluate_now() {
  engine_->begin_evaluation();
  return evaluate([&](const data::Batch& b, double* s) { engine_->eval_batch(b, s); }, p_.ds.test, p_.ds.norm,
                  o_.eval_batch_size, &comm_, [&] { watchdog_->progress(tally_.step); }, p_.threads, p_.gpu);
}

// The epoch's figures over all ranks, its evaluation, line and checkpoint; false: a stop asked
// for during the evaluation ends the run here, not after one more step.
bool TrainingRun::end_epoch(int64_t epoch, EpochTally& e, bool save) {
  const double epoch_seconds = seconds_since(e.t0);  // this process's part
  tally_.train_seconds += epoch_seconds;
  if (world_ > 1) comm_.allreduce_sum(e.sums, 3);
  e.ended = true;
  eval_ = evaluate_now();
  evaluated_ = true;
  const double seen = std::max(e.sums[2], 1.0);
  const double train_loss = e.sums[0] / seen;
  const double ips = static_cast<double>(e.global_samples) / std::max(epoch_seconds + e.carried_seconds, 1e-9);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "epoch %lld/%lld: train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.0f img/s  %s",
                static_cast<long long>(epoch + 1), static_cast<long long>(o_.epochs), train_loss, eval_.loss,
                100 * eval_.accuracy, ips, format_duration(epoch_seconds + e.carried_seconds).c_str());
  progress_->line(buf);
  with_metrics([&](StepMetrics& m) { m.after_epoch(eval_.accuracy); });
  // The event before the epoch's checkpoint, which records the epoch as ended: a kill between the
  // two leaves a record that ends the epoch again on resume, and finds this event there.
  metrics_->write({{"event", std::string("epoch")},
                   {"epoch", epoch + 1},
                   {"step", tally_.step},
                   {"train_loss", train_loss},
                   {"train_accuracy", e.sums[1] / seen},
                   {"test_loss", eval_.loss},
                   {"test_accuracy", eval_.accuracy},
                   {"images_per_second", ips},
                   {"train_seconds", tally_.train_seconds},
                   {"elapsed_seconds", seconds_since(t_start_)}});
  if (o_.checkpoint_each_epoch && save) {
    const RunPosition at{tally_.step, epoch + 1, 0, plan_.global_batch, tally_.samples_seen};
    checkpoint(at);
    snapshot(at);
    // In the heartbeat too, as at_step_boundary's checkpoints: the epoch's last boundary beat is
    // often passed over (a second not yet gone), and a run killed in the next epoch's first steps
    // left a heartbeat below the checkpoint it had written.
    beat(tally_.step, epoch + 1, /*now=*/true);
  }
  if (trace_) trace_->gather();
  return !(tally_.step < plan_.total_steps && stop_asked(comm_).signal);
}

// Asked to stop: checkpoint where the run stands and leave with "requeue me".
TrainResult TrainingRun::stop() {
  const StopAsked asked = stop_asked(comm_);
  const std::string cause =
      detail::concat("stopped on request (", cause_of(asked, world_), ") after step ", tally_.step);
  const Clock::time_point saving = Clock::now();
  const RunPosition here = saved_position(tally_.here);
  const bool in_memory = stop_for_membership(here);  // asked once: it takes the snapshots
  if (!in_memory) {
    checkpoint(here, /*last=*/true);
    snapshot(here);
    checkpoints_->wait_for_writes(cause);  // rank 0's checkpoint is durable before anyone exits
  }
  // At an epoch's last step, its state saved, the stop ends the epoch (its evaluation, line and
  // event) before it goes: a signal that ends the process meanwhile (a second SIGTERM, the
  // scheduler's SIGKILL) takes only the evaluation with it.
  if (unended_) {
    unended_->tally.t0 += Clock::now() - saving;  // the epoch's time is its steps'
    end_epoch(unended_->epoch, unended_->tally, !in_memory);
  }
  if (in_memory) {
    heartbeat_->last(tally_.step, tally_.step / plan_.steps_per_epoch, "stopped");
    if (lead_) log::warn(cause, " for hpcrun to change the hosts; every host's memory holds its state");
  } else {
    // The checkpoint holds the state the snapshots hold: their memory goes back to the host.
    if (!o_.checkpoint_dir.empty()) snapshots_->remove_all();
    heartbeat_->last(tally_.step, tally_.step / plan_.steps_per_epoch, "stopped");
    if (lead_)
      log::warn(cause, o_.checkpoint_dir.empty() ? "; nothing saved: no --checkpoint-dir"
                                                 : "; checkpoint written, --resume auto continues from it");
  }
  if (trace_) trace_->gather();
  TrainResult result;
  result.steps = tally_.step;
  result.exit_code = stop_exit_code(o_, asked);
  with_metrics([&result](StepMetrics& m) { m.ended(RunState::Stopped, result.exit_code); });
  write_stopped_event(tally_.step, asked.signal, !in_memory && !o_.checkpoint_dir.empty(), result.exit_code);
  return result;
}

// hpcrun stops the job to add or drain hosts (it leaves CHECKPOINT_DIR/membership-change): the
// hosts that go on hold the state in memory, so the stop writes a snapshot on every host
// instead of a checkpoint to shared storage. False (a checkpoint then) when it is not such a
// stop, snapshots are off, or some host could not write its snapshot. hpcrun takes the marker
// back when a user's stop (Ctrl-C, Slurm's preemption) replaces its own: that stop is for good,
// perhaps followed by a requeue onto other nodes, so a marker gone once the snapshots are written
// means a checkpoint too.
bool TrainingRun::stop_for_membership(const RunPosition& at) {
  if (!snapshots_->enabled() || !membership_marked(true)) return false;
  if (!snapshots_->take_and_wait(at)) return false;
  if (membership_marked(false)) return true;
  if (lead_) log::warn("hpcrun's stop to change the hosts became a stop for good: writing a checkpoint too");
  return false;
}

// Whether this job's hpcrun's membership-change marker is there (collective: rank 0 looks).
bool TrainingRun::membership_marked(bool warn_if_stale) {
  uint64_t marked = 0;
  if (lead_) {
    const ckpt::MembershipMarker marker = ckpt::membership_marker(o_.checkpoint_dir, ckpt::hpcrun_token_from_env());
    marked = marker == ckpt::MembershipMarker::Ours ? 1 : 0;
    if (marker == ckpt::MembershipMarker::Stale && warn_if_stale)
      log::warn((std::filesystem::path(o_.checkpoint_dir) / ckpt::kMembershipMarkerFile).string(),
                " is not this job's hpcrun's (left by one that was killed?): the stop writes a checkpoint, not "
                "snapshots alone");
  }
  if (world_ > 1) comm_.broadcast(&marked, sizeof marked, 0);
  return marked != 0;
}

// Every planned step done: the final state checked and saved, every write finished, then the
// report.
TrainResult TrainingRun::finish() {
  const int64_t step = tally_.step;
  if (!evaluated_) {
    // Resumed from a checkpoint at the run's end (a finished run started again, as a job chain's
    // later segments do, or one stopped right after its last step): nothing left to train, but
    // the result reported is still the model's.
    if (lead_) log::info("the checkpoint is at the run's last step (", step, "): nothing to train; evaluating");
    eval_ = evaluate_now();
  }
  // Checked by save(), or here without a checkpoint directory.
  if (o_.checkpoint_dir.empty()) require_finite_state(comm_, *engine_, o_, step, true);
  checkpoint(final_position(), /*last=*/true);
  if (trace_) trace_->gather();
  checkpoints_->wait_for_writes(detail::concat("finished after step ", step));
  if (StopSignals::requested())  // on this rank: too late to stop before the end, which is as good
    log::warn("a stop was asked for (", signal_name(StopSignals::signal_number()),
              ") as the run was finishing; it finished instead");
  if (ckpt::AsyncWriter* writer = checkpoints_->writer()) {
    log::info("checkpoint: ", writer->last_written());
    // The epochs the final checkpoint stands after (all of them, --max-steps or not): "0 epoch(s)
    // done" beside a checkpoint "after epoch 1" was said of a run that --max-steps ended mid-epoch.
    heartbeat_->last(step, final_position().epoch, "done");
  }
  snapshots_->remove_all();  // the final checkpoint holds the state now
  with_metrics([](StepMetrics& m) { m.ended(RunState::Done); });
  return report();
}

// The result (its checksums from a snapshot of the final state, where the final checkpoint
// stands), the done line and the last log lines.
TrainResult TrainingRun::report() {
  ckpt::Checkpoint state;
  record_run(state, o_, model_id_, world_, final_position());
  engine_->snapshot(state);
  TrainResult result;
  result.steps = tally_.step;
  result.test_accuracy = eval_.accuracy;
  result.test_loss = eval_.loss;
  result.train_seconds = tally_.train_seconds;
  result.images_per_second = tally_.run_samples / std::max(tally_.train_seconds, 1e-9);
  result.param_checksum = param_checksum(state);
  result.state_checksum = state_checksum(state);
  const double run_steps = static_cast<double>(std::max<int64_t>(tally_.step - p_.start.step, 1));  // this run's
  const double wait_per_step = tally_.comm_wait_seconds / run_steps;
  write_done_line(result, state, wait_per_step, run_steps);
  char buf[240];
  std::snprintf(buf, sizeof buf, "done: %lld steps, test accuracy %.2f%%, %.0f img/s, param checksum %s",
                static_cast<long long>(result.steps), 100 * eval_.accuracy, result.images_per_second,
                result.param_checksum.c_str());
  log::info(buf);
  if (world_ > 1)
    log::info("exposed communication: ", 1e3 * wait_per_step, " ms per step (",
              100 * tally_.comm_wait_seconds / std::max(tally_.train_seconds, 1e-9), "% of the step time)");
  return result;
}

double norm(const std::vector<float>& v) {
  double norm2 = 0;
  for (float x : v) norm2 += static_cast<double>(x) * x;
  return std::sqrt(norm2);
}

void TrainingRun::write_done_line(const TrainResult& r, const ckpt::Checkpoint& state, double wait_per_step,
                                  double run_steps) {
  const std::optional<optim::LossScalerState> scaler = loss_scaler_of(state);
  metrics_->write({{"event", std::string("done")},
                   {"steps", r.steps},
                   {"test_accuracy", eval_.accuracy},
                   {"test_loss", eval_.loss},
                   {"param_checksum", r.param_checksum},
                   {"state_checksum", r.state_checksum},
                   {"param_norm", norm(state.params)},
                   {"images_per_second", r.images_per_second},
                   {"train_flops_per_sample", static_cast<int64_t>(std::llround(train_flops_per_sample_))},
                   {"train_seconds", tally_.train_seconds},
                   {"world_size", world_},
                   {"device", std::string(p_.gpu ? "cuda" : "cpu")},
                   {"peak_device_memory_bytes", static_cast<int64_t>(engine_->peak_device_memory())},
                   {"global_batch_size", plan_.global_batch},
                   {"comm_wait_seconds_per_step", wait_per_step},
                   {"step_seconds", tally_.train_seconds / run_steps},
                   {"resumed_from_step", p_.resumed ? p_.start.step : int64_t{-1}},
                   {"resumed_from", std::string(source_name(p_.source))},
                   {"snapshots_taken", snapshots_->taken()},
                   {"snapshot_stall_seconds", snapshots_->stall_seconds()},
                   {"skipped_steps", scaler ? scaler->skipped : int64_t{0}},
                   {"checkpoints_written", checkpoints_->written()},
                   {"checkpoint_stall_seconds", checkpoints_->stall_seconds()},
                   {"elapsed_seconds", seconds_since(t_start_)}});
}

}  // namespace

EvalResult evaluate(nn::Model<float>& model, const data::Dataset& ds, const data::Normalization& norm,
                    int64_t batch_size, dist::Communicator* comm, const std::function<void()>& on_batch,
                    int decode_threads) {
  return evaluate([&](const data::Batch& b, double* sums) { eval_batch_cpu(model, b, sums); }, ds, norm, batch_size,
                  comm, on_batch, decode_threads);
}

EvalResult evaluate(const std::function<void(const data::Batch&, double*)>& run, const data::Dataset& ds,
                    const data::Normalization& norm, int64_t batch_size, dist::Communicator* comm,
                    const std::function<void()>& on_batch, int decode_threads, bool bytes) {
  // The test set is cut into batches the same way on any number of ranks; each rank evaluates
  // a contiguous run of them, and the batches' sums are added up in batch order, so that the
  // figures have the same bits on 1 rank or on 8 (each sum is non-zero on one rank only: the
  // all-reduce adds zeros to it, which is exact).
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const int64_t batches = (ds.count + batch_size - 1) / batch_size;
  const int64_t first = batches * rank / world, last = batches * (rank + 1) / world;
  data::BatchAssembler assembler(ds, norm, {}, 0, decode_threads, bytes);
  data::Batch batch;
  std::vector<double> per_batch(2 * static_cast<size_t>(batches), 0.0);  // loss * samples, correct
  for (int64_t b = first; b < last; ++b) {
    const int64_t start = b * batch_size, n = std::min(batch_size, ds.count - start);
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(start));
    assembler.assemble(idx, 0, false, batch);
    run(batch, &per_batch[2 * b]);
    if (on_batch) on_batch();
  }
  if (comm && world > 1) comm->allreduce_sum(per_batch.data(), static_cast<int64_t>(per_batch.size()));
  double sums[2] = {0, 0};
  for (int64_t b = 0; b < batches; ++b) {
    sums[0] += per_batch[2 * b];
    sums[1] += per_batch[2 * b + 1];
  }
  EvalResult r;
  r.samples = ds.count;
  r.loss = sums[0] / static_cast<double>(ds.count);
  r.accuracy = sums[1] / static_cast<double>(ds.count);
  return r;
}

TrainResult run_training(const TrainOptions& options, dist::ProcessContext& ctx) {
  return TrainingRun(options, ctx).run();
}

}  // namespace hpc::train
