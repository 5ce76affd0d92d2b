// The checkpoint format: round trip, and every truncation or flipped bit is caught; the
// heartbeat's fields read back as written.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/dir_lock.hpp"
#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"

namespace hpc::testing {
namespace {

ckpt::Checkpoint sample() {
  ckpt::Checkpoint c;
  c.meta = {{"model", "cnn"}, {"step", "42"}, {"samples_seen", "2688.5"}};
  for (int i = 0; i < 50; ++i) c.params.push_back(0.25f * i - 3);
  for (int i = 0; i < 50; ++i) c.momentum.push_back(-0.5f * i);
  c.buffers = {1, 2, 3, 4};
  return c;
}

TEST(CheckpointFormat, RoundTrip) {
  const ckpt::Checkpoint c = sample();
  const ckpt::Checkpoint d = ckpt::decode(ckpt::encode(c), "test");
  EXPECT_EQ(d.meta, c.meta);
  EXPECT_EQ(d.params, c.params);
  EXPECT_EQ(d.momentum, c.momentum);
  EXPECT_EQ(d.buffers, c.buffers);
  EXPECT_EQ(d.integer("step"), 42);
  EXPECT_EQ(d.number("samples_seen"), 2688.5);
  EXPECT_THROW(d.integer("model"), Error);
  EXPECT_THROW(d.text("nothing"), Error);
}

TEST(CheckpointFormat, EveryTruncationIsDetected) {
  const std::vector<char> bytes = ckpt::encode(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    EXPECT_THROW(ckpt::decode(cut, "cut"), Error) << "cut to " << n << " bytes";
  }
  std::vector<char> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(ckpt::decode(longer, "longer"), Error);
}

TEST(CheckpointFormat, EveryFlippedBitIsDetected) {
  const std::vector<char> bytes = ckpt::encode(sample());
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit : {0, 5}) {
      std::vector<char> bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_THROW(ckpt::decode(bad, "flipped"), Error) << "byte " << i << " bit " << bit;
    }
}

// Arenas::Check (which checkpoint is the newest valid one, without its size in memory) reads the
// arenas in pieces of 1 MiB and keeps none of them, and says of every file what a decode that
// keeps them says: the same meta, or the same error, whichever byte was flipped or cut.
TEST(CheckpointFormat, CheckingTheArenasAsTheyStreamGivesTheSameVerdicts) {
  ckpt::Checkpoint c = sample();
  c.params.resize(700001);  // 2.8 MB: three pieces, the last one short
  for (size_t i = 0; i < c.params.size(); ++i) c.params[i] = static_cast<float>(i % 613) * 0.5f;
  const std::vector<char> bytes = ckpt::encode(c);
  const auto verdict = [](const std::vector<char>& b, ckpt::Arenas arenas, ckpt::Checkpoint* out) {
    size_t at = 0;
    const auto read = [&](char* dst, size_t n) {
      if (n) std::memcpy(dst, b.data() + at, n);
      at += n;
    };
    try {
      *out = ckpt::decode(b.size(), read, "file", nullptr, arenas);
      return std::string("valid");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  ckpt::Checkpoint kept, checked;
  ASSERT_EQ(verdict(bytes, ckpt::Arenas::Check, &checked), "valid");
  EXPECT_EQ(checked.meta, c.meta);
  EXPECT_EQ(checked.integer("step"), 42);
  EXPECT_TRUE(checked.params.empty() && checked.momentum.empty() && checked.buffers.empty());
  std::vector<size_t> at{bytes.size() - 1, bytes.size() - 17, bytes.size() / 2};
  for (size_t i = 0; i < bytes.size(); i += 65537) at.push_back(i);
  for (size_t piece = 1; piece <= 2; ++piece) at.push_back(100 + piece * (size_t{1} << 20));  // about the pieces' seams
  for (const size_t i : at) {
    std::vector<char> flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    const std::string want = verdict(flipped, ckpt::Arenas::Keep, &kept);
    EXPECT_NE(want, "valid") << "byte " << i;
    EXPECT_EQ(verdict(flipped, ckpt::Arenas::Check, &checked), want) << "byte " << i << " flipped";
    const std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<long>(i));
    EXPECT_EQ(verdict(cut, ckpt::Arenas::Check, &checked), verdict(cut, ckpt::Arenas::Keep, &kept))
        << "cut to " << i << " bytes";
  }
}

// The sections' checksums are zlib's CRC-32 (computed by ISA-L): checkpoints written before
// the change, and by other tools, check the same.
TEST(CheckpointFormat, SectionChecksumsAreZlibsCrc32) {
  ckpt::Checkpoint c = sample();
  c.params.resize(100003);  // long enough for the folded path, and an odd tail
  for (size_t i = 0; i < c.params.size(); ++i) c.params[i] = static_cast<float>(i % 977) * 0.37f;
  const std::vector<char> bytes = ckpt::encode(c);
  // Sections: u32 kind, u64 bytes, u32 CRC, payload; the meta section comes first, after the
  // 8-byte magic and the u32 version.
  size_t at = 12;
  for (int section = 0; section < 3; ++section) {
    uint64_t n = 0;
    uint32_t stored = 0;
    std::memcpy(&n, bytes.data() + at + 4, sizeof n);
    std::memcpy(&stored, bytes.data() + at + 12, sizeof stored);
    const auto* payload = reinterpret_cast<const Bytef*>(bytes.data() + at + 16);
    EXPECT_EQ(stored, static_cast<uint32_t>(crc32(0, payload, static_cast<uInt>(n)))) << "section " << section;
    at += 16 + n;
  }
}

// A store that reuses pages (in-memory snapshots) rewrites the checkpoint retention drops, kept
// as DIR/.spare, in place: the same inode, never listed or read, each new file exactly its
// bytes (a larger spare is cut to size).
TEST(CheckpointStore, ReusedPagesHoldExactlyTheNewCheckpoint) {
  const TempDir tmp;  // removed at the end, however the test ends
  const std::string dir = tmp.str();
  ckpt::CheckpointStore store(dir, 1, /*reuse_pages=*/true);
  const std::string spare = dir + "/.spare";
  ino_t spare_inode = 0;
  const size_t sizes[] = {5000, 9000, 3000, 3000, 7000};
  for (int64_t step = 1; step <= 5; ++step) {
    ckpt::Checkpoint c = sample();
    c.params.assign(sizes[step - 1], static_cast<float>(step));
    c.meta["step"] = std::to_string(step);
    const std::string path = store.write(ckpt::Encoded(c), step);
    const std::vector<std::string> listed = ckpt::list_checkpoints(dir);
    ASSERT_EQ(listed, std::vector<std::string>{path});
    const ckpt::Checkpoint back = ckpt::load_checkpoint(path);
    EXPECT_EQ(back.params, c.params) << "step " << step;
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    if (spare_inode) {
      EXPECT_EQ(st.st_ino, spare_inode) << "step " << step << " did not reuse the spare";
    }
    EXPECT_EQ(std::filesystem::exists(spare), step > 1) << "step " << step;
    spare_inode = 0;
    if (::stat(spare.c_str(), &st) == 0) spare_inode = st.st_ino;
  }
}

// sample() as the checkpoint of step `holds`, written by `store` under step `named`'s file name.
std::string write_sample(ckpt::CheckpointStore& store, int64_t holds, int64_t named) {
  ckpt::Checkpoint c = sample();
  c.meta["step"] = std::to_string(holds);
  return store.write(ckpt::Encoded(c), named);
}

// A run whose lock was taken over while it wrote a checkpoint (its host stopped for longer than
// the stale time, then went on) puts nothing into the directory: the lock is asked again before
// the rename, and the temporary file goes.
TEST(CheckpointStore, ALockLostDuringAWriteRenamesNothingIn) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  const std::unique_ptr<ckpt::DirectoryLock> lock = ckpt::DirectoryLock::acquire(dir, 0, [] { return false; });
  ASSERT_TRUE(lock);
  ckpt::CheckpointStore store(dir, 2);
  store.guard_with(lock.get());
  const std::string named = dir + "/" + ckpt::CheckpointStore::file_name(5);
  const std::string unfinished = named + ".tmp." + std::to_string(::getpid());
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "1", 1);
  std::string error = "(none)";
  std::thread writer([&] {
    try {
      write_sample(store, 5, 5);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  for (int i = 0; i < 10000 && !std::filesystem::exists(unfinished); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::ofstream taken(dir + "/lock.new");
    taken << "host=elsewhere\npid=1\nstate=held\n";
  }
  const bool taken_over = ::rename((dir + "/lock.new").c_str(), (dir + "/lock").c_str()) == 0;
  writer.join();
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  ASSERT_TRUE(taken_over);
  EXPECT_NE(error.find("lost the checkpoint directory's lock"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(named));
  EXPECT_FALSE(std::filesystem::exists(unfinished));
}

// A file named for one step that holds another (ckpt-000000500.hpck holding step 10, copied or
// renamed by hand) would be preferred by --resume auto over newer states: reading it is an error
// naming it, and find_latest skips it as it skips a damaged file. A name of another form says
// nothing about the step.
TEST(CheckpointStore, AFileWhoseNameSaysAnotherStepIsSkipped) {
  const TempDir tmp;  // removed at the end, however the test ends
  const std::string dir = tmp.str();
  ckpt::CheckpointStore store(dir, 5);
  const std::string valid = write_sample(store, 20, 20);
  const std::string misnamed = write_sample(store, 10, 500);
  const std::string says = "checkpoint " + misnamed + " holds step 10, not the step 500 its name says";
  try {
    ckpt::load_checkpoint(misnamed);
    ADD_FAILURE() << "a checkpoint named for step 500 holding step 10 was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  const ckpt::LatestCheckpoint latest = ckpt::find_latest(dir);
  EXPECT_EQ(latest.listed, 2u);
  ASSERT_TRUE(latest.found.has_value());
  EXPECT_EQ(latest.found->first, valid);
  EXPECT_EQ(latest.found->second.integer("step"), 20);
  ASSERT_EQ(latest.skipped.size(), 1u);
  EXPECT_NE(latest.skipped[0].find(says), std::string::npos) << latest.skipped[0];
  std::filesystem::rename(misnamed, dir + "/best.hpck");
  EXPECT_EQ(ckpt::load_checkpoint(dir + "/best.hpck").integer("step"), 10);
}

// A checkpoint of a later format (its magic right, its version higher: a newer hpctrain wrote it)
// is not damaged either: passed by, its resume moved it aside and went back to the older step,
// or started afresh. A version below this one's is damage, and passed by.
TEST(CheckpointStore, ANewerFormatIsNotPassedBy) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  ckpt::CheckpointStore store(dir, 5);
  const std::string older = write_sample(store, 10, 10);
  const std::string newest = write_sample(store, 20, 20);
  const auto set_version = [&](uint32_t v) {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);  // after the magic
    f.write(reinterpret_cast<const char*>(&v), sizeof v);
  };
  set_version(ckpt::kFormatVersion + 1);
  for (const ckpt::Arenas arenas : {ckpt::Arenas::Keep, ckpt::Arenas::Check}) {
    try {
      ckpt::find_latest(dir, arenas);
      ADD_FAILURE() << "a checkpoint of a newer format was passed by";
    } catch (const ckpt::NewerFormatCheckpoint& e) {
      EXPECT_EQ(std::string(e.what()), "checkpoint " + newest + " has checkpoint format version 2; this hpctrain reads "
                                       "version 1 (written by a newer hpctrain?); it is not passed by for an older "
                                       "one: run the hpctrain that wrote it, or move it out of " + dir);
    }
  }
  set_version(0);
  const ckpt::LatestCheckpoint latest = ckpt::find_latest(dir);
  ASSERT_TRUE(latest.found.has_value());
  EXPECT_EQ(latest.found->first, older);
  ASSERT_EQ(latest.skipped.size(), 1u);
}

// A checkpoint the system refuses to read (EACCES here; EIO, a stale NFS handle) is not damaged:
// --resume auto passed it by for an older one, whose resume moved it aside, and when every file
// failed alike (a permission, a memory limit) it started afresh. Read by an unprivileged user
// (root reads a file of mode 000), in a child process.
TEST(CheckpointStore, AnUnreadableCheckpointIsNotPassedBy) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  ckpt::CheckpointStore store(dir, 5);
  write_sample(store, 10, 10);
  const std::string newest = write_sample(store, 20, 20);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(newest.c_str(), 0), 0);
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::geteuid() == 0 && ::setuid(65534) != 0) ::_exit(3);
    std::string what;
    try {
      const ckpt::LatestCheckpoint latest = ckpt::find_latest(dir);
      what = latest.found ? "found " + latest.found->first : "found none";
    } catch (const ckpt::UnreadableCheckpoint& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = std::string("another error: ") + e.what();
    }
    ::_exit(::write(report[1], what.data(), what.size()) == static_cast<ssize_t>(what.size()) ? 0 : 4);
  }
  ::close(report[1]);
  std::string what;
  char buf[512];
  for (ssize_t n; (n = ::read(report[0], buf, sizeof buf)) > 0;) what.append(buf, static_cast<size_t>(n));
  ::close(report[0]);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not run as uid 65534, status " << status;
  EXPECT_NE(what.find("cannot read checkpoint " + newest + ": Permission denied; an unreadable checkpoint is not "
                      "passed by for an older one: make it readable, or move it out of " + dir),
            std::string::npos)
      << what;
}

