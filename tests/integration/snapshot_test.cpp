// In-memory snapshots through the real binary: a killed rank's job continues from the hosts'
// snapshot a few steps back and ends in exactly the state of a run never interrupted; damaged,
// foreign and incompatible snapshots are skipped with a warning for the next valid state; a
// stop for hpcrun's change of hosts keeps the state in memory only; the memory budget, a
// directory that cannot be used and a file system that fills up are warnings, never the end of
// a run; a finished run's snapshots and old leftovers go.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

constexpr int kEvery = 3;  // --snapshot-every-steps of the tests

class Snapshots : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Fashion-MNIST not found in " << fashion_mnist_dir();
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
  }
  void TearDown() override {
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  }

  // 2 epochs of 20 global steps (1280 samples, global batch 64); checkpoints on shared storage
  // every 5 steps, snapshots every kEvery in `snaps` (the test's own, not /dev/shm).
  std::vector<std::string> job(const std::string& ck, const std::string& metrics, const std::string& snaps) const {
    std::vector<std::string> a{"--train-samples", "1280",        "--test-samples", "300",   "--epochs",
                               "2",               "--global-batch-size", "64",     "--threads", "1",
                               "--quiet",         "--data-dir",  fashion_mnist_dir(), "--metrics-file", metrics};
    if (!ck.empty())
      a.insert(a.end(), {"--checkpoint-dir", ck, "--checkpoint-every-steps", "5", "--snapshot-every-steps",
                         std::to_string(kEvery)});
    if (!snaps.empty()) a.insert(a.end(), {"--snapshot-dir", snaps});
    return a;
  }
  // job() never interrupted: its done line and epoch events.
  const Ended& uninterrupted_run(int ranks) {
    return uninterrupted_end(ranks, [&](const std::string& m) { return job("", m, ""); },
                             dir_.file("full" + std::to_string(ranks) + ".jsonl"));
  }
  JsonObject uninterrupted(int ranks) { return uninterrupted_run(ranks).done; }
  // The epochs of the last resume() against job() never interrupted.
  void expect_resumed_epochs(int ranks) {
    expect_same_epochs(epochs_of(dir_.file("resumed.jsonl")), uninterrupted_run(ranks).epochs);
  }
  // Kills rank `victim` after `step` of job(ck) on `ranks` ranks.
  void kill_after(int ranks, const std::string& ck, const std::string& snaps, int step, int victim = 0) {
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", (std::to_string(step) + "@" + std::to_string(victim)).c_str(), 1);
    const RunResult killed = run_mpi(ranks, job(ck, dir_.file("killed.jsonl"), snaps));
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    ASSERT_NE(killed.exit_code, 0) << killed.err;
  }
  // job(ck) on 2 ranks, stopped after step 8 for hpcrun's change of hosts (its marker left in ck,
  // its token given): snapshots of step 8, no checkpoint of it. The marker stays.
  RunResult stopped_for_hosts_after_8(const std::string& ck, const std::string& snaps);
  // job(ck) again: its done line, its stderr in *err.
  JsonObject resume(int ranks, const std::string& ck, const std::string& snaps, std::string* err = nullptr) {
    const std::string m = dir_.file("resumed.jsonl");
    fs::remove(m);
    const RunResult r = run_mpi(ranks, job(ck, m, snaps));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (err) *err = r.err;
    return done_of(m);
  }
  // The run directory (the run id's) in `snaps`, and its one snapshot.
  static std::string run_dir(const std::string& snaps) {
    for (const auto& e : fs::directory_iterator(snaps))
      if (e.is_directory()) return e.path().string();
    return "";
  }
  static std::string the_snapshot(const std::string& snaps) {
    for (const auto& e : fs::directory_iterator(run_dir(snaps)))
      if (e.path().extension() == ".hpck") return e.path().string();
    return "";
  }

  TempDir dir_{"snap"};
};

// args with the value of `option` replaced.
std::vector<std::string> with(std::vector<std::string> args, const std::string& option, const std::string& value) {
  const auto at = std::find(args.begin(), args.end(), option);
  EXPECT_NE(at, args.end()) << option;
  if (at != args.end()) *(at + 1) = value;
  return args;
}

// The meta section's text (the first section: after the 8-byte magic and the version, a u32
// kind, a u64 length and a u32 CRC-32) with `from` replaced by `to` (of the same length) and
// its CRC made right again: a valid snapshot that says something else.
void rewrite_meta(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  Bytes b = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data() + 16, sizeof n);
  std::string meta(reinterpret_cast<const char*>(b.data()) + 28, n);
  const size_t at = meta.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << meta;
  meta.replace(at, from.size(), to);
  std::memcpy(b.data() + 28, meta.data(), n);
  const auto crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(meta.data()), static_cast<uInt>(n)));
  std::memcpy(b.data() + 24, &crc, sizeof crc);
  write_bytes(path, b);
}

// A rank dies after step 8: the job on the same ranks resumes from the hosts' newest snapshot
// (step 6, at most --snapshot-every-steps back), not from the checkpoint of step 5, and ends
// in exactly the state of a run never interrupted. With 2 ranks the victim is rank 1 and, in a
// second round, rank 0; with 1 rank the snapshots are in the default place (/dev/shm), which a
// finished run leaves empty of its own.
TEST_F(Snapshots, AKilledRankResumesFromTheSnapshotAndEndsInTheSameState) {
  for (const auto& [ranks, victim] : {std::pair{2, 1}, std::pair{2, 0}, std::pair{1, 0}}) {
    SCOPED_TRACE(::testing::Message() << ranks << " rank(s), rank " << victim << " killed");
    const std::string ck = dir_.file("ck" + std::to_string(ranks) + std::to_string(victim));
    const std::string snaps = ranks == 1 ? "" : dir_.file("snaps" + std::to_string(victim));
    kill_after(ranks, ck, snaps, 8, victim);
    const std::string id = read_text(ck + "/run-id").substr(0, 16);
    const std::string where = (snaps.empty() ? "/dev/shm/hpctrain-" + std::to_string(geteuid()) : snaps) + "/" + id;
    EXPECT_TRUE(fs::exists(where + "/ckpt-000000006.hpck")) << where;
    std::string err;
    const JsonObject d = resume(ranks, ck, snaps, &err);
    EXPECT_EQ(d.at("resumed_from").str, "snapshot") << err;
    EXPECT_EQ(d.at("resumed_from_step").number, 6) << err;
    EXPECT_GE(d.at("resumed_from_step").number, 8 - kEvery + 1);
    EXPECT_GT(d.at("snapshots_taken").number, 0);
    expect_same_end(d, uninterrupted(ranks));
    expect_resumed_epochs(ranks);  // from the snapshot's sums of epoch 1 so far
    EXPECT_FALSE(fs::exists(where)) << "a finished run's snapshots stay in " << where;
  }
}

