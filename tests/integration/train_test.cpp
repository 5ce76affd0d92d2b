// Short real trainings on the real Fashion-MNIST: determinism, the metrics-file contract,
// convergence, config files, and every model of the zoo.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

class Train : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte.gz"))
        << "Fashion-MNIST not found in " << fashion_mnist_dir()
        << " (apt-get install dataset-fashion-mnist, or configure with -DHPCTRAIN_TEST_FASHION_MNIST_DIR=...)";
  }

  // Runs hpctrain quietly on two threads with `args` plus a fresh metrics file; expects success,
  // `err` on stderr (nothing, unless told), and returns the metrics lines.
  std::vector<JsonObject> train(std::vector<std::string> args, const std::string& err = "") {
    const std::string metrics = dir_.file("m" + std::to_string(runs_++) + ".jsonl");
    args.insert(args.end(), {"--data-dir", fashion_mnist_dir(), "--metrics-file", metrics, "--quiet"});
    if (std::find(args.begin(), args.end(), "--threads") == args.end()) args.insert(args.end(), {"--threads", "2"});
    const RunResult r = run_hpctrain(args);
    EXPECT_EQ(r.exit_code, 0) << r.command << "\nstderr: " << r.err;
    EXPECT_EQ(r.err, err) << r.command;
    EXPECT_EQ(r.out, "") << r.command << " (--quiet prints nothing)";
    if (r.exit_code != 0) return {};
    return read_json_lines(metrics);
  }

  static std::string checksum(const std::vector<JsonObject>& lines) {
    const JsonObject& d = done_line(lines);
    auto it = d.find("param_checksum");
    return it == d.end() ? "" : it->second.str;
  }

  TempDir dir_{"train"};
  int runs_ = 0;
};