// A live holder whose clock runs behind: its record looks stale by its own time, but it changes.
// The waiter watches it for the stale time past its wait, then refuses; it waited for ever. The
// holder here is another open file description of this process, rewriting its record.
TEST(DirectoryLock, AHolderWhoseClockRunsBehindIsWaitedForOnlySoLong) {
  setenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS", "1", 1);
  const TempDir tmp;
  const std::string dir = tmp.str(), path = dir + "/lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(fd, F_OFD_SETLK, &l), 0);
  const auto beat = [&](int i) {
    const std::string text = "host=behind\npid=1\nunix_time=" + std::to_string(::time(nullptr) - 10) +
                             "\nstate=held\nbeat=" + std::to_string(i) + "\n";
    return ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()) &&
           ::ftruncate(fd, static_cast<off_t>(text.size())) == 0;
  };
  ASSERT_TRUE(beat(0));  // before the waiter's first look
  std::atomic<bool> done{false};
  std::thread holder([&] {
    for (int i = 1; !done && beat(i); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::string what;
  try {
    const auto lock = ckpt::DirectoryLock::acquire(dir, 0, [&] { return waited() > 20; });
    what = lock ? "took the lock of a live holder" : "still waiting after 20 s";
  } catch (const Error& e) {
    what = e.what();
  }
  done = true;
  holder.join();
  ::close(fd);
  unsetenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS");
  EXPECT_NE(what.find("is in use by another run (host behind pid 1"), std::string::npos) << what;
}

// A stat of the lock file that fails for a moment (EIO, ESTALE on NFS; ELOOP here: the directory's
// path is a link, turned into a loop for a while) marked the lock lost for good, and the run ended
// without its checkpoint. A failure that lasts a third of the stale time still loses it.
TEST(DirectoryLock, AMomentsFailedStatDoesNotLoseTheLock) {
  namespace fs = std::filesystem;
  setenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS", "9", 1);  // looked at every 0.6 s; lost after 3 s unanswered
  const TempDir tmp;
  const std::string link = tmp.str() + "/dir", loop = tmp.str() + "/loop", back = tmp.str() + "/back";
  fs::create_directory(tmp.str() + "/real");
  fs::create_directory_symlink("real", link);
  const auto point = [&](bool looped) {  // the link renamed over: to itself, or back to the directory
    if (looped) fs::create_symlink("dir", loop), fs::rename(loop, link);
    else fs::create_directory_symlink("real", back), fs::rename(back, link);
  };
  const std::unique_ptr<ckpt::DirectoryLock> lock = ckpt::DirectoryLock::acquire(link, 0, [] { return false; });
  ASSERT_TRUE(lock);
  point(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const bool during = lock->held();
  point(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_TRUE(during);
  EXPECT_TRUE(lock->held());
  EXPECT_FALSE(lock->lost());
  // Lost once a third of the stale time has passed unanswered: looked for until then, not after a
  // fixed 4 s (which left the lock's own thread, looking every 0.6 s, 0.4 s to make its first look
  // on a loaded machine: a first look by this held() would have started the 3 s only then).
  point(true);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (lock->held() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(lock->held());
  point(false);
  unsetenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS");
}

// A file named like a checkpoint of a step past int64_t is no checkpoint hpctrain wrote: listing
// the directory (--resume auto, evaluate DIR, inspect DIR, retention) passes it by, as any other
// file, rather than failing on its number.
TEST(CheckpointStore, ANameWithAStepPastInt64IsNotACheckpoint) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  ckpt::CheckpointStore store(dir, 5);
  const std::string valid = write_sample(store, 4, 4);
  for (const char* name : {"ckpt-99999999999999999999999.hpck", "ckpt-9223372036854775808.hpck", "ckpt--5.hpck"})
    std::ofstream(dir + "/" + name) << "not a checkpoint";
  const ckpt::LatestCheckpoint latest = ckpt::find_latest(dir);
  EXPECT_EQ(latest.listed, 1u);
  ASSERT_TRUE(latest.found.has_value());
  EXPECT_EQ(latest.found->first, valid);
  EXPECT_TRUE(latest.skipped.empty());
}

// The test hook that lets a kill land between a checkpoint's write and its rename waits for that
// writer's pause: a run that also takes snapshots has a second writer, whose pause said nothing
// about the checkpoint (the kill then came before the checkpoint's file existed).
TEST(AsyncWriter, APauseBeforeRenameIsTheWritersOwn) {
  const TempDir tmp;
  ckpt::CheckpointStore checkpoints(tmp.str() + "/ckpt", 5), snapshots(tmp.str() + "/snap", 5);
  ::setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME"); }
  } unset;
  ckpt::AsyncWriter checkpoint_writer(checkpoints), snapshot_writer(snapshots);
  snapshot_writer.submit(sample(), 7);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!snapshot_writer.paused_before_rename() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(snapshot_writer.paused_before_rename()) << "the snapshot's write never reached its pause";
  EXPECT_TRUE(checkpoint_writer.idle());
  EXPECT_FALSE(checkpoint_writer.paused_before_rename()) << "the snapshot writer's pause passed for the checkpoint writer's";
  snapshot_writer.wait();
  EXPECT_FALSE(snapshot_writer.paused_before_rename());
  EXPECT_EQ(ckpt::list_checkpoints(snapshots.dir()).size(), 1u);
}

// A write that fails reaches the step loop once, as its own exception, at the next wait or
// submit; the writer then goes on. (Its thread hands the failure over and keeps no reference:
// under ThreadSanitizer the exception's last release raced the reader's what().)
TEST(AsyncWriter, AFailedWriteIsTheCallersOnceAndTheWriterGoesOn) {
  const TempDir tmp;
  ckpt::CheckpointStore store(tmp.str(), 5);
  ckpt::AsyncWriter writer(store);
  writer.submit(sample(), 3, [] { throw std::runtime_error("planted: the fill failed"); });
  try {
    writer.wait();
    ADD_FAILURE() << "the failed write was not said";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "planted: the fill failed");
  }
  EXPECT_NO_THROW(writer.wait());  // said once
  EXPECT_TRUE(ckpt::list_checkpoints(tmp.str()).empty());
  writer.submit(sample(), 4);
  writer.wait();
  EXPECT_EQ(writer.completed().first, 1);
  EXPECT_EQ(ckpt::list_checkpoints(tmp.str()).size(), 1u);
}

// A checkpoint writer counts its bytes as they are synced, chunk by chunk (HPCTRAIN_TEST_SLOW_WRITE:
// 4 chunks, 50 ms before each sync): never backwards, to the file's size; wait_for says whether the
// write is over and never throws: a failure is kept for wait().
TEST(AsyncWriter, CountsSyncedBytesAndItsTimedWaitNeverThrows) {
  const TempDir tmp;
  ckpt::CheckpointStore store(tmp.str(), 5);
  ::setenv("HPCTRAIN_TEST_SLOW_WRITE", "0.05:4", 1);
  struct Unset {
    ~Unset() { ::unsetenv("HPCTRAIN_TEST_SLOW_WRITE"); }
  } unset;
  ckpt::AsyncWriter writer(store);
  const uint64_t chunks = writer.progress().chunks.load();
  writer.submit(sample(), 7);
  uint64_t last = 0, seen = 0;
  while (!writer.wait_for(0.01)) {
    const uint64_t synced = writer.progress().synced.load();
    EXPECT_GE(synced, last);
    if (synced != last) ++seen;
    last = synced;
  }
  EXPECT_GE(seen, 2u) << "the bytes were not counted as they were synced";
  const std::string file = writer.last_written();
  EXPECT_EQ(writer.progress().synced.load(), std::filesystem::file_size(file));
  EXPECT_EQ(writer.progress().total.load(), std::filesystem::file_size(file));
  EXPECT_EQ(writer.progress().chunks.load(), chunks + 4);
  writer.submit(sample(), 8, [] { throw std::runtime_error("planted: the fill failed"); });
  bool over = false;
  EXPECT_NO_THROW(over = writer.wait_for(10));
  EXPECT_TRUE(over);
  EXPECT_THROW(writer.wait(), std::runtime_error);
}

TEST(Heartbeat, ReadsBackWhatWasWritten) {
  const TempDir tmp;  // removed at the end, however the test ends
  const std::string dir = tmp.str();
  EXPECT_TRUE(ckpt::read_heartbeat(dir).empty());
  ckpt::write_heartbeat(dir, 12, 1, "stopped");
  const auto beat = ckpt::read_heartbeat(dir);
  EXPECT_EQ(beat.at("step"), "12");
  EXPECT_EQ(beat.at("epoch"), "1");
  EXPECT_EQ(beat.at("state"), "stopped");
  EXPECT_EQ(beat.at("pid"), std::to_string(::getpid()));
  EXPECT_GT(std::stoll(beat.at("unix_time")), 0);
  EXPECT_EQ(ckpt::heartbeat_step(beat), 12);
}

// The heartbeat a process that ends at once leaves (a stop at once, from the signal thread): the
// last beat's position with state "stopped" and the exit code, the run's own lines kept; nothing
// before the run's first beat or after its own last one.
TEST(Heartbeat, AStopAtOnceLeavesStoppedNotTraining) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  ckpt::prepare_final_heartbeat(dir, "resumed_from=3\nresumed_source=checkpoint\n");
  ckpt::write_final_heartbeat(130);
  EXPECT_TRUE(ckpt::read_heartbeat(dir).empty()) << "written before the run's first beat";
  ckpt::write_heartbeat(dir, 7, 1, "training");
  ckpt::arm_final_heartbeat(9, 1);
  ckpt::write_final_heartbeat(130);
  const auto beat = ckpt::read_heartbeat(dir);
  EXPECT_EQ(beat.at("step"), "9");
  EXPECT_EQ(beat.at("epoch"), "1");
  EXPECT_EQ(beat.at("state"), "stopped");
  EXPECT_EQ(beat.at("exit_code"), "130");
  EXPECT_EQ(beat.at("resumed_from"), "3");
  EXPECT_EQ(beat.at("pid"), std::to_string(::getpid()));
  EXPECT_GT(std::stoll(beat.at("unix_time")), 0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/heartbeat.tmp"));
  ckpt::write_heartbeat(dir, 12, 2, "done");
  ckpt::disarm_final_heartbeat();
  ckpt::write_final_heartbeat(143);
  EXPECT_EQ(ckpt::read_heartbeat(dir).at("state"), "done");
}

// A process that ends at once after another run took its directory over (it was stopped, or cut
// off, for the lock's stale time) leaves the new owner's heartbeat as it is.
TEST(Heartbeat, AStopAtOnceLeavesAnotherRunsHeartbeatAlone) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  const auto lock = ckpt::DirectoryLock::acquire(dir, 0, {});
  ckpt::prepare_final_heartbeat(dir, "");
  ckpt::write_heartbeat(dir, 7, 1, "training");
  ckpt::arm_final_heartbeat(7, 1);
  ckpt::write_final_heartbeat(130);
  EXPECT_EQ(ckpt::read_heartbeat(dir).at("state"), "stopped") << "while the lock is this process's";
  // As acquire() takes a stale lock over: a file of its own renamed over DIR/lock.
  std::ofstream(dir + "/lock.new") << "host=other\npid=1\n";
  std::filesystem::rename(dir + "/lock.new", dir + "/lock");
  ckpt::write_heartbeat(dir, 20, 2, "training", "hpcrun_token=theirs\nhpcrun_attempt=2\n");
  ckpt::arm_final_heartbeat(9, 1);
  ckpt::write_final_heartbeat(130);
  const auto beat = ckpt::read_heartbeat(dir);
  EXPECT_EQ(beat.at("state"), "training");
  EXPECT_EQ(beat.at("step"), "20");
  EXPECT_EQ(beat.at("hpcrun_token"), "theirs");
  ckpt::disarm_final_heartbeat();
}

// The lock file that the process removes itself as it ends (its watchdog's last words, a stop at
// once) is not said to be another run's doing: the refresher, looking meanwhile, blamed one.
TEST(DirectoryLock, ItsRemovalAtExitIsNotBlamedOnAnotherRun) {
  const TempDir tmp;
  const auto lock = ckpt::DirectoryLock::acquire(tmp.str(), 0, {});
  ckpt::remove_lock_at_exit();
  EXPECT_FALSE(std::filesystem::exists(tmp.str() + "/lock"));
  EXPECT_FALSE(lock->held());
  const std::string how = lock->how_lost();
  EXPECT_EQ(how, "this process removed its lock file as it ends (its watchdog, or a stop at once)");
  EXPECT_EQ(how.find("another run"), std::string::npos) << how;
}

// The lock file is no other user's to open, whatever the umask: one they could open for reading
// was one they could read-lock, which blocks the write lock (a crashed run's leftover, held so, had
// the relaunch refused at once as "in use by another run"). So 0600: made anew, taken over from a
// stale holder, and one an earlier version left 0644.
TEST(DirectoryLock, ItsFileIsNoOtherUsersToOpen) {
  const mode_t umask_was = ::umask(0);
  const auto mode_of = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  const TempDir fresh, left, stale;
  {
    const auto lock = ckpt::DirectoryLock::acquire(fresh.str(), 0, {});
    EXPECT_EQ(mode_of(fresh.str() + "/lock"), 0600) << "made anew";
  }
  const int old = ::open((left.str() + "/lock").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(old, 0);
  ::close(old);
  {
    const auto lock = ckpt::DirectoryLock::acquire(left.str(), 0, {});
    EXPECT_EQ(mode_of(left.str() + "/lock"), 0600) << "left 0644";
  }
  setenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS", "1", 1);
  const int held = ::open((stale.str() + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(held, 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(held, F_OFD_SETLK, &l), 0);
  const std::string record = "host=gone\npid=1\nunix_time=" + std::to_string(::time(nullptr) - 100) + "\nstate=held\n";
  ASSERT_EQ(::pwrite(held, record.data(), record.size(), 0), static_cast<ssize_t>(record.size()));
  {
    const auto lock = ckpt::DirectoryLock::acquire(stale.str(), 30, {});
    ASSERT_TRUE(lock);
    EXPECT_EQ(mode_of(stale.str() + "/lock"), 0600) << "taken over";
  }
  ::close(held);
  unsetenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS");
  ::umask(umask_was);
}

// The step a launcher reads: a whole number of 0 or more, else -1 (nothing it can compare with a
// checkpoint's step; atoll read "12abc" as 12 and "x" as 0).
TEST(Heartbeat, ItsStepIsAWholeNumberOrNone) {
  using Beat = std::map<std::string, std::string>;
  EXPECT_EQ(ckpt::heartbeat_step(Beat{{"step", "0"}}), 0);
  EXPECT_EQ(ckpt::heartbeat_step(Beat{{"step", "4420"}, {"epoch", "4"}}), 4420);
  for (const char* bad : {"", "x", "12abc", "-1", " 12", "99999999999999999999"})
    EXPECT_EQ(ckpt::heartbeat_step(Beat{{"step", bad}}), -1) << bad;
  EXPECT_EQ(ckpt::heartbeat_step(Beat{{"epoch", "4"}}), -1);
}

// hpcrun's marker is obeyed only with its own token (HPCRUN_TOKEN in the ranks').
TEST(MembershipMarker, OnlyTheAskingHpcrunsTokenMakesItOurs) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  EXPECT_EQ(ckpt::membership_marker(dir, "0123456789abcdef"), ckpt::MembershipMarker::None);
  std::ofstream(dir + "/membership-change") << "token=0123456789abcdef\npid=7\n";
  EXPECT_EQ(ckpt::membership_marker(dir, "0123456789abcdef"), ckpt::MembershipMarker::Ours);
  EXPECT_EQ(ckpt::membership_marker(dir, "0123456789abcdee"), ckpt::MembershipMarker::Stale);
  EXPECT_EQ(ckpt::membership_marker(dir, ""), ckpt::MembershipMarker::Stale);  // a plain hpctrain
  std::ofstream(dir + "/membership-change") << "hpcrun pid 7 changes the job's hosts\n";  // an older hpcrun's
  EXPECT_EQ(ckpt::membership_marker(dir, ""), ckpt::MembershipMarker::Stale);
}

// The heartbeat and hpcrun's membership-change marker were written through an ofstream, 0666
// less the umask: under umask 000 any user could rewrite the state and step that hpcrun acts on
// (the token it checks is in the file), or plant a change of hosts. 0644, as the checkpoints.
TEST(MembershipMarker, HeartbeatAndMarkerAreNoOneElsesToWriteUnderUmask000) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  const mode_t umask_before = ::umask(0);
  ckpt::write_heartbeat(dir, 3, 0, "training");
  ckpt::write_membership_marker(dir, "0123456789abcdef");
  ::umask(umask_before);
  EXPECT_EQ(ckpt::membership_marker(dir, "0123456789abcdef"), ckpt::MembershipMarker::Ours);
  for (const char* name : {"heartbeat", "membership-change"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 07777, 0644u) << name;
  }
}

// On a full file system the new heartbeat fails at its flush: the last good one stays (an empty
// file renamed over it would tell hpcrun nothing), and no temporary file is left. A last beat
// (failed, stopped, done) is written over it in place instead, in the block it holds: a run that
// the full disk ended (its checkpoint could not be written) said "training" for ever, as a hung
// one does; so did one stopped at once there (write_final_heartbeat). Needs root to mount a
// small tmpfs. The warning says why, once.
TEST(Heartbeat, AFullFileSystemKeepsTheLastOne) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (mounts a tmpfs); CI runs as root";
  const TempDir tmp;
  const std::string dir = tmp.str();
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=64k tmpfs " + dir).c_str()), 0);
  struct Unmount {
    std::string dir;
    ~Unmount() { EXPECT_EQ(std::system(("umount " + dir).c_str()), 0); }
  } unmount{dir};  // however the test ends, before the TempDir goes
  ckpt::write_heartbeat(dir, 12, 1, "training");
  {
    std::ofstream fill(dir + "/fill");
    const std::string block(4096, 'x');
    while (fill << block && fill.flush()) {
    }
  }
  ::testing::internal::CaptureStderr();
  ckpt::write_heartbeat(dir, 13, 1, "training");
  ckpt::write_heartbeat(dir, 13, 1, "training");
  const std::string said = ::testing::internal::GetCapturedStderr();  // the reason, once
  const std::string line = "warning: cannot write heartbeat " + dir + "/heartbeat.tmp: No space left on device (said once)\n";
  EXPECT_NE(said.find(line), std::string::npos) << said;
  EXPECT_EQ(said.find("heartbeat", said.find(line) + line.size()), std::string::npos) << said;
  const auto beat = ckpt::read_heartbeat(dir);
  EXPECT_EQ(beat.count("step") ? beat.at("step") : "(none)", "12");
  EXPECT_FALSE(std::filesystem::exists(dir + "/heartbeat.tmp"));
  using Beat = std::map<std::string, std::string>;
  const auto last_words = [&dir] {
    const Beat b = ckpt::read_heartbeat(dir);
    return Beat{{"step", b.count("step") ? b.at("step") : ""},
                {"state", b.count("state") ? b.at("state") : ""},
                {"exit_code", b.count("exit_code") ? b.at("exit_code") : ""}};
  };
  ckpt::write_heartbeat(dir, 14, 1, "failed", "exit_code=2\n");
  EXPECT_EQ(last_words(), (Beat{{"step", "14"}, {"state", "failed"}, {"exit_code", "2"}}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/heartbeat.tmp"));
  ckpt::prepare_final_heartbeat(dir, "");
  ckpt::arm_final_heartbeat(15, 1);
  ckpt::write_final_heartbeat(130);
  ckpt::disarm_final_heartbeat();
  EXPECT_EQ(last_words(), (Beat{{"step", "15"}, {"state", "stopped"}, {"exit_code", "130"}}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/heartbeat.tmp"));
}

// A process that ends at once (SIGINT, a second SIGTERM) while its main thread replaces the
// heartbeat leaves no heartbeat.tmp: the write under way finishes, and none starts after. Run in
// a child process, since the end it asks for holds for the rest of the process.
TEST(Heartbeat, AnEndAtOnceLeavesNoTemporaryFile) {
  const TempDir tmp;
  const std::string dir = tmp.str();
  const auto end_while_writing = [&dir] {
    std::atomic<bool> stop{false};
    std::atomic<int64_t> written{0};
    std::thread writer([&] {
      while (!stop.load()) ckpt::write_heartbeat(dir, written.fetch_add(1) + 1, 0, "training");
    });
    while (written.load() < 200) std::this_thread::yield();
    ckpt::remove_unfinished_files();
    bool clean = true;
    for (int i = 0; i < 200 && clean; ++i, std::this_thread::sleep_for(std::chrono::microseconds(250)))
      clean = !std::filesystem::exists(dir + "/heartbeat.tmp");
    stop = true;
    writer.join();
    const int64_t step = ckpt::heartbeat_step(ckpt::read_heartbeat(dir));
    ckpt::write_heartbeat(dir, step + 1, 0, "done");  // after the end: nothing more
    const bool unchanged = ckpt::heartbeat_step(ckpt::read_heartbeat(dir)) == step && step > 0;
    std::fprintf(stderr, "clean=%d unchanged=%d\n", clean, unchanged);
    std::_Exit(clean && unchanged ? 0 : 1);
  };
  EXPECT_EXIT(end_while_writing(), ::testing::ExitedWithCode(0), "clean=1 unchanged=1");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"heartbeat"});
}

// Rank 0 writes a checkpoint and a snapshot at once, on two threads (a stop writes both): an end
// at once removes the temporary file of each write still under way, also after the other ended.
// (One shared mark was cleared by whichever ended first.) In a child process, as above. Each
// write waits before its rename for what it must follow, not for a fixed time (a 0.5 s gap
// between two 1.5 s pauses failed at random on a loaded machine): the first for the second's
// file written whole, the second for the end at once.
TEST(WriteFileAtomically, AnEndAtOnceRemovesEveryWritersTemporaryFile) {
  const TempDir tmp;
  const std::string first = tmp.file("first"), second = tmp.file("second");
  const auto end_while_two_write = [&] {
    const std::string suffix = ".tmp." + std::to_string(::getpid());
    std::atomic<bool> second_written{false}, ended{false};
    const auto wait_for = [](const std::atomic<bool>& flag) {  // a minute at most: a failure, not a hang
      for (int i = 0; i < 60000 && !flag.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    const std::vector<char> a_bytes(16, 'a'), b_bytes(16, 'b');
    std::thread a([&] {
      ckpt::write_file_atomically(first, {{a_bytes.data(), a_bytes.size()}}, "", [&] { wait_for(second_written); });
    });
    std::thread b([&] {
      try {
        ckpt::write_file_atomically(second, {{b_bytes.data(), b_bytes.size()}}, "", [&] {
          second_written = true;
          wait_for(ended);
        });
      } catch (const Error&) {  // its temporary file removed: the rename fails
      }
    });
    a.join();  // the first write ended; the second waits in its own
    const bool under_way = std::filesystem::exists(second + suffix);
    ckpt::remove_unfinished_files();
    const bool removed = !std::filesystem::exists(second + suffix);
    ended = true;
    b.join();
    std::fprintf(stderr, "under_way=%d removed=%d\n", under_way, removed);
    std::_Exit(under_way && removed ? 0 : 1);
  };
  EXPECT_EXIT(end_while_two_write(), ::testing::ExitedWithCode(0), "under_way=1 removed=1");
}

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The temporary file's name (PATH.tmp.PID) is easy to guess: a link or a file another user put
// there first (in /tmp, beside an export's --output) is never written through nor renamed into
// place. Before, the open followed the link and truncated its target (a file of the user's own),
// and wrote the bytes into a planted file, still the planter's to read (here: a hard link to it).
TEST(WriteFileAtomically, APlantedTemporaryFileIsNeitherWrittenThroughNorKept) {
  const TempDir tmp;
  const std::string out = tmp.file("model.onnx"), tmp_name = out + ".tmp." + std::to_string(::getpid());
  const std::string precious = tmp.file("precious"), planted_view = tmp.file("planted-view");
  std::ofstream(precious) << "the user's own notes\n";
  ASSERT_EQ(::symlink(precious.c_str(), tmp_name.c_str()), 0);
  ckpt::write_file_atomically(out, std::vector<char>{'o', 'n', 'e'});
  EXPECT_EQ(text_of(precious), "the user's own notes\n");
  EXPECT_EQ(text_of(out), "one");
  EXPECT_FALSE(std::filesystem::is_symlink(out));

  std::ofstream(tmp_name) << "planted\n";
  ASSERT_EQ(::link(tmp_name.c_str(), planted_view.c_str()), 0);
  ckpt::write_file_atomically(out, std::vector<char>{'t', 'w', 'o'});
  EXPECT_EQ(text_of(planted_view), "planted\n");
  EXPECT_EQ(text_of(out), "two");
  EXPECT_FALSE(std::filesystem::exists(tmp_name));
}

// A PID that no process has now: a child's, reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

// Whether a write lock is held on `path` by another open file description (any process's).
bool write_locked(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  const bool asked = fd >= 0 && ::fcntl(fd, F_OFD_GETLK, &whole) == 0;
  if (fd >= 0) ::close(fd);
  return asked && whole.l_type != F_UNLCK;
}

// The temporary file's PID (PATH.tmp.PID) is its writer's host's: on shared storage (NFS, EFS)
// another host's. Judged by kill(PID, 0) here alone, a live write on another host was removed from
// under it (its PID none here), and a dead writer's file was kept for ever where a process here had
// its number. The writer's lock decides now: held (an open file description of another host's, or
// here of this test's), kept whatever the PID; none, and the PID a process here, once unchanged
// for an hour; none, and the PID no process here, removed at once, as before. An export's write
// holds the lock from its file's creation until its rename.
TEST(WriteFileAtomically, AbandonedWritesAreJudgedByTheWritersLockNotThePidAlone) {
  const TempDir tmp;
  const std::string out = tmp.file("model.onnx");
  const auto temporary = [&](pid_t pid) { return out + ckpt::kTemporaryInfix + std::to_string(pid); };
  const auto plant = [&](const std::string& path, double age_seconds) {
    std::ofstream(path) << "a write under way\n";
    const timespec then{::time(nullptr) - static_cast<time_t>(age_seconds), 0}, times[2] = {then, then};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  };
  // Another host's live write: its PID is none here, and it holds its lock.
  const std::string remote_live = temporary(dead_pid());
  plant(remote_live, 5);
  const int remote_writer = ::open(remote_live.c_str(), O_WRONLY | O_CLOEXEC);
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(remote_writer, F_OFD_SETLK, &whole), 0) << std::strerror(errno);
  // A dead writer's file whose PID a process here has now (an unrelated one), two hours old.
  const pid_t unrelated = ::fork();
  if (unrelated == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string reused_pid = temporary(unrelated);
  plant(reused_pid, 7200);
  // A write under way here by an hpctrain without the lock (or before it took it): young, kept.
  const std::string young = temporary(::getppid());
  plant(young, 5);
  // A write killed here: removed at once, as before.
  const std::string killed = temporary(dead_pid());
  plant(killed, 5);
  ckpt::remove_abandoned_writes(out);
  ::kill(unrelated, SIGKILL);
  ::waitpid(unrelated, nullptr, 0);
  EXPECT_TRUE(std::filesystem::exists(remote_live)) << "a live write on another host was removed";
  EXPECT_FALSE(std::filesystem::exists(reused_pid)) << "kept for ever: its PID is another process's now";
  EXPECT_TRUE(std::filesystem::exists(young));
  EXPECT_FALSE(std::filesystem::exists(killed));
  ::close(remote_writer);  // its writer gone: the next look removes it
  ckpt::remove_abandoned_writes(out);
  EXPECT_FALSE(std::filesystem::exists(remote_live));
  EXPECT_TRUE(std::filesystem::exists(young));

  // write_file_atomically holds the lock while its file waits for the rename.
  const std::string gate = tmp.file("gate");
  std::ofstream(gate) << "";
  ::setenv("HPCTRAIN_TEST_HOLD_BEFORE_RENAME", ("m2.onnx:" + gate).c_str(), 1);
  std::thread writer([&] { ckpt::write_file_atomically(tmp.file("m2.onnx"), std::vector<char>{'m'}, "", true); });
  const std::string own = tmp.file("m2.onnx") + ckpt::kTemporaryInfix + std::to_string(::getpid());
  for (int i = 0; i < 6000 && !std::filesystem::exists(own); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its descriptor closed, before the rename
  EXPECT_TRUE(write_locked(own));
  std::filesystem::remove(gate);
  writer.join();
  ::unsetenv("HPCTRAIN_TEST_HOLD_BEFORE_RENAME");
  EXPECT_EQ(text_of(tmp.file("m2.onnx")), "m");
  EXPECT_FALSE(std::filesystem::exists(own));
}

// A file replaced keeps its permission bits, as torch.save and cp over an existing file keep
// them: a model its owner made private stays private (it became 644 under umask 022). A new
// file takes the umask's.
TEST(WriteFileAtomically, AReplacedFileKeepsItsModeANewOneTakesTheUmasks) {
  const TempDir tmp;
  const std::string out = tmp.file("model.onnx"), fresh = tmp.file("fresh.onnx");
  const mode_t old_umask = ::umask(022);
  ckpt::write_file_atomically(out, std::vector<char>{'a'});
  ASSERT_EQ(::chmod(out.c_str(), 0600), 0);
  ckpt::write_file_atomically(out, std::vector<char>{'b'});
  ::umask(027);
  ckpt::write_file_atomically(fresh, std::vector<char>{'c'});
  ::umask(old_umask);
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(text_of(out), "b");
}

}  // namespace
}  // namespace hpc::testing

#include "core/hash.hpp"
#include "data/loader.hpp"
#include "data/shards.hpp"
#include "train/engine/engine.hpp"
#include "train/engine/training_state.hpp"
#include "train/state/checkpointing.hpp"

namespace hpc::testing {
namespace {

// An fp16 run's dynamic loss scale goes into its checkpoints and comes back for the resumed
// run's engine; the other precisions' checkpoints carry none. A damaged value is an error.
TEST(CheckpointPosition, TheLossScaleTravelsInCheckpoints) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Mlp;
  spec.input = Shape{28, 28, 1};
  nn::Model<float> model(spec);
  model.init(1);
  optim::Sgd<float> sgd(model.params(), optim::SgdSpec{});
  train::TrainOptions o;
  const train::RunPosition at{10, 1, 2, 64, 640};
  const ckpt::Checkpoint plain = train::make_checkpoint(o, model, sgd, 1, at);
  EXPECT_EQ(plain.meta.count("loss_scale"), 0u);
  EXPECT_FALSE(train::loss_scaler_of(plain).has_value());

  ckpt::Checkpoint scaled = train::make_checkpoint(o, model, sgd, 1, at);
  train::record_loss_scaler(scaled, optim::LossScalerState{8192.0, 37, 3});
  ckpt::Checkpoint c = ckpt::decode(ckpt::encode(scaled), "test");
  EXPECT_EQ(train::check_resumable(c, o, model, 60000).step, 10);
  const std::optional<optim::LossScalerState> back = train::loss_scaler_of(c);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->scale, 8192.0);
  EXPECT_EQ(back->good_steps, 37);
  EXPECT_EQ(back->skipped, 3);
  EXPECT_NE(train::state_checksum(c), train::state_checksum(plain)) << "the scaler is part of the state";

  c.meta["loss_scale"] = "0.25";
  try {
    train::check_resumable(c, o, model, 60000);
    ADD_FAILURE() << "a loss scale below 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scale"), std::string::npos) << e.what();
  }
}

// Each rank's training sums of the epoch so far go into a checkpoint taken inside it, exactly, and
// come back with its position (a resumed epoch's line then covers all of its steps); a record
// reused at an epoch's start (as snapshots reuse theirs) drops them; a checkpoint without them (one
// written before they were recorded) has none; a malformed record is an error, not state.
TEST(CheckpointPosition, TheEpochsSumsTravelInCheckpoints) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Mlp;
  spec.input = Shape{28, 28, 1};
  nn::Model<float> model(spec);
  train::TrainOptions o;
  train::RunPosition at{10, 1, 2, 64, 640};
  at.epoch_sums = {0.1 + 0.2, 17, 32, 1.0 / 3, 15, 32};  // 2 ranks: digits a short print would lose
  ckpt::Checkpoint c;
  train::record_run(c, o, train::ModelIdentity::of(model), 2, at);
  c = ckpt::decode(ckpt::encode(c), "test");
  EXPECT_EQ(train::recorded_position(c).epoch_sums, at.epoch_sums);
  const std::string with = train::state_checksum(c);
  train::record_position(c, train::RunPosition{20, 2, 0, 64, 1280});
  EXPECT_EQ(c.meta.count("epoch_train_sums"), 0u);
  EXPECT_TRUE(train::recorded_position(c).epoch_sums.empty());
  train::record_position(c, at);
  c.meta.erase("epoch_train_sums");
  EXPECT_TRUE(train::recorded_position(c).epoch_sums.empty());
  EXPECT_EQ(train::state_checksum(c), with) << "the sums are no part of the state";
  // At an epoch's end, saved before that epoch was ended: its sums, images and seconds come back,
  // and the epoch counts as unended; a record reused at the next position drops all three.
  train::RunPosition closing{20, 2, 0, 64, 1280};
  closing.epoch_sums = at.epoch_sums;
  closing.epoch_images = 640;
  closing.epoch_seconds = 1.25;
  train::record_position(c, closing);
  const train::RunPosition back = train::recorded_position(ckpt::decode(ckpt::encode(c), "test"));
  EXPECT_TRUE(back.epoch_unended());
  EXPECT_EQ(back.epoch_sums, closing.epoch_sums);
  EXPECT_EQ(back.epoch_images, 640);
  EXPECT_EQ(back.epoch_seconds, 1.25);
  EXPECT_EQ(train::state_checksum(c), train::state_checksum([&] {
              ckpt::Checkpoint ended = c;
              train::record_position(ended, train::RunPosition{20, 2, 0, 64, 1280});
              return ended;
            }()))
      << "whether the epoch was ended is no part of the state";
  c.meta["epoch_train_seconds"] = "-1";
  EXPECT_THROW(train::recorded_position(c), Error);
  train::record_position(c, train::RunPosition{25, 2, 5, 64, 1600});
  EXPECT_FALSE(train::recorded_position(c).epoch_unended());
  EXPECT_EQ(c.meta.count("epoch_train_images") + c.meta.count("epoch_train_seconds"), 0u);
  train::record_position(c, at);
  for (const char* bad : {"[]", "[1,2]", "[1,2,-3]", "[1,2,null]", "1,2,3", "[\"1\",2,3]"}) {
    c.meta["epoch_train_sums"] = bad;
    try {
      train::recorded_position(c);
      ADD_FAILURE() << "epoch_train_sums " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("epoch_train_sums is not a JSON array"), std::string::npos) << e.what();
    }
  }
}