// A rank dies after step 4, before the first checkpoint (step 5): a snapshot (step 3) is the run's
// only saved state. Rerun with another --lr, it is refused as a checkpoint would be (one line,
// exit 2) and kept: it was passed by with a warning, the run started afresh and removed it. With
// the run's own options it resumes from it, to the same end.
TEST_F(Snapshots, TheOnlySavedStateIsRefusedNotReplacedWhenTheOptionsDiffer) {
  const std::string ck = dir_.file("ck"), snaps = dir_.file("snaps");
  kill_after(2, ck, snaps, 4, 1);
  ASSERT_FALSE(fs::exists(ck + "/ckpt-000000005.hpck"));
  const std::string snapshot = the_snapshot(snaps);
  ASSERT_NE(snapshot, "");
  std::vector<std::string> other = job(ck, dir_.file("other.jsonl"), snaps);
  other.insert(other.end(), {"--lr", "0.2"});
  const RunResult refused = run_mpi(2, other);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_EQ(count_of(refused.err, "hpctrain: error: "), 1) << refused.err;
  EXPECT_NE(refused.err.find("the snapshot " + snapshot + ", this run's only saved state (in host memory, no "
                             "checkpoint yet), does not fit this run: the checkpoint was made with --lr=0.1, this run "
                             "has --lr=0.2"),
            std::string::npos)
      << refused.err;
  EXPECT_TRUE(fs::exists(snapshot));
  std::string err;
  const JsonObject d = resume(2, ck, snaps, &err);
  EXPECT_EQ(d.at("resumed_from").str, "snapshot") << err;
  EXPECT_EQ(d.at("resumed_from_step").number, 3) << err;
  expect_same_end(d, uninterrupted(2));
}

// Each kind of bad snapshot is skipped with one warning naming it and why, and the run goes on
// from the next valid state (the checkpoint of step 5) to the same end.
TEST_F(Snapshots, ABadSnapshotIsSkippedForTheNextValidState) {
  const std::map<std::string, std::pair<std::function<void(const std::string&)>, std::string>> damage{
      {"truncated", {[](const std::string& f) { fs::resize_file(f, fs::file_size(f) / 2); }, "truncated"}},
      {"bit-flipped",
       {[](const std::string& f) {
          Bytes b = read_bytes(f);
          b[b.size() / 2] ^= 0x10;
          write_bytes(f, b);
        },
        "corrupt"}},
      {"another run", {[](const std::string& f) { rewrite_meta(f, "run_id=", "run_Id="); }, "of another run"}},
      {"other options",
       {[](const std::string& f) { rewrite_meta(f, "option.lr=0.1\n", "option.lr=0.2\n"); }, "--lr"}},
      {"a diverged state",
       {[](const std::string& f) {
          // A NaN as the first parameter, its section's CRC made right: only the state check can
          // tell.
          Bytes b = read_bytes(f);
          uint64_t n = 0;
          std::memcpy(&n, b.data() + 16, sizeof n);
          const size_t params = 28 + n;  // the next section's header
          uint64_t pn = 0;
          std::memcpy(&pn, b.data() + params + 4, sizeof pn);
          const float nan = std::nanf("");
          std::memcpy(b.data() + params + 16, &nan, sizeof nan);
          const auto crc = static_cast<uint32_t>(
              crc32(0, reinterpret_cast<const Bytef*>(b.data() + params + 16), static_cast<uInt>(pn)));
          std::memcpy(b.data() + params + 12, &crc, sizeof crc);
          write_bytes(f, b);
        },
        "not finite"}},
  };
  const JsonObject want = uninterrupted(1);
  // One killed run; each kind of damage is done to a copy of what it left (its checkpoints and
  // its snapshot), so every resume starts from the same killed state.
  const std::string killed_ck = dir_.file("killed"), killed_snaps = dir_.file("killed-snaps");
  kill_after(1, killed_ck, killed_snaps, 8);
  int n = 0;
  for (const auto& [what, how] : damage) {
    SCOPED_TRACE(what);
    const std::string ck = dir_.file("bad" + std::to_string(++n)), snaps = dir_.file("bad-snaps" + std::to_string(n));
    fs::copy(killed_ck, ck, fs::copy_options::recursive);
    fs::copy(killed_snaps, snaps, fs::copy_options::recursive);
    // The copy's run-id as hpctrain wrote it before it named the directory (the id alone), which
    // is taken for the directory's own: a copy is otherwise another run (ACopyOf... below).
    write_text(ck + "/run-id", read_text(ck + "/run-id").substr(0, 16) + "\n");
    const std::string file = the_snapshot(snaps);
    ASSERT_EQ(fs::path(file).filename(), "ckpt-000000006.hpck");
    how.first(file);
    std::string err;
    const JsonObject d = resume(1, ck, snaps, &err);
    EXPECT_EQ(count_of(err, "snapshot " + file + " ignored: "), 1) << err;
    EXPECT_NE(err.find(how.second), std::string::npos) << err;
    EXPECT_EQ(d.at("resumed_from").str, "checkpoint");
    EXPECT_EQ(d.at("resumed_from_step").number, 5);
    expect_same_end(d, want);
  }
}

// A snapshot older than the newest checkpoint is not resumed (and said so); a fresh start in the
// directory (--resume none) makes the run a new one whose hosts drop the old run's snapshots.
TEST_F(Snapshots, AStaleOrReplacedRunsSnapshotIsNotResumed) {
  const std::string ck = dir_.file("stale"), snaps = dir_.file("stale-snaps");
  kill_after(1, ck, snaps, 8);
  const std::string old_dir = run_dir(snaps);
  // A checkpoint of step 7 from the same run, newer than the snapshot of step 6: the file of step
  // 6 renamed and its step rewritten would do, but the real thing is simpler: train to step 7.
  fs::rename(the_snapshot(snaps), dir_.file("held"));
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "7", 1);
  auto a = with(with(job(ck, dir_.file("k2.jsonl"), snaps), "--checkpoint-every-steps", "7"), "--snapshot-every-steps",
                "100");
  ASSERT_NE(run_mpi(1, a).exit_code, 0);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  for (const auto& e : fs::directory_iterator(old_dir)) fs::remove(e.path());
  fs::rename(dir_.file("held"), old_dir + "/ckpt-000000006.hpck");
  std::string err;
  JsonObject d = resume(1, ck, snaps, &err);
  EXPECT_NE(err.find("older (step 6) than the newest checkpoint (step 7)"), std::string::npos) << err;
  EXPECT_EQ(d.at("resumed_from").str, "checkpoint");
  EXPECT_EQ(d.at("resumed_from_step").number, 7);
  // A fresh start: a new run id, and the old run's snapshots go as soon as it starts.
  const std::string ck2 = dir_.file("replaced");
  kill_after(1, ck2, snaps, 8);
  const std::string old_id2 = read_text(ck2 + "/run-id");
  const std::string replaced_dir = snaps + "/" + old_id2.substr(0, 16);
  ASSERT_TRUE(fs::exists(replaced_dir));
  auto fresh = job(ck2, dir_.file("fresh.jsonl"), snaps);
  fresh.insert(fresh.end(), {"--resume", "none", "--max-steps", "2"});
  const RunResult r = run_mpi(1, fresh);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(read_text(ck2 + "/run-id"), old_id2);
  EXPECT_FALSE(fs::exists(replaced_dir)) << r.err;
}

