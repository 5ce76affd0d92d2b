// Where checkpoints live: one directory (EFS/NFS on clusters), files ckpt-<step>.hpck.
// Writes are atomic and durable (temporary file in the same directory, fsync, rename, fsync
// of the directory), so a crash at any moment leaves every earlier checkpoint intact; the
// newest `keep` are kept. The AsyncWriter writes on a background thread so the step loop only
// pays for copying the state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "core/file_identity.hpp"

namespace hpc::ckpt {

class DirectoryLock;
struct WriteProgress;

class CheckpointStore {
 public:
  // Creates the directory if needed; usage error if it cannot be made or written.
  // reuse_pages (in-memory snapshots on a tmpfs): the checkpoint that retention removes is kept
  // as DIR/.spare instead, and the next write rewrites it in place under its temporary name, so
  // that its memory is not freed and allocated (and zeroed) again for every snapshot. A spare
  // is never read; the directory then holds keep checkpoints and one spare.
  CheckpointStore(std::string dir, int keep, bool reuse_pages = false);
  // Writes the checkpoint of `step`; returns its path. Then deletes all but the newest keep.
  // progress: where given, counts its bytes as they are written and synced (WriteProgress).
  std::string write(const Encoded& checkpoint, int64_t step, WriteProgress* progress = nullptr);
  const std::string& dir() const { return dir_; }

  // For a run that does not continue the directory's newest checkpoint (a fresh start, step
  // -1; --resume FILE; newer files skipped as damaged): the checkpoints above `step` are moved
  // into DIR/superseded-<unix time>/ now, as the run's identity is replaced. Left in place they
  // would outrank this run's own (retention keeps the highest steps, --resume auto takes the
  // highest): its checkpoints deleted as soon as written, another run's resumed in their place.
  // Not at the first write: a fresh start killed before it has snapshots of its own, and the
  // next --resume auto took the abandoned run's checkpoints over them.
  void supersede_after(int64_t step);

  static std::string file_name(int64_t step);

  // The run's lock on the directory (dir_lock.hpp): every write first checks that the run still
  // holds it, so a run that lost it to another writes nothing more there.
  void guard_with(const DirectoryLock* lock) { lock_ = lock; }
  void require_owned() const;  // usage error once the lock is lost
  bool owned() const;

 private:
  std::string spare() const;