const std::vector<std::string> kShort{"--train-samples", "512", "--test-samples", "200", "--batch-size", "32",
                                      "--max-steps",     "12",  "--epochs",       "1"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- (a) determinism -------------------------------------------------------------------------

// The same run twice, once as a world of one without MPI (what a process no launcher started is:
// OPAL_PREFIX pointing nowhere would fail Open MPI's singleton start) and once as Open MPI's
// singleton (HPCTRAIN_USE_MPI=1): the same bits.
TEST_F(Train, SameSeedSameChecksumOtherSeedOtherChecksum) {
  setenv("OPAL_PREFIX", "/nonexistent", 1);
  const auto a = train(kShort + std::vector<std::string>{"--seed", "1"});
  unsetenv("OPAL_PREFIX");
  setenv("HPCTRAIN_USE_MPI", "1", 1);
  const auto b = train(kShort + std::vector<std::string>{"--seed", "1"});
  unsetenv("HPCTRAIN_USE_MPI");
  const auto c = train(kShort + std::vector<std::string>{"--seed", "2"});
  const std::string ca = checksum(a), cb = checksum(b), cc = checksum(c);
  EXPECT_TRUE(std::regex_match(ca, std::regex("[0-9a-f]{16}"))) << ca;
  EXPECT_EQ(ca, cb);
  EXPECT_NE(ca, cc);
  EXPECT_EQ(done_line(a).at("test_accuracy").number, done_line(b).at("test_accuracy").number);
  EXPECT_EQ(a.front().at("train_loss").raw, b.front().at("train_loss").raw);
}

// Under onecycle the momentum is cycled (--onecycle-*-momentum) and --momentum applies only
// with --no-cycle-momentum (without it, it is said to be ignored).
TEST_F(Train, OneCycleMomentumOptions) {
  const std::vector<std::string> base = kShort + std::vector<std::string>{"--lr-schedule", "onecycle"};
  const std::string cycled = checksum(train(base));
  EXPECT_EQ(checksum(train(base + std::vector<std::string>{"--momentum", "0.5"},
                           "hpctrain: warning: --momentum is ignored: --lr-schedule onecycle cycles the momentum "
                           "between --onecycle-max-momentum and --onecycle-base-momentum (--no-cycle-momentum keeps "
                           "--momentum)\n")),
            cycled);
  EXPECT_NE(checksum(train(base + std::vector<std::string>{"--onecycle-base-momentum", "0.5"})), cycled);
  const std::string fixed = checksum(train(base + std::vector<std::string>{"--no-cycle-momentum"}));
  EXPECT_NE(fixed, cycled);
  EXPECT_NE(checksum(train(base + std::vector<std::string>{"--no-cycle-momentum", "--momentum", "0.5"})), fixed);
}

// ---- (b) the metrics-file contract -----------------------------------------------------------

void expect_epoch_line(const JsonObject& o, int64_t epoch, int64_t step) {
  SCOPED_TRACE("epoch line " + std::to_string(epoch));
  ASSERT_EQ(o.at("event").type, JsonValue::String);
  EXPECT_EQ(o.at("event").str, "epoch");
  for (const char* key : {"epoch", "step"}) {
    ASSERT_TRUE(o.count(key)) << key;
    EXPECT_TRUE(o.at(key).is_integer()) << key << " = " << o.at(key).raw;
  }
  EXPECT_EQ(o.at("epoch").number, epoch);
  EXPECT_EQ(o.at("step").number, step);
  for (const char* key : {"train_loss", "train_accuracy", "test_loss", "test_accuracy", "images_per_second",
                          "train_seconds", "elapsed_seconds"}) {
    ASSERT_TRUE(o.count(key)) << key;
    ASSERT_EQ(o.at(key).type, JsonValue::Number) << key << " = " << o.at(key).raw;
    EXPECT_TRUE(std::isfinite(o.at(key).number)) << key;
  }
  EXPECT_GT(o.at("train_loss").number, 0);
  EXPECT_GE(o.at("train_accuracy").number, 0);
  EXPECT_LE(o.at("train_accuracy").number, 1);
  EXPECT_GT(o.at("train_seconds").number, 0);
  EXPECT_LE(o.at("train_seconds").number, o.at("elapsed_seconds").number);
  EXPECT_GT(o.at("test_loss").number, 0);
  EXPECT_GE(o.at("test_accuracy").number, 0);
  EXPECT_LE(o.at("test_accuracy").number, 1);
  EXPECT_GT(o.at("images_per_second").number, 0);
  EXPECT_GT(o.at("elapsed_seconds").number, 0);
}

void expect_done_line(const JsonObject& o, int64_t steps, const JsonObject& last_epoch) {
  SCOPED_TRACE("done line");
  EXPECT_EQ(o.at("event").str, "done");
  ASSERT_TRUE(o.count("steps"));
  EXPECT_TRUE(o.at("steps").is_integer());
  EXPECT_EQ(o.at("steps").number, steps);
  ASSERT_TRUE(o.count("test_accuracy"));
  EXPECT_EQ(o.at("test_accuracy").number, last_epoch.at("test_accuracy").number);
  ASSERT_TRUE(o.count("test_loss"));
  EXPECT_EQ(o.at("test_loss").number, last_epoch.at("test_loss").number);
  ASSERT_TRUE(o.count("param_checksum"));
  ASSERT_EQ(o.at("param_checksum").type, JsonValue::String);
  EXPECT_TRUE(std::regex_match(o.at("param_checksum").str, std::regex("[0-9a-f]{16}"))) << o.at("param_checksum").str;
}

TEST_F(Train, MetricsFileKeysAndStepCounts) {
  // 300 samples in batches of 64: 4 steps per epoch when the short batch is dropped.
  const std::vector<std::string> base{"--train-samples", "300", "--test-samples", "100", "--batch-size", "64",
                                      "--epochs",        "2"};
  const auto lines = train(base);
  ASSERT_EQ(lines.size(), 3u);
  expect_epoch_line(lines[0], 1, 4);
  expect_epoch_line(lines[1], 2, 8);
  expect_done_line(lines[2], 8, lines[1]);
  EXPECT_GE(lines[1].at("elapsed_seconds").number, lines[0].at("elapsed_seconds").number);

  // Kept, the short batch is a fifth step.
  const auto kept = train(base + std::vector<std::string>{"--keep-last-batch"});
  ASSERT_EQ(kept.size(), 3u);
  expect_epoch_line(kept[0], 1, 5);
  expect_epoch_line(kept[1], 2, 10);
  expect_done_line(kept[2], 10, kept[1]);

  // --max-steps ends the run inside the second epoch, which still reports.
  const auto capped = train(base + std::vector<std::string>{"--max-steps", "6"});
  ASSERT_EQ(capped.size(), 3u);
  expect_epoch_line(capped[0], 1, 4);
  expect_epoch_line(capped[1], 2, 6);
  expect_done_line(capped[2], 6, capped[1]);
}

// The metrics file starts each run with its configuration: every option (Local ones too) with
// its value as text, the world, the hosts, the devices; and every event carries the wall-clock
// time it was written at.
TEST_F(Train, TheMetricsFileStartsWithTheConfiguration) {
  const std::string m = dir_.file("config.jsonl");
  const double before = static_cast<double>(std::time(nullptr));
  const RunResult r = run_hpctrain(kShort + std::vector<std::string>{"--model", "mlp", "--lr", "0.05", "--threads", "1",
                                                                   "--data-dir", fashion_mnist_dir(), "--metrics-file", m,
                                                                   "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double after = static_cast<double>(std::time(nullptr)) + 1;
  const std::vector<JsonObject> lines = read_all_json_lines(m);
  ASSERT_GE(lines.size(), 3u);
  const JsonObject& c = lines.front();
  EXPECT_EQ(c.at("event").str, "config");
  EXPECT_EQ(c.at("option.lr").str, "0.05");
  EXPECT_EQ(c.at("option.model").str, "mlp");
  EXPECT_EQ(c.at("option.threads").str, "1");
  EXPECT_EQ(c.at("option.metrics-file").str, m);
  EXPECT_EQ(c.at("option.max-steps").str, "12");
  EXPECT_EQ(c.at("world_size").number, 1);
  EXPECT_EQ(c.at("host_count").number, 1);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(c.at("hosts").str, host);
  EXPECT_EQ(c.at("device").str, "cpu");
  EXPECT_EQ(c.at("gpu_model").str, "");
  EXPECT_FALSE(c.at("cpu_model").str.empty());
  // What computes the bits: the float GEMM's library, its version and the kernels it chose.
  EXPECT_TRUE(std::regex_match(c.at("kernels").str, std::regex("(oneDNN [0-9]+\\.[0-9]+\\.[0-9]+ [a-z0-9_]+|OpenBLAS [^ ]+ [^ ]+)")))
      << c.at("kernels").str;
  EXPECT_EQ(c.at("threads").number, 1);
  EXPECT_EQ(c.at("global_batch_size").number, 32);
  EXPECT_EQ(c.at("total_steps").number, 12);
  EXPECT_EQ(c.at("resumed_from_step").number, -1);
  EXPECT_EQ(c.at("hpctrain_version").str, HPCTRAIN_TEST_VERSION);
  EXPECT_EQ(c.at("hpctrain_revision").str, tree_revision());
  // Every option of --help is there: each name but --version and --config (no run's options;
  // --help is shown as "-h [ --help ]"), and but the --no-NAME twin of a --NAME (one setting,
  // recorded under NAME).
  const RunResult help = run_hpctrain({"--help"});
  std::set<std::string> shown;
  for (size_t at = help.out.find("\n  --"); at != std::string::npos; at = help.out.find("\n  --", at + 1))
    shown.insert(help.out.substr(at + 5, help.out.find_first_of(" \n", at + 5) - (at + 5)));
  std::set<std::string> settings;
  for (const std::string& name : shown)
    if (name != "version" && name != "config" && !(name.rfind("no-", 0) == 0 && shown.count(name.substr(3))))
      settings.insert(name);
  std::set<std::string> recorded;
  for (const auto& [key, value] : c)
    if (key.rfind("option.", 0) == 0) recorded.insert(key.substr(7));
  EXPECT_EQ(recorded, settings);
  double last = before;
  for (const JsonObject& o : lines) {
    ASSERT_TRUE(o.count("unix_time")) << o.at("event").str;
    EXPECT_GE(o.at("unix_time").number, last) << o.at("event").str;
    EXPECT_LE(o.at("unix_time").number, after);
    last = o.at("unix_time").number;
  }
  EXPECT_EQ(lines.back().at("event").str, "done");
}

// The math threads follow OMP_NUM_THREADS where it is set (and --threads overrides it); a value
// that is no number of threads is one warning; more threads than the CPUs the rank may use is
// one warning that the ranks share cores.
TEST_F(Train, ThreadsFollowOmpNumThreads) {
  auto threads_of = [&](const char* omp, std::vector<std::string> extra, std::string* err) {
    const std::string m = dir_.file("omp" + std::to_string(runs_++) + ".jsonl");
    if (omp) setenv("OMP_NUM_THREADS", omp, 1);
    std::vector<std::string> args = kShort + std::vector<std::string>{"--model", "mlp", "--data-dir", fashion_mnist_dir(),
                                                                    "--metrics-file", m, "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run_hpctrain(args);
    unsetenv("OMP_NUM_THREADS");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    *err = r.err;
    return r.exit_code == 0 ? read_all_json_lines(m).front().at("threads").number : -1;
  };
  std::string err;
  const double usable = threads_of(nullptr, {}, &err);
  EXPECT_EQ(err, "");
  EXPECT_EQ(threads_of("1", {}, &err), 1);
  EXPECT_EQ(err, "");
  EXPECT_EQ(threads_of("1,4", {}, &err), 1) << "the first level of a nested list";
  EXPECT_EQ(threads_of("1", {"--threads", "2"}, &err), 2) << "--threads wins";
  EXPECT_EQ(threads_of("lots", {}, &err), usable);
  // (After the OpenMP runtime's own complaint, where it reads the variable too.)
  EXPECT_EQ(count_of(err, "hpctrain: warning: OMP_NUM_THREADS='lots' is not a number of threads (1 to 4096): left "
                          "aside, the threads are chosen as without it\n"), 1) << err;
  EXPECT_EQ(hpctrain_lines(err), 1) << err;
  EXPECT_EQ(threads_of("64", {}, &err), 64);
  EXPECT_NE(err.find("hpctrain: warning: the ranks on "), std::string::npos) << err;
  EXPECT_NE(err.find(" share cores: 1 rank(s) with 64 math thread(s) each"), std::string::npos) << err;
  EXPECT_NE(err.find("or a smaller OMP_NUM_THREADS\n"), std::string::npos) << err;
}

// Every key of the done line, and each with the value it must have: 12 steps of the mlp (batch
// 32) on one rank with checkpoints every 5 steps. The final checkpoint holds the state the done
// line's checksums describe.
TEST_F(Train, TheDoneLineHoldsEveryKeyWithItsValue) {
  const std::string ck = dir_.file("done_ck");
  const auto lines = train({"--model", "mlp", "--train-samples", "384", "--test-samples", "100", "--batch-size", "32",
                            "--epochs", "1", "--checkpoint-dir", ck, "--checkpoint-every-steps", "5"});
  ASSERT_EQ(lines.size(), 2u);
  const JsonObject &epoch = lines[0], &d = lines[1];
  std::vector<std::string> keys;
  for (const auto& [key, value] : d) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "checkpoint_stall_seconds", "checkpoints_written", "comm_wait_seconds_per_step", "device",
                      "elapsed_seconds", "event", "global_batch_size", "images_per_second", "param_checksum",
                      "param_norm", "peak_device_memory_bytes", "resumed_from", "resumed_from_step",
                      "skipped_steps", "snapshot_stall_seconds", "snapshots_taken", "state_checksum", "step_seconds",
                      "steps", "test_accuracy", "test_loss", "train_flops_per_sample", "train_seconds", "unix_time",
                      "world_size"}))
      << "a key added to the done line belongs in README's list and here";
  expect_done_line(d, 12, epoch);
  for (const char* key : {"steps", "world_size", "global_batch_size", "resumed_from_step", "skipped_steps", "snapshots_taken",
                          "checkpoints_written", "peak_device_memory_bytes", "train_flops_per_sample"})
    EXPECT_TRUE(d.at(key).is_integer()) << key << " = " << d.at(key).raw;
  EXPECT_EQ(d.at("world_size").number, 1);
  EXPECT_EQ(d.at("global_batch_size").number, 32);
  EXPECT_EQ(d.at("device").str, "cpu");
  EXPECT_EQ(d.at("peak_device_memory_bytes").number, 0);
  EXPECT_EQ(d.at("resumed_from_step").number, -1);
  EXPECT_EQ(d.at("resumed_from").str, "none");
  // Snapshots by default (auto): at least with each of the two checkpoints before the end, and
  // never more than one a step.
  EXPECT_GE(d.at("snapshots_taken").number, 2);
  EXPECT_LE(d.at("snapshots_taken").number, 12);
  EXPECT_GE(d.at("snapshot_stall_seconds").number, 0);
  EXPECT_LE(d.at("snapshot_stall_seconds").number, d.at("train_seconds").number);
  EXPECT_EQ(d.at("skipped_steps").number, 0);
  EXPECT_EQ(d.at("checkpoints_written").number, 3) << "after steps 5 and 10, and the final one";
  // The mlp's three linear layers (784-512-256-10): two FLOPs per weight forward, and a backward
  // pass of twice that.
  EXPECT_EQ(d.at("train_flops_per_sample").number, 3 * 2 * (784 * 512 + 512 * 256 + 256 * 10));
  // Times: training (the epoch's, as its line says) within the run, its steps and throughput
  // from it; checkpoints and the all-reduce's wait within the steps.
  const double train_seconds = d.at("train_seconds").number;
  EXPECT_EQ(train_seconds, epoch.at("train_seconds").number);
  EXPECT_GT(train_seconds, 0);
  EXPECT_LE(train_seconds, d.at("elapsed_seconds").number);
  EXPECT_NEAR(d.at("step_seconds").number, train_seconds / 12, 1e-9 * train_seconds);
  EXPECT_NEAR(d.at("images_per_second").number, 12 * 32 / train_seconds, 1e-6 * d.at("images_per_second").number);
  // The checkpoints' stall is the run's: the final checkpoint is taken after the last step, outside
  // train_seconds (on a loaded machine it alone took longer than these 12 small steps: 46 ms
  // against 45).
  EXPECT_GE(d.at("checkpoint_stall_seconds").number, 0);
  EXPECT_LE(d.at("checkpoint_stall_seconds").number, d.at("elapsed_seconds").number);
  EXPECT_GE(d.at("comm_wait_seconds_per_step").number, 0);
  EXPECT_LE(d.at("comm_wait_seconds_per_step").number, d.at("step_seconds").number);
  EXPECT_GT(d.at("param_norm").number, 1);
  EXPECT_TRUE(std::regex_match(d.at("state_checksum").str, std::regex("[0-9a-f]{16}"))) << d.at("state_checksum").str;
  EXPECT_NE(d.at("state_checksum").str, d.at("param_checksum").str);
  const RunResult inspected = run_hpctrain({"inspect", "--json", ck + "/ckpt-000000012.hpck"});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.err;
  const JsonObject h = FlatJsonParser(lines_of(inspected.out).at(0)).parse();
  EXPECT_EQ(h.at("state_checksum").str, d.at("state_checksum").str);
  EXPECT_EQ(h.at("param_checksum").str, d.at("param_checksum").str);
  const RunResult earlier = run_hpctrain({"inspect", "--json", ck + "/ckpt-000000010.hpck"});
  EXPECT_NE(FlatJsonParser(lines_of(earlier.out).at(0)).parse().at("state_checksum").str, d.at("state_checksum").str);
}

TEST_F(Train, MetricsFileIsAppendedTo) {
  const std::string metrics = dir_.file("shared.jsonl");
  const std::vector<std::string> args{"--train-samples", "128", "--test-samples", "50",  "--batch-size", "32",
                                      "--max-steps",     "2",   "--epochs",       "1",   "--threads",    "2",
                                      "--quiet",         "--data-dir", fashion_mnist_dir(), "--metrics-file", metrics};
  for (int i = 0; i < 2; ++i) {
    const RunResult r = run_hpctrain(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto lines = read_json_lines(metrics);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1].at("event").str, "done");
  EXPECT_EQ(lines[3].at("event").str, "done");
  EXPECT_EQ(lines[1].at("param_checksum").str, lines[3].at("param_checksum").str);
}

// ---- (b2) step metrics: step events and the Prometheus file --------------------------------

// The step events of a metrics file, in order.
std::vector<JsonObject> step_events(const std::vector<JsonObject>& lines) {
  std::vector<JsonObject> steps;
  for (const JsonObject& o : lines)
    if (o.at("event").str == "step") steps.push_back(o);
  return steps;
}

// hpctrain's onecycle: PyTorch's OneCycleLR with the defaults (pct_start 0.3, div_factor 25,
// final_div_factor 1e4), the lr before step k of T (k from 0): cosine up from peak/25 until
// step 0.3*T - 1, then down to peak/25/1e4, reached at the last step, T - 1.
double onecycle_lr(double peak, int64_t k, int64_t steps) {
  const double initial = peak / 25, final_lr = initial / 1e4, rise_end = 0.3 * steps - 1;
  const auto anneal = [](double a, double b, double x) { return b + (a - b) * (1 + std::cos(M_PI * x)) / 2; };
  return k <= rise_end ? anneal(initial, peak, k / rise_end)
                       : anneal(peak, final_lr, (k - rise_end) / (steps - 1 - rise_end));
}

// 300 samples in batches of 32: 9 steps per epoch (the short batch dropped), 18 in two epochs.
const std::vector<std::string> kStepRun{"--model", "mlp", "--train-samples", "300", "--test-samples", "100",
                                        "--batch-size", "32", "--epochs", "2"};

// Every N steps a step event with the step's figures, before its epoch's line; the rest of the
// file as without them; the learning rate the schedule's for that step.
TEST_F(Train, StepEventsEveryNStepsCarryTheSchedulesLearningRate) {
  const auto lines = train(kStepRun + std::vector<std::string>{"--metrics-every-steps", "4"});
  const auto steps = step_events(lines);
  ASSERT_EQ(steps.size(), 18u / 4) << "steps 4, 8, 12 and 16 of 18";
  ASSERT_EQ(lines.size(), steps.size() + 3) << "two epoch lines and the done line as ever";
  expect_epoch_line(lines[2], 1, 9);  // after steps 4 and 8
  expect_epoch_line(lines[5], 2, 18);
  expect_done_line(lines[6], 18, lines[5]);
  for (size_t i = 0; i < steps.size(); ++i) {
    const JsonObject& s = steps[i];
    SCOPED_TRACE("step event " + s.at("step").raw);
    std::vector<std::string> keys;
    for (const auto& [key, value] : s) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"comm_wait_seconds", "data_wait_seconds", "elapsed_seconds", "epoch",
                                              "event", "images_per_second", "learning_rate", "loss", "step",
                                              "step_seconds", "unix_time"}))
        << "a key added to the step event belongs in README's list and here";
    const int64_t step = 4 * static_cast<int64_t>(i + 1);
    ASSERT_TRUE(s.at("step").is_integer() && s.at("epoch").is_integer());
    EXPECT_EQ(s.at("step").number, step);
    EXPECT_EQ(s.at("epoch").number, (step - 1) / 9 + 1);
    EXPECT_NEAR(s.at("learning_rate").number, onecycle_lr(0.1, step - 1, 18), 1e-12);
    EXPECT_TRUE(std::isfinite(s.at("loss").number) && s.at("loss").number > 0) << s.at("loss").raw;
    const double seconds = s.at("step_seconds").number;
    EXPECT_GT(seconds, 0);
    EXPECT_GE(s.at("data_wait_seconds").number, 0);
    EXPECT_GE(s.at("comm_wait_seconds").number, 0);
    EXPECT_LE(s.at("data_wait_seconds").number + s.at("comm_wait_seconds").number, seconds);
    EXPECT_NEAR(s.at("images_per_second").number, 32 / seconds, 1e-9 * s.at("images_per_second").number);
    EXPECT_LE(s.at("elapsed_seconds").number, (step <= 9 ? lines[2] : lines[5]).at("elapsed_seconds").number);
    if (i > 0) {
      EXPECT_GE(s.at("elapsed_seconds").number, steps[i - 1].at("elapsed_seconds").number + seconds);
    }
  }

  // Every step, under the step schedule: 0.05 for the first epoch's 9 steps, then a tenth.
  const auto stepped = step_events(train(kStepRun + std::vector<std::string>{
                                             "--metrics-every-steps", "1", "--lr-schedule", "step", "--lr", "0.05",
                                             "--lr-step-epochs", "1", "--lr-gamma", "0.1"}));
  ASSERT_EQ(stepped.size(), 18u);
  for (size_t i = 0; i < stepped.size(); ++i) {
    EXPECT_EQ(stepped[i].at("step").number, static_cast<double>(i + 1));
    EXPECT_NEAR(stepped[i].at("learning_rate").number, i < 9 ? 0.05 : 0.005, 1e-15) << "step " << i + 1;
  }
}