// A run of `ranks` signalled after step 8 (HPCTRAIN_TEST_SIGNAL_AFTER_STEP=`signal`), its ranks
// given HPCRUN_TOKEN=`token` as hpcrun gives it (none when empty).
RunResult stopped_after_8(int ranks, const std::vector<std::string>& args, const char* signal,
                          const std::string& token) {
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", signal, 1);
  if (!token.empty()) setenv("HPCRUN_TOKEN", token.c_str(), 1);
  RunResult r = run_mpi(ranks, args);
  unsetenv("HPCRUN_TOKEN");
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  return r;
}

RunResult Snapshots::stopped_for_hosts_after_8(const std::string& ck, const std::string& snaps) {
  fs::create_directories(ck);
  write_text(ck + "/membership-change", "token=0123456789abcdef\npid=1\n");
  return stopped_after_8(2, job(ck, dir_.file(fs::path(ck).filename().string() + ".jsonl"), snaps), "8@1:usr1",
                         "0123456789abcdef");
}

// A copy of a checkpoint directory (cp -r, to branch an experiment) is another run: run-id names
// the directory it was written in, so the copy takes a new id and resumes its own checkpoint, not
// the original's snapshot, which it leaves in place; the original then resumes that snapshot.
// A run-id written before the directory line (an id alone) is still the directory's own.
TEST_F(Snapshots, ACopyOfACheckpointDirectoryIsAnotherRun) {
  const std::string ck = dir_.file("original"), copy = dir_.file("copy"), snaps = dir_.file("copy-snaps");
  kill_after(1, ck, snaps, 8);  // checkpoint 5, snapshot 6
  const std::string id = read_text(ck + "/run-id").substr(0, 16);
  fs::copy(ck, copy, fs::copy_options::recursive);
  std::string err;
  const JsonObject c = resume(1, copy, snaps, &err);
  EXPECT_NE(err.find("/run-id was written in another directory (this is a copy of it?)"), std::string::npos) << err;
  EXPECT_EQ(c.at("resumed_from").str, "checkpoint");
  EXPECT_EQ(c.at("resumed_from_step").number, 5);
  EXPECT_NE(read_text(copy + "/run-id").substr(0, 16), id);
  ASSERT_TRUE(fs::exists(snaps + "/" + id)) << "the copy removed the original's snapshots";
  write_text(ck + "/run-id", id + "\n");  // as hpctrain wrote it before
  const JsonObject o = resume(1, ck, snaps);
  EXPECT_EQ(o.at("resumed_from").str, "snapshot");
  EXPECT_EQ(o.at("resumed_from_step").number, 6);
  expect_same_end(o, uninterrupted(1));
  EXPECT_EQ(read_text(ck + "/run-id").rfind(id + "\ndirectory_inode=", 0), 0u) << read_text(ck + "/run-id");
}

// A run that does not continue the directory's newest checkpoint (a fresh start, a rollback to an
// older file) and is killed before its first checkpoint: the next --resume auto continues it
// from its snapshot. The checkpoints it replaced were moved aside as it began; before, they
// stayed until its first write, and outranked its snapshots (the abandoned run resumed, at step 40).
TEST_F(Snapshots, ARunKilledBeforeItsFirstCheckpointIsTheOneResumedNotTheRunItReplaced) {
  const std::string ck = dir_.file("replaced-run"), snaps = dir_.file("replaced-snaps");
  ASSERT_EQ(run_mpi(1, job(ck, dir_.file("first.jsonl"), snaps)).exit_code, 0);  // checkpoints up to 40
  const std::vector<std::pair<std::string, std::string>> starts{{"none", "a fresh start"},
                                                                {ck + "/ckpt-000000035.hpck", "a rollback"}};
  for (const auto& [from, what] : starts) {
    SCOPED_TRACE(what);
    auto again = job(ck, dir_.file("again.jsonl"), snaps);
    again.insert(again.end(), {"--resume", from});
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", from == "none" ? "4" : "39", 1);
    const RunResult killed = run_mpi(1, again);
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    ASSERT_NE(killed.exit_code, 0) << killed.err;
    EXPECT_FALSE(fs::exists(ck + "/ckpt-000000040.hpck")) << "the replaced run's checkpoint is still in place";
    const JsonObject d = resume(1, ck, snaps);
    EXPECT_EQ(d.at("resumed_from").str, "snapshot");
    EXPECT_EQ(d.at("resumed_from_step").number, from == "none" ? 3 : 39);
    expect_same_end(d, uninterrupted(1));
    bool aside = false;
    for (const auto& e : fs::directory_iterator(ck))
      aside |= e.path().filename().string().rfind("superseded-", 0) == 0 &&
               fs::exists(e.path() / "ckpt-000000040.hpck");
    EXPECT_TRUE(aside) << "the replaced run's checkpoints were not kept aside";
  }
}

// hpcrun asks for a stop to change the hosts (CHECKPOINT_DIR/membership-change): every host
// writes its snapshot and no checkpoint goes to shared storage; the next run continues from the
// very step it stopped at.
TEST_F(Snapshots, AStopForAChangeOfHostsKeepsTheStateInMemoryOnly) {
  const std::string ck = dir_.file("member"), snaps = dir_.file("member-snaps");
  const RunResult stopped = stopped_for_hosts_after_8(ck, snaps);
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_NE(stopped.err.find("for hpcrun to change the hosts"), std::string::npos) << stopped.err;
  EXPECT_FALSE(fs::exists(ck + "/ckpt-000000008.hpck")) << "the stop wrote a checkpoint to shared storage";
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000005.hpck"));
  EXPECT_TRUE(fs::exists(run_dir(snaps) + "/ckpt-000000008.hpck"));
  fs::remove(ck + "/membership-change");
  const JsonObject d = resume(2, ck, snaps);
  EXPECT_EQ(d.at("resumed_from").str, "snapshot");
  EXPECT_EQ(d.at("resumed_from_step").number, 8) << "a step redone";
  expect_same_end(d, uninterrupted(2));
  expect_resumed_epochs(2);
  // Without the marker a stop writes its checkpoint as before.
  const std::string ck2 = dir_.file("member2");
  EXPECT_EQ(stopped_after_8(2, job(ck2, dir_.file("m2.jsonl"), snaps), "8@1:usr1", "").exit_code, 75);
  EXPECT_TRUE(fs::exists(ck2 + "/ckpt-000000008.hpck"));
  // ... and, the checkpoint holding the same state, gives the snapshots' memory back.
  EXPECT_FALSE(fs::exists(snaps + "/" + read_text(ck2 + "/run-id").substr(0, 16)))
      << "a stop that wrote its checkpoint left its snapshots";
}