  std::string dir_;
  int keep_;
  bool reuse_pages_;
  const DirectoryLock* lock_ = nullptr;
};

// Liveness for a launcher: DIR/heartbeat holds "step=N" (global steps done), "epoch=E"
// (epochs done), "unix_time=T", "pid=P" and "state=S" lines, replaced (write + rename, not
// synced: it is not state) by rank 0 about once a second while it trains (state "training"),
// and once more when it ends: "done", or "stopped" after a stop signal's checkpoint. A
// launcher that sees unix_time stop advancing while the state is "training" knows the job hangs.
// `extra`: more "key=value" lines, as they are.
void write_heartbeat(const std::string& dir, int64_t step, int64_t epochs_done, const char* state = "training",
                     const std::string& extra = "");
// The heartbeat of a process that ends at once (train/stop/signals.cpp: SIGINT, a second SIGTERM, a
// signal left out of --stop-signals), which otherwise said "training" for ever after: state
// "stopped" as after a stop signal's checkpoint, with an exit_code= line (128 + the signal) that
// says none was written. prepare_final_heartbeat: DIR and the `extra` lines of the run's beats,
// once it writes them; arm_final_heartbeat: where the run stands, at each step boundary;
// disarm_final_heartbeat: the run wrote its own last heartbeat (done, stopped, failed), or ended.
// write_final_heartbeat writes it when armed, after remove_unfinished_files(), where no
// heartbeat write still hangs; async-signal-safe, as disarm and arm are.
void prepare_final_heartbeat(const std::string& dir, const std::string& extra);
void arm_final_heartbeat(int64_t step, int64_t epochs_done);
void disarm_final_heartbeat();
void write_final_heartbeat(int exit_code);

// A run's last word (a heartbeat's or a Prometheus file's done, stopped or failed) where the file
// cannot be replaced: on a full file system a temporary file gets no block, and a run that the
// full disk ended said "training" for ever, a hung run to whoever reads it. Written over the old
// file instead, in the blocks it already holds (none to allocate, else nothing is written); not
// atomic, so only for a last word, once the replacement failed. Whether it was written.
// Async-signal-safe. (O_NONBLOCK: a FIFO of that name without a reader fails the open instead of
// blocking it.)
bool overwrite_in_place(const char* path, const char* text, size_t n);
// The heartbeat's fields by name (empty when DIR has none).
std::map<std::string, std::string> read_heartbeat(const std::string& dir);
// Its step: the global steps done, -1 when it has none or not a whole number of 0 or more.
int64_t heartbeat_step(const std::map<std::string, std::string>& beat);
// Under hpcrun, whose attempt writes the heartbeat: "hpcrun_token=T\nhpcrun_attempt=N\n" for
// write_heartbeat's `extra` (T the hpcrun's token, its ranks' HPCRUN_TOKEN; N its attempt); ""
// when either is empty.
std::string heartbeat_owner_lines(const std::string& token, const std::string& attempt);
// Whether a beat is progress of hpcrun `token`'s attempt `attempt`: one that names an hpcrun is
// only if it names these two; one that names none (a program other than hpctrain) is.
bool heartbeat_is_of(const std::map<std::string, std::string>& beat, const std::string& token,
                     const std::string& attempt);
// Whether a record (a heartbeat, a lock's) names hpcrun `token`'s attempt `attempt`; one that
// names no hpcrun does not.
bool names_hpcrun_attempt(const std::map<std::string, std::string>& record, const std::string& token,
                          const std::string& attempt);
// What hpcrun tells its ranks (launch/attempt.cpp): its token (HPCRUN_TOKEN, hex digits) and the
// attempt's number (HPCRUN_ATTEMPT). "" where unset or not of that form: taken as none, never
// written into a record nor matched against a marker.
std::string hpcrun_token_from_env();
std::string hpcrun_attempt_from_env();
// The fields naming them in a record (hpcrun_token=, hpcrun_attempt=); none unless both are given.
std::map<std::string, std::string> hpcrun_owner_fields(const std::string& token, const std::string& attempt);

// hpcrun's ask for a stop to change the job's hosts: DIR/membership-change, holding
// "token=T" (and "pid=P", the writer's), T the asking hpcrun's own, which its ranks have as
// HPCRUN_TOKEN. A marker of another token (left by an hpcrun that was killed; a plain hpctrain
// has none) is Stale: such a stop must write its checkpoint, as the hosts that hold the
// snapshots may be gone next.
inline constexpr char kMembershipMarkerFile[] = "membership-change";
enum class MembershipMarker { None, Ours, Stale };
MembershipMarker membership_marker(const std::string& dir, const std::string& token);
// Leaves hpcrun `token`'s marker in DIR.
void write_membership_marker(const std::string& dir, const std::string& token);
// Removes DIR's marker if it is `token`'s: another hpcrun's is its own to remove.
void remove_membership_marker(const std::string& dir, const std::string& token);

// What write_file_atomically adds to PATH's name for its temporary file: ".tmp." and the PID.
inline constexpr char kTemporaryInfix[] = ".tmp.";
// Its longest length: the infix and a PID of up to 7 digits (the kernel's PID_MAX_LIMIT, 4194304).
inline constexpr size_t kLongestTemporaryTail = sizeof kTemporaryInfix - 1 + 7;

// Replaces (or creates) the file at `path` with `bytes` the checkpoint way: a temporary file
// beside it, written, synced, renamed over it, the directory synced. A failure or a kill at any
// moment leaves what was at `path` byte for byte (a kill before the rename may leave the
// temporary file, PATH.tmp.PID, which remove_unfinished_files() removes from a signal
// handler). The temporary file is made anew (O_EXCL, never through a link: its name is easy to
// guess); a file that replaces another takes its permission bits, a new one the umask's. Usage
// error naming the file and the system's reason. reuse: a file that becomes the
// temporary one, rewritten in place (its pages kept) rather than created; ignored when absent.
// locked: the temporary file is held by a lock until the rename, which remove_abandoned_writes
// (on any host of shared storage) reads as a write under way: for the files it judges (export's
// --output). Checkpoints take none: their directory's lock says whose they are, and a lock call
// to a file server that does not answer must not hold a checkpoint up.
// replace false: a file that appeared at PATH meanwhile is kept, and the write is a usage error
// saying so (renameat2's RENAME_NOREPLACE; link + unlink where the file system lacks it): a check
// that PATH is not there, made before the file was made, held only until then.
void write_file_atomically(const std::string& path, const std::vector<char>& bytes, const std::string& reuse = "",
                           bool locked = false, bool replace = true);
// How far a write that reports its progress has come (a checkpoint writer's, read by the ranks
// that wait for it: a slow file system that still moves is not a hang). Its bytes are written in
// chunks of kSyncChunkBytes, each made durable (fdatasync) before it counts: on NFS and EFS the
// transfer happens in the sync, not in write(), which fills the page cache at memory's pace.
struct WriteProgress {
  static constexpr uint64_t kSyncChunkBytes = uint64_t{16} << 20;
  std::atomic<uint64_t> synced{0};  // bytes of the write under way written and synced
  std::atomic<uint64_t> total{0};   // its size (0 until its bytes are known)
  std::atomic<uint64_t> chunks{0};  // chunks synced by every write so far: it grows with each
};

// The same with the file's bytes in pieces, written in order (an Encoded checkpoint's).
// before_rename: called with the temporary file written whole, just before the rename; what it
// throws removes that file and is thrown on (a checkpoint store's check that its lock is still held).
// progress: where given, the bytes go in synced chunks counted there (WriteProgress).
void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& pieces, const std::string& reuse = "",
                           const std::function<void()>& before_rename = {}, bool locked = false, bool replace = true,
                           WriteProgress* progress = nullptr);

