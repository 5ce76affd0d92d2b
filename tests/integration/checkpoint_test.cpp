// Checkpoints and resume through the real binary: bit-exact resume after a rank is killed,
// resume on another world size, crash consistency of the store, retention, and the errors
// of a checkpoint that does not fit.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <regex>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

// Whether DIR/heartbeat ends the run as stopped (not "training", which a watcher takes for a hang once
// its time stops advancing), with an exit_code= line where it was a stop at once (exit_code > 0).
void expect_stopped_heartbeat(const std::string& dir, int exit_code = 0) {
  const std::string beat = read_text(dir + "/heartbeat");
  EXPECT_NE(beat.find("\nstate=stopped\n"), std::string::npos) << beat;
  if (exit_code > 0) {
    EXPECT_NE(beat.find("\nexit_code=" + std::to_string(exit_code) + "\n"), std::string::npos) << beat;
  } else {
    EXPECT_EQ(beat.find("\nexit_code="), std::string::npos) << beat;
  }
}

// Whether the metrics file ends in a stop at once's "stopped" event (its signal and exit code,
// no checkpoint) and the Prometheus file says state "stopped" with that exit code: a scrape of
// the file a killed run left said "training" for ever.
// `job`: the Prometheus file's hpctrain_job label (the checkpoint directory's name). `ck`: that
// directory, whose heartbeat names the event's step (a watcher reading either sees one position).
void expect_stopped_at_once(const std::string& metrics, const std::string& prom, const std::string& job,
                            const std::string& signal, int exit_code, const std::string& ck) {
  const std::string text = read_text(prom);
  const std::string labels = "{hpctrain_job=\"" + job + "\",world_size=\"1\"";
  EXPECT_NE(text.find("hpctrain_state" + labels + ",state=\"stopped\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hpctrain_state" + labels + ",state=\"training\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hpctrain_exit_code" + labels + "} " + std::to_string(exit_code) + "\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\nhpctrain_last_update_timestamp_seconds" + labels + "} "), std::string::npos) << text;
  // With the config event: a run stopped before its first epoch line has that one.
  const auto lines = read_all_json_lines(metrics);
  ASSERT_FALSE(lines.empty());
  ASSERT_EQ(lines.back().at("event").str, "stopped") << read_text(metrics);
  EXPECT_EQ(lines.back().at("signal").str, signal);
  EXPECT_EQ(lines.back().at("exit_code").number, exit_code);
  EXPECT_FALSE(lines.back().at("checkpointed").boolean);
  EXPECT_GT(lines.back().at("step").number, 0);
  EXPECT_GT(lines.back().at("elapsed_seconds").number, 0);
  EXPECT_GT(lines.back().at("unix_time").number, 1e9);
  const std::string beat = read_text(ck + "/heartbeat");
  const auto step = static_cast<int64_t>(lines.back().at("step").number);
  EXPECT_NE(beat.find("step=" + std::to_string(step) + "\n"), std::string::npos)
      << "the stopped event says step " << step << ", the heartbeat:\n" << beat;
}

// "usr2" -> "USR2" (the tests' hooks name signals in lower case).
std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A checkpoint file's bytes with the payload of its section of `kind` (1 meta, 2 parameters)
// changed by `edit`, its length and CRC-32 made to fit: a file made or edited elsewhere.
Bytes with_section(const Bytes& file, uint32_t kind, const std::function<void(Bytes&)>& edit) {
  Bytes out(file.begin(), file.begin() + 12);  // magic and format version
  for (size_t at = 12; at + 16 <= file.size();) {  // sections: u32 kind, u64 bytes, u32 CRC-32, payload
    uint32_t k = 0;
    uint64_t bytes = 0;
    std::memcpy(&k, &file[at], 4);
    std::memcpy(&bytes, &file[at + 4], 8);
    Bytes payload(file.begin() + static_cast<ptrdiff_t>(at + 16), file.begin() + static_cast<ptrdiff_t>(at + 16 + bytes));
    if (k == kind) edit(payload);
    const uint64_t n = payload.size();
    const auto sum = static_cast<uint32_t>(crc32(0L, payload.data(), static_cast<uInt>(n)));
    const size_t head = out.size();
    out.resize(head + 16);
    std::memcpy(&out[head], &k, 4);
    std::memcpy(&out[head + 4], &n, 8);
    std::memcpy(&out[head + 12], &sum, 4);
    out.insert(out.end(), payload.begin(), payload.end());
    at += 16 + bytes;
  }
  return out;
}

// The same with the meta section's line KEY=... reading KEY=VALUE.
Bytes with_meta(const Bytes& file, const std::string& key, const std::string& value) {
  return with_section(file, 1, [&](Bytes& meta) {
    std::string text = "\n" + std::string(meta.begin(), meta.end());
    const size_t at = text.find("\n" + key + "=");
    ASSERT_NE(at, std::string::npos) << key;
    const size_t from = at + key.size() + 2, to = text.find('\n', from);
    text.replace(from, to - from, value);
    meta.assign(text.begin() + 1, text.end());
  });
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Fashion-MNIST not found in " << fashion_mnist_dir();
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  }
  void TearDown() override {
    unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  }

  // 2 epochs of 20 global steps (1280 samples, global batch 64), one thread per rank.
  std::vector<std::string> job(const std::string& ckpt_dir, const std::string& metrics, int epochs = 2) const {
    std::vector<std::string> a{"--train-samples", "1280", "--test-samples", "300",       "--epochs", std::to_string(epochs),
                               "--global-batch-size", "64", "--threads",    "1",        "--quiet",  "--data-dir",
                               fashion_mnist_dir(),   "--metrics-file",     metrics};
    // The checkpoints on shared storage alone: snapshot_test has the snapshots in host memory.
    if (!ckpt_dir.empty())
      a.insert(a.end(), {"--checkpoint-dir", ckpt_dir, "--checkpoint-every-steps", "5", "--snapshot-every-steps", "0"});
    return a;
  }
  // The done line and epoch events of job() never interrupted (the same in every test).
  const Ended& uninterrupted_run(int ranks) {
    return uninterrupted_end(ranks, [&](const std::string& m) { return job("", m); },
                             dir_.file("full" + std::to_string(ranks) + ".jsonl"));
  }
  JsonObject uninterrupted(int ranks) { return uninterrupted_run(ranks).done; }

  // job() continued from the checkpoints in `ck`: it must resume at step `from` and end exactly
  // where an uninterrupted run does.
  void expect_exact_resume(int ranks, const std::string& ck, int64_t from) {
    const std::string m = dir_.file("resumed.jsonl");
    std::filesystem::remove(m);
    const RunResult r = run_mpi(ranks, job(ck, m));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(done_of(m).at("resumed_from_step").number, static_cast<double>(from));
    expect_same_end(done_of(m), uninterrupted(ranks));
  }

  // job() started in the background with `ck` (checkpoints every 5 steps) and extra options.
  std::unique_ptr<Started> start(const std::string& ck, std::vector<std::string> extra = {}) {
    auto args = job(ck, dir_.file("bg.jsonl"));
    args.insert(args.end(), extra.begin(), extra.end());
    return start_hpctrain(args);
  }

  TempDir dir_{"ckpt"};
};

// A rank dies by SIGKILL after step 7 (checkpoints every 5 steps); the job resumed on the same
// number of ranks ends with exactly the parameters of a run never interrupted.
TEST_F(Checkpoints, ResumeAfterAKilledRankIsBitExact) {
  for (const auto& [ranks, victim] : {std::pair{1, "7@0"}, std::pair{2, "7@1"}}) {
    SCOPED_TRACE(::testing::Message() << ranks << " rank(s), kill " << victim);
    const JsonObject want = uninterrupted(ranks);
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
    expect_same_end(d, want);
    expect_same_epochs(epochs_of(m), uninterrupted_run(ranks).epochs);  // epoch 1 resumed 5 steps into it
  }
}

// The progress line's ETA after a resume: the time per step is this process's over its own
// steps. Divided among every step since the run's start, it read a third of the time left after
// a kill at step 20 of 200 (2s of 7 here; 0s long before the end of a run resumed late).
TEST_F(Checkpoints, TheEtaAfterAResumeCountsOnlyThisProcesssSteps) {
  const std::string ck = dir_.file("eta");
  const std::vector<std::string> args{"--train-samples", "6400", "--test-samples", "100", "--epochs", "1",
                                      "--global-batch-size", "32", "--threads", "1", "--model", "mlp",
                                      "--data-dir", fashion_mnist_dir(), "--progress", "lines", "--log-every", "10",
                                      "--checkpoint-dir", ck, "--checkpoint-every-steps", "20", "--snapshot-every-steps", "0"};
  // {step: ETA in seconds} of the progress lines ("step 30/200 ... ETA 1m05s").
  const auto etas = [](const std::string& text) {
    std::map<int, double> found;
    const std::regex line(R"(step (\d+)/200 .*ETA (?:(\d+)m)?(\d+)s)");
    for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
      found[std::stoi((*it)[1])] = 60.0 * ((*it)[2].matched ? std::stoi((*it)[2]) : 0) + std::stoi((*it)[3]);
    return found;
  };
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:40", 1);  // 40 ms a step: an ETA of seconds, its pace the sleep's
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "20", 1);
  const RunResult killed = run_hpctrain(args, 120);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  EXPECT_NE(killed.exit_code, 0);
  const RunResult resumed = run_hpctrain(args, 120);
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto before = etas(killed.out + killed.err), after = etas(resumed.out + resumed.err);
  ASSERT_TRUE(before.count(20) && after.count(30)) << killed.out << killed.err << resumed.out << resumed.err;
  // 180 steps left at step 20, 170 at step 30, at the same pace: within a factor of 2 either way.
  const double expected = before.at(20) * 170 / 180;
  EXPECT_GE(after.at(30), expected / 2) << resumed.out << resumed.err;
  EXPECT_LE(after.at(30), expected * 2 + 1) << resumed.out << resumed.err;
}

// A run killed without last words (SIGKILL, a lost host) leaves its last beat, which hpcrun takes
// for the attempt's last step (its summary's step range, the steps a relaunch redoes). Beats were
// once a second alone: a run killed at step 12 a second after its start left "step=1", though it
// had checkpointed step 10. Each checkpoint's step is in the heartbeat now. Runs `args` (ck its
// --checkpoint-dir) killed after step 12, and asks for the checkpoint of step 10 in the heartbeat.
void expect_killed_runs_heartbeat_holds_step_10(const std::vector<std::string>& args, const std::string& ck) {
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "12", 1);
  const RunResult killed = run_hpctrain(args, 120);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_NE(killed.exit_code, 0) << killed.err;
  ASSERT_TRUE(fs::exists(ck + "/ckpt-000000010.hpck")) << killed.err;
  const std::string beat = read_text(ck + "/heartbeat");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(beat, m, std::regex(R"((?:^|\n)step=(\d+)\n)"))) << beat;
  EXPECT_GE(std::stoi(m[1]), 10) << beat;
  EXPECT_LE(std::stoi(m[1]), 12) << beat;
}

TEST_F(Checkpoints, AKilledRunsHeartbeatHoldsItsLastCheckpointsStepAtLeast) {
  const std::string ck = dir_.file("beat");
  // Small steps (8 samples): twelve of them take well under the heartbeat's second.
  expect_killed_runs_heartbeat_holds_step_10(
      {"--train-samples", "1280", "--test-samples", "300", "--max-steps", "40", "--global-batch-size", "8",
       "--threads", "1", "--quiet", "--data-dir", fashion_mnist_dir(), "--checkpoint-dir", ck,
       "--checkpoint-every-steps", "5", "--snapshot-every-steps", "0"},
      ck);
}

// The same for an epoch's checkpoint (--checkpoint-each-epoch): written after the epoch's last
// boundary, whose beat the second since the last one had passed over, it was not in the
// heartbeat, and a run killed two steps into the next epoch left "step=1" of a checkpoint at 10.
TEST_F(Checkpoints, AKilledRunsHeartbeatHoldsItsLastEpochCheckpointsStepAtLeast) {
  const std::string ck = dir_.file("epoch_beat");
  // Ten steps an epoch (80 samples, 8 a step), all of them well inside the heartbeat's second.
  expect_killed_runs_heartbeat_holds_step_10(
      {"--train-samples", "80", "--test-samples", "100", "--epochs", "4", "--global-batch-size", "8", "--threads",
       "1", "--quiet", "--data-dir", fashion_mnist_dir(), "--checkpoint-dir", ck, "--checkpoint-each-epoch",
       "--snapshot-every-steps", "0"},
      ck);
}