// The state that only host memory holds (a stop for hpcrun's change of hosts at step 8: snapshots
// of step 8, checkpoint 5) is written into the checkpoint directory by `hpctrain persist-snapshot`,
// once: a run on other nodes (no snapshots there) then resumes at step 8, not 5, and ends as a run
// never interrupted. Run again, it finds nothing newer to keep. While a live run holds the
// directory's lock it is refused and writes nothing.
TEST_F(Snapshots, APersistedSnapshotIsTheStateARunElsewhereResumes) {
  const std::string ck = dir_.file("persist"), snaps = dir_.file("persist-snaps");
  const RunResult stopped = stopped_for_hosts_after_8(ck, snaps);
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  fs::remove(ck + "/membership-change");
  ASSERT_FALSE(fs::exists(ck + "/ckpt-000000008.hpck"));
  const std::string held = run_dir(snaps) + "/ckpt-000000008.hpck";
  ASSERT_TRUE(fs::exists(held));
  const std::vector<std::string> persist{"persist-snapshot", "--checkpoint-dir", ck, "--snapshot-dir", snaps};
  {  // a live run's lock
    const int fd = hold_directory_lock(ck);
    const RunResult busy = run_mpi(2, persist, 60);
    ::close(fd);
    fs::remove(ck + "/lock");
    EXPECT_EQ(busy.exit_code, 2) << busy.err;
    EXPECT_NE(busy.err.find("is in use by another run (host elsewhere pid 1)"), std::string::npos) << busy.err;
    EXPECT_FALSE(fs::exists(ck + "/ckpt-000000008.hpck"));
  }
  const RunResult kept = run_mpi(2, persist, 60);
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_NE(kept.out.find(": kept the snapshot of step 8 (" + held + ") as " + ck + "/ckpt-000000008.hpck ("),
            std::string::npos)
      << kept.out << kept.err;
  EXPECT_EQ(read_bytes(ck + "/ckpt-000000008.hpck"), read_bytes(held)) << "not the snapshot's bytes";
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000005.hpck")) << "an older checkpoint was removed";
  EXPECT_FALSE(fs::exists(ck + "/lock")) << "the directory's lock was left behind";
  const RunResult again = run_mpi(1, persist, 60);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("hpctrain: nothing to keep: no snapshot of run "), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("newest valid checkpoint (step 8)"), std::string::npos) << again.out;
  {  // that checkpoint damaged: the newest valid one is step 5's, as a resume would find, and the
     // snapshot of step 8 takes the damaged file's place
    Bytes b = read_bytes(ck + "/ckpt-000000008.hpck");
    b[b.size() / 2] ^= 0x10;
    write_bytes(ck + "/ckpt-000000008.hpck", b);
    const RunResult repaired = run_mpi(1, persist, 60);
    EXPECT_EQ(repaired.exit_code, 0) << repaired.err;
    EXPECT_NE(repaired.out.find(": kept the snapshot of step 8 (" + held + ") as " + ck +
                                "/ckpt-000000008.hpck ("),
              std::string::npos)
        << repaired.out << repaired.err;
    EXPECT_NE(repaired.out.find(", in place of a damaged file of that step"), std::string::npos) << repaired.out;
    EXPECT_EQ(read_bytes(ck + "/ckpt-000000008.hpck"), read_bytes(held)) << "not the snapshot's bytes";
  }
  // Elsewhere: another host's memory, which holds no snapshot of the run.
  const JsonObject d = resume(2, ck, dir_.file("other-hosts"));
  EXPECT_EQ(d.at("resumed_from").str, "checkpoint");
  EXPECT_EQ(d.at("resumed_from_step").number, 8) << "steps redone";
  expect_same_end(d, uninterrupted(2));
  expect_resumed_epochs(2);
}

