// GPU training through the real binary (hpctrain --device cuda): the default job's accuracy on
// one GPU, reproducibility and bit-exact resume in deterministic mode, agreement with the CPU
// reference, and GPU checkpoints that the CPU reads; hpctrain predict on the GPU. Skips where no
// GPU is visible.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/device.hpp"
#include "data/jpeg.hpp"
#include "data/nvjpeg.hpp"
#include "data/pack.hpp"
#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA GPU visible (" << device::describe() << "): GPU training tests skipped";
    if (!fs::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Fashion-MNIST not found in " << fashion_mnist_dir();
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  }
  void TearDown() override {
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    unsetenv("HPCTRAIN_TEST_LOSS_SCALE");
    unsetenv("HPCTRAIN_TEST_FAIL_CAPTURE");
  }

  // 2 epochs of 20 steps of 64 samples.
  std::vector<std::string> short_job(const std::string& metrics, const std::string& device = "cuda") const {
    return {"--device", device, "--train-samples", "1280", "--test-samples", "500", "--epochs", "2",
            "--quiet", "--data-dir", fashion_mnist_dir(), "--metrics-file", metrics};
  }
  // The same with the run's log lines (what it captured, which path it took).
  std::vector<std::string> logged_job(const std::string& metrics) const {
    auto job = short_job(metrics);
    job.erase(std::find(job.begin(), job.end(), "--quiet"));
    return job;
  }
  TempDir dir_{"gpu-train"};
};

// The acceptance run: the default job (cnn, 4 epochs of Fashion-MNIST) on one GPU.
TEST_F(GpuTraining, DefaultJobReaches92PercentOnOneGpu) {
  const std::string m = dir_.file("default.jsonl");
  const RunResult r = run_hpctrain({"--device", "cuda", "--data-dir", fashion_mnist_dir(), "--metrics-file", m});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonObject d = done_of(m);
  EXPECT_GE(d.at("test_accuracy").number, 0.92);
  EXPECT_EQ(d.at("device").str, "cuda");
  EXPECT_GT(d.at("peak_device_memory_bytes").number, 0);
  std::cout << "default job on the GPU: test accuracy " << d.at("test_accuracy").number << ", "
            << d.at("images_per_second").number << " img/s\n";
}

// Deterministic mode (the default): two runs end with the same bits, and a run killed after
// step 7 and resumed from its step-5 checkpoint ends with them too, in its whole state (the
// checkpoints on shared storage alone: SnapshotsThroughTheSideStream... has the snapshots).
TEST_F(GpuTraining, DeterministicRunsRepeatAndResumeBitExactly) {
  const std::string a = dir_.file("a.jsonl"), b = dir_.file("b.jsonl");
  ASSERT_EQ(run_hpctrain(short_job(a)).exit_code, 0);
  ASSERT_EQ(run_hpctrain(short_job(b)).exit_code, 0);
  const JsonObject want = done_of(a);
  EXPECT_EQ(done_of(b).at("param_checksum").str, want.at("param_checksum").str);
  EXPECT_EQ(done_of(b).at("state_checksum").str, want.at("state_checksum").str);

  const std::string ck = dir_.file("ck");
  auto job = short_job(dir_.file("killed.jsonl"));
  job.insert(job.end(), {"--checkpoint-dir", ck, "--checkpoint-every-steps", "5", "--snapshot-every-steps", "0"});
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "7", 1);
  EXPECT_NE(run_hpctrain(job).exit_code, 0);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  const std::string m = dir_.file("resumed.jsonl");
  job = short_job(m);
  job.insert(job.end(), {"--checkpoint-dir", ck, "--checkpoint-every-steps", "5", "--snapshot-every-steps", "0"});
  const RunResult resumed = run_hpctrain(job);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 5);
  EXPECT_EQ(done_of(m).at("param_checksum").str, want.at("param_checksum").str);
  EXPECT_EQ(done_of(m).at("state_checksum").str, want.at("state_checksum").str);
}

// The training loss of each step (--metrics-every-steps 1), in step order.
std::vector<double> step_losses(const std::string& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "step") losses.push_back(j.at("loss").get<double>());
  }
  return losses;
}