// Packed shards' class names go into the checkpoint with a digest of classes.txt, and come back;
// a checkpoint without them (other datasets, or written before they were recorded) has none, and
// a malformed record is an error.
TEST(CheckpointRecord, ClassNamesTravelInCheckpoints) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Mlp;
  spec.input = Shape{8, 8, 3};
  spec.classes = 2;
  nn::Model<float> model(spec);
  train::TrainOptions o;
  const train::RunPosition at{10, 1, 2, 64, 640};
  ckpt::Checkpoint c;
  train::record_run(c, o, train::ModelIdentity::of(model, {"cat", "dog"}), 1, at);
  c = ckpt::decode(ckpt::encode(c), "test");
  EXPECT_EQ(c.text("class_names"), "[\"cat\",\"dog\"]");
  EXPECT_EQ(c.text("classes_digest"), data::class_names_digest({"cat", "dog"}));
  const std::string classes_txt = "cat\ndog\n";  // as hpcdata pack writes classes.txt
  EXPECT_EQ(c.text("classes_digest"), fnv1a_hex(classes_txt.data(), classes_txt.size()));
  EXPECT_EQ(train::class_names_of(c), (std::vector<std::string>{"cat", "dog"}));

  ckpt::Checkpoint fixed;
  train::record_run(fixed, o, train::ModelIdentity::of(model), 1, at);
  EXPECT_EQ(fixed.meta.count("class_names") + fixed.meta.count("classes_digest"), 0u);
  EXPECT_FALSE(train::class_names_of(fixed).has_value());

  for (const char* bad : {"[]", "[1,2]", "cat,dog", "[\"cat\""}) {
    c.meta["class_names"] = bad;
    try {
      train::class_names_of(c);
      ADD_FAILURE() << "class_names " << bad << " were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a JSON array of names"), std::string::npos) << e.what();
    }
  }
}