// What persist-snapshot cannot take, each one line and exit 2: a directory that is not one, one
// without a run id, a copy of a run's directory (its run-id names the original's).
TEST_F(Snapshots, PersistSnapshotRefusesWhatIsNoRunsDirectory) {
  const std::string ck = dir_.file("refused");
  const auto refused = [&](const std::string& dir, const std::string& says) {
    const RunResult r = run_hpctrain({"persist-snapshot", "--checkpoint-dir", dir, "--snapshot-dir", dir_.file("s")}, 60);
    EXPECT_EQ(r.exit_code, 2) << dir << ": " << r.err;
    EXPECT_NE(r.err.find("hpctrain: error: " + says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  refused(dir_.file("none"), "--checkpoint-dir " + dir_.file("none") + " is not a directory");
  fs::create_directories(ck);
  refused(ck, ck + " holds no run id (" + ck + "/run-id)");
  write_text(ck + "/run-id", "0123456789abcdef\ndirectory_inode=1\n");
  refused(ck, ck + "/run-id was written in another directory (this is a copy of it?)");
  const RunResult blank = run_hpctrain({"persist-snapshot", "--checkpoint-dir", ""}, 60);
  EXPECT_EQ(blank.exit_code, 2) << blank.err;
}

// The same stop at an epoch's last step (20 of 2 epochs of 20): the snapshots record epoch 1 as not
// ended (they are taken before its evaluation), and the stop then ends it. The run resumed from
// them finds epoch 1's event in the metrics file and ends it no second time; a rank killed at that
// step instead leaves it to the resumed run, which ends it once.
TEST_F(Snapshots, AnEpochEndedAroundAStopForAChangeOfHostsHasOneLine) {
  const std::string ck = dir_.file("member-edge"), snaps = dir_.file("member-edge-snaps"), m = dir_.file("edge.jsonl");
  fs::create_directories(ck);
  write_text(ck + "/membership-change", "token=0123456789abcdef\npid=1\n");
  // Checkpoints at 7 and 14 only: the stop's state is in the snapshots alone.
  const std::vector<std::string> args = with(job(ck, m, snaps), "--checkpoint-every-steps", "7");
  const RunResult stopped = stopped_after_8(2, args, "20@1:usr1", "0123456789abcdef");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_NE(stopped.err.find("for hpcrun to change the hosts"), std::string::npos) << stopped.err;
  EXPECT_EQ(epoch_numbers(m), (std::vector<double>{1})) << read_text(m);
  fs::remove(ck + "/membership-change");
  RunResult r = run_mpi(2, args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(done_of(m).at("resumed_from").str, "snapshot");
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 20);
  EXPECT_EQ(epoch_numbers(m), (std::vector<double>{1, 2})) << read_text(m);
  expect_same_end(done_of(m), uninterrupted(2));
  // Killed at that step (its snapshots taken, epoch 1 not yet evaluated; checkpoints at 7 and 14),
  // with a metrics file of its own.
  const std::string ck2 = dir_.file("killed-edge"), m2 = dir_.file("killed-edge.jsonl");
  const std::vector<std::string> args2 =
      with(with(job(ck2, m2, snaps), "--checkpoint-every-steps", "7"), "--snapshot-every-steps", "5");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "20@1", 1);
  r = run_mpi(2, args2);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_NE(r.exit_code, 0);
  r = run_mpi(2, args2);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(done_of(m2).at("resumed_from").str, "snapshot");
  EXPECT_EQ(done_of(m2).at("resumed_from_step").number, 20);
  EXPECT_EQ(epoch_numbers(m2), (std::vector<double>{1, 2})) << read_text(m2);
  expect_same_epochs(epochs_of(m2), uninterrupted_run(2).epochs);
}

// hpcrun takes its marker back when a user's stop replaces its stop to change the hosts. A run
// that had already read the marker looks again once its snapshots are written: a stop for good
// (a requeue may land on other nodes) writes its checkpoint too. Here the marker goes while the
// stop's snapshot sits before its rename, held there until the marker goes
// (HPCTRAIN_TEST_HOLD_BEFORE_RENAME): a 10 ms poll for a 0.5 s pause missed it on a loaded machine.
TEST_F(Snapshots, AMembershipMarkerTakenBackDuringTheStopMeansACheckpoint) {
  const std::string ck = dir_.file("taken-back"), snaps = dir_.file("taken-back-snaps");
  fs::create_directories(ck);
  write_text(ck + "/membership-change", "token=0123456789abcdef\npid=1\n");
  std::atomic<bool> done{false};
  std::thread hpcrun([&] {  // as hpcrun does on a user's signal
    for (; !done; usleep(10 * 1000)) {
      std::error_code ec;
      for (const auto& e : fs::recursive_directory_iterator(snaps, ec))
        if (e.path().filename().string().rfind("ckpt-000000008.hpck.tmp.", 0) == 0) {
          fs::remove(ck + "/membership-change");
          return;
        }
    }
  });
  setenv("HPCTRAIN_TEST_HOLD_BEFORE_RENAME", ("ckpt-000000008.hpck:" + ck + "/membership-change").c_str(), 1);
  const RunResult stopped = stopped_after_8(1, job(ck, dir_.file("tb.jsonl"), snaps), "8", "0123456789abcdef");
  unsetenv("HPCTRAIN_TEST_HOLD_BEFORE_RENAME");
  done = true;
  hpcrun.join();
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_FALSE(fs::exists(ck + "/membership-change")) << "the stop's snapshot was never seen being written";
  EXPECT_NE(stopped.err.find("became a stop for good: writing a checkpoint too"), std::string::npos) << stopped.err;
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000008.hpck")) << "the stop kept its state in memory only";
}

// A marker that is not this job's hpcrun's (left by an hpcrun that was killed, found by a plain
// hpctrain or by another hpcrun's job) is not obeyed: the stop writes its checkpoint, as the
// hosts that would hold the snapshots may be gone next (a preemption, a requeue elsewhere).
TEST_F(Snapshots, AMembershipMarkerOfAnotherHpcrunIsNotObeyed) {
  for (const char* token : {"", "fedcba9876543210"}) {
    SCOPED_TRACE(std::string("HPCRUN_TOKEN=") + token);
    const std::string ck = dir_.file(std::string("stale") + token), snaps = dir_.file("stale-snaps");
    fs::create_directories(ck);
    write_text(ck + "/membership-change", "token=0123456789abcdef\npid=1\n");
    const RunResult stopped = stopped_after_8(1, job(ck, dir_.file("stale.jsonl"), snaps), "8", token);
    ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
    EXPECT_NE(stopped.err.find("membership-change is not this job's hpcrun's"), std::string::npos) << stopped.err;
    EXPECT_TRUE(fs::exists(ck + "/ckpt-000000008.hpck")) << "the stop kept its state in memory only";
  }
}

// A run that resumed from a host's memory and is stopped before its first step checkpoints that
// state to shared storage before it exits (75): the next run continues from it even where the
// hosts' memory is gone (a requeue onto other nodes).
TEST_F(Snapshots, AStopDuringSetUpCheckpointsTheStateResumedFromMemory) {
  const std::string ck = dir_.file("setup"), snaps = dir_.file("setup-snaps");
  kill_after(1, ck, snaps, 8);
  setenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP", "4", 1);
  const RunResult stopped = run_mpi(1, job(ck, dir_.file("s1.jsonl"), snaps));
  unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_NE(stopped.err.find("the state it resumed from a host's memory is checkpointed"), std::string::npos)
      << stopped.err;
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000006.hpck")) << stopped.err;
  // Its memory given back, as a stop's in training: the checkpoint holds the snapshot's state.
  for (const auto& e : fs::recursive_directory_iterator(snaps))
    EXPECT_NE(e.path().extension(), ".hpck") << e.path() << " left in host memory";
  fs::remove_all(snaps);  // the hosts are gone
  const JsonObject d = resume(1, ck, snaps);
  EXPECT_EQ(d.at("resumed_from").str, "checkpoint");
  EXPECT_EQ(d.at("resumed_from_step").number, 6);
  expect_same_end(d, uninterrupted(1));
  expect_resumed_epochs(1);  // the snapshot's sums, checkpointed with its state
}

// Snapshots that cannot be kept are a warning at start-up and the run trains on without them:
// over --snapshot-max-memory, and a --snapshot-dir that cannot be made.
TEST_F(Snapshots, SnapshotsThatCannotBeKeptAreAWarningNotAFailure) {
  write_text(dir_.file("a-file"), "not a directory\n");
  fs::create_directory(dir_.file("open"));
  fs::permissions(dir_.file("open"), fs::perms::all);  // 777: others could move the run directories
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--snapshot-max-memory", "1M", "--snapshot-dir", dir_.file("budget")},
       "and --snapshot-max-memory allows 1.0 MB (1M)"},
      {{"--snapshot-dir", dir_.file("a-file") + "/snaps"}, "cannot create " + dir_.file("a-file") + "/snaps"},
      {{"--snapshot-dir", dir_.file("open")}, "--snapshot-dir " + dir_.file("open") +
                                                  " is writable by others and not sticky (mode 777)"},
  };
  for (const auto& [extra, message] : cases) {
    SCOPED_TRACE(message);
    const std::string m = dir_.file("warn.jsonl");
    fs::remove(m);
    auto a = job(dir_.file("warn-ck" + std::to_string(extra.size())), m, "");
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--max-steps", "6"});
    const RunResult r = run_mpi(2, a);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("snapshots in host memory off on "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(done_of(m).at("snapshots_taken").number, 0);
    EXPECT_EQ(done_of(m).at("steps").number, 6);
  }
}

// A --snapshot-dir that was there keeps its mode (as root, --snapshot-dir /dev/shm must not lock
// the machine's other users out of it); the run's own directory in it is private.
TEST_F(Snapshots, AnExistingSnapshotDirectoryKeepsItsMode) {
  const std::string shared = dir_.file("shared");
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all | fs::perms::sticky_bit);  // 1777, as /dev/shm
  kill_after(1, dir_.file("shared-ck"), shared, 8);                  // its snapshots are left
  EXPECT_EQ(fs::status(shared).permissions(), fs::perms::all | fs::perms::sticky_bit);
  const std::string run = run_dir(shared);
  ASSERT_FALSE(run.empty());
  EXPECT_EQ(fs::status(run).permissions(), fs::perms::owner_all) << run;
  EXPECT_FALSE(the_snapshot(shared).empty());
}

