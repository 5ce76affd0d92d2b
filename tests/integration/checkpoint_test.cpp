// Checkpoints and resume through the real binary: bit-exact resume after a rank is killed,
// resume on another world size, crash consistency of the store, retention, and the errors
// of a checkpoint that does not fit.
#include <gtest/gtest.h>

#include <cstdlib>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Fashion-MNIST not found in " << fashion_mnist_dir();
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  }
  void TearDown() override {
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  }

  // 2 epochs of 20 global steps (1280 samples, global batch 64), one thread per rank.
  std::vector<std::string> job(const std::string& ckpt_dir, const std::string& metrics) const {
    std::vector<std::string> a{"--train-samples", "1280", "--test-samples", "300",       "--epochs", "2",
                               "--global-batch-size", "64", "--threads",    "1",        "--quiet",  "--data-dir",
                               fashion_mnist_dir(),   "--metrics-file",     metrics};
    if (!ckpt_dir.empty()) a.insert(a.end(), {"--checkpoint-dir", ckpt_dir, "--checkpoint-every-steps", "5"});
    return a;
  }
  std::string uninterrupted(int ranks) {
    const std::string m = dir_.file("full" + std::to_string(ranks) + ".jsonl");
    const RunResult r = run_mpi(ranks, job("", m));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return done_of(m)["param_checksum"].str;
  }

  TempDir dir_{"ckpt"};
};

// A rank dies by SIGKILL after step 7 (checkpoints every 5 steps); the job resumed on the same
// number of ranks ends with exactly the parameters of a run never interrupted.
TEST_F(Checkpoints, ResumeAfterAKilledRankIsBitExact) {
  for (const auto& [ranks, victim] : {std::pair{1, "7@0"}, std::pair{2, "7@1"}}) {
    SCOPED_TRACE(::testing::Message() << ranks << " rank(s), kill " << victim);
    const std::string want = uninterrupted(ranks);
    const std::string ck = dir_.file("kill" + std::to_string(ranks));
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", victim, 1);
    const RunResult killed = run_mpi(ranks, job(ck, dir_.file("killed.jsonl")));
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    EXPECT_NE(killed.exit_code, 0);
    const std::string m = dir_.file("resumed" + std::to_string(ranks) + ".jsonl");
    const RunResult resumed = run_mpi(ranks, job(ck, m));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    const JsonObject d = done_of(m);
    EXPECT_EQ(d.at("resumed_from_step").number, 5);
    EXPECT_EQ(d.at("steps").number, 40);
    EXPECT_EQ(d.at("param_checksum").str, want);
  }
}

// SIGTERM (or SIGUSR1) on one rank: every rank stops at the same step boundary, rank 0
// checkpoints there, all exit with 75 ("checkpointed, requeue me"); the resumed job ends
// bit-exactly where an uninterrupted one does.
TEST_F(Checkpoints, StopOnSignalCheckpointsAndResumesExactly) {
  const std::string want = uninterrupted(2);
  for (const char* how : {"13@1", "17@0:usr1"}) {
    SCOPED_TRACE(how);
    const std::string ck = dir_.file(std::string("sig") + how[0] + how[1]);
    setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", how, 1);
    auto args = job(ck, dir_.file("s1.jsonl"));
    std::replace(args.begin(), args.end(), std::string("--checkpoint-every-steps"), std::string("--keep-checkpoints"));
    const RunResult stopped = run_mpi(2, args);  // no periodic checkpoints: only the one for the signal
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
    EXPECT_EQ(count_of(stopped.err, "stopped on request"), 1) << stopped.err;
    const int64_t at = std::atoll(how);
    EXPECT_TRUE(fs::exists(ck + "/" + "ckpt-0000000" + std::to_string(at) + ".hpck")) << stopped.err;
    const std::string m = dir_.file("s2.jsonl");
    const RunResult resumed = run_mpi(2, job(ck, m));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(done_of(m).at("resumed_from_step").number, static_cast<double>(at));
    EXPECT_EQ(done_of(m).at("param_checksum").str, want);
  }
}