// The model's max pools go into the checkpoint. resnet18's ImageNet stem (above 64 pixels a side)
// became torchvision's 3x3/2 pool padded by 1 with the same parameters: a checkpoint from before
// the record (its 2x2/2 stem) is refused there with one line saying why, while the cnn's and the
// CIFAR stem's (no padded pool) load as before; a recorded pool unlike the model's is refused.
TEST(CheckpointRecord, MaxPoolsTellAnOldImageNetStemApart) {
  auto model_of = [](nn::ModelKind kind, Shape input) {
    nn::ModelSpec spec;
    spec.kind = kind;
    spec.input = input;
    return std::make_unique<nn::Model<float>>(spec);
  };
  const auto stem = model_of(nn::ModelKind::ResNet18, Shape{72, 72, 3});
  const auto cifar = model_of(nn::ModelKind::ResNet18, Shape{32, 32, 3});
  const auto cnn = model_of(nn::ModelKind::Cnn, Shape{28, 28, 1});
  train::TrainOptions o;
  const train::RunPosition at{10, 1, 2, 64, 640};
  auto record = [&](const nn::Model<float>& m) {
    ckpt::Checkpoint c;
    train::record_run(c, o, train::ModelIdentity::of(m), 1, at);
    return ckpt::decode(ckpt::encode(c), "test");
  };
  auto refusal = [](const ckpt::Checkpoint& c, const nn::Model<float>& m) -> std::string {
    try {
      train::check_model(c, m);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ckpt::Checkpoint now = record(*stem);
  EXPECT_EQ(now.text("max_pools"), "3x3/2 pad 1");
  EXPECT_EQ(refusal(now, *stem), "");
  EXPECT_EQ(record(*cnn).text("max_pools"), "2x2/2,2x2/2");
  EXPECT_EQ(record(*cifar).text("max_pools"), "");

  ckpt::Checkpoint old = now;  // as hpctrain wrote it before the record
  old.meta.erase("max_pools");
  const std::string why = refusal(old, *stem);
  EXPECT_NE(why.find("old 2x2/2 max pool"), std::string::npos) << why;
  EXPECT_NE(why.find("train it again"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << "one line: " << why;
  for (const auto* m : {cnn.get(), cifar.get()}) {
    ckpt::Checkpoint before = record(*m);
    before.meta.erase("max_pools");
    EXPECT_EQ(refusal(before, *m), "") << m->summary();
  }

  ckpt::Checkpoint other = now;
  other.meta["max_pools"] = "2x2/2";
  EXPECT_NE(refusal(other, *stem).find("has the max pools \"2x2/2\", this one \"3x3/2 pad 1\""), std::string::npos)
      << refusal(other, *stem);
}

// What computed a run: each kind once, in its first rank's order; ranks that differ are said with
// each kind's hosts (each host once); a checkpoint records the run's, and a resume on other kernels
// is said (with the instruction-set hint where oneDNN is on both sides), one on the same or from a
// checkpoint that records none is not.
TEST(CheckpointRecord, KernelsTravelInCheckpointsAndOtherOnesAreSaid) {
  const std::string a = "oneDNN 2.6.3 avx512_core", b = "oneDNN 2.6.3 avx2";
  EXPECT_EQ(train::run_kernels({a, a}), a);
  EXPECT_EQ(train::run_kernels({b, a, b, a}), b + " + " + a);
  EXPECT_FALSE(train::mixed_kernels_warning({"n1", "n2"}, {a, a}).has_value());
  const std::optional<std::string> mixed = train::mixed_kernels_warning({"n1", "n1", "n2", "n3"}, {a, a, b, a});
  ASSERT_TRUE(mixed.has_value());
  EXPECT_EQ(mixed->find("the ranks compute with different kernels (" + a + " on n1, n3; " + b +
                        " on n2): the run's bits may depend on which host each rank runs on"),
            0u)
      << *mixed;
  EXPECT_NE(mixed->find("ONEDNN_MAX_CPU_ISA"), std::string::npos) << *mixed;

  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Mlp;
  spec.input = Shape{8, 8, 3};
  spec.classes = 2;
  nn::Model<float> model(spec);
  train::ModelIdentity id = train::ModelIdentity::of(model);
  id.kernels = a;
  ckpt::Checkpoint c;
  train::record_run(c, train::TrainOptions{}, id, 1, train::RunPosition{10, 1, 2, 64, 640});
  c = ckpt::decode(ckpt::encode(c), "test");
  EXPECT_EQ(c.text("kernels"), a);
  EXPECT_FALSE(train::other_kernels_warning(c, a).has_value());
  const std::optional<std::string> other = train::other_kernels_warning(c, b);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->find("the checkpoint's run computed with " + a + ", this one computes with " + b + ": it continues"),
            0u)
      << *other;
  EXPECT_NE(other->find("ONEDNN_MAX_CPU_ISA"), std::string::npos) << *other;
  const std::optional<std::string> gpu = train::other_kernels_warning(c, "NVIDIA H100 (sm_90), CUDA 13000, cuDNN 91000");
  ASSERT_TRUE(gpu.has_value());
  EXPECT_EQ(gpu->find("ONEDNN_MAX_CPU_ISA"), std::string::npos) << *gpu;
  c.meta.erase("kernels");  // as hpctrain wrote it before the record
  EXPECT_FALSE(train::other_kernels_warning(c, b).has_value());
}

// A checkpoint of resnet18's ImageNet stem as hpctrain wrote it before 2026-12-04, with batch
// norm (the default): its 2x2/2 pool was fused into the stem's batch norm, no layer of its own, so
// each block's layer index was one below today's (a pool layer, index 2, now follows the stem's
// conv and batch norm), and so was its layout signature. Such a file (as the build of 2026-12-03
// wrote it) is refused for what it is, the old stem, not as "another variant, dataset shape or
// number of classes": that line sent its reader to other --image-size or --model values. A
// checkpoint that is of another shape indeed keeps that line.
TEST(CheckpointRecord, AnOldFusedImageNetStemIsNamedAsSuch) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::ResNet18;
  spec.input = Shape{72, 72, 3};
  const nn::Model<float> stem(spec);
  spec.input = Shape{32, 32, 3};
  const nn::Model<float> cifar(spec);
  // The old layout's names: the top-level index of every layer after the stem's pool one lower.
  auto old_name = [](const std::string& name) {
    const size_t dot = name.find('.');
    const int index = std::stoi(name.substr(0, dot));
    return (index > 2 ? std::to_string(index - 1) : std::to_string(index)) + name.substr(dot);
  };
  std::string layout;
  for (const auto& slot : stem.params().slots()) layout += old_name(slot.name) + slot.shape.str() + ';';
  for (const auto& slot : stem.params().buffer_slots()) layout += old_name(slot.name) + slot.shape.str() + ';';
  const train::TrainOptions o;
  const train::RunPosition at{10, 1, 2, 64, 640};
  ckpt::Checkpoint old;
  train::record_run(old, o, train::ModelIdentity::of(stem), 1, at);
  old.meta.erase("max_pools");
  old.meta["model_signature"] = fnv1a_hex(layout.data(), layout.size());
  auto refusal = [](const ckpt::Checkpoint& c, const nn::Model<float>& m) -> std::string {
    try {
      train::check_model(c, m);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return e.what();
    }
    return "";
  };
  const std::string why = refusal(old, stem);
  EXPECT_NE(why.find("old 2x2/2 max pool (hpctrain before 2026-12-04)"), std::string::npos) << why;
  EXPECT_NE(why.find("train it again"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << "one line: " << why;

  ckpt::Checkpoint small;  // the CIFAR stem's, not recording its pools either: another shape
  train::record_run(small, o, train::ModelIdentity::of(cifar), 1, at);
  small.meta.erase("max_pools");
  EXPECT_NE(refusal(small, stem).find("do not fit this resnet18 (another variant"), std::string::npos)
      << refusal(small, stem);
  EXPECT_EQ(refusal(small, cifar), "");
}

// --init-from's copy: a cnn for 10 classes into one for 5 keeps every tensor but the output
// layer's, value for value; those stay as the new model's seed made them. Into the same model
// everything is copied; a model sharing no tensor copies nothing.
TEST(InitFrom, TensorsOfTheSameNameAndShapeAreCopied) {
  auto cnn = [](int64_t classes) {
    nn::ModelSpec spec;
    spec.classes = classes;
    return spec;
  };
  nn::Model<float> trained(cnn(10)), fresh(cnn(5)), same(cnn(10));
  trained.init(1);
  fresh.init(2);
  same.init(2);
  float* stats = trained.params().buffers().data<float>();  // batch-norm statistics as training leaves them
  for (int64_t i = 0; i < trained.params().buffers().numel(); ++i) stats[i] = 0.5f + static_cast<float>(i % 7);
  nn::Model<float> seeded(cnn(5));
  seeded.init(2);

  const train::FittingState s = train::copy_fitting_state(trained, fresh);
  const auto& slots = fresh.params().slots();
  EXPECT_EQ(s.total, static_cast<int64_t>(slots.size() + fresh.params().buffer_slots().size()));
  EXPECT_EQ(s.copied, s.total - 2);
  ASSERT_EQ(s.left.size(), 2u);
  EXPECT_EQ(s.left, (std::vector<std::string>{slots[slots.size() - 2].name, slots.back().name}));
  for (const ParamSlot& slot : slots) {
    SCOPED_TRACE(slot.name);
    const bool left = std::find(s.left.begin(), s.left.end(), slot.name) != s.left.end();
    const auto* from = &trained.params().slots()[static_cast<size_t>(&slot - slots.data())];
    const float* want = left ? seeded.params().values().data<float>() + slot.offset
                             : trained.params().values().data<float>() + from->offset;
    EXPECT_EQ(std::memcmp(fresh.params().values().data<float>() + slot.offset, want, slot.shape.numel() * 4), 0);
  }
  EXPECT_EQ(std::memcmp(fresh.params().buffers().data<float>(), stats, fresh.params().buffers().bytes()), 0);

  const train::FittingState all = train::copy_fitting_state(trained, same);
  EXPECT_EQ(all.copied, all.total);
  EXPECT_TRUE(all.left.empty());
  EXPECT_EQ(std::memcmp(same.params().values().raw(), trained.params().values().raw(), same.params().values().bytes()),
            0);

  nn::ModelSpec mlp;
  mlp.kind = nn::ModelKind::Mlp;
  nn::Model<float> other(mlp);
  EXPECT_EQ(train::copy_fitting_state(trained, other).copied, 0);
}

// --init-from between resnet18's two stems (a checkpoint of 32-pixel images into a run of 72, or
// back): every tensor but the stem's convolution (3x3 against 7x7) goes to the same layer it came
// from. The ImageNet stem's max pool is a layer of its own (since 2026-12-04), one index that the
// CIFAR stem lacks: by name alone each block's tensors went into the next block's where the shapes
// fit, and the rest started from the seed (41 of 102 copied, most into another block), where the
// build before had copied 101, each into its own layer.
TEST(InitFrom, TheLayersAfterAStemPoolMeetTheirPeers) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::ResNet18;
  spec.classes = 10;
  spec.input = Shape{32, 32, 3};
  nn::Model<float> cifar(spec), cifar_back(spec);
  spec.input = Shape{72, 72, 3};
  nn::Model<float> imagenet(spec);
  cifar.init(1);
  imagenet.init(2);
  cifar_back.init(3);
  auto by_name = [](const nn::Model<float>& m) {
    std::map<std::string, const ParamSlot*> named;
    for (const ParamSlot& slot : m.params().slots()) named[slot.name] = &slot;
    return named;
  };
  auto same_values = [](const nn::Model<float>& a, const ParamSlot& sa, const nn::Model<float>& b, const ParamSlot& sb) {
    return sa.shape == sb.shape && std::memcmp(a.params().values().data<float>() + sa.offset,
                                               b.params().values().data<float>() + sb.offset,
                                               static_cast<size_t>(sa.shape.numel()) * sizeof(float)) == 0;
  };
  const train::FittingState in = train::copy_fitting_state(cifar, imagenet);
  EXPECT_EQ(in.copied, in.total - 1);
  EXPECT_EQ(in.left, std::vector<std::string>{"0.weight"});
  const auto from = by_name(cifar), to = by_name(imagenet);
  // Blocks (the CIFAR stem's start at index 2, the ImageNet stem's at 3, after its pool), a
  // shortcut, and the classifier.
  for (const auto& [f, t] : std::vector<std::pair<std::string, std::string>>{
           {"2.main.0.weight", "3.main.0.weight"}, {"4.shortcut.0.weight", "5.shortcut.0.weight"},
           {"9.main.3.weight", "10.main.3.weight"}, {"11.weight", "12.weight"}}) {
    ASSERT_TRUE(from.count(f) && to.count(t)) << f << " " << t;
    EXPECT_TRUE(same_values(cifar, *from.at(f), imagenet, *to.at(t))) << f << " into " << t;
  }
  const train::FittingState back = train::copy_fitting_state(imagenet, cifar_back);
  EXPECT_EQ(back.copied, back.total - 1);
  EXPECT_EQ(back.left, std::vector<std::string>{"0.weight"});
  EXPECT_TRUE(same_values(imagenet, *to.at("3.main.0.weight"), cifar_back, *by_name(cifar_back).at("2.main.0.weight")));
}

// A snapshot begun at a step boundary (Engine::begin_snapshot) holds that boundary's state
// exactly, though its parameters and momentum are copied later: the next step's update first
// completes the copy. Without that, this snapshot would hold the next step's parameters.
TEST(EngineSnapshot, ABegunSnapshotHoldsItsBoundarysStateAfterTheNextStep) {
  nn::ModelSpec spec;  // cnn with batch norm: parameters, momentum and statistics
  auto model = std::make_unique<nn::Model<float>>(spec);
  model->init(1);
  auto sgd = std::make_unique<optim::Sgd<float>>(model->params(), optim::SgdSpec{});
  dist::SelfCommunicator self;
  const auto engine = train::make_cpu_engine(std::move(model), std::move(sgd), self,
                                             train::engine_spec(train::TrainOptions{}, 1));
  data::Batch batch;
  batch.images = Tensor(Shape{8, 28, 28, 1}, DType::F32);
  for (int64_t i = 0; i < batch.images.numel(); ++i) batch.images.data<float>()[i] = static_cast<float>(i % 13) * 0.1f;
  batch.labels = {0, 1, 2, 3, 4, 5, 6, 7};
  engine->train_step(batch, 1.0f, 0.1, 0.9);  // momentum that is not zero
  ckpt::Checkpoint want, got, after;
  engine->snapshot(want);
  engine->begin_snapshot(got);
  engine->train_step(batch, 1.0f, 0.1, 0.9);
  engine->complete_snapshot();
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.momentum, want.momentum);
  EXPECT_EQ(got.buffers, want.buffers);
  engine->snapshot(after);
  EXPECT_NE(after.params, want.params) << "the step changed nothing: the test shows nothing";
  EXPECT_NE(after.buffers, want.buffers);
}

}  // namespace
}  // namespace hpc::testing