// A snapshot directory that another user made (in a shared /dev/shm, before the run came to the
// host), or a run directory they made in a sticky one (root's --snapshot-dir /dev/shm), is not
// read: the snapshot in it could be theirs, planted under the run's id (which CHECKPOINT_DIR/run-id
// tells anyone who can read it). The run resumes from its checkpoint, and keeps no snapshots
// there. Before, --resume auto took the snapshot, and only then were snapshots switched off.
TEST_F(Snapshots, ASnapshotInAnotherUsersDirectoryIsNotResumed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (gives directories to another user); CI runs as root";
  for (const bool whole_dir : {true, false}) {
    SCOPED_TRACE(whole_dir ? "--snapshot-dir another user's" : "the run directory another user's");
    const std::string tag = whole_dir ? "theirs" : "sticky";
    const std::string ck = dir_.file(tag + "-ck"), snaps = dir_.file(tag + "-snaps");
    kill_after(1, ck, snaps, 8);  // checkpoint 5, snapshot 6
    const std::string run = run_dir(snaps);
    ASSERT_FALSE(run.empty());
    const std::string theirs = whole_dir ? snaps : run;
    if (!whole_dir) fs::permissions(snaps, fs::perms::all | fs::perms::sticky_bit);  // 1777, as /dev/shm
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    std::string err;
    const JsonObject d = resume(1, ck, snaps, &err);
    EXPECT_NE(err.find("snapshots not read: " + theirs + " belongs to another user (uid 65534)"), std::string::npos)
        << err;
    EXPECT_EQ(d.at("resumed_from").str, "checkpoint");
    EXPECT_EQ(d.at("resumed_from_step").number, 5);
    EXPECT_EQ(d.at("snapshots_taken").number, 0) << err;
  }
}

// A snapshot directory made under a umask that lets the group write (002, the default of many
// distributions for users with a group of their own) is made private, and used from the first
// run: its mode was judged as made, before the chmod, and snapshots were off on every host new to
// the user.
TEST_F(Snapshots, ADirectoryMadeUnderAGroupWritableUmaskIsUsed) {
  const std::string m = dir_.file("umask.jsonl"), snaps = dir_.file("umask-snaps");
  auto a = job(dir_.file("umask-ck"), m, snaps);
  a.insert(a.end(), {"--max-steps", "6"});
  const mode_t old = ::umask(002);
  const RunResult r = run_mpi(1, a);
  ::umask(old);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("snapshots in host memory off"), std::string::npos) << r.err;
  EXPECT_GT(done_of(m).at("snapshots_taken").number, 0);
  EXPECT_EQ(fs::status(snaps).permissions(), fs::perms::owner_all);
}

// An attempt with snapshots off (here: a budget too small for them; in the chaos soak: a host
// back with a full /dev/shm) still removes, at the run's end, the snapshots an earlier attempt
// left on every host: nothing would resume them, and they would hold the hosts' memory.
TEST_F(Snapshots, ARunThatEndsWithSnapshotsOffFreesAnEarlierAttemptsSnapshots) {
  const std::string ck = dir_.file("off-ck"), snaps = dir_.file("off-snaps");
  kill_after(2, ck, snaps, 8, 1);
  const std::string where = run_dir(snaps);
  ASSERT_FALSE(where.empty()) << "the killed attempt left no snapshots in " << snaps;
  const std::string m = dir_.file("off.jsonl");
  auto a = job(ck, m, snaps);
  a.insert(a.end(), {"--snapshot-max-memory", "1M"});
  const RunResult r = run_mpi(2, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("snapshots in host memory off on "), std::string::npos) << r.err;
  EXPECT_EQ(done_of(m).at("steps").number, 40);
  EXPECT_FALSE(fs::exists(where)) << "the finished run left the earlier attempt's snapshots in " << where;
}

// A run that ends removes its snapshots only when no other running hpctrain of the run holds the
// folder (its in-use lock, shared by each holder): here the test holds it, as a second job of the
// run on this host would, and the finished run keeps the folder and says so.
TEST_F(Snapshots, AFinishedRunLeavesSnapshotsAnotherRunningJobHolds) {
  const std::string ck = dir_.file("held-ck"), snaps = dir_.file("held-snaps");
  kill_after(1, ck, snaps, 8);
  const std::string where = run_dir(snaps);
  ASSERT_FALSE(where.empty()) << "the killed attempt left no snapshots in " << snaps;
  const int held = ::open((fs::path(where) / "in-use").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_SH), 0);
  std::string err;
  resume(1, ck, snaps, &err);
  EXPECT_TRUE(fs::exists(where)) << "the finished run removed snapshots another job holds: " << err;
  EXPECT_NE(err.find("kept the snapshots " + where + ": another running hpctrain of this run uses them"),
            std::string::npos) << err;
  ::close(held);
  const RunResult cleaned = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps, "--all"});
  EXPECT_EQ(cleaned.exit_code, 0) << cleaned.err;
  EXPECT_FALSE(fs::exists(where)) << "released, the folder is no longer in use";
}