// SIGTERM (or SIGUSR1, SIGUSR2 as submitit sends, SIGHUP) on one rank: every rank stops at the
// same step boundary, rank 0 checkpoints there, all exit with 75 ("checkpointed, requeue me").
// One job takes the four stops in turn, each run resumed from the one before's stop checkpoint
// (no periodic checkpoints: only the stop's), and the last ends bit-exactly where an
// uninterrupted one does: a stop or resume that lost or changed anything would show there.
TEST_F(Checkpoints, StopOnSignalCheckpointsAndResumesExactly) {
  const JsonObject want = uninterrupted(2);
  const std::string ck = dir_.file("sig");
  auto stop_only = job(ck, dir_.file("s1.jsonl"));
  std::replace(stop_only.begin(), stop_only.end(), std::string("--checkpoint-every-steps"),
               std::string("--keep-checkpoints"));
  int64_t resumed_from = -1;  // the first run starts afresh
  for (const char* how : {"11@1:usr2", "13@1", "17@0:usr1", "19@0:hup"}) {
    SCOPED_TRACE(how);
    const std::string m = dir_.file(std::string("s") + how[0] + how[1] + ".jsonl");
    auto args = stop_only;
    *(std::find(args.begin(), args.end(), "--metrics-file") + 1) = m;
    setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", how, 1);
    const RunResult stopped = run_mpi(2, args);
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
    EXPECT_EQ(count_of(stopped.err, "stopped on request"), 1) << stopped.err;
    const char* named = std::strchr(how, ':');
    const std::string signal = named ? "SIG" + upper(named + 1) : "SIGTERM";
    EXPECT_EQ(count_of(stopped.err, "stopped on request (" + signal + " to rank "), 1) << stopped.err;
    const int64_t at = std::atoll(how);
    EXPECT_TRUE(fs::exists(ck + "/" + "ckpt-0000000" + std::to_string(at) + ".hpck")) << stopped.err;
    const std::vector<JsonObject> lines = read_json_lines(m);
    ASSERT_FALSE(lines.empty()) << m;
    EXPECT_EQ(lines.back().at("event").str, "stopped");
    EXPECT_EQ(lines.back().at("step").number, static_cast<double>(at));
    const JsonObject config = read_all_json_lines(m).front();  // the run's first event
    EXPECT_EQ(config.at("resumed_from_step").number, static_cast<double>(resumed_from)) << m;
    resumed_from = at;
  }
  const std::string m = dir_.file("s2.jsonl");
  const RunResult resumed = run_mpi(2, job(ck, m));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, static_cast<double>(resumed_from));
  expect_same_end(done_of(m), want);
  // Epoch 1 was stopped and resumed 4 times, each run adding to the sums the one before resumed.
  expect_same_epochs(epochs_of(m), uninterrupted_run(2).epochs);
}

// A checkpoint written before checkpoints recorded the epoch's sums so far (epoch_train_sums) resumes
// as it did: to the same state, the resumed epoch's training figures covering its resumed steps
// only. One resumed on another number of ranks reports the whole epoch's, within rounding.
TEST_F(Checkpoints, AResumeInsideAnEpochWithoutItsSumsOrOnOtherRanksStillAddsUp) {
  const Ended& want = uninterrupted_run(2);
  const std::string ck = dir_.file("sums");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "13@1", 1);
  const RunResult stopped = run_mpi(2, job(ck, dir_.file("sums0.jsonl")));
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  const std::string file = ck + "/ckpt-000000013.hpck";
  const std::string older = dir_.file("sums-older");
  fs::create_directories(older);
  write_bytes(older + "/ckpt-000000013.hpck", with_section(read_bytes(file), 1, [](Bytes& meta) {
                std::string text(meta.begin(), meta.end());
                const size_t at = text.find("epoch_train_sums=");
                ASSERT_NE(at, std::string::npos) << text;
                text.erase(at, text.find('\n', at) + 1 - at);
                meta.assign(text.begin(), text.end());
              }));
  const std::string m = dir_.file("sums-older.jsonl");
  const RunResult resumed = run_mpi(2, job(older, m));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 13);
  expect_same_end(done_of(m), want.done);
  const std::map<int64_t, JsonObject> epochs = epochs_of(m);
  ASSERT_TRUE(epochs.count(1) && epochs.count(2)) << m;
  EXPECT_NE(epochs.at(1).at("train_loss").number, want.epochs.at(1).at("train_loss").number);
  EXPECT_EQ(epochs.at(2).at("train_loss").raw, want.epochs.at(2).at("train_loss").raw);
  // On 1 rank, rank 0 takes both ranks' sums and adds its steps' losses (its step events' whole
  // global batch's) to them. (Batch norm over 64 samples instead of 32 makes those steps' losses
  // another run's: no figure of the 2-rank run to compare with.)
  const std::string m1 = dir_.file("sums-1.jsonl");
  auto args = job(dir_.file("sums-1"), m1);
  args.insert(args.end(), {"--resume", file, "--metrics-every-steps", "1"});
  const RunResult one = run_mpi(1, args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  std::string meta;
  with_section(read_bytes(file), 1, [&](Bytes& b) { meta.assign(b.begin(), b.end()); });
  const std::smatch sums = [&] {
    std::smatch found;
    std::regex_search(meta, found, std::regex(R"(\nepoch_train_sums=\[([^,]+),[^,]+,([^,]+),([^,]+),[^,]+,([^,]+)\]\n)"));
    return found;
  }();
  ASSERT_EQ(sums.size(), 5u) << meta;
  double loss = std::stod(sums[1]) + std::stod(sums[3]), samples = std::stod(sums[2]) + std::stod(sums[4]);
  EXPECT_EQ(samples, 13 * 64);
  for (const JsonObject& o : read_json_lines(m1))
    if (o.at("event").str == "step" && o.at("epoch").number == 1) {
      loss += o.at("loss").number * 64;
      samples += 64;
    }
  EXPECT_EQ(samples, 1280);
  const double train_loss = epochs_of(m1).at(1).at("train_loss").number;
  EXPECT_NEAR(train_loss, loss / samples, 1e-12 * train_loss);
}

// Stopped right after its last step, and then started again once finished (as a job chain's
// later segments are): nothing is left to train, so each run only evaluates the checkpoint's
// model, and reports its real accuracy and parameters.
TEST_F(Checkpoints, ResumingAtTheLastStepOnlyEvaluates) {
  const JsonObject want = uninterrupted(2);
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
    expect_same_end(d, want);
    EXPECT_GT(d.at("test_accuracy").number, 0.3);  // evaluated, not a zero left unset
    if (accuracy >= 0) {
      EXPECT_EQ(d.at("test_accuracy").number, accuracy);
    }
    accuracy = d.at("test_accuracy").number;
  }
}

// --max-steps ending the run mid-epoch on a step a periodic checkpoint had just taken: the final
// checkpoint stands after the last epoch, as the done event's state_checksum says (it stayed the
// periodic one, 10 steps into the epoch, whose checksum no line of the run gave).
TEST_F(Checkpoints, TheFinalCheckpointIsTheDoneEventsStateAlsoOnAPeriodicCheckpointsStep) {
  const std::string ck = dir_.file("ended"), m = dir_.file("ended.jsonl");
  std::vector<std::string> args = job(ck, m, 1);
  args.insert(args.end(), {"--max-steps", "10"});
  const RunResult r = run_hpctrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonObject d = done_of(m);
  const RunResult inspected = run_hpctrain({"inspect", "--json", ck + "/ckpt-000000010.hpck"});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.err;
  const JsonObject h = FlatJsonParser(lines_of(inspected.out).at(0)).parse();
  EXPECT_EQ(h.at("state_checksum").str, d.at("state_checksum").str);
  EXPECT_EQ(h.at("epoch").number, 1);
  EXPECT_EQ(h.at("step_in_epoch").number, 0);
  EXPECT_NE(read_text(ck + "/heartbeat").find("\nepoch=1\n"), std::string::npos) << "the heartbeat says the same";
}

// Resumed on another number of ranks, the run continues at the checkpoint's sample with the
// checkpoint's global batch and finishes the planned steps. A --batch-size (which would be another
// global batch) is refused, naming the checkpoint's --global-batch-size, as another --lr is, not ignored.
TEST_F(Checkpoints, ResumeOnAnotherWorldSize) {
  for (const auto& [before, after] : {std::pair{4, 2}, std::pair{2, 1}}) {
    SCOPED_TRACE(::testing::Message() << before << " -> " << after << " ranks");
    const std::string ck = dir_.file("world" + std::to_string(before));
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "12@0", 1);
    run_mpi(before, job(ck, dir_.file("w_killed.jsonl")));
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    auto other = job(ck, dir_.file("w_refused.jsonl"));
    other.erase(std::find(other.begin(), other.end(), "--global-batch-size"),
                std::find(other.begin(), other.end(), "--threads"));
    other.insert(other.end(), {"--batch-size", "16"});
    const RunResult refused = run_mpi(after, other);
    EXPECT_EQ(refused.exit_code, 2) << refused.err;
    EXPECT_NE(refused.err.find("the checkpoint was made with --global-batch-size 64 (its --batch-size was not used), "
                               "this run has --batch-size 16: resume with --global-batch-size 64"),
              std::string::npos)
        << refused.err;
    const std::string m = dir_.file("w_resumed.jsonl");
    const RunResult r = run_mpi(after, job(ck, m));  // --global-batch-size 64 as before, split over fewer ranks
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonObject d = done_of(m);
    EXPECT_EQ(d.at("resumed_from_step").number, 10);
    EXPECT_EQ(d.at("steps").number, 40);
    EXPECT_EQ(d.at("world_size").number, after);
    EXPECT_EQ(d.at("global_batch_size").number, 64);
  }
}

// Killed late in its second epoch and resumed on half the ranks, a run reaches the accuracy
// of one never interrupted: 2 epochs of 100 steps, checkpoints every 25, resumed from step 150
// (the state a kill after step 155 leaves), so the last 50 steps run on the new world size
// (batch-norm statistics then come from other per-rank batches; everything else is the same
// computation). Evaluated on all 10000 test images; over seeds 1 to 4 the differences were at
// most 0.32 points.
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
    const std::string ck = dir_.file("acc" + tag);
    // From the checkpoints on shared storage alone, as the killed run's resume would be (its
    // hosts' snapshots would have resumed it at step 155).
    const auto checkpointed =
        with({"--checkpoint-dir", ck, "--checkpoint-every-steps", "25", "--snapshot-every-steps", "0"});
    // The uninterrupted run leaves the checkpoints of steps 150, 175 and 200. Without the last two,
    // its directory is what a kill after step 155 leaves (runs are deterministic: the checkpoint
    // of step 150 is the same file), and the run killed there need not be made.
    const std::string full = dir_.file("acc_full" + tag + ".jsonl");
    auto never_stopped = checkpointed;
    never_stopped.insert(never_stopped.end(), {"--metrics-file", full});
    ASSERT_EQ(run_mpi(before, never_stopped).exit_code, 0);
    for (const char* later : {"/ckpt-000000175.hpck", "/ckpt-000000200.hpck"}) EXPECT_TRUE(fs::remove(ck + later));
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

// Stopped in the middle of an epoch, right before its short last batch or at its end (the next
// step opens the next epoch), a run with augmentation (CIFAR-10's random crops and flips, drawn
// from the seed, epoch and sample) and --keep-last-batch resumes to the very state of a run never
// stopped: parameters, momentum, batch-norm statistics and position; on one rank and on two.
TEST_F(Checkpoints, ResumeWithAugmentationAndTheShortLastBatchEndsInTheSameState) {
  TempDir cifar("cifar");
  write_cifar10(cifar.str(), 400);
  // 300 samples in global batches of 64: four whole steps and a short fifth (44) per epoch.
  auto args = [&](const std::string& ck, const std::string& m) {
    std::vector<std::string> a{"--dataset", "cifar10", "--data-dir", cifar.str(), "--model", "mlp", "--train-samples",
                               "300", "--test-samples", "100", "--global-batch-size", "64", "--keep-last-batch",
                               "--epochs", "2", "--threads", "1", "--quiet", "--metrics-file", m};
    if (!ck.empty()) a.insert(a.end(), {"--checkpoint-dir", ck});
    return a;
  };
  // The stops are taken in turn by one job, each run resumed from the one before's stop: the last
  // run ends in the uninterrupted run's state only if every resume restored everything.
  for (const auto& [ranks, stops] : {std::pair<int, std::vector<std::string>>{1, {"3", "4", "5"}}, {2, {"5@1"}}}) {
    SCOPED_TRACE(::testing::Message() << ranks << " rank(s)");
    const std::string full = dir_.file("aug_full" + std::to_string(ranks) + ".jsonl");
    const RunResult f = run_mpi(ranks, args("", full));
    ASSERT_EQ(f.exit_code, 0) << f.err;
    const JsonObject want = done_of(full);
    EXPECT_EQ(want.at("steps").number, 10);
    const std::string ck = dir_.file("aug" + std::to_string(ranks));
    double resumed_from = -1;  // the first run starts afresh
    for (const std::string& at : stops) {
      SCOPED_TRACE("stopped after step " + at);
      const std::string m = dir_.file("aug_stopped" + std::to_string(ranks) + "_" + at.substr(0, 1) + ".jsonl");
      setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", at.c_str(), 1);
      const RunResult stopped = run_mpi(ranks, args(ck, m));
      unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
      ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
      EXPECT_EQ(read_all_json_lines(m).front().at("resumed_from_step").number, resumed_from) << m;
      resumed_from = std::stod(at);
    }
    const std::string m = dir_.file("aug_resumed" + std::to_string(ranks) + ".jsonl");
    const RunResult resumed = run_mpi(ranks, args(ck, m));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(done_of(m).at("resumed_from_step").number, resumed_from);
    expect_same_end(done_of(m), want);
  }
}