// Removes the PATH.tmp.PID files that earlier write_file_atomically(PATH, ...) calls left when
// their processes were killed before the rename (SIGKILL, the OOM killer, a lost host: no handler
// runs), which nothing else ever removes: each export to the same --output left one more. Only
// regular files of this user (never through a link) that no writer holds: a write with `locked`
// holds a lock on its temporary file until its rename (an OFD lock, which NFSv4 and EFS show to every host), so
// a write under way on another host of shared storage is kept, though its PID is none here. A
// file no lock holds: removed where its PID is no process on this host, and where it is one, once
// the file has not changed for an hour (an unrelated process took the PID; younger, it may be a
// write of an hpctrain that took no lock). On a file system without locks, this host's PIDs alone
// decide, as before the lock. Each removal is said in an info line; one that fails, in a warning.
void remove_abandoned_writes(const std::string& path);

// Removes the temporary files of the writes under way (a checkpoint's and a snapshot's, on
// their threads), lets a heartbeat being replaced finish (for up to a second) and starts no
// other: for a process that ends at once in the middle of a write (train/stop/signals.cpp),
// which would otherwise leave a half-written file behind. Async-signal-safe. Once called,
// write_heartbeat writes nothing.
void remove_unfinished_files();

// Test hook: whether the write of thread `writer` sits in HPCTRAIN_TEST_PAUSE_BEFORE_RENAME's
// pause now, its temporary file written and closed, waiting for its rename.
bool paused_before_rename(std::thread::id writer);

// The checkpoint files of a directory (ckpt-*.hpck), newest (highest step) first.
std::vector<std::string> list_checkpoints(const std::string& dir);
// The step a checkpoint file's name says (ckpt-000000020.hpck: 20), or -1 for other names (a
// number past int64_t too: no step hpctrain writes, and such a stray file must not stop every
// command that lists the directory).
int64_t step_of(const std::string& name);
// The step of a directory's newest checkpoint file by its name (list_checkpoints' first), -1 for none.
int64_t newest_step(const std::string& dir);
// What `option` PATH may read, as inputs that no output may replace (core/file_identity.hpp):
// the path and, for a directory, each of its checkpoint files (the newest valid one is read).
std::vector<NamedPath> checkpoint_inputs(const std::string& option, const std::string& path);

// Whether a CheckpointStore writes files of this name: its checkpoints (ckpt-*.hpck and their
// temporary files, ckpt-*.hpck.tmp.PID) and the spare whose pages the next write reuses (.spare).
// What a snapshot directory may hold (train/state/snapshots.cpp) is these and its in-use file.
bool is_store_file(const std::string& file_name);