// A snapshot directory this user may not write (as root, through setpriv without the override
// of permission bits, as CI runs it): one warning naming it, and the run trains on.
TEST_F(Snapshots, ASnapshotDirectoryThatIsNotWritableIsAWarning) {
  const std::string ro = dir_.file("read-only");
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const std::string m = dir_.file("ro.jsonl");
  auto a = job(dir_.file("ro-ck"), m, ro + "/snaps");
  a.insert(a.end(), {"--max-steps", "4"});
  const RunResult r = run_hpctrain_without_override(a);
  fs::permissions(ro, fs::perms::owner_all);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "snapshots in host memory off on "), 1) << r.err;
  EXPECT_NE(r.err.find(ro + "/snaps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
  EXPECT_EQ(done_of(m).at("snapshots_taken").number, 0);
  EXPECT_EQ(done_of(m).at("steps").number, 4);
  // A file where the directory should be: one warning, naming it, and no "checkpoint directory".
  const std::string file = dir_.file("a-file");
  std::ofstream(file) << "not a directory";
  auto b = job(dir_.file("file-ck"), dir_.file("file.jsonl"), file);
  b.insert(b.end(), {"--max-steps", "2"});
  const RunResult f = run_hpctrain(b);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(count_of(f.err, "warning: "), 1) << f.err;
  EXPECT_NE(f.err.find("snapshots in host memory off on "), std::string::npos) << f.err;
  EXPECT_NE(f.err.find(file + ": Not a directory"), std::string::npos) << f.err;
}

// Appends to `path` until its file system is full (ENOSPC): the bytes written.
size_t fill_up(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  const Bytes chunk(64 * 1024, 1);
  size_t total = 0;
  for (;;) {
    const ssize_t n = ::write(fd, chunk.data(), chunk.size());
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
  const int error = errno;
  ::close(fd);
  if (error != ENOSPC) throw std::runtime_error("cannot fill " + path + ": " + std::strerror(error));
  return total;
}

// The snapshots' file system fills up during the run (an 8 MB tmpfs, filled while the first
// snapshot of 3.4 MB waits, written whole, for its rename): a warning for the next, the run goes
// on, and the last snapshot that was written stays whole. The fill must come before a second
// snapshot is whole: from then on the store keeps a spare file, whose pages each new snapshot
// reuses, and a full file system fails no write (filled once the first snapshot was there, the
// test raced the run and lost under load: no failed write, two files). hpctrain refuses a file
// system too small for two snapshots at the start, so it cannot be full before. Needs root (mount).
TEST_F(Snapshots, AFullFileSystemDuringAWriteIsAWarning) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root (CI runs as root)";
  const std::string snaps = dir_.file("small");
  fs::create_directories(snaps);
  ASSERT_EQ(mount("tmpfs", snaps.c_str(), "tmpfs", 0, "size=8m"), 0) << std::strerror(errno);
  struct Unmount {
    std::string at;
    ~Unmount() { umount2(at.c_str(), MNT_DETACH); }
  } unmount{snaps};
  const std::string ck = dir_.file("full-ck");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "30", 1);
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "0.5", 1);  // every whole file: 1 snapshot, 6 checkpoints
  auto started = start_mpi(1, job(ck, dir_.file("full.jsonl"), snaps));
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  // The first snapshot's temporary file once its writer (hpctrain, whose pid ends the name) has
  // closed it: written whole, waiting for its rename. (A size that held still was not enough:
  // under load a write stalled half-way, the fill came then, and no snapshot was left.)
  std::string tmp, writer_fds;
  ASSERT_TRUE(wait_until(
      [&] {
        if (tmp.empty()) {
          if (!fs::exists(snaps) || run_dir(snaps).empty()) return false;
          for (const auto& e : fs::directory_iterator(run_dir(snaps))) {
            const std::string name = e.path().filename().string();
            const size_t at = name.find(".hpck.tmp.");
            if (at == std::string::npos) continue;
            tmp = fs::canonical(e.path()).string();
            writer_fds = "/proc/" + name.substr(at + 10) + "/fd";
          }
          return false;
        }
        if (!fs::exists(tmp)) throw std::runtime_error("the first snapshot was renamed before the test filled the file system");
        std::error_code ec;
        for (const auto& fd : fs::directory_iterator(writer_fds, ec))
          if (fs::read_symlink(fd.path(), ec).string() == tmp) return false;  // still open: being written
        return true;
      },
      60));
  fill_up(snaps + "/filler");
  const RunResult r = started->finish(120);
  EXPECT_NE(r.exit_code, 0) << "the kill hook did not fire: " << r.err;
  // Said once: every later try fails too, the file system still full.
  EXPECT_EQ(count_of(r.err, "a snapshot could not be written"), 1) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  // Nothing half-written: one whole snapshot, no temporary files; it resumes.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run_dir(snaps)))
    if (e.path().filename() != "in-use" && e.path().filename() != "checkpoint-dir")  // the run's lock and record
      left.push_back(e.path().filename().string());
  ASSERT_EQ(left.size(), 1u) << left.size();
  EXPECT_EQ(run_hpctrain({"inspect", run_dir(snaps) + "/" + left[0]}).exit_code, 0);
  const JsonObject d = resume(1, ck, snaps);
  EXPECT_EQ(d.at("resumed_from").str, "checkpoint") << "the newest state, step 30, is the checkpoint's";
  expect_same_end(d, uninterrupted(1));
}

// Snapshots of other runs last written over an hour ago are removed at start-up; newer ones,
// and files that are not run directories, stay.
TEST_F(Snapshots, OldLeftoversOfOtherRunsAreRemoved) {
  const std::string snaps = dir_.file("leftovers");
  for (const char* d : {"0123456789abcdef", "fedcba9876543210", "not-a-run"}) fs::create_directories(snaps + "/" + d);
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(snaps + "/0123456789abcdef", now - std::chrono::minutes(61));
  fs::last_write_time(snaps + "/fedcba9876543210", now - std::chrono::minutes(59));
  fs::last_write_time(snaps + "/not-a-run", now - std::chrono::hours(25));
  auto a = job(dir_.file("left-ck"), dir_.file("left.jsonl"), snaps);
  a.insert(a.end(), {"--max-steps", "2"});
  const RunResult r = run_mpi(1, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(snaps + "/0123456789abcdef"));
  EXPECT_TRUE(fs::exists(snaps + "/fedcba9876543210"));
  EXPECT_TRUE(fs::exists(snaps + "/not-a-run"));
}

// A killed run's snapshots stay for a relaunch, an hour at most: `hpctrain clean-snapshots`
// keeps them while they are younger and removes them once older (or with --all, or --run-id);
// the snapshots of a run that is still training are never removed, not even with --all.
TEST_F(Snapshots, AKilledRunsSnapshotsAreFreedAfterAnHourOrByTheCleanup) {
  const std::string snaps = dir_.file("clean"), ck = dir_.file("clean-ck");
  kill_after(1, ck, snaps, 8);
  const std::string killed = run_dir(snaps);
  ASSERT_TRUE(fs::exists(killed + "/ckpt-000000006.hpck")) << killed;
  const RunResult young = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps});
  EXPECT_EQ(young.exit_code, 0) << young.err;
  EXPECT_NE(young.out.find("removed the snapshots of 0 run(s), 0 B freed; kept 0 in use and 1 last written within 60 min"),
            std::string::npos) << young.out;
  EXPECT_TRUE(fs::exists(killed));
  // An hour later.
  fs::last_write_time(killed, fs::file_time_type::clock::now() - std::chrono::minutes(61));
  const RunResult old = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps});
  EXPECT_EQ(old.exit_code, 0) << old.err;
  EXPECT_NE(old.out.find("removed the snapshots of 1 run(s)"), std::string::npos) << old.out;
  EXPECT_NE((old.out + old.err).find("removed the snapshots of run " + fs::path(killed).filename().string() + " (older than"),
            std::string::npos) << old.out << old.err;
  EXPECT_FALSE(fs::exists(killed));

  // By its run id, at any age; and a running job's, with --all: kept.
  kill_after(1, ck, snaps, 8);
  const std::string again = run_dir(snaps);
  auto a = job(dir_.file("live-ck"), dir_.file("live.jsonl"), snaps);
  a = with(a, "--epochs", "1000");
  const auto live = start_mpi(1, a);
  std::string live_dir;
  ASSERT_TRUE(wait_until(
      [&] {
        for (const auto& e : fs::directory_iterator(snaps))
          if (e.path() != again && fs::exists(e.path() / "in-use")) live_dir = e.path().string();
        return !live_dir.empty() || !live->running();
      },
      60));
  ASSERT_FALSE(live_dir.empty()) << "the running job took no snapshot";
  const RunResult by_id =
      run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps, "--run-id", fs::path(again).filename().string()});
  EXPECT_EQ(by_id.exit_code, 0) << by_id.err;
  EXPECT_FALSE(fs::exists(again));
  EXPECT_TRUE(fs::exists(live_dir));
  const RunResult all = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps, "--all"});
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.out.find("removed the snapshots of 0 run(s), 0 B freed; kept 1 in use"), std::string::npos) << all.out;
  EXPECT_TRUE(fs::exists(live_dir)) << "the running job's snapshots were removed";
  const std::vector<pid_t> ranks = child_pids(live->pid());
  kill(-live->pid(), SIGKILL);
  for (pid_t rank : ranks) kill(rank, SIGKILL);
  live->finish();
  ASSERT_TRUE(wait_until([&] { return std::none_of(ranks.begin(), ranks.end(), [](pid_t p) { return kill(p, 0) == 0; }); }, 10));
  const RunResult after = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps, "--all"});
  EXPECT_NE(after.out.find("removed the snapshots of 1 run(s)"), std::string::npos) << after.out << after.err;
  EXPECT_FALSE(fs::exists(live_dir)) << "killed, its snapshots are no longer in use";
}