// With --sync-batch-norm the world size does not change what a step computes (up to float
// rounding: mpi_test.cpp), so a run stopped and resumed on more ranks (1 to 2, 2 to 4) or fewer
// (4 to 2, 2 to 1) agrees with runs never stopped, on every world size, within the tolerances of
// mpi_test's SyncBatchNormMatchesOneRank (the same job): the final parameters' norm within 1e-6
// relative, the test loss within 1e-5. One job makes the four moves in turn, stopped every 10
// steps and resumed on the next world size (1, 2, 4, 2, then 1 to the end): a move that lost or
// changed anything would show at the end. The control: a run one step shorter is outside the
// tolerances, so a resume that lost or repeated a step would be too.
TEST_F(Checkpoints, ResumeOnMoreOrFewerRanksWithSyncBatchNormAgreesWithAnUninterruptedRun) {
  auto args = [&](const std::string& ck, const std::string& m, const char* steps = "50") {
    std::vector<std::string> a{"--model", "mlp", "--sync-batch-norm", "--train-samples", "6400", "--test-samples",
                               "1000", "--epochs", "1", "--global-batch-size", "64", "--max-steps", steps,
                               "--lr-schedule", "constant", "--lr", "0.01", "--threads", "1", "--quiet",
                               "--data-dir", fashion_mnist_dir(), "--metrics-file", m};
    if (!ck.empty()) a.insert(a.end(), {"--checkpoint-dir", ck});
    return a;
  };
  // The epoch line (the run ends inside its one epoch, which still reports) and the done line.
  auto result = [](const std::string& m) {
    const std::vector<JsonObject> lines = read_json_lines(m);
    EXPECT_EQ(lines.size(), 2u) << m;
    return std::pair{lines.front().at("test_loss").number, done_line(lines).at("param_norm").number};
  };
  auto expect_close = [](std::pair<double, double> got, std::pair<double, double> want) {
    EXPECT_NEAR(got.first / want.first, 1.0, 1e-5) << "test loss";
    EXPECT_NEAR(got.second / want.second, 1.0, 1e-6) << "parameters' norm";
  };
  std::map<int, std::pair<double, double>> uninterrupted;
  for (int ranks : {1, 2, 4}) {
    const std::string m = dir_.file("sync_full" + std::to_string(ranks) + ".jsonl");
    ASSERT_EQ(run_mpi(ranks, args("", m)).exit_code, 0);
    uninterrupted[ranks] = result(m);
  }
  const std::string shorter = dir_.file("sync_49.jsonl");
  ASSERT_EQ(run_mpi(1, args("", shorter, "49")).exit_code, 0);
  EXPECT_GT(std::fabs(result(shorter).first / uninterrupted[1].first - 1), 1e-5) << "the control's test loss";
  EXPECT_GT(std::fabs(result(shorter).second / uninterrupted[1].second - 1), 1e-6) << "the control's norm";
  const std::string ck = dir_.file("sync");
  const std::vector<int> world_sizes{1, 2, 4, 2, 1};  // a stop every 10 steps, then the next one
  for (size_t run = 0; run < world_sizes.size(); ++run) {
    SCOPED_TRACE(::testing::Message() << "run " << run + 1 << " on " << world_sizes[run] << " rank(s)");
    const bool last = run + 1 == world_sizes.size();
    const std::string m = dir_.file("sync_run" + std::to_string(run + 1) + ".jsonl");
    if (!last) setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", std::to_string(10 * (run + 1)).c_str(), 1);
    const RunResult r = run_mpi(world_sizes[run], args(ck, m));
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    ASSERT_EQ(r.exit_code, last ? 0 : 75) << r.err;
    EXPECT_EQ(read_all_json_lines(m).front().at("resumed_from_step").number, run == 0 ? -1.0 : 10.0 * run) << m;
  }
  const std::string m = dir_.file("sync_run" + std::to_string(world_sizes.size()) + ".jsonl");
  const JsonObject got = done_of(m);
  EXPECT_EQ(got.at("steps").number, 50);
  EXPECT_EQ(got.at("world_size").number, 1);
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "against " << ranks << " rank(s) never stopped");
    expect_close(result(m), uninterrupted[ranks]);
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
  expect_same_end(done_of(m), uninterrupted(1));
  EXPECT_EQ(leftovers(), 0) << "the next run removes it";
}

// A checkpoint copied under another step's name (ckpt-000000500.hpck holding step 5) would be
// preferred over the newer ones by its name: evaluate DIR and --resume auto skip it with a
// warning naming it, as they skip a damaged file, and the resumed run moves it aside and ends
// exactly as a run never stopped.
TEST_F(Checkpoints, AFileNamedForAnotherStepIsSkipped) {
  const std::string ck = dir_.file("misnamed");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "12@0", 1);  // checkpoints at 5, 10 and the stop's at 12
  const RunResult stopped = run_hpctrain(job(ck, dir_.file("n1.jsonl")));
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  const std::string misnamed = ck + "/ckpt-000000500.hpck";
  fs::copy_file(ck + "/ckpt-000000005.hpck", misnamed);
  const std::string says = misnamed + " holds step 5, not the step 500 its name says";
  const RunResult evaluated = run_hpctrain({"evaluate", "--checkpoint", ck, "--test-samples", "300", "--data-dir",
                                            fashion_mnist_dir(), "--threads", "1"});
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.err;
  EXPECT_EQ(count_of(evaluated.err, says), 1) << evaluated.err;
  EXPECT_EQ(count_of(evaluated.err, "; using " + ck + "/ckpt-000000012.hpck"), 1) << evaluated.err;
  const std::string m = dir_.file("n2.jsonl");
  const RunResult resumed = run_hpctrain(job(ck, m));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(count_of(resumed.err, says), 1) << resumed.err;
  EXPECT_EQ(count_of(resumed.err, "; using the previous valid one, " + ck + "/ckpt-000000012.hpck"), 1) << resumed.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 12);
  expect_same_end(done_of(m), uninterrupted(1));
  EXPECT_FALSE(fs::exists(misnamed)) << "moved aside with the other superseded files";
}

// --resume FILE of another directory continues none of this directory's checkpoints: all of them
// are moved aside, untouched, the older ones too (retention deleted those below the resumed step:
// another run's, with no word).
TEST_F(Checkpoints, ResumingAnotherDirectorysFileMovesAllOfThisOnesAside) {
  const std::string a = dir_.file("lineage-a"), b = dir_.file("lineage-b");
  auto stopped = [&](const std::string& ck, const char* at, std::vector<std::string> extra) {
    setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", at, 1);
    std::vector<std::string> args = job(ck, dir_.file("l.jsonl"));
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run_hpctrain(args);
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    EXPECT_EQ(r.exit_code, 75) << r.err;
  };
  stopped(a, "15@0", {});               // a: 5, 10, 15
  stopped(b, "10@0", {"--seed", "7"});  // b: 5, 10, another run's
  std::vector<std::string> args = job(b, dir_.file("l2.jsonl"));
  args.insert(args.end(), {"--resume", a + "/ckpt-000000015.hpck"});
  const RunResult r = run_hpctrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "moved 2 checkpoint(s) this run does not continue"), 1) << r.err;
  std::vector<std::string> aside;
  for (const auto& e : fs::recursive_directory_iterator(b))
    if (e.path().parent_path() != fs::path(b) && e.path().extension() == ".hpck")
      aside.push_back(e.path().filename().string());
  std::sort(aside.begin(), aside.end());
  EXPECT_EQ(aside, (std::vector<std::string>{"ckpt-000000005.hpck", "ckpt-000000010.hpck"}));
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

// Whether one of process `pid`'s children (mpirun's ranks) is stopped (/proc/PID/stat: T).
bool a_child_is_stopped(pid_t pid) {
  for (pid_t c : child_pids(pid)) {
    const std::string stat = read_text("/proc/" + std::to_string(c) + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && stat.compare(paren, 3, ") T") == 0) return true;
  }
  return false;
}

// One rank stopped by SIGSTOP (a hung node) after step 3: the others wait inside an
// all-reduce until their watchdog ends the job with 124 within --step-timeout of the stop. Rank
// 0's watchdog says so in the Prometheus file too, where rank 0 is the one alive. (The bound was
// on the whole job, start-up and 3 steps included: 4 + 10 s, which beside six busy loops took
// 14.4-18.2 s, 3 runs of 3.)
TEST_F(Checkpoints, TheWatchdogEndsAJobWithAStoppedRank) {
  for (const char* stopped : {"3@1:stop", "3@0:stop"}) {
    SCOPED_TRACE(stopped);
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", stopped, 1);
    auto args = job("", dir_.file("hang.jsonl"));
    const std::string prom = dir_.file(std::string("hang-") + stopped[2] + ".prom");
    args.insert(args.end(), {"--step-timeout", "4s", "--prometheus-file", prom});
    const auto p = start_mpi(2, args);
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    ASSERT_TRUE(wait_until([&] { return a_child_is_stopped(p->pid()) || !p->running(); }, 120)) << "no rank stopped";
    const double stopped_at = p->seconds();
    const RunResult r = p->finish(120);
    ASSERT_FALSE(r.timed_out) << "the job hung\n" << r.err;
    EXPECT_EQ(r.exit_code, 124) << r.err;
    const std::string alive = stopped[2] == '1' ? "rank 0 on " : "rank 1 on ";
    EXPECT_NE(r.err.find("hpctrain: error: " + alive), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(": no step finished within --step-timeout 4 s (the last was step 3)"), std::string::npos)
        << r.err;
    EXPECT_GE(r.seconds, 4.0);
    EXPECT_LT(r.seconds - stopped_at, 4.0 + 10.0) << "the timeout and the job's end took this long after the stop";
    // (A stopped rank 0 may or may not get to say it: its own watchdog fires if mpirun's end of the
    // job lets it run on.)
    if (stopped[2] == '1') {
      EXPECT_NE(read_text(prom).find("hpctrain_state{hpctrain_job=\"hpctrain\",world_size=\"2\",state=\"failed\"} 1"),
                std::string::npos)
          << read_text(prom);
    }
  }
}

// job()'s options with the checkpoints of the stop and the end alone (or every `every` steps).
std::vector<std::string> with_checkpoints_every(std::vector<std::string> args, const std::string& every = "") {
  const auto at = std::find(args.begin(), args.end(), std::string("--checkpoint-every-steps"));
  if (every.empty()) {
    *at = "--keep-checkpoints";
  } else {
    *(at + 1) = every;
  }
  return args;
}

// job()'s options with the stop's checkpoint alone, under --step-timeout 3s, stopped by SIGTERM to
// rank 1 after step 11; its writes made slow by HPCTRAIN_TEST_SLOW_WRITE=`slow` (the caller unsets
// both once the job is started).
std::vector<std::string> slow_stop(const std::vector<std::string>& job_args, const char* slow) {
  auto args = with_checkpoints_every(job_args);
  args.insert(args.end(), {"--step-timeout", "3s"});
  setenv("HPCTRAIN_TEST_SLOW_WRITE", slow, 1);
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "11@1", 1);
  return args;
}