// In fp32 the GPU follows the CPU reference: the same initial weights and batches give the same
// loss at each of the first steps to 1e-4 (the products differ only in summation order), and
// after 40 steps the parameters' norm still agrees to 1e-2. A GPU checkpoint is then evaluated on
// the CPU. (Not the test accuracy: after 40 steps the running statistics are still far from
// settled, and runs 1e-3 apart in their parameters were seen 3 points apart on 500 test images.)
TEST_F(GpuTraining, Fp32TrainingFollowsTheCpuAndItsCheckpointsLoadOnTheCpu) {
  const std::string g = dir_.file("gpu.jsonl"), c = dir_.file("cpu.jsonl"), ck = dir_.file("ck32");
  auto gpu_job = short_job(g);
  gpu_job.insert(gpu_job.end(), {"--precision", "fp32", "--checkpoint-dir", ck, "--metrics-every-steps", "1"});
  ASSERT_EQ(run_hpctrain(gpu_job).exit_code, 0);
  auto cpu_job = short_job(c, "cpu");
  cpu_job.insert(cpu_job.end(), {"--metrics-every-steps", "1"});
  ASSERT_EQ(run_hpctrain(cpu_job).exit_code, 0);
  const std::vector<double> lg = step_losses(g), lc = step_losses(c);
  ASSERT_EQ(lg.size(), 40u);
  ASSERT_EQ(lc.size(), 40u);
  for (size_t i = 0; i < lg.size(); ++i) {
    std::cout << "step " << i + 1 << ": loss " << lg[i] << " on the GPU, " << lc[i] << " on the CPU (relative "
              << std::abs(lg[i] - lc[i]) / lc[i] << ")\n";
    if (i < 5) {
      EXPECT_NEAR(lg[i], lc[i], 1e-4 * lc[i]) << "step " << i + 1;
    }
  }
  const JsonObject dg = done_of(g), dc = done_of(c);
  EXPECT_NEAR(dg.at("param_norm").number, dc.at("param_norm").number, 1e-2 * dc.at("param_norm").number);
  std::cout << "after 40 steps: parameters' norm " << dg.at("param_norm").number << " on the GPU, "
            << dc.at("param_norm").number << " on the CPU; test accuracy " << dg.at("test_accuracy").number << " and "
            << dc.at("test_accuracy").number << "\n";
  const RunResult ev = run_hpctrain({"evaluate", "--checkpoint", ck, "--data-dir", fashion_mnist_dir(),
                                     "--test-samples", "500"});
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_NE(ev.out.find("test accuracy"), std::string::npos) << ev.out;
}

// Mixed precision trains as well as fp32: the default job (4 epochs of Fashion-MNIST, seconds
// on a GPU) ends within 0.6 points of fp32's accuracy and at 91.5% or more in bf16 and in fp16.
// (Not a short job: after 40 steps runs that differ only in rounding were seen from 42% to 69%
// on 500 test images.) An fp16 run killed and resumed ends bit-exactly where an uninterrupted
// one does, its state too: the dynamic loss scale and its counters travel in the checkpoint
// (its keys are there, and they are part of the state_checksum). bf16 has no loss scale and
// skips no step; fp16 may skip some while its scale comes down, never all.
TEST_F(GpuTraining, MixedPrecisionTrainsAndFp16ResumesExactly) {
  auto default_job = [&](const std::string& metrics, const char* precision) {
    return std::vector<std::string>{"--device", "cuda", "--precision", precision, "--quiet",
                                    "--data-dir", fashion_mnist_dir(), "--metrics-file", metrics};
  };
  const std::string ref = dir_.file("fp32.jsonl");
  ASSERT_EQ(run_hpctrain(default_job(ref, "fp32")).exit_code, 0);
  const double want_accuracy = done_of(ref).at("test_accuracy").number;
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const std::string m = dir_.file(std::string(precision) + ".jsonl");
    const RunResult r = run_hpctrain(default_job(m, precision));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonObject d = done_of(m);
    EXPECT_NEAR(d.at("test_accuracy").number, want_accuracy, 0.006);
    EXPECT_GE(d.at("test_accuracy").number, 0.915);
    EXPECT_TRUE(d.at("skipped_steps").is_integer()) << d.at("skipped_steps").raw;
    if (std::string(precision) == "bf16") {
      EXPECT_EQ(d.at("skipped_steps").number, 0);
    } else {
      EXPECT_LT(d.at("skipped_steps").number, d.at("steps").number) << "every step skipped";
    }
    std::cout << precision << ": test accuracy " << d.at("test_accuracy").number << " (fp32 " << want_accuracy
              << "), skipped steps " << d.at("skipped_steps").number << "\n";
  }
  const std::string whole = dir_.file("fp16-short.jsonl");
  auto short16 = short_job(whole);
  short16.insert(short16.end(), {"--precision", "fp16"});
  ASSERT_EQ(run_hpctrain(short16).exit_code, 0);
  const JsonObject want = done_of(whole);
  const std::string ck = dir_.file("ck16");
  auto job = short_job(dir_.file("killed16.jsonl"));
  job.insert(job.end(), {"--precision", "fp16", "--checkpoint-dir", ck, "--checkpoint-every-steps", "5",
                         "--snapshot-every-steps", "0"});
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "7", 1);
  EXPECT_NE(run_hpctrain(job).exit_code, 0);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  const RunResult listing = run_hpctrain({"inspect", "--json", ck + "/ckpt-000000005.hpck"});
  EXPECT_NE(listing.out.find("loss_scale"), std::string::npos) << listing.out;
  const std::string m = dir_.file("resumed16.jsonl");
  job = short_job(m);
  job.insert(job.end(), {"--precision", "fp16", "--checkpoint-dir", ck, "--checkpoint-every-steps", "5",
                         "--snapshot-every-steps", "0"});
  const RunResult resumed = run_hpctrain(job);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 5);
  EXPECT_EQ(done_of(m).at("param_checksum").str, want.at("param_checksum").str);
  EXPECT_EQ(done_of(m).at("state_checksum").str, want.at("state_checksum").str);
}