// A Prometheus text file's samples by series ("name{labels}") and the names its TYPE lines
// declare gauges, the HELP lines' names.
struct PromFile {
  std::map<std::string, double> samples;
  std::vector<std::string> gauges, counters, helped;
};

PromFile read_prom(const std::string& path) {
  PromFile f;
  for (const std::string& line : lines_of(read_text(path))) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex("# TYPE (\\S+) gauge"))) f.gauges.push_back(m[1]);
    else if (std::regex_match(line, m, std::regex("# TYPE (\\S+) counter"))) f.counters.push_back(m[1]);
    else if (std::regex_match(line, m, std::regex("# HELP (\\S+) .+"))) f.helped.push_back(m[1]);
    else if (std::regex_match(line, m, std::regex("([a-z_][a-z0-9_]*(\\{[^}]*\\})?) (\\S+)")))
      f.samples[m[1]] = std::strtod(m[3].str().c_str(), nullptr);
    else ADD_FAILURE() << "unexpected line in " << path << ": " << line;
  }
  return f;
}

// promtool (Debian's prometheus) on the file: its complaints, empty when it passes.
std::string promtool_check(const std::string& path) {
  const std::string promtool = "/usr/bin/promtool";
  if (!fs::exists(promtool)) return promtool + " is missing: apt-get install prometheus (setup.sh does)";
  const RunResult r = run_program({"/bin/sh", "-c", "exec " + promtool + " check metrics < \"$0\"", path});
  return r.exit_code == 0 ? "" : "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
}