// A checkpoint that a slow file system takes longer than --step-timeout to write, but that moves
// (HPCTRAIN_TEST_SLOW_WRITE: 12 chunks, each synced after 0.5 s), is no hang: a stop's on 2 ranks
// ends in 75 with the checkpoint whole, every rank's watchdog fed by each synced chunk, the
// heartbeat naming the write's bytes meanwhile (a launcher's stall clock reads it), and the job
// resumes from it exactly. Before, both watchdogs fired 3 s into the 6 s write: 124, the
// checkpoint lost.
TEST_F(Checkpoints, ACheckpointWriteThatMovesOutlastsTheStepTimeout) {
  const std::string ck = dir_.file("slow");
  const auto p = start_mpi(2, slow_stop(job(ck, dir_.file("slow.jsonl")), "0.5:12"));
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  std::string beat;
  EXPECT_TRUE(wait_until(
      [&] {
        beat = read_text(ck + "/heartbeat");
        return beat.find("\ncheckpoint_step=11\ncheckpoint_bytes_synced=") != std::string::npos &&
               beat.find("\ncheckpoint_bytes_synced=0\n") == std::string::npos;
      },
      60))
      << "no beat named the write's synced bytes; the last:\n" << beat;
  const RunResult r = p->finish(120);
  ASSERT_EQ(r.exit_code, 75) << r.err;
  EXPECT_EQ(r.err.find("hpctrain: error:"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 6.0) << "the write was not slow";
  expect_stopped_heartbeat(ck);
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  expect_exact_resume(2, ck, 11);
}

// The same for the checkpoints of a run on one rank: a periodic one still in flight when the next
// is due (step 20's save waits for step 10's write) and the final one; the run ends in 0.
TEST_F(Checkpoints, APeriodicAndTheFinalCheckpointThatMoveOutlastTheStepTimeout) {
  const std::string ck = dir_.file("slow1"), m = dir_.file("slow1.jsonl");
  auto args = with_checkpoints_every(job(ck, m, 1), "10");
  args.insert(args.end(), {"--step-timeout", "3s"});
  setenv("HPCTRAIN_TEST_SLOW_WRITE", "0.5:8", 1);
  const RunResult r = run_hpctrain(args);
  unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("hpctrain: error:"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 8.0) << "the writes were not slow";
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000010.hpck"));
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000020.hpck"));
  EXPECT_NE(read_text(ck + "/heartbeat").find("\nstate=done\n"), std::string::npos) << read_text(ck + "/heartbeat");
}

// A write that syncs nothing (30 s before its first chunk) is still a hang: every rank ends it with
// 124 within --step-timeout, the line naming the checkpoint and that nothing of it was synced.
TEST_F(Checkpoints, ACheckpointWriteThatDoesNotMoveEndsTheJob) {
  const std::string ck = dir_.file("stuck");
  const RunResult r = run_mpi(2, slow_stop(job(ck, dir_.file("stuck.jsonl")), "30:2"));
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_LT(r.seconds, 25.0) << r.err;
  EXPECT_NE(r.err.find(": the checkpoint of step 11 made no progress within --step-timeout 3 s (0 bytes written and "
                       "synced): a file system that does not answer? Exiting with code 124"),
            std::string::npos) << r.err;
  const std::string beat = read_text(ck + "/heartbeat");
  EXPECT_NE(beat.find("\nstate=failed\n"), std::string::npos) << beat;
  EXPECT_NE(beat.find("\nexit_code=124\n"), std::string::npos) << beat;
  // The write given up leaves no temporary file (as a stop at once's).
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// One rank stopped by SIGSTOP during set-up, once the data are loaded: the other waits in
// set-up's agreement until its set-up watchdog ends the job with 124 within --start-timeout.
// The bound counts from the stop, seen in /proc, as the watchdog test's does: on the whole job,
// start-up included (3 + 10 s), it took 7-8 s beside busy loops and failed at random in CI.
TEST_F(Checkpoints, TheStartTimeoutEndsAJobWithARankStoppedInSetUp) {
  setenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP", "2@1:stop", 1);
  auto args = job(dir_.file("setup-hang"), dir_.file("setup-hang.jsonl"));
  args.insert(args.end(), {"--start-timeout", "3s"});
  const auto p = start_mpi(2, args, true);
  unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
  ASSERT_TRUE(wait_until([&] { return a_child_is_stopped(p->pid()) || !p->running(); }, 120)) << "no rank stopped";
  const double stopped_at = p->seconds();
  const RunResult r = p->finish(120);
  ASSERT_FALSE(r.timed_out) << "the job hung\n" << r.err;
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_NE(r.err.find("hpctrain: error: rank 0 on "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(": set-up did not end within --start-timeout 3 s: a peer rank stopped, died or lost its "
                       "network while starting? Exiting with code 124"),
            std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 3.0);
  // The watchdog counts from the start of set-up, before the stop: at most 3 s after it.
  EXPECT_LT(r.seconds - stopped_at, 3.0 + 10.0) << "the timeout and the job's end took this long after the stop";
  EXPECT_FALSE(fs::exists(dir_.file("setup-hang") + "/lock")) << "the watchdog left the directory's lock";
}

void expect_usage_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.command << "\n" << r.err;
  EXPECT_EQ(count_of(r.err, "hpctrain: error: "), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "wanted '" << needle << "' in\n" << r.err;
}

// The metrics file's event `name` (a failure when there is none).
JsonObject event_of(const std::string& metrics, const std::string& name) {
  for (const JsonObject& line : read_all_json_lines(metrics))
    if (line.count("event") && line.at("event").str == name) return line;
  ADD_FAILURE() << "no " << name << " event in " << metrics << ":\n" << read_text(metrics);
  return {};
}

bool has_event(const std::string& metrics, const std::string& name) {
  return read_text(metrics).find("{\"event\":\"" + name + "\"") != std::string::npos;
}

// --init-from: a new run starts from a trained run's weights with a fresh optimizer and schedule.
// Evaluated before its first step it has the trained run's own last test loss, bit for bit; it
// trains its own steps from step 0 and checkpoints in its own directory, from which the same
// command then resumes (--init-from is for the first start only). Another model is refused by
// name; on another dataset (CIFAR-10's 32x32x3 images) only the tensors that fit are taken.
TEST_F(Checkpoints, InitFromStartsANewRunFromACheckpointsWeights) {
  const std::string base = dir_.file("base");
  const std::string m1 = dir_.file("base.jsonl");
  ASSERT_EQ(run_hpctrain(job(base, m1)).exit_code, 0);
  const JsonObject trained = done_of(m1);

  const std::string tuned = dir_.file("tuned"), m2 = dir_.file("tuned.jsonl");
  auto tune = job(tuned, m2, 1);
  tune.insert(tune.end(), {"--init-from", base, "--lr", "0.01"});
  const RunResult r = run_hpctrain(tune);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonObject init = event_of(m2, "init_from");
  EXPECT_EQ(init.at("checkpoint").str, base + "/ckpt-000000040.hpck");  // the directory's newest
  EXPECT_EQ(init.at("checkpoint_step").number, 40);
  EXPECT_EQ(init.at("step").number, 0);
  EXPECT_EQ(init.at("tensors_copied").number, init.at("tensors").number);
  EXPECT_EQ(init.at("from_seed").str, "");
  EXPECT_EQ(init.at("test_loss").raw, trained.at("test_loss").raw) << "not the trained run's own test loss bits";
  EXPECT_EQ(init.at("test_accuracy").raw, trained.at("test_accuracy").raw);
  const JsonObject done = done_of(m2);
  EXPECT_EQ(done.at("steps").number, 20);
  EXPECT_EQ(done.at("resumed_from_step").number, -1);
  EXPECT_TRUE(std::filesystem::exists(tuned + "/ckpt-000000020.hpck"));
  EXPECT_TRUE(std::filesystem::exists(base + "/ckpt-000000040.hpck")) << "the base run's checkpoint is untouched";

  // Again: it resumes from its own checkpoint, and says nothing of --init-from's weights.
  const RunResult again = run_hpctrain(tune);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(done_of(m2).at("resumed_from_step").number, 20);
  const std::string m3 = dir_.file("tuned3.jsonl");
  auto fresh_metrics = tune;
  *(std::find(fresh_metrics.begin(), fresh_metrics.end(), "--metrics-file") + 1) = m3;
  ASSERT_EQ(run_hpctrain(fresh_metrics).exit_code, 0);
  EXPECT_FALSE(has_event(m3, "init_from")) << read_text(m3);

  auto into = [&](std::vector<std::string> extra, const std::string& from) {
    auto a = job("", dir_.file("into.jsonl"), 1);
    a.insert(a.end(), {"--max-steps", "2", "--init-from", from});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_usage_error(run_hpctrain(into({"--model", "mlp"}, base)), "--init-from " + base +
                     "/ckpt-000000040.hpck is of model cnn; this run's --model is mlp");
  expect_usage_error(run_hpctrain(into({}, dir_.file("none.hpck"))), "cannot read checkpoint");
  expect_usage_error(run_hpctrain(into({"--resume", base + "/ckpt-000000040.hpck"}, base)),
                     "--init-from starts a new run from a checkpoint's weights and --resume");

  TempDir cifar("cifar");
  write_cifar10(cifar.str(), 400);
  auto other = into({"--dataset", "cifar10"}, base);
  *(std::find(other.begin(), other.end(), "--data-dir") + 1) = cifar.str();
  const RunResult on_cifar = run_hpctrain(other);
  ASSERT_EQ(on_cifar.exit_code, 0) << on_cifar.err;
  const JsonObject partial = event_of(dir_.file("into.jsonl"), "init_from");
  EXPECT_GT(partial.at("tensors_copied").number, 0);
  EXPECT_LT(partial.at("tensors_copied").number, partial.at("tensors").number);
  // The first convolution's weights (3 input channels, not 1) and the first linear layer's (the
  // 32x32 images pool to 8x8, not 7x7): the rest keeps its shape and is taken.
  EXPECT_EQ(partial.at("from_seed").str, "0.weight,5.weight");

  // Weights that are finite but huge (a crafted file, its checksums made anew): an mlp's first
  // loss is not finite before any update, the file's doing, not an internal error (exit 1) as it
  // was.
  const std::string mlp = dir_.file("mlp");
  auto small = job(mlp, dir_.file("mlp.jsonl"), 1);
  small.insert(small.end(), {"--model", "mlp", "--max-steps", "1"});
  ASSERT_EQ(run_hpctrain(small).exit_code, 0);
  write_bytes(dir_.file("huge.hpck"), with_section(read_bytes(mlp + "/ckpt-000000001.hpck"), 2, [](Bytes& params) {
                for (size_t at = 0; at + 4 <= params.size(); at += 4) {
                  const float huge = 3e38f;
                  std::memcpy(params.data() + at, &huge, 4);
                }
              }));
  expect_usage_error(run_hpctrain(into({"--model", "mlp"}, dir_.file("huge.hpck"))),
                     "the loss of step 1 (epoch 1) is not finite with the parameters of --init-from " +
                         dir_.file("huge.hpck") + ", before any update");
}

// --extend-epochs: a finished 2-epoch run goes on to 3 epochs, its schedule recomputed (onecycle:
// the learning rate, at its floor where the 2 epochs ended, is back up), said in the metrics
// file; the lengthened run's checkpoints then resume with --epochs 3, and nothing is extended
// again. Without --extend-epochs another --epochs is refused.
TEST_F(Checkpoints, ExtendEpochsLengthensAFinishedRun) {
  const std::string ck = dir_.file("ext");
  ASSERT_EQ(run_hpctrain(job(ck, dir_.file("e1.jsonl"))).exit_code, 0);
  expect_usage_error(run_hpctrain(job(ck, dir_.file("e0.jsonl"), 3)), "or lengthen the run with --extend-epochs");
  const std::string m = dir_.file("e2.jsonl");
  auto longer = job(ck, m, 3);
  longer.push_back("--extend-epochs");
  const RunResult r = run_hpctrain(longer);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonObject e = event_of(m, "extended");
  EXPECT_EQ(e.at("step").number, 40);
  EXPECT_EQ(e.at("epochs_before").number, 2);
  EXPECT_EQ(e.at("epochs").number, 3);
  EXPECT_EQ(e.at("total_steps").number, 60);
  EXPECT_EQ(e.at("lr_schedule").str, "onecycle");
  EXPECT_LT(e.at("lr_before").number, 1e-5);  // onecycle's floor: lr / 25 / 10000
  EXPECT_GT(e.at("lr").number, 0.01);
  const JsonObject done = done_of(m);
  EXPECT_EQ(done.at("steps").number, 60);
  EXPECT_EQ(done.at("resumed_from_step").number, 40);
  const std::string again = dir_.file("e3.jsonl");
  *(std::find(longer.begin(), longer.end(), m)) = again;
  ASSERT_EQ(run_hpctrain(longer).exit_code, 0);
  EXPECT_EQ(done_of(again).at("resumed_from_step").number, 60);
  EXPECT_FALSE(has_event(again, "extended"));
  auto shorter = job(ck, dir_.file("e4.jsonl"), 2);
  shorter.push_back("--extend-epochs");
  expect_usage_error(run_hpctrain(shorter), "--extend-epochs only lengthens a run: the checkpoint's has --epochs 3, "
                                            "this one --epochs 2");
}

// `hpctrain evaluate` of the final checkpoint reproduces the run's own last test accuracy and
// loss, bit for bit, on one rank and on two, of a run trained on one rank or on two (whose ranks
// keep the batch-norm statistics averaged: the checkpoint's are the ones every rank evaluated
// with; the test set's 5 batches of 64 are summed in order however the ranks share them);
// `hpctrain inspect` shows the header and tells valid from damaged files.
TEST_F(Checkpoints, EvaluateAndInspectACheckpoint) {
  for (int trained_on : {2, 1}) {
    const std::string ck = dir_.file("eval" + std::to_string(trained_on));
    const std::string m = dir_.file("e" + std::to_string(trained_on) + ".jsonl");
    std::vector<std::string> trained_job = job(ck, m);
    trained_job.insert(trained_job.end(), {"--eval-batch-size", "64"});
    ASSERT_EQ(run_mpi(trained_on, trained_job).exit_code, 0);
    const JsonObject trained = done_of(m);
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "trained on " << trained_on << " rank(s), evaluated on " << ranks);
      const std::string em = dir_.file("evaluate" + std::to_string(trained_on) + std::to_string(ranks) + ".jsonl");
      const RunResult r = run_mpi(ranks, {"evaluate", "--checkpoint", ck, "--test-samples", "300", "--data-dir",
                                          fashion_mnist_dir(), "--threads", "1", "--eval-batch-size", "64",
                                          "--metrics-file", em});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const auto lines = read_json_lines(em);
      ASSERT_EQ(lines.size(), 1u);
      EXPECT_EQ(lines[0].at("event").str, "evaluate");
      EXPECT_EQ(lines[0].at("checkpoint").str, ck + "/ckpt-000000040.hpck");
      EXPECT_EQ(lines[0].at("step").number, 40);
      EXPECT_EQ(lines[0].at("samples").number, 300);
      EXPECT_EQ(lines[0].at("test_accuracy").number, trained.at("test_accuracy").number);
      EXPECT_EQ(lines[0].at("test_loss").number, trained.at("test_loss").number);
      char want[64];
      std::snprintf(want, sizeof want, "test accuracy %.2f%%", 100 * trained.at("test_accuracy").number);
      EXPECT_EQ(count_of(r.out, want), 1) << r.out;
    }
  }

  const std::string ck = dir_.file("eval1");  // trained on one rank
  // --threads 0 (the default): OMP_NUM_THREADS where it is set, as training takes it (evaluate and
  // predict took the CPUs' share alone). 3: no machine's share of CPUs here, which it would be too.
  setenv("OMP_NUM_THREADS", "3", 1);
  const std::string om = dir_.file("omp.jsonl");
  const RunResult omp = run_hpctrain({"evaluate", "--checkpoint", ck, "--test-samples", "100", "--data-dir",
                                      fashion_mnist_dir(), "--metrics-file", om});
  unsetenv("OMP_NUM_THREADS");
  ASSERT_EQ(omp.exit_code, 0) << omp.err;
  EXPECT_EQ(read_json_lines(om).at(0).at("threads").number, 3);
  const RunResult listing = run_hpctrain({"inspect", ck});
  EXPECT_EQ(listing.exit_code, 0) << listing.err;
  EXPECT_EQ(count_of(listing.out, "  valid\n"), 3) << listing.out;
  EXPECT_NE(listing.out.find("ckpt-000000040.hpck  step 40  after epoch 2  cnn"), std::string::npos) << listing.out;
  EXPECT_NE(listing.out.find("heartbeat: done, step 40"), std::string::npos) << listing.out;
  // A heartbeat's time with text after the number is no time (std::stoll took 12abc for 12:
  // "1796380319 s ago").
  const std::string beat = dir_.file("beat");
  fs::create_directory(beat);
  fs::copy_file(ck + "/ckpt-000000040.hpck", beat + "/ckpt-000000040.hpck");
  {
    std::ofstream(beat + "/heartbeat") << std::regex_replace(read_text(ck + "/heartbeat"),
                                                             std::regex("unix_time=[0-9]+"), "unix_time=12abc");
  }
  const RunResult beat_listing = run_hpctrain({"inspect", beat});
  EXPECT_NE(beat_listing.out.find("heartbeat: done, step 40, 2 epoch(s) done, pid "), std::string::npos)
      << beat_listing.out;
  EXPECT_NE(beat_listing.out.find(", time unknown\n"), std::string::npos) << beat_listing.out;
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

  // The newest of a later format (a newer hpctrain wrote it): inspect, evaluate and a resume refuse
  // it alike, rather than pass it by for the older one, whose resume would move it aside.
  const std::string newer = dir_.file("newer");
  fs::create_directory(newer);
  fs::copy_file(ck + "/ckpt-000000035.hpck", newer + "/ckpt-000000035.hpck");
  Bytes later = read_bytes(ck + "/ckpt-000000040.hpck");
  later.at(8) = 2;  // the format version, after the magic
  write_bytes(newer + "/ckpt-000000040.hpck", later);
  const std::string refused = newer + "/ckpt-000000040.hpck has checkpoint format version 2; this hpctrain reads "
                              "version 1 (written by a newer hpctrain?)";
  const RunResult newer_listing = run_hpctrain({"inspect", newer});
  expect_usage_error(newer_listing, refused + ": --resume auto refuses it rather than pass it by");
  EXPECT_NE(newer_listing.out.find("ckpt-000000035.hpck  step 35"), std::string::npos) << newer_listing.out;
  expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", newer}), refused + "; it is not passed by for an older one");
  expect_usage_error(run_hpctrain({"--data-dir", fashion_mnist_dir(), "--checkpoint-dir", newer, "--resume", "auto",
                                   "--threads", "1", "--snapshot-every-steps", "0"}),
                     refused + "; it is not passed by for an older one");
  EXPECT_TRUE(fs::exists(newer + "/ckpt-000000040.hpck"));

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
  // Results under a name the directory's own files take: the next run there deleted them (lock).
  // Through a link elsewhere too: the link's folder was taken for the checkpoint's.
  fs::create_symlink(ck + "/ckpt-000000040.hpck", dir_.file("link.hpck"));
  for (const std::string& checkpoint : {ck, ck + "/ckpt-000000040.hpck", dir_.file("link.hpck")}) {
    expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", checkpoint, "--metrics-file", ck + "/lock"}),
                       "--metrics-file " + ck + "/lock is in the checkpoint's directory under a name its own files "
                       "take (lock)");
    EXPECT_FALSE(fs::exists(ck + "/lock"));
  }
  const RunResult help = run_hpctrain({"evaluate", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("Usage: hpctrain evaluate --checkpoint PATH"), std::string::npos) << help.out;
  expect_usage_error(run_hpctrain({"inspect"}), "hpctrain inspect needs a PATH");
  expect_usage_error(run_hpctrain({"inspect", dir_.str() + "/nothing-here"}), "No such file or directory");
  // A path through a file is named as what it is, as evaluate names it (not "no such file").
  expect_usage_error(run_hpctrain({"inspect", ck + "/ckpt-000000040.hpck/"}),
                     "cannot read checkpoint " + ck + "/ckpt-000000040.hpck/: Not a directory");
}

// ---- stop signals ----------------------------------------------------------------------------

std::string ckpt_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%09lld.hpck", static_cast<long long>(step));
  return buf;
}

// The names in a checkpoint directory, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Once its code runs (the signal blocked in its main thread), a stop signal at any moment of
// set-up or training ends hpctrain with 75 and one line: never the silent 143 of a signal's
// default action. Before the first step there is nothing to save, and no checkpoint is written;
// after it, the checkpoint is whole. Without --checkpoint-dir the code is the signal's.
TEST_F(Checkpoints, AStopSignalAtAnyMomentAfterStartEndsWithItsExitCode) {
  const std::pair<double, int> moments[] = {{0.0, SIGUSR2}, {0.0, SIGHUP}, {0.1, SIGTERM},
                                            {0.3, SIGUSR2}, {0.7, SIGHUP},  {1.5, SIGTERM}};
  for (const auto& moment : moments) {
    const double delay = moment.first;
    const int sig = moment.second;  // not a structured binding: Clang before 16 cannot capture one
    const std::string name = std::string("SIG") + sigabbrev_np(sig);
    SCOPED_TRACE(::testing::Message() << name << " " << delay << " s after its start");
    const std::string ck = dir_.file("any" + std::to_string(static_cast<int>(delay * 10)) + "_" + std::to_string(sig));
    // 50 epochs: a fast machine finishes 2 epochs in under 1.5 s, and a stop as the run ends is
    // not a stop (it finishes instead, exit 0). The run is stopped long before it would end.
    const auto p = start_hpctrain(job(ck, dir_.file("bg.jsonl"), 50));
    ASSERT_TRUE(wait_until([&] { return blocks_signal(p->pid(), sig) || !p->running(); }, 20));
    usleep(static_cast<useconds_t>(delay * 1e6));
    kill(p->pid(), sig);
    const RunResult r = p->finish(120);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_EQ(count_of(r.err, "hpctrain: warning: stopped on request (" + name + ") "), 1) << r.err;
    EXPECT_EQ(hpctrain_lines(r.err), 1) << r.err;
    const bool before_training = r.err.find("before the first step") != std::string::npos;
    for (const std::string& file : names_in(ck)) {
      EXPECT_EQ(file.find(".tmp"), std::string::npos) << file;
      if (before_training) {
        EXPECT_EQ(file.find("ckpt-"), std::string::npos) << file;
      }
    }
  }
  // Without --checkpoint-dir the code is the signal's; SIGINT ends it at once, also in set-up.
  struct Case {
    std::string ck;
    int signal, exit_code;
    std::string says;
  };
  const Case cases[] = {
      {"", SIGUSR1, 128 + SIGUSR1, "hpctrain: warning: stopped on request (SIGUSR1) while "},
      {"", SIGHUP, 128 + SIGHUP, "hpctrain: warning: stopped on request (SIGHUP) while "},
      {dir_.file("int"), SIGINT, 128 + SIGINT, "hpctrain: stopped at once by SIGINT, without a checkpoint"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const auto p = start(c.ck);
    ASSERT_TRUE(wait_until([&] { return blocks_signal(p->pid(), c.signal) || !p->running(); }, 20));
    kill(p->pid(), c.signal);
    const RunResult r = p->finish(120);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
    EXPECT_EQ(count_of(r.err, c.says), 1) << r.err;
    EXPECT_EQ(hpctrain_lines(r.err), 1) << r.err;
    if (c.ck.empty()) {
      EXPECT_NE(r.err.find(", before the first step: nothing to save (no --checkpoint-dir)\n"), std::string::npos)
          << r.err;
    }
    for (const std::string& name : names_in(c.ck)) EXPECT_EQ(name.find("ckpt-"), std::string::npos) << name;
  }
}

// A signal left out of --stop-signals does what it does to any program: it ends the process (no
// checkpoint for it; the periodic ones stay), at a step or while the process starts, before
// the options that leave it out were read.
TEST_F(Checkpoints, ASignalLeftOutOfStopSignalsKeepsItsDefaultAction) {
  const std::string ck = dir_.file("left_out");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "9:usr2", 1);
  const std::string prom = dir_.file("left_out.prom");
  const auto p = start(ck, {"--stop-signals", "TERM,USR1", "--prometheus-file", prom});
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  const RunResult r = p->finish(120);
  EXPECT_EQ(r.exit_code, -1) << "killed by the signal\n" << r.err;
  EXPECT_EQ(r.err, "hpctrain: ended by SIGUSR2 (not in --stop-signals)\n");
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000005.hpck", "heartbeat"}));
  expect_stopped_heartbeat(ck, 128 + SIGUSR2);
  expect_stopped_at_once(dir_.file("bg.jsonl"), prom, "left_out", "SIGUSR2", 128 + SIGUSR2, ck);
  expect_exact_resume(1, ck, 5);

  const std::string early = dir_.file("left_out_early");
  const auto q = start(early, {"--stop-signals", "USR2"});
  ASSERT_TRUE(wait_until([&] { return blocks_signal(q->pid(), SIGHUP) || !q->running(); }, 20));
  kill(q->pid(), SIGHUP);
  const RunResult e = q->finish(120);
  EXPECT_EQ(e.exit_code, -1) << "killed by the signal\n" << e.err;
  EXPECT_EQ(e.err, "hpctrain: ended by SIGHUP (not in --stop-signals)\n");
  for (const std::string& name : names_in(early)) EXPECT_EQ(name.find("ckpt-"), std::string::npos) << name;
}

// A stop asked for on rank 1 in each phase of set-up (SIGTERM, SIGUSR1, SIGUSR2, SIGHUP in phases
// 1 to 4; resuming from a checkpoint, in phase 3)
// ends both ranks there with 75 and one line naming it; the directory is left as it was, and
// the run continued from it later ends exactly as one never stopped.
TEST_F(Checkpoints, AStopDuringSetUpOnOneRankEndsEveryRankAndLosesNothing) {
  const std::string ck = dir_.file("setup");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "7@1", 1);
  ASSERT_EQ(run_mpi(2, job(ck, dir_.file("s0.jsonl"))).exit_code, 75);
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  const std::vector<std::string> before = names_in(ck);
  const Bytes newest = read_bytes(ck + "/ckpt-000000007.hpck");
  const char* phases[] = {"while starting", "while loading the dataset",
                          "while loading the checkpoint to resume from", "while preparing the training engine"};
  const char* named[] = {"", ":usr1", ":usr2", ":hup"};  // SIGTERM, SIGUSR1, ... in phase 1, 2, ...
  for (int phase = 1; phase <= 4; ++phase) {
    const std::string hook = std::to_string(phase) + "@1" + named[phase - 1];
    SCOPED_TRACE(hook);
    setenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP", hook.c_str(), 1);
    const RunResult r = run_mpi(2, job(ck, dir_.file("s1.jsonl")), 120);
    unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
    EXPECT_EQ(r.exit_code, 75) << r.err;
    const std::string line = std::string("hpctrain: warning: stopped on request (") +
                             (phase == 1 ? "SIGTERM" : "SIG" + upper(named[phase - 1] + 1)) + " to rank 1) " +
                             phases[phase - 1] +
                             ", before the first step: nothing to save and nothing lost; run it again to continue";
    EXPECT_EQ(count_of(r.err, line), 1) << r.err;
    EXPECT_EQ(hpctrain_lines(r.err), 1) << r.err;
    EXPECT_EQ(names_in(ck), before);
    EXPECT_EQ(read_bytes(ck + "/ckpt-000000007.hpck"), newest);
    if (phase == 4) {  // after the config event: the metrics file ends as a stopped run's (it ended in that event)
      const auto lines = read_json_lines(dir_.file("s1.jsonl"));
      ASSERT_FALSE(lines.empty());
      EXPECT_EQ(lines.back().at("event").str, "stopped");
      EXPECT_EQ(lines.back().at("step").number, 7);
      EXPECT_EQ(lines.back().at("signal").str, "SIGHUP");
      EXPECT_EQ(lines.back().at("exit_code").number, 75);
      EXPECT_NE(read_text(ck + "/heartbeat").find("state=stopped\n"), std::string::npos) << read_text(ck + "/heartbeat");
    }
  }
  expect_exact_resume(2, ck, 7);
}