// Whether a checkpoint directory's own files may take this file name: the store's files
// (is_store_file), their superseded-* folders, lock, run-id, heartbeat (and its .tmp), and
// hpcrun's membership-change marker and hpcrun/ logs. Another file of that name there would be
// replaced or moved away.
bool checkpoint_dir_uses(const std::string& file_name);
// An output that would be an entry of checkpoint directory `dir` (named as `dir_what`) under a
// name its own files take: a usage error naming it (it would be replaced or moved away, and its
// bytes lost without a word). Empty paths are passed by.
void require_not_its_own_name(const NamedPath& output, const std::string& dir, const std::string& dir_what);
// The directory whose own files a checkpoint PATH goes with: PATH itself where it is a directory,
// else the folder of the file it names through links (a link elsewhere to ck/ckpt-N.hpck: ck, not
// the link's folder, which let "--output ck/heartbeat --force" past the check above); "." for a
// bare name.
std::string checkpoint_folder(const std::string& path);

// Reads and verifies one checkpoint file (usage error naming the problem, the system's reason
// when it cannot be read; a file named ckpt-<step>.hpck must hold that step); with `layout`,
// records what could be read (see decode).
Checkpoint load_checkpoint(const std::string& path, Layout* layout = nullptr, Arenas arenas = Arenas::Keep);

// The newest valid checkpoint of a directory, and what was wrong with the newer ones (damaged
// or misnamed: one that cannot be read is thrown, UnreadableCheckpoint, not passed by; so is one
// too large for memory, unless it is larger than the older one found: CheckpointTooLarge).
struct LatestCheckpoint {
  std::optional<std::pair<std::string, Checkpoint>> found;  // its path and contents
  std::vector<std::string> skipped;  // the problem of each newer file, newest first
  size_t listed = 0;                 // checkpoint files in the directory
};
LatestCheckpoint find_latest(const std::string& dir, Arenas arenas = Arenas::Keep);

// The newest valid checkpoint of dir and its path: corrupt or truncated newer ones, and those
// whose name says another step than they hold, are skipped with a warning naming them. nullopt
// when there is none (a fresh start).
std::optional<std::pair<std::string, Checkpoint>> load_latest(const std::string& dir);
// The step of a directory's newest valid checkpoint (find_latest's, each file read whole and its
// arenas checked as they stream past, not kept: newer files that are damaged or misnamed are
// passed by, as a resume passes them by), -1 for none. Throws what find_latest throws (an
// unreadable file).
int64_t newest_valid_step(const std::string& dir);

class AsyncWriter {
 public:
  explicit AsyncWriter(CheckpointStore& store);
  ~AsyncWriter();  // finishes the write in flight
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Hands a snapshot over. At most one write is in flight: if the previous one is still
  // being written, this waits for it first (the step loop stalls rather than skipping or
  // queueing checkpoints). Returns the seconds it waited. A failed earlier write is thrown.
  // fill, when given, runs on the writer's thread before the snapshot is encoded: the rest of
  // its state copied in there, off the step loop (Engine::complete_snapshot).
  double submit(Checkpoint snapshot, int64_t step, std::function<void()> fill = {});
  // Waits until nothing is in flight; throws a failed write's error.
  void wait();
  // Waits up to `seconds` for nothing to be in flight; whether nothing is. Never throws: a failed
  // write is kept for wait() or recycled() to throw.
  bool wait_for(double seconds);
  // The write in flight's bytes synced and size, and the chunks synced by all writes so far.
  const WriteProgress& progress() const { return progress_; }
  // A snapshot to fill for the next submit: the last one written, handed back with its
  // buffers' capacity, so taking a snapshot copies into memory already mapped instead of
  // faulting in fresh pages (most of a large model's stall). Waits like submit.
  Checkpoint recycled();
  // Whether nothing is in flight (a submit would not wait).
  bool idle();
  // Test hook: whether this writer's write sits in HPCTRAIN_TEST_PAUSE_BEFORE_RENAME's pause.
  bool paused_before_rename() const;
  // Path of the last checkpoint written completely ("" before the first).
  std::string last_written();
  // How many were written completely, and the Unix time the last one was (0 before the first).
  std::pair<int64_t, double> completed();

 private:
  void run();

  CheckpointStore& store_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    Checkpoint snapshot;
    int64_t step = 0;
    std::function<void()> fill;
  };
  std::optional<Job> pending_;
  Checkpoint spare_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr failure_;
  std::string last_;
  int64_t completed_ = 0;
  double completed_unix_ = 0;
  WriteProgress progress_;
  std::thread thread_;
};

}  // namespace hpc::ckpt