// The file node_exporter reads passes promtool, labels every series with the job (the
// checkpoint directory's name here) and the world size, and holds the last step's figures as
// the metrics file's last step event has them, the last epoch's test accuracy and the state.
TEST_F(Train, PrometheusFileParsesAndAgreesWithTheMetricsFile) {
  unsetenv("SLURM_JOB_ID");
  const std::string prom = dir_.file("run.prom"), ck = dir_.file("nightly") + "/";
  const double t0 = static_cast<double>(std::time(nullptr));
  const auto lines = train(kStepRun + std::vector<std::string>{"--metrics-every-steps", "6", "--prometheus-file", prom,
                                                               "--checkpoint-dir", ck});
  const auto steps = step_events(lines);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(promtool_check(prom), "");
  const PromFile f = read_prom(prom);
  const std::string labels = "{hpctrain_job=\"nightly\",world_size=\"1\"}";
  const JsonObject& last = steps.back();
  EXPECT_EQ(f.samples.at("hpctrain_step" + labels), last.at("step").number);
  EXPECT_EQ(f.samples.at("hpctrain_planned_steps" + labels), 18);
  for (const char* key : {"epoch", "loss", "learning_rate", "images_per_second", "data_wait_seconds",
                          "comm_wait_seconds", "step_seconds"})
    EXPECT_EQ(f.samples.at("hpctrain_" + std::string(key) + labels), last.at(key).number) << key;
  EXPECT_EQ(f.samples.at("hpctrain_test_accuracy" + labels), done_line(lines).at("test_accuracy").number);
  for (const char* state : {"training", "stopped", "done", "failed"})
    EXPECT_EQ(f.samples.at("hpctrain_state{hpctrain_job=\"nightly\",world_size=\"1\",state=\"" + std::string(state) +
                           "\"}"),
              std::strcmp(state, "done") == 0 ? 1 : 0)
        << state;
  const double updated = f.samples.at("hpctrain_last_update_timestamp_seconds" + labels);
  EXPECT_GE(updated, t0);
  EXPECT_LE(updated, static_cast<double>(std::time(nullptr)) + 1);
  // Counters of this process's work, the newest checkpoint's time, the throughput over a minute.
  EXPECT_EQ(f.samples.at("hpctrain_steps_total" + labels), 18);
  EXPECT_EQ(f.samples.at("hpctrain_samples_total" + labels), 18 * 32);
  EXPECT_EQ(f.samples.at("hpctrain_checkpoints_total" + labels), 1) << "the final checkpoint";
  const double checkpointed = f.samples.at("hpctrain_last_checkpoint_timestamp_seconds" + labels);
  EXPECT_GE(checkpointed, t0);
  EXPECT_LE(checkpointed, updated);
  EXPECT_GT(f.samples.at("hpctrain_images_per_second_1m" + labels), 0);
  EXPECT_EQ(f.samples.size(), 20u);
  for (const auto& [series, value] : f.samples) {
    const std::string name = series.substr(0, series.find('{'));
    const bool counter = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(std::count(counter ? f.counters.begin() : f.gauges.begin(), counter ? f.counters.end() : f.gauges.end(),
                         name), 1)
        << name << " has one TYPE line, counter for a _total";
    EXPECT_EQ(std::count(f.helped.begin(), f.helped.end(), name), 1) << name << " has one HELP line";
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.str()), fs::directory_iterator()), 3)
      << "the metrics file, the Prometheus file and the checkpoints: no temporary file left";
}