// Stopped right after its last step, and then started again once finished (as a job chain's
// later segments are): nothing is left to train, so each run only evaluates the checkpoint's
// model, and reports its real accuracy and parameters.
TEST_F(Checkpoints, ResumingAtTheLastStepOnlyEvaluates) {
  const std::string want = uninterrupted(2);
  const std::string ck = dir_.file("end");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "40@1", 1);
  const RunResult stopped = run_mpi(2, job(ck, dir_.file("end1.jsonl")));
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  double accuracy = -1;
  for (const char* run : {"end2", "end3"}) {
    SCOPED_TRACE(run);
    const std::string m = dir_.file(std::string(run) + ".jsonl");
    const RunResult r = run_mpi(2, job(ck, m));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonObject d = done_of(m);
    EXPECT_EQ(d.at("steps").number, 40);
    EXPECT_EQ(d.at("resumed_from_step").number, 40);
    EXPECT_EQ(d.at("param_checksum").str, want);
    EXPECT_GT(d.at("test_accuracy").number, 0.3);  // evaluated, not a zero left unset
    if (accuracy >= 0) {
      EXPECT_EQ(d.at("test_accuracy").number, accuracy);
    }
    accuracy = d.at("test_accuracy").number;
  }
}

// Resumed on another number of ranks, the run continues at the checkpoint's sample with the
// checkpoint's global batch and finishes the planned steps.
TEST_F(Checkpoints, ResumeOnAnotherWorldSize) {
  for (const auto& [before, after] : {std::pair{4, 2}, std::pair{2, 1}}) {
    SCOPED_TRACE(::testing::Message() << before << " -> " << after << " ranks");
    const std::string ck = dir_.file("world" + std::to_string(before));
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "12@0", 1);
    run_mpi(before, job(ck, dir_.file("w_killed.jsonl")));
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    const std::string m = dir_.file("w_resumed.jsonl");
    auto args = job(ck, m);
    args.erase(std::find(args.begin(), args.end(), "--global-batch-size"), std::find(args.begin(), args.end(), "--threads"));
    args.insert(args.end(), {"--batch-size", "16"});  // per rank: would be another global batch; the checkpoint's wins
    const RunResult r = run_mpi(after, args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonObject d = done_of(m);
    EXPECT_EQ(d.at("resumed_from_step").number, 10);
    EXPECT_EQ(d.at("steps").number, 40);
    EXPECT_EQ(d.at("world_size").number, after);
    EXPECT_EQ(d.at("global_batch_size").number, 64);
  }
}

// Killed late in its second epoch and resumed on half the ranks, a run reaches the accuracy
// of one never interrupted: 2 epochs of 100 steps, checkpoints every 25, killed after step
// 155, so the last 50 steps run on the new world size (batch-norm statistics then come from
// other per-rank batches; everything else is the same computation). Evaluated on all 10000
// test images; over seeds 1 to 4 the differences were at most 0.32 points.
TEST_F(Checkpoints, ResumeOnAnotherWorldSizeKeepsTheAccuracy) {
  const std::vector<std::string> base{"--train-samples", "6400",    "--epochs",     "2",
                                      "--global-batch-size", "64",  "--threads",    "1",
                                      "--quiet",         "--data-dir", fashion_mnist_dir()};
  for (const auto& [before, after] : {std::pair{4, 2}, std::pair{2, 1}}) {
    SCOPED_TRACE(::testing::Message() << before << " -> " << after << " ranks");
    const std::string tag = std::to_string(before) + std::to_string(after);
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.begin(), base.begin(), base.end());
      return extra;
    };
    const std::string full = dir_.file("acc_full" + tag + ".jsonl");
    ASSERT_EQ(run_mpi(before, with({"--metrics-file", full})).exit_code, 0);
    const std::string ck = dir_.file("acc" + tag);
    const auto checkpointed = with({"--checkpoint-dir", ck, "--checkpoint-every-steps", "25"});
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "155@0", 1);
    EXPECT_NE(run_mpi(before, checkpointed).exit_code, 0);
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    const std::string resumed = dir_.file("acc_resumed" + tag + ".jsonl");
    auto args = checkpointed;
    args.insert(args.end(), {"--metrics-file", resumed});
    const RunResult r = run_mpi(after, args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonObject want = done_of(full), got = done_of(resumed);
    EXPECT_EQ(got.at("resumed_from_step").number, 150);
    EXPECT_EQ(got.at("steps").number, 200);
    EXPECT_EQ(got.at("world_size").number, after);
    EXPECT_NEAR(got.at("test_accuracy").number, want.at("test_accuracy").number, 0.005);
  }
}