// CUDA graphs replay a captured step: the same bits as the eager steps (--no-cuda-graphs) in
// tf32, bf16 and fp16, over epochs whose evaluations force a new capture each time; the default
// (one rank on its GPU) replays them, and says it captured; --no-cuda-graphs does not. fp16 starts
// at a loss scale of 2^30 (HPCTRAIN_TEST_LOSS_SCALE), where the first steps overflow for sure:
// each halving is a new capture (the graph holds its scale), and the steps it skips are the
// eager run's, with its whole state.
TEST_F(GpuTraining, CudaGraphsReplayTheEagerStepsBitExactly) {
  for (const std::string precision : {"tf32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const std::string e = dir_.file("eager-" + precision + ".jsonl"), g = dir_.file("graphs-" + precision + ".jsonl");
    if (precision == "fp16") setenv("HPCTRAIN_TEST_LOSS_SCALE", "1073741824", 1);
    auto eager = logged_job(e);
    eager.insert(eager.end(), {"--precision", precision, "--no-cuda-graphs"});
    const RunResult plain = run_hpctrain(eager);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ((plain.out + plain.err).find("CUDA graph"), std::string::npos) << plain.err;
    auto graphs = logged_job(g);
    graphs.insert(graphs.end(), {"--precision", precision});  // the default: graphs on one GPU
    const RunResult r = run_hpctrain(graphs);
    unsetenv("HPCTRAIN_TEST_LOSS_SCALE");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE((r.out + r.err).find("CUDA graph: the training step captured"), std::string::npos) << r.err;
    EXPECT_NE((r.out + r.err).find(", CUDA graphs"), std::string::npos) << r.err;
    EXPECT_EQ(done_of(g).at("param_checksum").str, done_of(e).at("param_checksum").str);
    EXPECT_EQ(done_of(g).at("state_checksum").str, done_of(e).at("state_checksum").str);
    EXPECT_EQ(done_of(g).at("test_accuracy").number, done_of(e).at("test_accuracy").number);
    EXPECT_EQ(done_of(g).at("skipped_steps").number, done_of(e).at("skipped_steps").number);
    if (precision == "fp16") {
      EXPECT_GE(done_of(g).at("skipped_steps").number, 5) << "too few overflows: the scale's recapture went untested";
      EXPECT_LT(done_of(g).at("skipped_steps").number, 30) << "the scale never came down";
    }
  }
}

// Graphs by default must never cost a run: where the step cannot be captured (every capture
// fails under HPCTRAIN_TEST_FAIL_CAPTURE=1, as a library call refused inside a capture would
// make it), the run says so once and goes on without graphs, with the eager run's bits; asked
// for with --cuda-graphs, the same failure is the run's error.
TEST_F(GpuTraining, AStepThatCannotBeCapturedRunsEagerlyUnlessGraphsWereAskedFor) {
  const std::string e = dir_.file("nocapture-eager.jsonl"), a = dir_.file("nocapture-auto.jsonl"),
                    on = dir_.file("nocapture-on.jsonl");
  auto eager = short_job(e);
  eager.push_back("--no-cuda-graphs");
  ASSERT_EQ(run_hpctrain(eager).exit_code, 0);
  setenv("HPCTRAIN_TEST_FAIL_CAPTURE", "1", 1);
  auto by_default = logged_job(a);
  const RunResult r = run_hpctrain(by_default);
  auto asked = short_job(on);
  asked.push_back("--cuda-graphs");
  const RunResult refused = run_hpctrain(asked);
  unsetenv("HPCTRAIN_TEST_FAIL_CAPTURE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out + r.err, "could not be captured"), 1) << r.err;
  EXPECT_EQ((r.out + r.err).find("CUDA graph: the training step captured"), std::string::npos) << r.err;
  EXPECT_EQ(done_of(a).at("param_checksum").str, done_of(e).at("param_checksum").str);
  EXPECT_EQ(done_of(a).at("state_checksum").str, done_of(e).at("state_checksum").str);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("HPCTRAIN_TEST_FAIL_CAPTURE"), std::string::npos) << refused.err;
}

// In-memory snapshots every step on the GPU: the parameters and momentum go to pinned memory on
// a side stream while the next step runs, and its update (a replayed graph: its launch) waits for
// that copy. A run killed after step 7 resumes from the snapshot of step 7 and ends with the
// uninterrupted run's whole state, eager and with CUDA graphs. A copy that raced the update
// would hold step 8's parameters under step 7's position, and the end would differ.
TEST_F(GpuTraining, SnapshotsThroughTheSideStreamResumeBitExactly) {
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "CUDA graphs" : "eager");
    const std::string tag = graphs ? "graphs" : "eager";
    auto job = [&](const std::string& metrics, bool keep) {
      auto a = short_job(dir_.file(metrics));
      a.push_back(graphs ? "--cuda-graphs" : "--no-cuda-graphs");
      if (keep)
        a.insert(a.end(), {"--checkpoint-dir", dir_.file("ck-" + tag), "--checkpoint-every-steps", "5",
                           "--snapshot-every-steps", "1", "--snapshot-dir", dir_.file("snaps-" + tag)});
      return a;
    };
    ASSERT_EQ(run_hpctrain(job("whole-" + tag + ".jsonl", false)).exit_code, 0);
    const JsonObject want = done_of(dir_.file("whole-" + tag + ".jsonl"));
    setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "7", 1);
    EXPECT_NE(run_hpctrain(job("killed-" + tag + ".jsonl", true)).exit_code, 0);
    unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
    const RunResult resumed = run_hpctrain(job("resumed-" + tag + ".jsonl", true));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    const JsonObject d = done_of(dir_.file("resumed-" + tag + ".jsonl"));
    EXPECT_EQ(d.at("resumed_from").str, "snapshot");
    EXPECT_EQ(d.at("resumed_from_step").number, 7);
    EXPECT_EQ(d.at("param_checksum").str, want.at("param_checksum").str);
    EXPECT_EQ(d.at("state_checksum").str, want.at("state_checksum").str);
  }
}