// The state after a stop (exit 75) and after a failure (diverged, exit 2); the job from Slurm.
// A file that cannot be written is one warning, and the run goes on.
TEST_F(Train, PrometheusFileShowsStopsAndFailuresAndNeverEndsARun) {
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", "5", 1);
  const std::string prom = dir_.file("stop.prom");
  const RunResult stopped = run_hpctrain(kStepRun + std::vector<std::string>{
      "--data-dir", fashion_mnist_dir(), "--threads", "2", "--quiet", "--prometheus-file", prom,
      "--checkpoint-dir", dir_.file("ck")});
  unsetenv("HPCTRAIN_TEST_SIGNAL_AFTER_STEP");
  unsetenv("SLURM_JOB_ID");
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_EQ(promtool_check(prom), "");
  const std::string labels = "{hpctrain_job=\"4242\",world_size=\"1\"";
  PromFile f = read_prom(prom);
  EXPECT_EQ(f.samples.at("hpctrain_step" + labels + "}"), 5);
  EXPECT_EQ(f.samples.at("hpctrain_state" + labels + ",state=\"stopped\"}"), 1);
  EXPECT_EQ(f.samples.at("hpctrain_state" + labels + ",state=\"training\"}"), 0);
  EXPECT_EQ(f.samples.at("hpctrain_exit_code" + labels + "}"), 75);  // as the "stopped" event's

  // With a checkpoint directory: the failure lets the directory go (its writer ended) before the
  // file says "failed", which counts that writer's checkpoints (once read from the freed writer).
  const std::string failed_prom = dir_.file("failed.prom"), failed_ck = dir_.file("failed_ck");
  const RunResult failed = run_hpctrain(kShort + std::vector<std::string>{
      "--lr-schedule", "constant", "--lr", "1e6", "--data-dir", fashion_mnist_dir(), "--threads", "2", "--quiet",
      "--prometheus-file", failed_prom, "--checkpoint-dir", failed_ck, "--checkpoint-every-steps", "1",
      "--snapshot-dir", dir_.file("failed-snapshots")}, 60);  // (kept for a relaunch: not in /dev/shm)
  EXPECT_EQ(failed.exit_code, 2) << failed.err;
  EXPECT_EQ(promtool_check(failed_prom), "");
  f = read_prom(failed_prom);
  const std::string failed_labels = "{hpctrain_job=\"failed_ck\",world_size=\"1\"";
  EXPECT_EQ(f.samples.at("hpctrain_state" + failed_labels + ",state=\"failed\"}"), 1);
  EXPECT_EQ(f.samples.at("hpctrain_state" + failed_labels + ",state=\"training\"}"), 0);
  int written = 0;
  for (const auto& e : fs::directory_iterator(failed_ck)) written += e.path().extension() == ".hpck";
  EXPECT_EQ(f.samples.at("hpctrain_checkpoints_total" + failed_labels + "}"), written);

  // A directory that is missing at the start is a wrong path, refused before anything trains; one
  // that fails later is a warning and training goes on (PrometheusTextfile.AFailedWriteIsOneWarning...).
  const RunResult unwritable = run_hpctrain(kShort + std::vector<std::string>{
      "--data-dir", fashion_mnist_dir(), "--threads", "2", "--quiet", "--prometheus-file", dir_.file("none/x.prom")});
  EXPECT_EQ(unwritable.exit_code, 2) << unwritable.err;
  EXPECT_EQ(unwritable.err, "hpctrain: error: cannot write --prometheus-file " + dir_.file("none/x.prom") +
                                ": its directory " + dir_.file("none") +
                                " does not exist (create it, or give node_exporter's --collector.textfile.directory)\n");
}