// A stop at once (SIGINT; a second SIGTERM) in set-up's last part, right after the metrics file's
// config event: the file ended in that event, with no "stopped" record (a job script that reads it
// for "requeue me" took the run for one that never wrote its end). Now it ends as a stop at once
// after the first step does, at the step the run started from.
TEST_F(Checkpoints, AStopAtOnceRightAfterTheConfigEventEndsTheMetricsFileAsStopped) {
  const std::string ck = dir_.file("at_once"), metrics = dir_.file("at_once.jsonl");
  setenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP", "4:int", 1);  // SIGINT at set-up's last phase: a stop at once
  const RunResult r = run_hpctrain(job(ck, metrics), 120);
  unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
  EXPECT_EQ(r.exit_code, 130) << r.err;
  const std::string text = read_text(metrics);
  EXPECT_EQ(text.rfind("{\"event\":\"config\"", 0), 0u) << text;
  const auto lines = read_json_lines(metrics);  // the config event left out
  ASSERT_EQ(lines.size(), 1u) << text;
  EXPECT_EQ(lines.back().at("event").str, "stopped") << text;
  EXPECT_EQ(lines.back().at("step").number, 0);
  EXPECT_EQ(lines.back().at("signal").str, "SIGINT");
  EXPECT_EQ(lines.back().at("exit_code").number, 130);
  EXPECT_EQ(lines.back().at("checkpointed").raw, "false");
  EXPECT_EQ(lines.back().count("elapsed_seconds"), 1u) << text;
}