// --device cuda under mpirun with one rank: the NCCL communicator of world size 1.
TEST_F(GpuTraining, RunsUnderMpirunWithNccl) {
  const std::string m = dir_.file("mpi.jsonl");
  const RunResult r = run_mpi(1, short_job(m));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(done_of(m).at("steps").number, 40);
}

// HPCTRAIN_TEST_FORCE_NCCL=1 on one GPU: the bucketed NCCL path that several GPUs take (the
// fence event on the compute stream, the all-reduce with ncclAvg on the NCCL stream behind it,
// the compute stream's wait for the done event before the optimizer), with 0.1 MB buckets so
// that one overlaps the backward pass. An average over one rank is each gradient itself, so
// the run ends with the bits of the run without NCCL; the log names the path, and the timeline
// holds every bucket of every step. With NCCL, graphs are taken only when asked for: the same
// path with --cuda-graphs captures the step with its all-reduces inside the graph (the fork onto
// the NCCL stream and the join back), as several ranks would, and ends with the same bits; its
// replayed steps leave no bucket in the timeline.
TEST_F(GpuTraining, ForcedNcclBucketsOnOneGpuEndWithTheSameBits) {
  const std::string plain = dir_.file("plain.jsonl"), forced = dir_.file("forced.jsonl"),
                    timeline = dir_.file("timeline.jsonl");
  auto job = logged_job(plain);
  const RunResult p = run_hpctrain(job);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE((p.out + p.err).find("no NCCL (one GPU)"), std::string::npos) << p.err;
  auto forced_job = logged_job(forced);
  forced_job.insert(forced_job.end(), {"--bucket-mb", "0.1", "--timeline-file", timeline});
  setenv("HPCTRAIN_TEST_FORCE_NCCL", "1", 1);
  const RunResult f = run_hpctrain(forced_job);
  unsetenv("HPCTRAIN_TEST_FORCE_NCCL");
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE((f.out + f.err).find("forced at world size 1"), std::string::npos) << f.err;
  EXPECT_EQ(done_of(forced).at("param_checksum").str, done_of(plain).at("param_checksum").str);
  EXPECT_EQ(done_of(forced).at("state_checksum").str, done_of(plain).at("state_checksum").str);
  std::ifstream in(timeline);
  int64_t lines = 0, max_bucket = 0;
  for (std::string line; std::getline(in, line); ++lines)
    max_bucket = std::max<int64_t>(max_bucket, nlohmann::json::parse(line).at("bucket").get<int64_t>());
  // The cnn's gradients come in two groups (its layers' order of completion): with 0.1 MB
  // buckets each is a bucket, the first all-reduced while the backward pass goes on.
  EXPECT_GE(max_bucket, 1) << "0.1 MB buckets of the cnn: two per step";
  EXPECT_EQ(lines, 40 * (max_bucket + 1)) << "every bucket of every step";
  EXPECT_EQ((f.out + f.err).find("CUDA graph"), std::string::npos) << "graphs with NCCL without --cuda-graphs";

  const std::string captured = dir_.file("captured.jsonl"), captured_timeline = dir_.file("captured-timeline.jsonl");
  auto graphs_job = logged_job(captured);
  graphs_job.insert(graphs_job.end(), {"--bucket-mb", "0.1", "--timeline-file", captured_timeline, "--cuda-graphs"});
  setenv("HPCTRAIN_TEST_FORCE_NCCL", "1", 1);
  const RunResult g = run_hpctrain(graphs_job);
  unsetenv("HPCTRAIN_TEST_FORCE_NCCL");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE((g.out + g.err).find("forced at world size 1"), std::string::npos) << g.err;
  EXPECT_NE((g.out + g.err).find("CUDA graph: the training step captured"), std::string::npos) << g.err;
  EXPECT_EQ(done_of(captured).at("param_checksum").str, done_of(plain).at("param_checksum").str);
  EXPECT_EQ(done_of(captured).at("state_checksum").str, done_of(plain).at("state_checksum").str);
  std::ifstream in2(captured_timeline);
  int64_t captured_lines = 0;
  for (std::string line; std::getline(in2, line);) ++captured_lines;
  // Each epoch's first step runs eagerly (the first, or the first after an evaluation), the
  // second is captured and launched, the rest replay: one step of each epoch leaves its buckets.
  EXPECT_EQ(captured_lines, 2 * (max_bucket + 1)) << "buckets of the eager steps only";

  // bf16: the convolutions' 16-bit weight gradients land in the fp32 arena one conversion a
  // bucket (before its all-reduce), not one a layer, and with NCCL only there: the bits are
  // those of one GPU's single landing at the end of the backward pass (both runs eager), and a
  // bucket that skipped its landing would leave stale gradients (or fail the engine's check
  // that none is left deferred).
  const std::string plain16 = dir_.file("plain-bf16.jsonl"), forced16 = dir_.file("forced-bf16.jsonl");
  auto plain16_job = logged_job(plain16);
  plain16_job.insert(plain16_job.end(), {"--precision", "bf16", "--no-cuda-graphs"});
  ASSERT_EQ(run_hpctrain(plain16_job).exit_code, 0);
  auto forced16_job = logged_job(forced16);
  forced16_job.insert(forced16_job.end(), {"--precision", "bf16", "--bucket-mb", "0.1"});
  setenv("HPCTRAIN_TEST_FORCE_NCCL", "1", 1);
  const RunResult f16 = run_hpctrain(forced16_job);
  unsetenv("HPCTRAIN_TEST_FORCE_NCCL");
  ASSERT_EQ(f16.exit_code, 0) << f16.err;
  EXPECT_NE((f16.out + f16.err).find("forced at world size 1"), std::string::npos) << f16.err;
  EXPECT_EQ(done_of(forced16).at("param_checksum").str, done_of(plain16).at("param_checksum").str);
  EXPECT_EQ(done_of(forced16).at("state_checksum").str, done_of(plain16).at("state_checksum").str);
}