// ---- (c) it learns ---------------------------------------------------------------------------

TEST_F(Train, ShortRunReachesSaneAccuracy) {
  const auto lines = train({"--train-samples", "4096", "--test-samples", "1000", "--epochs", "2"});
  ASSERT_EQ(lines.size(), 3u);
  const JsonObject &e1 = lines[0], &e2 = lines[1];
  expect_epoch_line(e1, 1, 64);
  expect_epoch_line(e2, 2, 128);
  EXPECT_LT(e1.at("train_loss").number, std::log(10.0));  // below chance already
  EXPECT_LT(e2.at("train_loss").number, e1.at("train_loss").number);
  EXPECT_LT(e2.at("test_loss").number, e1.at("test_loss").number);
  EXPECT_GT(done_line(lines).at("test_accuracy").number, 0.70);
}

// ---- (d) config files ------------------------------------------------------------------------

TEST_F(Train, ConfigFileEqualsCommandLineAndCommandLineWins) {
  const std::string cfg = dir_.file("run.cfg");
  write_text(cfg,
             "# a short job\n"
             "model = mlp\n"
             "no-batch-norm = true\n"
             "no-nesterov = true\n"
             "seed = 3\n"
             "batch-size = 32\n"
             "train-samples = 512\n"
             "test-samples = 100\n"
             "max-steps = 10\n"
             "lr = 0.05\n"
             "lr-schedule = cosine\n"
             "weight-decay = 0.001\n");
  const std::vector<std::string> same{"--model", "mlp", "--no-batch-norm", "--no-nesterov", "--seed", "3",
                                      "--batch-size", "32", "--train-samples", "512", "--test-samples", "100",
                                      "--max-steps", "10", "--lr", "0.05", "--lr-schedule", "cosine",
                                      "--weight-decay", "0.001"};
  const std::string from_file = checksum(train({"--config", cfg}));
  const std::string from_line = checksum(train(same));
  EXPECT_FALSE(from_file.empty());
  EXPECT_EQ(from_file, from_line);
  // The file's settings matter: the same line without the two switches trains differently.
  std::vector<std::string> with_bn = same;
  with_bn.erase(std::find(with_bn.begin(), with_bn.end(), "--no-batch-norm"));
  EXPECT_NE(checksum(train(with_bn)), from_line);
  // The command line wins over the file.
  std::vector<std::string> seed4 = same;
  *(std::find(seed4.begin(), seed4.end(), "--seed") + 1) = "4";
  const std::string line_seed4 = checksum(train(seed4));
  EXPECT_NE(line_seed4, from_line);
  EXPECT_EQ(checksum(train({"--config", cfg, "--seed", "4"})), line_seed4);
  EXPECT_EQ(checksum(train({"--seed", "4", "--config", cfg})), line_seed4);
}