// SIGINT in the middle of a checkpoint write stops at once, and says so (not "second signal"):
// the unfinished file is removed, the previous checkpoint stays the newest, whole.
TEST_F(Checkpoints, SigintDuringACheckpointWriteStopsAtOnceAndKeepsThePreviousOne) {
  const std::string ck = dir_.file("sigint");
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "2", 1);
  const std::string prom = dir_.file("sigint.prom");
  const auto p = start(ck, {"--prometheus-file", prom});
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  const std::string unfinished = "ckpt-000000010.hpck.tmp." + std::to_string(p->pid());
  ASSERT_TRUE(wait_until([&] { return fs::exists(ck + "/" + unfinished) || !p->running(); }, 60));
  kill(p->pid(), SIGINT);
  const RunResult r = p->finish(60);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_EQ(r.err, "hpctrain: stopped at once by SIGINT, without a checkpoint: the ones already written are kept "
                   "(SIGTERM or SIGUSR1 would have written one first)\n");
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000005.hpck", "heartbeat"}));
  expect_stopped_heartbeat(ck, 128 + SIGINT);
  expect_stopped_at_once(dir_.file("bg.jsonl"), prom, "sigint", "SIGINT", 128 + SIGINT, ck);
  expect_exact_resume(1, ck, 5);
}

// SIGINT's line names the stop signals that would have checkpointed: those of --stop-signals, not
// the default's SIGTERM and SIGUSR1.
TEST_F(Checkpoints, SigintNamesTheStopSignalsChosen) {
  const std::string ck = dir_.file("sigint_named");
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "7:int", 1);
  const auto p = start(ck, {"--stop-signals", "USR2,HUP"});
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  const RunResult r = p->finish(120);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_EQ(r.err, "hpctrain: stopped at once by SIGINT, without a checkpoint: the ones already written are kept "
                   "(SIGUSR2 or SIGHUP would have written one first)\n");
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000005.hpck", "heartbeat"}));
}

// A second SIGTERM while the stop's checkpoint is written ends at once; one within 5 s of the
// first (Slurm's end of a job sends one to each task, and srun passes its own on) is the same
// stop, whose checkpoint is written, and so are a SIGUSR1 then SIGTERM, or two SIGUSR1.
TEST_F(Checkpoints, SignalsDuringTheStopsCheckpoint) {
  struct Case {
    const char* first;  // HPCTRAIN_TEST_SIGNAL_AFTER_STEP
    double after;       // seconds from the checkpoint's temporary file to the signals
    std::vector<int> then;
    int exit_code;
    std::vector<std::string> lines;
    int64_t resumes_from;
  };
  const std::string stopped =
      "hpctrain: warning: stopped on request (SIGUSR1) after step 13; checkpoint written, --resume auto continues "
      "from it\n";
  const Case cases[] = {
      {"13", 5.5, {SIGTERM}, 128 + SIGTERM,
       {"hpctrain: stopped at once by SIGTERM (the second one), without a checkpoint: the ones already written are "
        "kept\n"},
       10},
      {"13", 0, {SIGTERM}, 75,
       {"hpctrain: SIGTERM again within 5 s of the first: the same stop (Slurm sends one to each task and srun passes "
        "its own on); a SIGTERM 5 s or more after the first, or SIGINT, stops at once, without a checkpoint\n",
        "hpctrain: warning: stopped on request (SIGTERM) after step 13; checkpoint written, --resume auto continues "
        "from it\n"},
       13},
      {"13:usr1", 0, {SIGUSR1, SIGTERM}, 75,
       {"hpctrain: SIGUSR1: already stopping (SIGUSR1); a second SIGTERM (5 s or more after the first) or SIGINT "
        "would stop at once, without a checkpoint\n",
        "hpctrain: SIGTERM: already stopping (SIGUSR1); a second SIGTERM (5 s or more after the first) or SIGINT "
        "would stop at once, without a checkpoint\n",
        stopped},
       13},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.first);
    SCOPED_TRACE(c.after);
    const std::string ck = dir_.file("second" + std::to_string(n++));
    setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", c.first, 1);
    setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", c.after > 0 ? "10" : "3", 1);  // the signals land in the pause
    const auto p = start(ck);
    unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
    const std::string unfinished = "ckpt-000000013.hpck.tmp." + std::to_string(p->pid());
    ASSERT_TRUE(wait_until([&] { return fs::exists(ck + "/" + unfinished) || !p->running(); }, 60));
    usleep(static_cast<useconds_t>(c.after * 1e6));
    for (int sig : c.then) {
      kill(p->pid(), sig);
      usleep(100000);
    }
    const RunResult r = p->finish(60);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
    std::string want;
    for (const std::string& line : c.lines) want += line;
    EXPECT_EQ(r.err, want);
    for (const std::string& name : names_in(ck)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    EXPECT_TRUE(fs::exists(ck + "/" + ckpt_name(c.resumes_from)));
    expect_stopped_heartbeat(ck, c.exit_code == 75 ? 0 : c.exit_code);
    expect_exact_resume(1, ck, c.resumes_from);
  }
}

// A stop asked for while the final checkpoint is written lets the run finish (exit 0, the
// checkpoint whole, a warning); a second SIGTERM there (more than 5 s after the first: one
// within that is the same stop) stops at once and leaves the one before.
TEST_F(Checkpoints, SignalsDuringTheFinalCheckpoint) {
  for (const int sigterms : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << sigterms << " SIGTERM(s)");
    const std::string ck = dir_.file("final" + std::to_string(sigterms));
    const std::string m = dir_.file("final" + std::to_string(sigterms) + ".jsonl");
    auto args = job(ck, m);
    *(std::find(args.begin(), args.end(), "--checkpoint-every-steps") + 1) = "20";
    setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", sigterms == 1 ? "1" : "10", 1);
    const auto p = start_hpctrain(args);
    unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
    const std::string unfinished = "ckpt-000000040.hpck.tmp." + std::to_string(p->pid());
    ASSERT_TRUE(wait_until([&] { return fs::exists(ck + "/" + unfinished) || !p->running(); }, 60));
    for (int i = 0; i < sigterms; ++i) {
      if (i > 0) usleep(5500000);
      kill(p->pid(), SIGTERM);
      usleep(100000);
    }
    const RunResult r = p->finish(60);
    if (sigterms == 1) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.err, "hpctrain: warning: a stop was asked for (SIGTERM) as the run was finishing; it finished "
                       "instead\n");
      expect_same_end(done_of(m), uninterrupted(1));
      EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000020.hpck", "ckpt-000000040.hpck", "heartbeat"}));
    } else {
      EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
      EXPECT_EQ(count_of(r.err, "hpctrain: stopped at once by SIGTERM (the second one)"), 1) << r.err;
      EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000020.hpck", "heartbeat"}));
      expect_stopped_heartbeat(ck, 128 + SIGTERM);
      args = job(ck, dir_.file("final_resumed.jsonl"));
      *(std::find(args.begin(), args.end(), "--checkpoint-every-steps") + 1) = "20";
      const RunResult resumed = run_hpctrain(args);
      ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
      EXPECT_EQ(done_of(dir_.file("final_resumed.jsonl")).at("resumed_from_step").number, 20);
      expect_same_end(done_of(dir_.file("final_resumed.jsonl")), uninterrupted(1));
    }
  }
}

// A stop asked for during the first epoch's evaluation is honoured right after it, at the
// epoch's end (step 20), not one step into the next epoch.
TEST_F(Checkpoints, AStopDuringTheEvaluationEndsTheRunRightAfterIt) {
  const std::string ck = dir_.file("eval");
  auto args = job(ck, dir_.file("ev.jsonl"));
  std::replace(args.begin(), args.end(), std::string("--quiet"), std::string("--log-every"));
  args.insert(std::find(args.begin(), args.end(), std::string("--log-every")) + 1, "20");
  *(std::find(args.begin(), args.end(), "--test-samples") + 1) = "4000";  // a second or more to evaluate
  const auto p = start_hpctrain(args);
  ASSERT_TRUE(wait_until([&] { return read_text(p->out_path()).find("step 20/20") != std::string::npos ||
                                      !p->running(); }, 60));
  kill(p->pid(), SIGTERM);
  const RunResult r = p->finish(60);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_EQ(r.err, "hpctrain: warning: stopped on request (SIGTERM) after step 20; checkpoint written, --resume "
                   "auto continues from it\n");
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000010.hpck", "ckpt-000000015.hpck",
                                                    "ckpt-000000020.hpck", "heartbeat"}));
  expect_exact_resume(1, ck, 20);
}

// A stop at an epoch's last step (20 of 2 epochs of 20): the resumed run starts at the next epoch
// and never evaluates this one, so the metrics file held no test loss for epoch 1 at all. The stop
// ends the epoch (its evaluation and event) once its checkpoint is written, not before: a second
// signal or the scheduler's SIGKILL during a long evaluation must not take the checkpoint with it.
TEST_F(Checkpoints, AStopAtAnEpochsLastStepCheckpointsThenEvaluatesThatEpoch) {
  const std::string ck = dir_.file("edge"), m = dir_.file("edge.jsonl");
  auto stop_only = job(ck, m);  // no periodic checkpoint at step 20: the stop's alone
  std::replace(stop_only.begin(), stop_only.end(), std::string("--checkpoint-every-steps"),
               std::string("--keep-checkpoints"));
  // The checkpoint's write pauses a second before its rename: an epoch event written after the
  // rename comes a second or more after the file's last write (its mtime, to the kernel's tick),
  // one written before the checkpoint a moment before it.
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "20@1", 1);
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "1", 1);
  const RunResult stopped = run_mpi(2, stop_only);
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  struct stat written {};
  ASSERT_EQ(::stat((ck + "/ckpt-000000020.hpck").c_str(), &written), 0) << stopped.err;
  const std::vector<JsonObject> first = read_json_lines(m);
  ASSERT_GE(first.size(), 2u) << read_text(m);
  ASSERT_EQ(first[first.size() - 2].at("event").str, "epoch") << read_text(m);
  EXPECT_LT(static_cast<double>(written.st_mtim.tv_sec) + 1e-9 * static_cast<double>(written.st_mtim.tv_nsec) + 0.5,
            first[first.size() - 2].at("unix_time").number)
      << "the stop's checkpoint was written after the epoch's evaluation";
  const RunResult resumed = run_mpi(2, job(ck, m));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  std::vector<double> epochs;
  for (const JsonObject& line : read_all_json_lines(m))
    if (line.at("event").str == "epoch") {
      epochs.push_back(line.at("epoch").number);
      EXPECT_GT(line.at("test_accuracy").number, 0.3);
    }
  EXPECT_EQ(epochs, (std::vector<double>{1, 2})) << read_text(m);
  expect_same_end(done_of(m), uninterrupted(2));
}

// A rank killed after an epoch's last step (20 of 2 epochs of 20), once the checkpoint at that step
// is written and before the epoch is evaluated (a kill during its evaluation): the resumed run
// started at epoch 2, and epoch 1's evaluation, line and event were lost for good. The checkpoint
// now records the epoch as not ended, with its sums: the resumed run ends it first, with the
// figures of a run never stopped, once. A run resumed from there again finds its event in the
// metrics file and does not end it twice.
TEST_F(Checkpoints, AKillBeforeAnEpochIsEvaluatedLosesNoEpochLine) {
  const std::string ck = dir_.file("unended"), m = dir_.file("unended.jsonl");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "20@1", 1);
  const RunResult killed = run_mpi(2, job(ck, m));
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_NE(killed.exit_code, 0);
  ASSERT_TRUE(epochs_of(m).empty()) << read_text(m);
  // Resumed, it ends epoch 1 and is killed again after step 23, before the next checkpoint: the
  // last run resumes from the same checkpoint at step 20.
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "23@1", 1);
  const RunResult again = run_mpi(2, job(ck, m));
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_NE(again.exit_code, 0);
  ASSERT_EQ(epoch_numbers(m), (std::vector<double>{1})) << read_text(m);
  const RunResult resumed = run_mpi(2, job(ck, m));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(epoch_numbers(m), (std::vector<double>{1, 2})) << read_text(m);
  expect_same_epochs(epochs_of(m), uninterrupted_run(2).epochs);
  EXPECT_GT(epochs_of(m).at(1).at("images_per_second").number, 0);
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 20);
  expect_same_end(done_of(m), uninterrupted(2));
}

// A stop whose checkpoint cannot be written (something in the way of its file) is an error on
// every rank, not a 75 that promises a checkpoint; the ones before stay. An earlier one that
// failed does not keep the stop's from being tried. A stop during set-up
// with a directory that cannot be used is that directory's error.
// (The directory in the way is made once the run has written its first checkpoint, at step 5:
// made before, the run refuses it at the start. Each write pauses a second before its rename, so
// the directory is there before the blocked step's rename.)
RunResult stopped_at_13_with_a_checkpoint_blocked(const std::vector<std::string>& job, const std::string& ck,
                                                  int64_t blocked_step) {
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "13@1", 1);
  setenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME", "1", 1);
  const auto p = start_mpi(2, job);
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  EXPECT_TRUE(wait_until([&] { return fs::exists(ck + "/ckpt-000000005.hpck") || !p->running(); }, 60));
  char name[64];
  std::snprintf(name, sizeof name, "/ckpt-%09lld.hpck", static_cast<long long>(blocked_step));
  fs::create_directories(ck + name);
  return p->finish(120);
}