// A host a run left (killed there; requeued elsewhere) keeps its snapshots for the hour a
// relaunch there may need them; once the run has ended for good on other hosts (--snapshot-dir
// b), the cleanup there (the next job's Slurm epilog) frees them at once, as its checkpoint
// directory tells: its heartbeat says done, or its run-id names a fresh start. A copy of the
// directory where it was (another inode) tells nothing: kept.
TEST_F(Snapshots, AnEndedRunsSnapshotsOnAHostItLeftAreFreedByTheCleanup) {
  const std::string a = dir_.file("left-a"), b = dir_.file("left-b"), ck = dir_.file("left-ck");
  const auto clean_a = [&] {
    const RunResult r = run_hpctrain({"clean-snapshots", "--snapshot-dir", a});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out + r.err;
  };
  kill_after(1, ck, a, 8);
  const std::string left = run_dir(a), id = fs::path(left).filename().string();
  ASSERT_TRUE(fs::exists(left + "/checkpoint-dir")) << left;
  std::string said = clean_a();
  EXPECT_NE(said.find("removed the snapshots of 0 run(s)"), std::string::npos) << said;  // it may come back here
  resume(1, ck, b);  // finishes "on another host"
  fs::rename(ck, ck + "-moved");  // and a copy in its place: another directory
  fs::copy(ck + "-moved", ck, fs::copy_options::recursive);
  said = clean_a();
  EXPECT_NE(said.find("removed the snapshots of 0 run(s)"), std::string::npos) << said;
  EXPECT_TRUE(fs::exists(left));
  fs::remove_all(ck);
  fs::rename(ck + "-moved", ck);
  said = clean_a();
  EXPECT_NE(said.find("removed the snapshots of run " + id + " (its run has finished"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(left));

  // Killed here again, then a fresh start in its checkpoint directory elsewhere.
  const std::string ck2 = dir_.file("left-ck2");
  kill_after(1, ck2, a, 8);
  const std::string left2 = run_dir(a), id2 = fs::path(left2).filename().string();
  auto fresh = job(ck2, dir_.file("left-fresh.jsonl"), b);
  fresh.insert(fresh.end(), {"--resume", "none", "--max-steps", "2"});
  const RunResult r = run_mpi(1, fresh);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NE(read_text(ck2 + "/run-id").substr(0, 16), id2);
  said = clean_a();
  EXPECT_NE(said.find("removed the snapshots of run " + id2 + " (its checkpoint directory went on to another run"),
            std::string::npos) << said;
  EXPECT_FALSE(fs::exists(left2));
}

// clean-snapshots removes a run's directory only when it holds nothing but a Snapshotter's
// files: a directory named like a run id (16 hex digits) that holds anything else is kept and
// said so; and it refuses the root directory, as training does.
TEST_F(Snapshots, TheCleanupRemovesNothingButSnapshots) {
  const fs::path snaps = dir_.file("foreign");
  fs::create_directories(snaps / "0123456789abcdef");
  std::ofstream(snaps / "0123456789abcdef" / "thesis.txt") << "years of work";
  std::ofstream(snaps / "0123456789abcdef" / "in-use");
  fs::create_directories(snaps / "fedcba9876543210");
  std::ofstream(snaps / "fedcba9876543210" / "in-use");
  std::ofstream(snaps / "fedcba9876543210" / "ckpt-000000004.hpck") << "a snapshot";
  std::ofstream(snaps / "fedcba9876543210" / ".spare") << "its spare pages";
  fs::create_directories(snaps / "00000000ffffffff");  // a checkpoint directory of that name
  for (const char* f : {"lock", "run-id", "ckpt-000000004.hpck"}) std::ofstream(snaps / "00000000ffffffff" / f) << f;
  const RunResult all = run_hpctrain({"clean-snapshots", "--snapshot-dir", snaps.string(), "--all"});
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.out.find("removed the snapshots of 1 run(s)"), std::string::npos) << all.out;
  EXPECT_NE((all.out + all.err).find("kept " + (snaps / "0123456789abcdef").string() + ": it holds files that are not hpctrain's"),
            std::string::npos) << all.out << all.err;
  EXPECT_TRUE(fs::exists(snaps / "0123456789abcdef" / "thesis.txt"));
  EXPECT_TRUE(fs::exists(snaps / "00000000ffffffff" / "ckpt-000000004.hpck"));
  EXPECT_FALSE(fs::exists(snaps / "fedcba9876543210"));
  const RunResult root = run_hpctrain({"clean-snapshots", "--snapshot-dir", "//", "--all"});
  EXPECT_EQ(root.exit_code, 2) << root.out << root.err;
  EXPECT_NE(root.err.find("--snapshot-dir // is the root directory"), std::string::npos) << root.err;
}

// --snapshot-max-memory holds across all of a user's runs on a host: the snapshots of another
// run that no running hpctrain uses make room (oldest first); with them it would not fit.
TEST_F(Snapshots, TheMemoryBudgetCoversEveryRunOfTheUser) {
  const std::string snaps = dir_.file("budget");
  for (const char* id : {"0123456789abcdef", "fedcba9876543210"}) {
    fs::create_directories(snaps + "/" + id);
    write_bytes(snaps + "/" + id + "/ckpt-000000003.hpck", Bytes(4 << 20, 1));
  }
  fs::last_write_time(snaps + "/0123456789abcdef", fs::file_time_type::clock::now() - std::chrono::minutes(5));
  // The cnn's state is about 3.3 MB: twice that and one of the two 4 MiB leftovers fit in 12M.
  auto a = job(dir_.file("budget-ck"), dir_.file("budget.jsonl"), snaps);
  a.insert(a.end(), {"--max-steps", "4", "--snapshot-max-memory", "12M"});
  const RunResult r = run_mpi(1, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "snapshots in host memory off"), 0) << r.err;
  EXPECT_FALSE(fs::exists(snaps + "/0123456789abcdef")) << "the older leftover makes room";
  EXPECT_TRUE(fs::exists(snaps + "/fedcba9876543210")) << r.err;
  // Held by a running job, the younger leftover could not make room: the snapshots are off.
  const int fd = ::open((snaps + "/fedcba9876543210/in-use").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  write_bytes(snaps + "/fedcba9876543210/ckpt-000000004.hpck", Bytes(4 << 20, 1));
  auto b = job(dir_.file("budget-ck2"), dir_.file("budget2.jsonl"), snaps);
  b.insert(b.end(), {"--max-steps", "4", "--snapshot-max-memory", "12M"});
  const RunResult off = run_mpi(1, b);
  ::close(fd);
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.err.find("the snapshots of 1 other running job(s) of this user in " + snaps + " hold 8.4 MB of the 12.6 MB"),
            std::string::npos) << off.err;
  EXPECT_TRUE(fs::exists(snaps + "/fedcba9876543210/ckpt-000000004.hpck"));
}

}  // namespace
}  // namespace hpc::itest