// Synthetic ImageNet-shaped data (the GPU benchmark's ResNet-50 input): resnet18 at 32x32
// trains a few steps, with 1000 classes, the same parameters twice; evaluate makes the images
// at the checkpoint's size again.
TEST_F(Train, SyntheticDataTrainsAndEvaluates) {
  const std::string ck = dir_.file("synthetic");
  const std::vector<std::string> args{"--dataset", "synthetic", "--image-size", "32", "--model", "resnet18",
                                      "--max-steps", "2", "--train-samples", "64", "--test-samples", "32",
                                      "--batch-size", "16", "--checkpoint-dir", ck};
  const auto lines = train(args);
  ASSERT_EQ(lines.size(), 2u);
  const JsonObject& d = done_line(lines);
  EXPECT_EQ(d.at("steps").number, 2);
  EXPECT_TRUE(std::isfinite(lines[0].at("train_loss").number));
  EXPECT_GT(lines[0].at("train_loss").number, 5.0) << "ln(1000) = 6.9 for random labels";
  fs::remove_all(ck);
  EXPECT_EQ(checksum(train(args)), checksum(lines));
  const std::string em = dir_.file("synthetic_eval.jsonl");
  const RunResult r = run_hpctrain({"evaluate", "--checkpoint", ck, "--test-samples", "32", "--threads", "2",
                                    "--metrics-file", em});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_json_lines(em).at(0).at("test_accuracy").number, d.at("test_accuracy").number);
}

// ---- (e) every model -------------------------------------------------------------------------

class TrainModel : public Train, public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

TEST_P(TrainModel, FewStepsWithFiniteLoss) {
  const auto& [model, bn] = GetParam();
  std::vector<std::string> args{"--model",      model, "--max-steps", "3",  "--train-samples", "256",
                                "--test-samples", "100", "--batch-size", "16", "--eval-batch-size", "50"};
  // Without batch norm the deep ResNets need a gentler peak lr than the default 0.1.
  if (!bn) args.insert(args.end(), {"--no-batch-norm", "--lr", "0.01"});
  // Start at the initial lr: over 3 steps pct_start 0.3 leaves no rising phase (PyTorch's
  // OneCycleLR rises until step 0.3 * 3 - 1 < 0) and the first step would take nearly the
  // peak lr; 0.5 rises until step 0.5.
  args.insert(args.end(), {"--onecycle-pct-start", "0.5"});
  const auto lines = train(args);
  ASSERT_EQ(lines.size(), 2u);
  expect_epoch_line(lines[0], 1, 3);
  expect_done_line(lines[1], 3, lines[0]);
  // The mean loss per sample of three steps from a fresh start is still near chance (ln 10 =
  // 2.3; 2.1 to 3.6 measured over these models): a loss summed over the batch, or one never
  // computed, is far outside.
  EXPECT_GT(lines[0].at("train_loss").number, 0.5 * std::log(10.0));
  EXPECT_LT(lines[0].at("train_loss").number, 2 * std::log(10.0));
}

