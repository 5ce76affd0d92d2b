// One writer per checkpoint directory. A training run holds DIR/lock for its whole life, so a
// second run on the same directory (another job given the same --checkpoint-dir, a resubmitted
// job while the first still runs) is refused before it reads or moves anything there, instead of
// interleaving its checkpoints, run id and heartbeat with the first's.
//
// How, and why it is safe on EFS/NFS:
// - The lock is an open-file-description lock (fcntl F_OFD_SETLK, a write lock on the whole
//   file), which the kernel drops when the holder dies, and which NFSv4 (EFS) sends to the server
//   as a POSIX lock, so it holds between hosts. (flock() is emulated by the same server locks on
//   NFS, but with fcntl's rule that closing any descriptor of the file drops it; an OFD lock has
//   no such trap.) Whoever locks it then checks that DIR/lock still names the file it locked.
// - The file is removed when the run ends (while still locked: see the destructor), so a finished
//   run leaves no trace; one that crashed leaves it, and the next run says whose it was.
// - The file holds the holder's record ("key=value" lines: host, pid, run_id, since, unix_time,
//   state), which the holder rewrites every couple of seconds: a refused run names the holder,
//   and a waiter can tell a live holder from a lost one.
// - A holder whose host died keeps its lock on the NFS server until the server's lease for that
//   host expires (about 90 s on EFS), and one that is stopped (SIGSTOP) or cut off keeps it while
//   it lives. When its record has not changed for kStaleSeconds, by its own time and by the
//   waiter's watching, the waiter takes the lock over: it writes a locked file of its own and
//   renames it over DIR/lock, with a warning naming the holder it replaced. The old holder, if it
//   ever comes back, finds DIR/lock is no longer its file (its refresh thread compares inodes) and
//   writes nothing more there: require_held() fails its next checkpoint.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace hpc::ckpt {

class DirectoryLock {
 public:
  // A record unchanged this long means its holder is gone (it rewrites it every kRefreshSeconds).
  // HPCTRAIN_TEST_LOCK_STALE_SECONDS sets it for tests (the refresh then comes 10 times as often).
  static double stale_seconds();

  // Takes DIR/lock (making DIR if needed). While another live process holds it, waits up to
  // wait_seconds, asking stop() every fraction of a second (a stop signal: nullptr is returned),
  // then throws a usage error naming the holder. A lock left by a holder that ended without
  // releasing it is taken with a warning; a stale one (see above) is taken over. `owner`: fields
  // the record carries besides its own (under hpcrun, its token and attempt: hpcrun tells an
  // attempt that waits for an earlier one's lock from a start-up that hangs).
  static std::unique_ptr<DirectoryLock> acquire(const std::string& dir, double wait_seconds,
                                                const std::function<bool()>& stop,
                                                const std::map<std::string, std::string>& owner = {});
  ~DirectoryLock();  // release(false)
  // Removes DIR/lock and unlocks; with remove_made_directory (a run that failed), also DIR itself
  // when acquire() made it, and the folders above it that it made, as long as they are empty, so
  // a refused run leaves nothing behind (--checkpoint-dir new/a/b left new/ and new/a/).
  void release(bool remove_made_directory);
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Adds the run's id to the record, once set-up knows it.
  void set_run_id(const std::string& id);
  // Whether DIR/lock is still this process's (another process has not taken it over). A stat of
  // it that fails for another reason than its absence (EIO, ESTALE: a file system's hiccup) says
  // nothing: held still, for up to a third of the stale time, then lost.
  bool held() const;
  // Whether the refresh thread has found it taken over (a flag: cheap enough for every step).
  bool lost() const { return lost_.load(); }
  // How it was lost: "taken over by host ...", "its lock file is gone (...)" or "the directory
  // was removed ...".
  std::string how_lost() const;
  // Usage error naming the process that took the lock over, before a write into DIR.
  void require_held() const;
  const std::string& path() const { return path_; }

 private:
  DirectoryLock(const std::string& dir, int fd, std::vector<std::string> made,
                const std::map<std::string, std::string>& owner);
  void write_record(const char* state);
  void refresh_loop();

  const std::string dir_, path_;
  const int fd_;
  const std::vector<std::string> made_;  // the folders of DIR's path acquire() made, in the order made
  bool released_ = false;
  std::map<std::string, std::string> record_;
  mutable std::mutex mu_;  // record_, lost_to_, stop_
  std::condition_variable cv_;
  bool stop_ = false;
  mutable std::atomic<bool> lost_{false};
  mutable std::atomic<int64_t> unknown_since_ns_{0};  // steady clock; 0: the last stat answered
  mutable std::string lost_to_;
  std::thread refresher_;
};

// For a process that ends at once (train/stop/signals.cpp): removes the directory's lock file it holds,
// as a run that ends normally does (the kernel drops the lock itself). Async-signal-safe.
void remove_lock_at_exit();
// Whether this process holds a directory's lock that is no longer its own (another run took the
// directory over, or its lock file went): what it would write there then is another run's to
// write. False while it holds none. Async-signal-safe.
bool lock_lost_at_exit();

// The fields of a "key=value" lines file (empty when it cannot be read): a regular file only (a
// FIFO of that name would block the read), its first kMostKeyValueBytes (a lock's record or a
// heartbeat is a few lines; a huge file must not take the memory), lines holding control
// characters left out (they would reach a terminal as they are).
inline constexpr size_t kMostKeyValueBytes = 64 * 1024;
std::map<std::string, std::string> read_key_values(const std::string& path);
// A "key=value" record (a lock's) read again and again, and when it last changed by the caller's
// clock, in seconds: the first look counts as a change. A holder rewrites its record every few
// seconds (unix_time), so a record unchanged for DirectoryLock::stale_seconds() says its holder
// is gone (the lock's waiter takes it over; hpcrun stops counting a wait for it).
class RecordWatch {
 public:
  explicit RecordWatch(std::string path) : path_(std::move(path)) {}
  const std::map<std::string, std::string>& look(double now);
  const std::map<std::string, std::string>& record() const { return last_; }
  double unchanged_for(double now) const { return seen_ ? now - changed_ : 0; }  // 0 before the first look

 private:
  std::string path_;
  std::map<std::string, std::string> last_;
  double changed_ = 0;
  bool seen_ = false;
};

// A lock's holder as its record names it: "host H pid P, run R, since T".
std::string describe_lock_holder(const std::map<std::string, std::string>& record);
// The first kMostKeyValueBytes of a regular file, "" for anything else (not there, unreadable, a
// FIFO, which is not waited on, a directory): a small record's text (run-id, a run's owner).
std::string read_small_file(const std::string& path);

}  // namespace hpc::ckpt
