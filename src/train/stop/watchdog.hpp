// The step watchdog: a thread that ends the process when the training loop stops making
// progress for --step-timeout (a peer stopped, died or lost its network inside an all-reduce,
// where the collective would otherwise wait forever). The loop reports progress after every
// step and evaluation batch; halfway to the timeout a warning names the step that is late.
//
// Every rank runs one, so whichever ranks are still alive notice; the first to fire exits
// with kExitStepTimeout and mpirun ends the rest of the job. It also polls, every
// kPollSeconds, an error source the caller gives (NCCL's asynchronous errors: on the GPU no
// host thread waits inside the all-reduce to see them), and fires at once on an error; only
// while it runs (--step-timeout 0 turns the poll off too).
//
// Set-up waits for the peers as well (the options' and the data's agreements, the broadcast of
// the initial state): a watchdog of Watched::SetUp covers it, from the options read to the first
// step, for --start-timeout; it is given no progress but the end of a wait with its own limit.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace hpc::train {

// What a watchdog waits for, named in its messages: a training step, the end of training's set-up
// (a relaunch continues from the last checkpoint), or evaluate's set-up and batches.
enum class Watched { Steps, SetUp, EvaluationSetUp, EvaluationBatches };

// The end of a run whose outcome is known (its exit code): what is left (the run's objects
// ended, the checkpoint directory's lock removed, the loader's threads joined, MPI_Finalize,
// which waits for every rank) is given `timeout_seconds` (the run's --step-timeout; <= 0: no
// limit), after which one line names what did not end and the process exits with `exit_code`
// at once. A peer stopped or cut off after its last collective, or a file system that stopped
// answering there, held this rank for ever: no watchdog runs past the last step's. A detached
// thread: the process ending on its own ends it too; none where no thread can be started (an
// end that succeeded is not turned into a failure by its bound).
void bound_the_end(double timeout_seconds, const std::string& where, int exit_code, bool peers);

// The process's exit after MPI's end, when nothing of hpctrain's is left to write: the libraries'
// exit handlers, which a library's own threads can hold for ever (OpenBLAS's shutdown joins a
// worker that retries its buffer's allocation without end once a memory limit, ulimit -v, is
// reached: ten minutes, to --step-timeout, after an out-of-memory error). After `seconds`, one
// warning line, and the process exits with `exit_code`. Nothing if no thread can be started.
void bound_the_exit(double seconds, int exit_code);

class StepWatchdog {
 public:
  // Called from the watchdog's thread with the message when the timeout passes; must not
  // return to training (the default prints the message and _exits with kExitStepTimeout).
  using Expire = std::function<void(const std::string& message)>;
  // Returns an error's message, or empty while there is none. Called from the watchdog's thread.
  using Poll = std::function<std::string()>;
  static constexpr double kPollSeconds = 1.0;
  // The default Expire: the message on stderr, then _exit(kExitStepTimeout).
  [[noreturn]] static void print_and_exit(const std::string& message);
  // Its two halves, for an Expire with last words between them.
  static void print_expired(const std::string& message);
  [[noreturn]] static void exit_expired();

  // timeout_seconds <= 0: off (no thread). `where` names this process in messages
  // ("rank 1 on node7"); `peers`: whether it has any, the likely cause of a wait (else a file
  // system or device that does not answer).
  StepWatchdog(double timeout_seconds, std::string where, Expire expire = {}, Poll poll = {},
               Watched watched = Watched::Steps, bool peers = true);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  // The loop made progress; `step` is the number of global steps done. Lock-free, so it is
  // cheap enough for every step and every evaluation batch.
  void progress(int64_t step);
  // The clock stops for up to `seconds`, for a wait that has its own limit (the checkpoint
  // directory's lock: --checkpoint-lock-wait); progress() after the wait starts it again (seen
  // within kPollSeconds).
  void hold_for(double seconds);
  // The loop waits for rank 0's checkpoint of `checkpoint_step` (Checkpointer::await_writes),
  // `synced` bytes of it written and synced so far; `progressed`: a chunk was synced since the
  // last call, which counts as progress (the clock starts again). `own`: this process writes it,
  // else a peer does. The messages then name the write; progress() ends the wait.
  void writing(int64_t checkpoint_step, uint64_t synced, bool own, bool progressed);

 private:
  void run();
  std::string expired_message() const;
  std::string late_message(double idle_seconds) const;
  const char* timeout_option() const;
  std::string write_text() const;
  std::string written_text() const;

  using Clock = std::chrono::steady_clock;
  const double timeout_;
  const std::string where_;
  const Watched watched_;
  const bool peers_;
  Expire expire_;
  Poll poll_;
  std::atomic<int64_t> last_ns_{0}, step_{0};
  std::atomic<bool> writing_{false}, own_write_{false};
  std::atomic<int64_t> write_step_{0};
  std::atomic<uint64_t> write_synced_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hpc::train