INSTANTIATE_TEST_SUITE_P(Zoo, TrainModel, ::testing::Combine(::testing::Values("mlp", "cnn", "resnet20", "resnet18"),
                                                             ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& i) {
                           return std::get<0>(i.param) + (std::get<1>(i.param) ? "_bn" : "_nobn");
                         });

// ---- (f) a diverging run ---------------------------------------------------------------------

// Whether every float of a checkpoint file's parameter, momentum and batch-norm sections is
// finite (the format: ckpt/checkpoint.hpp; sections of kind 2, 3 and 4 hold float32).
bool finite_checkpoint(const std::string& path) {
  const Bytes b = read_bytes(path);
  size_t at = 12;  // magic and version
  while (at + 16 <= b.size()) {
    uint32_t kind = 0;
    uint64_t bytes = 0;
    std::memcpy(&kind, &b[at], 4);
    std::memcpy(&bytes, &b[at + 4], 8);
    at += 16;
    if (kind >= 2 && kind <= 4)
      for (uint64_t i = 0; i + 4 <= bytes; i += 4) {
        float v = 0;
        std::memcpy(&v, &b[at + i], 4);
        if (!std::isfinite(v)) return false;
      }
    at += bytes;
  }
  return at == b.size();
}

// A learning rate far too high: a loss, or first the state after a step's update (batch-norm
// statistics overflow while the loss stays finite), stops being finite. Training stops at that
// step with exit 2 and one line naming it and the remedy, never "done"; no checkpoint holds a
// state that is not finite (every one written before is checked, the newest evaluates to a
// finite loss), so --resume auto never continues into NaN.
TEST_F(Train, ADivergingRunStopsWithoutSavingItsState) {
  const std::vector<std::vector<std::string>> lrs{
      {"--lr", "1e6"}, {"--lr-schedule", "constant", "--lr", "1e6"}, {"--lr-schedule", "constant", "--lr", "50"}};
  for (const auto& lr : lrs) {
    const bool checkpoints = lr.size() == 2;
    SCOPED_TRACE(lr.back() + (checkpoints ? " with checkpoints" : ""));
    const std::string ck = dir_.file("diverged" + lr.back()), m = dir_.file("diverged" + lr.back() + ".jsonl");
    auto args = kShort + lr + std::vector<std::string>{"--data-dir", fashion_mnist_dir(), "--metrics-file", m,
                                                       "--threads", "2", "--log-every", "1"};
    // (A failed run's snapshots stay for a relaunch: in the test's directory, not in /dev/shm.)
    if (checkpoints)
      args = args + std::vector<std::string>{"--checkpoint-dir", ck, "--checkpoint-every-steps", "1", "--snapshot-dir",
                                             dir_.file("diverged-snapshots")};
    const RunResult r = run_hpctrain(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const std::regex line("hpctrain: error: training diverged: the (loss of step ([0-9]+) \\(epoch 1\\) is not finite|"
                          "(parameters|optimizer's momentum|batch-norm statistics) are not finite after step "
                          "([0-9]+), though its loss still was); lower --lr \\(now " +
                          std::string(lr.back() == "50" ? "50" : "1e\\+06") +
                          "\\) or warm up to it \\(--warmup-epochs\\); no checkpoint holds this state\n");
    std::smatch got;
    ASSERT_TRUE(std::regex_match(r.err, got, line)) << r.err;
    for (const JsonObject& o : read_json_lines(m)) EXPECT_NE(o.at("event").str, "done");
    // It stopped at the first step whose loss was not finite (the progress lines show the
    // epoch's mean loss so far), or, named for its state, no loss before was.
    const int64_t n = std::stoll(got[2].matched ? got[2].str() : got[4].str());
    const std::regex progress("epoch 1/1  step ([0-9]+)/[0-9]+  loss ([^ ]+) ");
    int64_t first_bad = 0, last = 0;
    for (const std::string& l : lines_of(r.out)) {
      std::smatch p;
      if (!std::regex_search(l, p, progress)) continue;
      last = std::stoll(p[1].str());
      if (!first_bad && !std::isfinite(std::strtod(p[2].str().c_str(), nullptr))) first_bad = last;
    }
    EXPECT_EQ(last, n) << r.out;
    EXPECT_EQ(first_bad, got[2].matched ? n : 0) << r.out;
    if (!checkpoints) continue;
    // The state after step n-1 was checked and saved; nothing after it.
    char newest[32];
    std::snprintf(newest, sizeof newest, "ckpt-%09lld.hpck", static_cast<long long>(n - 1));
    EXPECT_TRUE(fs::exists(ck + "/" + newest)) << newest;
    for (const auto& e : fs::directory_iterator(ck)) {
      const std::string name = e.path().filename().string();
      if (name == "heartbeat" || name == "run-id") continue;
      EXPECT_LE(name, newest);
      EXPECT_TRUE(finite_checkpoint(e.path().string())) << name;
    }
    const std::string em = dir_.file("diverged_eval.jsonl");
    const RunResult eval = run_hpctrain({"evaluate", "--checkpoint", ck, "--test-samples", "200", "--data-dir",
                                         fashion_mnist_dir(), "--threads", "2", "--metrics-file", em});
    ASSERT_EQ(eval.exit_code, 0) << eval.err;
    EXPECT_TRUE(std::isfinite(read_json_lines(em).at(0).at("test_loss").number));
  }
}

}  // namespace
}  // namespace hpc::itest