// The logits of hpctrain predict --json --logits's lines, in order.
std::vector<std::vector<double>> predicted_logits(const std::string& out) {
  std::vector<std::vector<double>> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    rows.push_back(nlohmann::json::parse(line).at("logits").get<std::vector<double>>());
  return rows;
}

// hpctrain predict --device cuda: the checkpoint's model on the GPU (the GpuNetwork the engine
// evaluates with, in fp32) gives the CPU's logits within 1e-4, also for a residual network.
TEST_F(GpuTraining, PredictOnTheGpuGivesTheCpuLogits) {
  const std::string images = dir_.file("images");
  fs::create_directories(images);
  for (int i = 0; i < 6; ++i) {  // colour JPEGs of several sizes
    data::Image img;
    img.height = 28 + 5 * i, img.width = 40 - 2 * i;
    for (int64_t p = 0; p < img.height * img.width * 3; ++p)
      img.pixels.push_back(static_cast<uint8_t>((p * (i + 3)) % 251));
    const std::vector<uint8_t> jpeg = data::encode_jpeg(img, 90);
    std::ofstream(images + "/" + std::to_string(i) + ".jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
  }
  for (const std::string model : {"cnn", "resnet20"}) {
    SCOPED_TRACE(model);
    const std::string ck = dir_.file("ck-" + model);
    const RunResult trained = run_hpctrain({"--device", "cpu", "--model", model, "--train-samples", "256",
                                            "--max-steps", "4", "--test-samples", "16", "--quiet", "--data-dir",
                                            fashion_mnist_dir(), "--checkpoint-dir", ck});
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
    std::vector<std::vector<double>> logits[2];
    for (int gpu = 0; gpu < 2; ++gpu) {
      const RunResult r = run_hpctrain({"predict", "--checkpoint", ck, "--device", gpu ? "cuda" : "cpu", "--json",
                                        "--logits", "--batch-size", "4", images});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      if (gpu) {
        EXPECT_NE(r.err.find("on GPU"), std::string::npos) << r.err;
      }
      logits[gpu] = predicted_logits(r.out);
    }
    ASSERT_EQ(logits[0].size(), 6u);
    ASSERT_EQ(logits[1].size(), 6u);
    for (size_t i = 0; i < logits[0].size(); ++i) {
      double scale = 0, worst = 0;
      for (size_t k = 0; k < logits[0][i].size(); ++k) {
        scale = std::max(scale, std::abs(logits[0][i][k]));
        worst = std::max(worst, std::abs(logits[0][i][k] - logits[1][i][k]));
      }
      EXPECT_LE(worst, 1e-4 * scale) << "image " << i;
    }
  }
}


// --jpeg-decode gpu through the binary: packed JPEG shards decoded by nvJPEG on the loader's
// thread and cropped by the GPU's kernel. The run trains as the CPU-decoded one does (decoders
// differ by a few byte levels: close losses, not the same bits), repeats its bits (the decode is
// deterministic), and with CUDA graphs (the default: the decoded batch copied into the captured
// input) ends with the eager run's (--no-cuda-graphs) bits.
TEST_F(GpuTraining, JpegShardsDecodedOnTheGpuTrainAsOnTheCpu) {
  std::string why;
  if (!data::NvjpegLibrary::load_installed(&why)) GTEST_SKIP() << why;
  const fs::path src = fs::path(dir_.file("jpeg-src"));
  for (int cls = 0; cls < 3; ++cls) {
    fs::create_directories(src / ("class" + std::to_string(cls)));
    for (int i = 0; i < 48; ++i) {
      data::Image img;
      img.height = 48 + (i % 5) * 8, img.width = 64 - (i % 3) * 8;
      img.pixels.resize(static_cast<size_t>(img.height * img.width * 3));
      for (int64_t y = 0; y < img.height; ++y)
        for (int64_t x = 0; x < img.width; ++x)
          for (int c = 0; c < 3; ++c)
            img.pixels[static_cast<size_t>((y * img.width + x) * 3 + c)] = static_cast<uint8_t>(
                (c == cls ? 150 : 60) + 50 * std::sin(0.1 * static_cast<double>(x + 2 * y) + i + c));
      const std::vector<uint8_t> jpeg = data::encode_jpeg(img, 90);
      std::ofstream((src / ("class" + std::to_string(cls)) / (std::to_string(i) + ".jpg")).string(), std::ios::binary)
          .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
    }
  }
  const std::string packed = dir_.file("jpeg-packed");
  for (const char* split : {"train", "val"}) {
    data::PackOptions o;
    o.src = src.string();
    o.out = packed;
    o.split = split;
    data::pack_image_folder(o);
  }
  auto job = [&](const std::string& metrics, const std::string& decode) {
    return std::vector<std::string>{"--device", "cuda", "--dataset", "shards", "--data-dir", packed, "--image-size",
                                    "32", "--batch-size", "16", "--epochs", "4", "--lr", "0.01", "--test-samples",
                                    "48", "--jpeg-decode", decode, "--metrics-file", metrics};
  };
  const std::string g1 = dir_.file("gpu1.jsonl"), g2 = dir_.file("gpu2.jsonl"), gg = dir_.file("eager.jsonl"),
                    c = dir_.file("cpu.jsonl");
  const RunResult gpu = run_hpctrain(job(g1, "gpu"));
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_NE((gpu.out + gpu.err).find("JPEG decode on the GPU with nvJPEG"), std::string::npos) << gpu.out;
  ASSERT_EQ(run_hpctrain(job(g2, "gpu")).exit_code, 0);
  EXPECT_EQ(done_of(g2).at("param_checksum").str, done_of(g1).at("param_checksum").str) << "not deterministic";
  EXPECT_NE((gpu.out + gpu.err).find("CUDA graph: the training step captured"), std::string::npos) << gpu.err;
  // The decoder's thread frees and allocates device memory as its batches grow (each free waits
  // for the device) while the step may be being captured on the main thread: the run must not
  // have fallen back to eager steps, which would give the same bits.
  EXPECT_EQ((gpu.out + gpu.err).find("could not be captured"), std::string::npos) << gpu.err;
  auto eager = job(gg, "gpu");
  eager.push_back("--no-cuda-graphs");
  const RunResult launched = run_hpctrain(eager);
  ASSERT_EQ(launched.exit_code, 0) << launched.err;
  EXPECT_EQ(done_of(gg).at("param_checksum").str, done_of(g1).at("param_checksum").str) << "graphs differ";
  const RunResult cpu = run_hpctrain(job(c, "cpu"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ((cpu.out + cpu.err).find("JPEG decode on the GPU"), std::string::npos) << cpu.out;
  // Both decoders' runs learn the three classes. With the default recipe (peak lr 0.1) these
  // 144 images trained unstably even on the CPU (test loss 1.10, 0.90, 0.53, 1.10 after 2, 4,
  // 6, 8 epochs), and the H200's first run of this test saw 0.87 against 1.08 after 2 epochs;
  // at lr 0.01 and 4 epochs the CPU's seeds 1-3 ended at accuracy 1 and loss 0.29 to 0.32.
  const double loss_gpu = done_of(g1).at("test_loss").number, loss_cpu = done_of(c).at("test_loss").number;
  EXPECT_GE(done_of(g1).at("test_accuracy").number, 0.9) << "GPU-decoded run";
  EXPECT_GE(done_of(c).at("test_accuracy").number, 0.9) << "CPU-decoded run";
  EXPECT_NEAR(loss_gpu, loss_cpu, 0.05 + 0.1 * loss_cpu) << "GPU-decoded test loss " << loss_gpu << ", CPU "
                                                         << loss_cpu;
}

}  // namespace
}  // namespace hpc::itest