TEST_F(Checkpoints, AStopThatCannotCheckpointIsAnError) {
  const std::string ck = dir_.file("blocked");
  const RunResult r = stopped_at_13_with_a_checkpoint_blocked(job(ck, dir_.file("b.jsonl")), ck, 13);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "hpctrain: error: "), 1) << r.err;
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << "every rank knows, none is killed\n" << r.err;
  EXPECT_NE(r.err.find("stopped on request (SIGTERM to rank 1) after step 13, but its checkpoint could not be "
                       "written: cannot rename " + ck + "/ckpt-000000013.hpck.tmp."),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" to " + ck + "/ckpt-000000013.hpck: Is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"ckpt-000000005.hpck", "ckpt-000000010.hpck",
                                                    "ckpt-000000013.hpck", "heartbeat"}));
  EXPECT_TRUE(fs::is_directory(ck + "/ckpt-000000013.hpck"));

  // The periodic checkpoint before the stop (step 10) failed in the background: the stop, the
  // next to hand a checkpoint over, says so in a warning and writes its own all the same (the
  // last chance to keep steps 6 to 13), and the run stops as asked.
  const std::string ck10 = dir_.file("blocked10");
  const RunResult r10 = stopped_at_13_with_a_checkpoint_blocked(job(ck10, dir_.file("b10.jsonl")), ck10, 10);
  EXPECT_EQ(r10.exit_code, 75) << r10.err;
  EXPECT_EQ(count_of(r10.err, "hpctrain: error: "), 0) << r10.err;
  EXPECT_NE(r10.err.find("hpctrain: warning: an earlier checkpoint could not be written (cannot rename"),
            std::string::npos)
      << r10.err;
  EXPECT_NE(r10.err.find(" to " + ck10 + "/ckpt-000000010.hpck: Is a directory); writing this one, of step 13, "
                         "all the same"),
            std::string::npos)
      << r10.err;
  EXPECT_EQ(names_in(ck10), (std::vector<std::string>{"ckpt-000000005.hpck", "ckpt-000000010.hpck",
                                                      "ckpt-000000013.hpck", "heartbeat"}));

  write_text(dir_.file("a-file"), "");
  setenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP", "2", 1);
  const RunResult early = run_hpctrain(job(dir_.file("a-file") + "/ckpt", dir_.file("b2.jsonl")));
  unsetenv("HPCTRAIN_TEST_SIGNAL_IN_SETUP");
  expect_usage_error(early, "cannot create checkpoint directory " + dir_.file("a-file") + "/ckpt");
  EXPECT_EQ(early.err.find("stopped on request"), std::string::npos) << early.err;
}

// `hpctrain evaluate` has nothing to save: a stop signal ends it at once, saying so.
TEST_F(Checkpoints, EvaluateStopsAtOnceOnASignal) {
  const std::string ck = dir_.file("evaluate");
  auto args = job(ck, dir_.file("ee.jsonl"));
  args.insert(args.end(), {"--max-steps", "1"});
  ASSERT_EQ(run_hpctrain(args).exit_code, 0);
  for (const int sig : {SIGTERM, SIGUSR1, SIGUSR2, SIGHUP}) {
    const auto p = start_hpctrain({"evaluate", "--checkpoint", ck, "--data-dir", fashion_mnist_dir(), "--threads", "1"});
    ASSERT_TRUE(wait_until([&] { return blocks_signal(p->pid(), sig) || !p->running(); }, 20));
    usleep(200000);
    kill(p->pid(), sig);
    const RunResult r = p->finish(60);
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_EQ(r.err, std::string("hpctrain: stopped at once by SIG") + sigabbrev_np(sig) + " (nothing to save)\n");
  }
}

// ... and leaves no --metrics-file behind that it made and wrote no result to (an empty file was
// left, which a script took for a result), nor touches one that was there.
TEST_F(Checkpoints, EvaluateStoppedAtOnceLeavesNoEmptyMetricsFile) {
  const std::string ck = dir_.file("evaluate-m");
  auto args = job(ck, dir_.file("em.jsonl"));
  args.insert(args.end(), {"--max-steps", "1"});
  ASSERT_EQ(run_hpctrain(args).exit_code, 0);
  const std::string before = "{\"event\":\"evaluate\",\"step\":0}\n";
  for (const int sig : {SIGINT, SIGTERM}) {
    for (const bool existed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << sigabbrev_np(sig) << (existed ? ", the file there before" : ""));
      const std::string m = dir_.file(std::string("eval-") + sigabbrev_np(sig) + (existed ? "-old" : "") + ".jsonl");
      if (existed) write_text(m, before);
      // After batch 5 of 1000: the file is opened (made) before the test set is read, and the
      // result written after the last batch.
      setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", (std::string("5:") + sigabbrev_np(sig)).c_str(), 1);
      const RunResult r = run_hpctrain({"evaluate", "--checkpoint", ck, "--data-dir", fashion_mnist_dir(), "--threads",
                                        "1", "--eval-batch-size", "10", "--metrics-file", m});
      unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
      ASSERT_EQ(r.exit_code, 128 + sig) << r.err;
      if (existed) EXPECT_EQ(read_text(m), before);
      else EXPECT_FALSE(fs::exists(m)) << "left: '" << read_text(m) << "'";
    }
  }
}

TEST_F(Checkpoints, ACheckpointThatDoesNotFitIsAClearError) {
  const std::string ck = dir_.file("fit");
  ASSERT_EQ(run_hpctrain(job(ck, dir_.file("f.jsonl"))).exit_code, 0);
  // A valid older one, for the end: a run below resumes a file of another directory into ck, and
  // moves ck's own aside.
  fs::copy_file(ck + "/ckpt-000000035.hpck", dir_.file("older.hpck"));
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
  // A checkpoint whose parameters are not finite (written by a run that diverged, before
  // hpctrain refused to write such): refused by name, not resumed into NaN.
  const Bytes last = read_bytes(ck + "/ckpt-000000040.hpck");
  write_bytes(dir_.file("diverged.hpck"), with_section(last, 2, [](Bytes& params) {
                const float nan = std::nanf("");
                std::memcpy(params.data(), &nan, 4);
              }));
  expect_usage_error(with({"--resume", dir_.file("diverged.hpck")}),
                     dir_.file("diverged.hpck") + " holds a state that is not finite (its run had diverged): resume "
                     "from an earlier checkpoint (--resume FILE) or start afresh (--resume none)");
  // evaluate refuses it as export and predict do (it printed "test loss nan", exit 0).
  expect_usage_error(run_hpctrain({"evaluate", "--checkpoint", dir_.file("diverged.hpck"), "--test-samples", "100",
                                   "--data-dir", fashion_mnist_dir(), "--threads", "1"}),
                     "the checkpoint " + dir_.file("diverged.hpck") + " holds parameters that are not finite");
  // A position that is not in the run (a file made or edited elsewhere, its checksums made
  // anew) is refused: one past the run's epochs ended it at once, untrained, with exit 0. The
  // file as written (step 40 at the end of epoch 2 of 20 steps each) still resumes.
  using Edit = std::pair<std::string, std::string>;
  for (const std::vector<Edit>& edits : std::vector<std::vector<Edit>>{{{"epoch", "1000000001"}},
                                                                        {{"epoch", "1"}, {"step_in_epoch", "20"}},
                                                                        {{"step_in_epoch", "3"}},
                                                                        {{"step", "1000"}}}) {
    Bytes edited = last;
    for (const auto& [field, value] : edits) edited = with_meta(edited, field, value);
    write_bytes(dir_.file("edited.hpck"), edited);
    expect_usage_error(with({"--resume", dir_.file("edited.hpck")}), "the checkpoint's position (step ");
  }
  // On several ranks too: one line, from rank 0 (each rank printed its own, then MPI_ABORT's).
  auto on_two = job(ck, dir_.file("f4.jsonl"));
  on_two.insert(on_two.end(), {"--resume", dir_.file("edited.hpck")});
  expect_usage_error(run_mpi(2, on_two), "the checkpoint's position (step 1000, epoch 3, step 0 of it) is not in "
                                         "this run of 2 epochs of 20 steps");
  write_bytes(dir_.file("edited.hpck"), with_meta(last, "samples_seen", "nan"));
  expect_usage_error(with({"--resume", dir_.file("edited.hpck")}), "the checkpoint's position is invalid");
  write_bytes(dir_.file("edited.hpck"), with_meta(last, "time", "1"));
  const RunResult same = with({"--resume", dir_.file("edited.hpck")});
  EXPECT_EQ(same.exit_code, 0) << same.err;
  // Parameters one value short (checksums made anew): inspect said "valid: yes", where resume,
  // evaluate and export refuse the file.
  write_bytes(dir_.file("short.hpck"), with_section(last, 2, [](Bytes& params) { params.resize(params.size() - 4); }));
  const RunResult seen = run_hpctrain({"inspect", dir_.file("short.hpck")});
  EXPECT_EQ(seen.exit_code, 2) << seen.out;
  EXPECT_NE(seen.out.find("valid: no: the checkpoint's parameters hold "), std::string::npos) << seen.out;
  EXPECT_EQ(run_hpctrain({"inspect", ck + "/ckpt-000000040.hpck"}).exit_code, 0);
  // What any resume refuses before it looks at the run (all "valid: yes" before): a position that
  // is not one, a state that is not finite, an optimizer state of another size than the parameters.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [bytes, problem] : std::vector<std::pair<Bytes, std::string>>{
           {with_meta(last, "samples_seen", "nan"), "the checkpoint's position is invalid"},
           {with_meta(last, "step", "-3"), "the checkpoint's position is invalid"},
           // (an epoch this large overflowed where the epoch is shown from 1: UBSan's report)
           {with_meta(last, "epoch", "9223372036854775807"), "the checkpoint's position is invalid"},
           {with_section(last, 2, [&](Bytes& params) { std::memcpy(params.data(), &nan, 4); }),
            "it holds a state that is not finite (the parameters; its run had diverged)"},
           {with_section(last, 3, [](Bytes& momentum) { momentum.resize(momentum.size() - 4); }),
            "the checkpoint's optimizer state holds "},
           // Statistics no run leaves (every value normalised by them NaN: evaluate and export
           // went on and said nothing)
           {with_section(last, 4,
                         [](Bytes& buffers) {
                           for (size_t at = 0; at + 4 <= buffers.size(); at += 4) {
                             const float below = -1;
                             std::memcpy(buffers.data() + at, &below, 4);
                           }
                         }),
            "the checkpoint's batch-norm statistics are invalid: "}}) {
    write_bytes(dir_.file("refused.hpck"), bytes);
    const RunResult shown = run_hpctrain({"inspect", dir_.file("refused.hpck")});
    EXPECT_EQ(shown.exit_code, 2) << shown.out;
    EXPECT_NE(shown.out.find("valid: no: " + problem), std::string::npos) << shown.out;
    const RunResult resumed = with({"--resume", dir_.file("refused.hpck")});
    EXPECT_EQ(resumed.exit_code, 2) << "resume takes what inspect refuses";
    EXPECT_NE(resumed.err.find(dir_.file("refused.hpck")), std::string::npos) << "names the file: " << resumed.err;
  }
  // evaluate too: it reported step -3 as the step evaluated, and wrote it to its metrics file.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{{"step", "-3"}, {"epoch", "-1"}}) {
    write_bytes(dir_.file("refused.hpck"), with_meta(last, key, value));
    const RunResult evaluated = run_hpctrain({"evaluate", "--checkpoint", dir_.file("refused.hpck"), "--test-samples",
                                              "100", "--data-dir", fashion_mnist_dir(), "--threads", "1"});
    expect_usage_error(evaluated, "the checkpoint's position is invalid");
  }
  // A time no clock gives (year -1126091476 was printed): "?".
  write_bytes(dir_.file("when.hpck"), with_meta(last, "time", "99999999999999999"));
  const RunResult when = run_hpctrain({"inspect", dir_.file("when.hpck")});
  EXPECT_EQ(when.exit_code, 0) << when.err;
  EXPECT_NE(when.out.find(" rank(s), ?\n"), std::string::npos) << when.out;
  // As a directory's newest, where --resume auto refuses it (it reads, so it is not passed by):
  // inspect DIR said exit 0, for the valid older one, as if the run could go on.
  const std::string misfit = dir_.file("misfit");
  fs::create_directory(misfit);
  fs::copy_file(dir_.file("older.hpck"), misfit + "/ckpt-000000035.hpck");
  fs::copy_file(dir_.file("short.hpck"), misfit + "/ckpt-000000040.hpck");
  const RunResult listed = run_hpctrain({"inspect", misfit});
  expect_usage_error(listed, "hpctrain: error: the newest checkpoint that reads, " + misfit +
                                 "/ckpt-000000040.hpck, does not fit its model (the checkpoint's parameters hold ");
  EXPECT_NE(listed.err.find("--resume auto refuses it"), std::string::npos) << listed.err;
  auto resumed = job(misfit, dir_.file("f5.jsonl"));
  expect_usage_error(run_hpctrain(resumed), "the checkpoint's parameters hold ");
  // --resume none starts afresh even with checkpoints in the directory.
  const std::string m = dir_.file("fresh.jsonl");
  auto fresh = job(ck, m);
  fresh.insert(fresh.end(), {"--resume", "none"});
  ASSERT_EQ(run_hpctrain(fresh).exit_code, 0);
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, -1);
}


// Whether process `pid` is stopped (SIGSTOP): state T in /proc/PID/stat.
bool is_stopped(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

// The first run's job() with snapshots every step in `shm`, stopped (SIGSTOP, by the test hook)
// at step 12 of 40, holding its directory's lock with checkpoints and snapshots written.
std::unique_ptr<Started> start_and_stop_at_step_12(const std::vector<std::string>& args, const std::string& shm) {
  auto a = args;
  *(std::find(a.begin(), a.end(), std::string("--snapshot-every-steps")) + 1) = "1";
  a.insert(a.end(), {"--snapshot-dir", shm});
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "12:stop", 1);
  auto p = start_hpctrain(a);
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  EXPECT_TRUE(wait_until([&] { return is_stopped(p->pid()) || !p->running(); }, 60));
  return p;
}