// A writer killed between writing its temporary file and renaming it leaves the earlier
// checkpoints as they were; truncated and bit-flipped newest files are skipped with a warning.
TEST_F(Checkpoints, CrashesAndCorruptionLeaveAValidCheckpoint) {
  const std::string ck = dir_.file("crash");
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "3", 1);
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "11@0", 1);  // the step-10 write is paused before its rename
  run_mpi(1, job(ck, dir_.file("c1.jsonl")));
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000005.hpck"));
  EXPECT_FALSE(fs::exists(ck + "/ckpt-000000010.hpck"));
  auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(ck)) n += e.path().filename().string().find(".tmp.") != std::string::npos;
    return n;
  };
  EXPECT_EQ(leftovers(), 1) << "the killed writer's temporary file";
  // Now damage copies: a newest file cut short and one with a flipped bit.
  Bytes good = read_bytes(ck + "/ckpt-000000005.hpck");
  Bytes cut(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  write_bytes(ck + "/ckpt-000000015.hpck", cut);
  Bytes flipped = good;
  flipped[flipped.size() - 100] ^= 0x10;
  write_bytes(ck + "/ckpt-000000020.hpck", flipped);
  const std::string m = dir_.file("c2.jsonl");
  auto args = job(ck, m);
  std::replace(args.begin(), args.end(), std::string("--quiet"), std::string("--log-every"));
  args.insert(std::find(args.begin(), args.end(), std::string("--log-every")) + 1, "1000");
  const RunResult r = run_hpctrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("ckpt-000000020.hpck is corrupt (checksum mismatch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ckpt-000000015.hpck is truncated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("using the previous valid one"), std::string::npos) << r.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 5);
  EXPECT_EQ(done_of(m).at("param_checksum").str, uninterrupted(1));
  EXPECT_EQ(leftovers(), 0) << "the next run removes it";
}

TEST_F(Checkpoints, KeepsTheNewestK) {
  const std::string ck = dir_.file("keep");
  auto args = job(ck, dir_.file("k.jsonl"));
  args.insert(args.end(), {"--keep-checkpoints", "2"});
  ASSERT_EQ(run_hpctrain(args).exit_code, 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-000000035.hpck", "ckpt-000000040.hpck", "heartbeat"}));
  const std::string beat = read_text(ck + "/heartbeat");
  EXPECT_EQ(beat.rfind("step=", 0), 0u) << beat;
  EXPECT_NE(beat.find("\nunix_time="), std::string::npos) << beat;
}

// One rank stopped by SIGSTOP (a hung node) after step 3: the others wait inside an
// all-reduce until their watchdog ends the job with 124 within --step-timeout plus start-up.
TEST_F(Checkpoints, TheWatchdogEndsAJobWithAStoppedRank) {
  for (const char* stopped : {"3@1:stop", "3@0:stop"}) {
    SCOPED_TRACE(stopped);
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", stopped, 1);
    auto args = job("", dir_.file("hang.jsonl"));
    args.insert(args.end(), {"--step-timeout", "4s"});
    const RunResult r = run_mpi(2, args, 120);
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    ASSERT_FALSE(r.timed_out) << "the job hung\n" << r.err;
    EXPECT_EQ(r.exit_code, 124) << r.err;
    const std::string alive = stopped[2] == '1' ? "rank 0 on " : "rank 1 on ";
    EXPECT_NE(r.err.find("hpctrain: error: " + alive), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(": no step finished within --step-timeout 4 s (the last was step 3)"), std::string::npos)
        << r.err;
    EXPECT_GE(r.seconds, 4.0);
    EXPECT_LT(r.seconds, 4.0 + 10.0) << "start-up, 3 steps and the timeout took this long";
  }
}

void expect_usage_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.command << "\n" << r.err;
  EXPECT_EQ(count_of(r.err, "hpctrain: error: "), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "wanted '" << needle << "' in\n" << r.err;
}

// `hpctrain evaluate` of the final checkpoint reproduces the run's own last test accuracy, on
// one rank and on two; `hpctrain inspect` shows the header and tells valid from damaged files.
TEST_F(Checkpoints, EvaluateAndInspectACheckpoint) {
  const std::string ck = dir_.file("eval");
  const std::string m = dir_.file("e.jsonl");
  ASSERT_EQ(run_hpctrain(job(ck, m)).exit_code, 0);
  const double trained = done_of(m).at("test_accuracy").number;
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << ranks << " rank(s)");
    const std::string em = dir_.file("evaluate" + std::to_string(ranks) + ".jsonl");
    const RunResult r = run_mpi(ranks, {"evaluate", "--checkpoint", ck, "--test-samples", "300", "--data-dir",
                                        fashion_mnist_dir(), "--threads", "1", "--metrics-file", em});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto lines = read_json_lines(em);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].at("event").str, "evaluate");
    EXPECT_EQ(lines[0].at("checkpoint").str, ck + "/ckpt-000000040.hpck");
    EXPECT_EQ(lines[0].at("step").number, 40);
    EXPECT_EQ(lines[0].at("samples").number, 300);
    EXPECT_EQ(lines[0].at("test_accuracy").number, trained);
    char want[64];
    std::snprintf(want, sizeof want, "test accuracy %.2f%%", 100 * trained);
    EXPECT_EQ(count_of(r.out, want), 1) << r.out;
  }

  const RunResult listing = run_hpctrain({"inspect", ck});
  EXPECT_EQ(listing.exit_code, 0) << listing.err;
  EXPECT_EQ(count_of(listing.out, "  valid\n"), 3) << listing.out;
  EXPECT_NE(listing.out.find("ckpt-000000040.hpck  step 40  after epoch 2  cnn"), std::string::npos) << listing.out;
  EXPECT_NE(listing.out.find("heartbeat: done, step 40"), std::string::npos) << listing.out;
  const RunResult json = run_hpctrain({"inspect", "--json", ck + "/ckpt-000000035.hpck"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const JsonObject h = FlatJsonParser(lines_of(json.out).at(0)).parse();
  EXPECT_EQ(h.at("valid").str, "yes");
  EXPECT_EQ(h.at("model").str, "cnn");
  EXPECT_EQ(h.at("step").number, 35);
  EXPECT_EQ(h.at("epoch").number, 1);
  EXPECT_EQ(h.at("step_in_epoch").number, 15);
  EXPECT_EQ(h.at("global_batch_size").number, 64);
  EXPECT_EQ(h.at("option.lr").str, "0.1");
  EXPECT_EQ(h.at("size_bytes").number, static_cast<double>(fs::file_size(ck + "/ckpt-000000035.hpck")));

  // A bit flipped in the parameters: the header is still shown, the file is declared invalid.
  Bytes bad = read_bytes(ck + "/ckpt-000000035.hpck");
  bad[bad.size() / 3] ^= 0x01;
  write_bytes(dir_.file("bad.hpck"), bad);
  const RunResult damaged = run_hpctrain({"inspect", dir_.file("bad.hpck")});
  expect_usage_error(damaged, "is corrupt (checksum mismatch in its parameters section)");
  EXPECT_NE(damaged.out.find("valid: no"), std::string::npos) << damaged.out;
  EXPECT_NE(damaged.out.find("position: step 35, in epoch 2, 15 steps into it"), std::string::npos) << damaged.out;
  expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", dir_.file("bad.hpck")}), "is corrupt");
  expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", dir_.file("none.hpck")}), "cannot read checkpoint");
  expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", ck, "--eval-batch-size", "0"}),
                     "--eval-batch-size must be a positive integer");
  expect_usage_error(run_hpctrain({"evaluate"}), "'--checkpoint' is required");
  const RunResult help = run_hpctrain({"evaluate", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("Usage: hpctrain evaluate --checkpoint PATH"), std::string::npos) << help.out;
  expect_usage_error(run_hpctrain({"inspect"}), "hpctrain inspect needs a PATH");
  expect_usage_error(run_hpctrain({"inspect", dir_.str() + "/nothing-here"}), "no such file or directory");
}

TEST_F(Checkpoints, ACheckpointThatDoesNotFitIsAClearError) {
  const std::string ck = dir_.file("fit");
  ASSERT_EQ(run_hpctrain(job(ck, dir_.file("f.jsonl"))).exit_code, 0);
  auto with = [&](std::vector<std::string> extra) {
    auto a = job(ck, dir_.file("f2.jsonl"));
    a.insert(a.end(), extra.begin(), extra.end());
    return run_hpctrain(a);
  };
  expect_usage_error(with({"--lr", "0.2"}), "the checkpoint was made with --lr=0.1, this run has --lr=0.2");
  expect_usage_error(with({"--model", "mlp"}), "the checkpoint is of model cnn, not mlp");
  auto other_batch = job(ck, dir_.file("f3.jsonl"));
  *(std::find(other_batch.begin(), other_batch.end(), "--global-batch-size") + 1) = "32";
  expect_usage_error(run_hpctrain(other_batch), "the checkpoint was made with a global batch of 64");
  expect_usage_error(with({"--resume", dir_.file("missing.hpck")}), "cannot read checkpoint");
  write_text(dir_.file("junk.hpck"), "not a checkpoint at all");
  expect_usage_error(with({"--resume", dir_.file("junk.hpck")}), "is not an hpctrain checkpoint (wrong magic)");
  expect_usage_error(with({"--checkpoint-interval", "soon"}), "--checkpoint-interval must be a duration");
  // --resume none starts afresh even with checkpoints in the directory.
  const std::string m = dir_.file("fresh.jsonl");
  auto fresh = job(ck, m);
  fresh.insert(fresh.end(), {"--resume", "none"});
  ASSERT_EQ(run_hpctrain(fresh).exit_code, 0);
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, -1);
}

}  // namespace
}  // namespace hpc::itest