// A run resumed on other training data: a copy of its Fashion-MNIST with two training samples of
// other labels swapped (as a dataset packed again with another seed, or files replaced, would order
// them) resumed silently, and its samples no longer continued where it had stopped. Refused by
// name; the same files in another directory (data moved) resume.
TEST_F(Checkpoints, AResumeOnOtherTrainingDataIsRefused) {
  const std::string ck = dir_.file("data");
  ASSERT_EQ(run_hpctrain(job(ck, dir_.file("d.jsonl"))).exit_code, 0);
  const auto gunzipped = [](const std::string& path) {
    Bytes b;
    gzFile f = gzopen(path.c_str(), "rb");
    char buf[1 << 16];
    for (int n; f && (n = gzread(f, buf, sizeof buf)) > 0;) b.insert(b.end(), buf, buf + n);
    if (f) gzclose(f);
    return b;
  };
  const std::string moved = dir_.file("moved"), swapped = dir_.file("swapped");
  for (const std::string& d : {moved, swapped}) {
    fs::create_directories(d);
    for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                             "t10k-labels-idx1-ubyte"})
      write_bytes(d + "/" + name, gunzipped(fashion_mnist_dir() + "/" + name + ".gz"));
  }
  Bytes images = read_bytes(swapped + "/train-images-idx3-ubyte"), labels = read_bytes(swapped + "/train-labels-idx1-ubyte");
  size_t other = 1;  // the first sample whose label is not sample 0's
  while (labels[8 + other] == labels[8]) ++other;
  ASSERT_LT(other, 1280u);
  std::swap(labels[8], labels[8 + other]);
  std::swap_ranges(images.begin() + 16, images.begin() + 16 + 784, images.begin() + 16 + 784 * static_cast<ptrdiff_t>(other));
  write_bytes(swapped + "/train-images-idx3-ubyte", images);
  write_bytes(swapped + "/train-labels-idx1-ubyte", labels);
  const auto resumed_on = [&](const std::string& data) {
    std::vector<std::string> a = job(ck, dir_.file("d2.jsonl"));
    *(std::find(a.begin(), a.end(), "--data-dir") + 1) = data;
    a.insert(a.end(), {"--resume", ck + "/ckpt-000000030.hpck"});
    return run_hpctrain(a);
  };
  const RunResult refused = resumed_on(swapped);
  expect_usage_error(refused, ck + "/ckpt-000000030.hpck: the checkpoint's run trained on another training set than " +
                                  swapped + "/train-images-idx3-ubyte, or on its samples in another order (digest ");
  // inspect shows the digest the file records.
  std::smatch digest;
  ASSERT_TRUE(std::regex_search(refused.err, digest, std::regex("\\(digest ([0-9a-f]{16}), here [0-9a-f]{16}:")));
  const RunResult shown = run_hpctrain({"inspect", ck + "/ckpt-000000030.hpck"});
  EXPECT_NE(shown.out.find("training set: digest " + digest[1].str()), std::string::npos) << shown.out;
  const RunResult r = resumed_on(moved);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// What computes the bits beyond the binary (here oneDNN's instruction set, which the CPU and
// ONEDNN_MAX_CPU_ISA set) is the run's "kernels": in its config event and its checkpoints. A
// resume on other kernels (another CPU after a requeue) warns that its bits may not be those of
// a run never stopped, naming both, and records its own; a resume on the same says nothing.
TEST_F(Checkpoints, AResumeOnOtherKernelsSaysItsBitsMayDiffer) {
  const std::string ck = dir_.file("kernels");
  ASSERT_EQ(run_hpctrain(job(ck, dir_.file("k.jsonl"))).exit_code, 0);
  const std::string from = ck + "/ckpt-000000030.hpck";
  const auto resumed = [&](const std::string& isa, const std::string& name) {
    std::vector<std::string> argv = hpctrain_argv(job(dir_.file(name), dir_.file(name + ".jsonl")));
    argv.insert(argv.end(), {"--resume", from});
    if (!isa.empty()) argv.insert(argv.begin(), {"/usr/bin/env", "ONEDNN_MAX_CPU_ISA=" + isa});
    return run_program(argv);
  };
  const auto kernels_of = [&](const std::string& name) {
    return read_all_json_lines(dir_.file(name + ".jsonl")).front().at("kernels").str;
  };
  const std::string written = read_all_json_lines(dir_.file("k.jsonl")).front().at("kernels").str;
  ASSERT_FALSE(written.empty());
  const RunResult same = resumed("", "same");
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(kernels_of("same"), written);
  EXPECT_EQ(same.err.find("computed with"), std::string::npos) << same.err;
  const RunResult other = resumed("SSE41", "other");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  const std::string now = kernels_of("other");
  ASSERT_NE(now, written) << "ONEDNN_MAX_CPU_ISA=SSE41 left oneDNN's kernels as they were: a CPU without AVX2?";
  EXPECT_NE(other.err.find("warning: the checkpoint's run computed with " + written + ", this one computes with " + now +
                           ": it continues from the checkpoint's state, but its bits may not be those a run never "
                           "stopped would have had (ONEDNN_MAX_CPU_ISA set to the least"),
            std::string::npos)
      << other.err;
  EXPECT_EQ(count_of(other.err, "computed with"), 1) << other.err;
  const RunResult shown = run_hpctrain({"inspect", dir_.file("other") + "/ckpt-000000040.hpck"});
  EXPECT_NE(shown.out.find("computed with: " + now + "\n"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find(std::string("written by: hpctrain ") + HPCTRAIN_TEST_VERSION + " (revision " + tree_revision() +
                           ") on 1 rank(s), "),
            std::string::npos)
      << shown.out;
}

// One writer per checkpoint directory: while a run holds it (stopped here, so that nothing moves),
// a second one on the same directory, fresh or resuming, is refused with one line naming the
// holder, and leaves every file of the first, its checkpoints and its snapshots, as it was; the
// first then ends exactly as a run never disturbed, and its lock goes with it.
TEST_F(Checkpoints, ASecondRunOnABusyDirectoryIsRefusedAndTouchesNothing) {
  const JsonObject want = uninterrupted(1);
  const std::string ck = dir_.file("busy"), shm = dir_.file("busy-shm");
  const auto first = start_and_stop_at_step_12(job(ck, dir_.file("first.jsonl")), shm);
  ASSERT_TRUE(first->running());
  const std::vector<Snapshot> before = snapshots({ck, shm});
  ASSERT_TRUE(fs::exists(ck + "/ckpt-000000005.hpck"));
  ASSERT_GT(before[1].size(), 1u) << "no snapshot was taken";
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--resume", "none"},
                                                std::vector<std::string>{},
                                                std::vector<std::string>{"--checkpoint-lock-wait", "1s"},
                                                // the wait is not set-up's time: refused for the lock, not 124
                                                std::vector<std::string>{"--checkpoint-lock-wait", "3s",
                                                                         "--start-timeout", "1s"}}) {
    SCOPED_TRACE(extra.empty() ? "--resume auto" : extra[0]);
    auto args = job(ck, dir_.file("second.jsonl"));
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult second = run_hpctrain(args, 60);
    expect_usage_error(second, "hpctrain: error: checkpoint directory " + ck + " is in use by another run (host ");
    EXPECT_NE(second.err.find(" pid " + std::to_string(first->pid()) + ", run "), std::string::npos) << second.err;
    if (!extra.empty() && extra[0] == "--checkpoint-lock-wait") {
      EXPECT_GE(second.seconds, extra[1] == "3s" ? 3.0 : 1.0);
    }
    EXPECT_EQ(snapshots({ck, shm}), before);
  }
  kill(first->pid(), SIGCONT);
  const RunResult r = first->finish(120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_end(done_of(dir_.file("first.jsonl")), want);
  EXPECT_FALSE(fs::exists(ck + "/lock")) << "a finished run leaves its lock behind";
  // Free again: the next run continues it (at its end: nothing to train).
  const RunResult after = run_hpctrain(job(ck, dir_.file("after.jsonl")), 60);
  EXPECT_EQ(after.exit_code, 0) << after.err;
}

// A holder that stopped refreshing its lock (its host lost, the process stopped) is taken over
// after the stale time, with a warning naming it; when it comes back it writes nothing more in
// the directory, and ends with one error line and exit code 2. The lock of a run killed outright
// (SIGKILL) is taken with a warning saying whose it was.
TEST_F(Checkpoints, AStaleLockIsTakenOverAndItsHolderWritesNothingMore) {
  const JsonObject want = uninterrupted(1);
  const std::string ck = dir_.file("stale"), shm = dir_.file("stale-shm");
  setenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS", "3", 1);
  const auto first = start_and_stop_at_step_12(job(ck, dir_.file("first.jsonl")), shm);
  usleep(3200000);  // its record stale by its own time: a second run watches it for 3 s, then takes it
  auto args = job(ck, dir_.file("second.jsonl"));
  // That watch, past --checkpoint-lock-wait, is not set-up's time either (it was: 124 from a
  // --start-timeout shorter than the watch). The 2 s left are for the rest of set-up: 1 s was
  // not always enough beside another test and a disk kept busy.
  args.insert(args.end(), {"--checkpoint-lock-wait", "0", "--start-timeout", "2s"});
  const RunResult second = run_hpctrain(args, 120);
  unsetenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(count_of(second.err, "hpctrain: warning: taking over the checkpoint directory's lock " + ck +
                                     "/lock from host "), 1) << second.err;
  // From step 10, or 5 where the stop came before the checkpoint of step 10 was written whole.
  const double from = done_of(dir_.file("second.jsonl")).at("resumed_from_step").number;
  EXPECT_TRUE(from == 10 || from == 5) << from;
  expect_same_end(done_of(dir_.file("second.jsonl")), want);
  const Snapshot before = snapshot(ck);
  kill(first->pid(), SIGCONT);
  const RunResult r = first->finish(120);
  // (The second run has ended and released the lock: its file is gone.)
  expect_usage_error(r, "hpctrain: error: the checkpoint directory " + ck + " is no longer this run's: its lock file is gone");
  EXPECT_EQ(snapshot(ck), before);

  const std::string killed = dir_.file("killed");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "7", 1);
  EXPECT_EQ(run_hpctrain(job(killed, dir_.file("k1.jsonl")), 60).exit_code, -1);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_TRUE(fs::exists(killed + "/lock"));
  const RunResult resumed = run_hpctrain(job(killed, dir_.file("k2.jsonl")), 60);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(count_of(resumed.err, "hpctrain: warning: the checkpoint directory's lock " + killed + "/lock was left by "
                                      "host "), 1) << resumed.err;
  EXPECT_NE(resumed.err.find(", which ended without releasing it; taking it"), std::string::npos) << resumed.err;
  expect_same_end(done_of(dir_.file("k2.jsonl")), want);
}

// The heartbeat ends with the run's real state: "failed" and the exit code after a run that
// diverged, not "training".
TEST_F(Checkpoints, TheHeartbeatOfAFailedRunSaysSo) {
  const std::string ck = dir_.file("diverges");
  auto args = job(ck, dir_.file("d.jsonl"));
  args.insert(args.end(), {"--lr", "1e6"});
  const RunResult r = run_hpctrain(args, 60);
  expect_usage_error(r, "hpctrain: error: training diverged: the ");
  const std::string beat = read_text(ck + "/heartbeat");
  EXPECT_NE(beat.find("\nstate=failed\n"), std::string::npos) << beat;
  EXPECT_NE(beat.find("\nexit_code=2\n"), std::string::npos) << beat;
  // A run refused before it wrote anything leaves no directory behind.
  const std::string none = dir_.file("never-made");
  auto refused = job(none, dir_.file("r.jsonl"));
  refused.insert(refused.end(), {"--data-dir", dir_.file("no-such-data")});
  EXPECT_EQ(run_hpctrain(refused, 60).exit_code, 2);
  EXPECT_FALSE(fs::exists(none));
}

// Under umask 000 a run made its checkpoint directory (and those above it) 0777, and then
// refused it as writable by others, leaving it behind for anyone to fill; its heartbeat was 0666,
// and the snapshot directory was every user's until its chmod. Now nothing it makes is others' to
// write in or to: the directories as the umask says but never others', the files 0644 as the
// checkpoints, the snapshot directory 0700 from the start.
TEST_F(Checkpoints, UnderUmask000NothingItMakesIsWritableByOthers) {
  const std::string ck = dir_.file("new/deeper/ck"), shm = dir_.file("shm/hpctrain-test");
  std::vector<std::string> args{"--train-samples", "640", "--test-samples", "100", "--epochs", "1",
                                "--global-batch-size", "64", "--threads", "1", "--quiet", "--data-dir",
                                fashion_mnist_dir(), "--metrics-file", dir_.file("u.jsonl"), "--checkpoint-dir", ck,
                                "--checkpoint-every-steps", "5", "--snapshot-every-steps", "1", "--snapshot-dir", shm};
  const mode_t umask_before = ::umask(0);
  const RunResult r = run_hpctrain(args, 120);
  ::umask(umask_before);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(ck + "/heartbeat"));
  for (const auto& e : fs::recursive_directory_iterator(dir_.str()))
    EXPECT_EQ(e.symlink_status().permissions() & fs::perms::others_write, fs::perms::none)
        << e.path() << " is writable by others";
  EXPECT_EQ(fs::status(ck + "/heartbeat").permissions(), fs::perms(0644));
  EXPECT_EQ(fs::status(ck).permissions(), fs::perms(0775));
  EXPECT_EQ(fs::status(shm).permissions(), fs::perms(0700));
}

}  // namespace
}  // namespace hpc::itest
