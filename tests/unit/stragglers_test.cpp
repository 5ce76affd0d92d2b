// The straggler window (train/observe/stragglers.hpp): which rank is slowest over the last seconds of
// steps, its busy time over the median rank's, and what leaves the window. And the Prometheus
// file's writes once a run trains (train/observe/prometheus.hpp). And what rank 0 gathers of the
// Chrome trace's events (train/observe/trace.hpp) in a large world.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "train/observe/prometheus.hpp"
#include "train/observe/stragglers.hpp"
#include "train/observe/trace.hpp"

namespace hpc::train {
namespace {

// One step's slots from each rank's busy seconds (waiting: 1 - busy, as in a step of 1 s).
std::vector<double> step_of(const std::vector<double>& busy) {
  std::vector<double> slots;
  for (double b : busy) slots.insert(slots.end(), {b, 1.0 - b});
  return slots;
}

TEST(StragglerWindow, NamesTheRankBusiestOverTheWindowAndItsRatioToTheMedian) {
  StragglerWindow w(4, 10, 100);
  EXPECT_FALSE(w.slowest()) << "no verdict before a step";
  // Rank 2 is busy 0.6 s a step, the others 0.2 s, 0.25 s and 0.3 s.
  for (int i = 0; i < 5; ++i) w.add(i, step_of({0.2, 0.25, 0.6, 0.3}));
  const auto s = w.slowest();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 2);
  EXPECT_NEAR(s->busy_seconds, 0.6, 1e-12);
  EXPECT_NEAR(s->wait_seconds, 0.4, 1e-12);
  // Of 4 ranks, the lower median: the second fastest.
  EXPECT_NEAR(s->median_busy_seconds, 0.25, 1e-12);
  EXPECT_NEAR(s->ratio, 0.6 / 0.25, 1e-12);
}

TEST(StragglerWindow, TheMedianOfAnOddWorldIsItsMiddleRankAndOfTwoTheFasterOne) {
  StragglerWindow three(3, 10, 100);
  three.add(0, step_of({0.5, 0.1, 0.2}));
  EXPECT_EQ(three.slowest()->rank, 0);
  EXPECT_NEAR(three.slowest()->ratio, 2.5, 1e-12);
  StragglerWindow two(2, 10, 100);
  two.add(0, step_of({0.1, 0.3}));
  EXPECT_EQ(two.slowest()->rank, 1);
  EXPECT_NEAR(two.slowest()->ratio, 3.0, 1e-12);
}

TEST(StragglerWindow, EvenRanksAreNoStraggler) {
  StragglerWindow w(4, 10, 100);
  w.add(0, step_of({0.3, 0.3, 0.3, 0.3}));
  EXPECT_EQ(w.slowest()->rank, 0);
  EXPECT_DOUBLE_EQ(w.slowest()->ratio, 1.0);
  StragglerWindow idle(2, 10, 100);  // steps too short for the clock: no ratio to divide by
  idle.add(0, step_of({0, 0}));
  EXPECT_DOUBLE_EQ(idle.slowest()->ratio, 1.0);
}

// Steps older than the window's seconds leave it: a rank that was slow and recovered is no
// longer named, and one that turned slow is, once its steps fill the window.
TEST(StragglerWindow, ForgetsStepsOlderThanItsSeconds) {
  StragglerWindow w(3, 10, 1000);
  for (int t = 0; t <= 20; ++t) w.add(t, step_of({0.1, 0.9, 0.1}));  // rank 1 slow for 20 s
  EXPECT_EQ(w.slowest()->rank, 1);
  for (int t = 21; t <= 31; ++t) w.add(t, step_of({0.1, 0.1, 0.5}));  // then rank 2, for 10 s
  EXPECT_EQ(w.steps(), 11u) << "the steps of the last 10 s (21..31)";
  const auto s = w.slowest();
  EXPECT_EQ(s->rank, 2);
  EXPECT_NEAR(s->ratio, 5.0, 1e-9) << "rank 1's slow steps are out of the window";
}

TEST(StragglerWindow, KeepsAtMostItsStepsAndAlwaysTheNewest) {
  StragglerWindow w(2, 10, 3);
  for (int i = 0; i < 10; ++i) w.add(0, step_of({0.9, 0.1}));
  for (int i = 0; i < 3; ++i) w.add(0, step_of({0.1, 0.2}));
  EXPECT_EQ(w.steps(), 3u);
  EXPECT_EQ(w.slowest()->rank, 1);
  EXPECT_NEAR(w.slowest()->ratio, 2.0, 1e-9);
  StragglerWindow slow_step(2, 1, 100);
  slow_step.add(0, step_of({0.1, 0.2}));
  slow_step.add(100, step_of({0.4, 0.2}));  // a step longer than the window
  EXPECT_EQ(slow_step.steps(), 1u);
  EXPECT_EQ(slow_step.slowest()->rank, 0);
}

TEST(StragglerWindow, RefusesFiguresOfAnotherWorldSize) {
  StragglerWindow w(3, 10, 100);
  EXPECT_ANY_THROW(w.add(0, step_of({0.1, 0.2})));
}

// One rank: nothing to compare, nothing said; several: rank 0 alone keeps the window, and the
// heartbeat names the slowest rank's host.
TEST(StragglerTracker, OnlyRankZeroOfSeveralJudges) {
  StragglerTracker alone(0, {"a"});
  alone.slots();
  alone.agreed(0, 0);
  EXPECT_FALSE(alone.slowest());
  EXPECT_EQ(alone.heartbeat_lines(), "");
  StragglerTracker other(1, {"a", "b"});
  other.slots();
  other.agreed(0, 0);
  EXPECT_FALSE(other.slowest());

  StragglerTracker lead(0, {"node1", "node2", "node2"});
  std::span<double> slots = lead.slots();
  ASSERT_EQ(slots.size(), 6u);
  EXPECT_EQ(slots[2], 0.0) << "only its own slots are filled";
  // As the all-reduce would leave them: rank 2 busy 0.4 s, the others 0.1 s.
  const std::vector<double> summed = {0.1, 0.3, 0.1, 0.3, 0.4, 0.0};
  std::copy(summed.begin(), summed.end(), slots.begin());
  lead.agreed(0.01, 1.0);
  ASSERT_TRUE(lead.slowest());
  EXPECT_EQ(lead.slowest()->rank, 2);
  EXPECT_EQ(lead.heartbeat_lines(), "slowest_rank=2\nslowest_host=node2\nstraggler_ratio=4.000\n");
}

// A rank's busy time is its step less its wait for the gradient buckets; its waiting time that
// wait and the last boundary's all-reduce (before the step began, so not inside it).
TEST(StragglerTracker, BusyIsTheStepLessItsWaitsForThePeers) {
  using namespace std::chrono_literals;
  StragglerTracker t(1, {"a", "b"});
  t.step_began(StragglerTracker::Clock::now() - 1s);
  t.waited(0.25);
  t.waited(0.05);
  std::span<double> s = t.slots();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_NEAR(s[2], 0.7, 0.05);
  EXPECT_DOUBLE_EQ(s[3], 0.3);
  t.agreed(0.2, 1);
  t.step_began(StragglerTracker::Clock::now() - 1s);
  s = t.slots();
  EXPECT_NEAR(s[2], 1.0, 0.05);
  EXPECT_DOUBLE_EQ(s[3], 0.2) << "the last agreement's wait, and no bucket wait carried over";
}

// A write that fails once the run trains (its directory gone, a full disk) is one warning and
// ends nothing: each later write tries again, and the first that can, writes the file. (A wrong
// path at the start is refused before training: Cli.BadArgs.)
TEST(PrometheusTextfile, AFailedWriteIsOneWarningAndTheNextOnesTryAgain) {
  char made[] = "/tmp/hpctrain-prom-XXXXXX";
  ASSERT_NE(::mkdtemp(made), nullptr);
  const std::filesystem::path dir = std::filesystem::path(made) / "textfiles";
  std::filesystem::create_directory(dir);
  const std::string path = (dir / "x.prom").string();
  PrometheusTextfile file(path, {{"hpctrain_job", "t"}});
  const std::vector<Gauge> step = {{"step", "Global training steps done.", 3}};
  ASSERT_TRUE(file.write(step));
  std::filesystem::remove_all(dir);
  testing::internal::CaptureStderr();
  EXPECT_FALSE(file.write(step));
  EXPECT_FALSE(file.write(step));
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("warning: cannot write --prometheus-file " + path + ": No such file or directory (said once; "
                      "training goes on, and so do the tries)\n"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find('\n'), said.size() - 1) << "one line, however many writes fail: " << said;
  std::filesystem::create_directory(dir);
  EXPECT_TRUE(file.write(step));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(text.str(), "# HELP hpctrain_step Global training steps done.\n# TYPE hpctrain_step gauge\n"
                        "hpctrain_step{hpctrain_job=\"t\"} 3\n");
  std::filesystem::remove_all(made);
}

// A link (into node_exporter's textfile directory) is written through: its target is rewritten
// and the link stays. (The rename replaced the link with a file; the target was never updated.)
TEST(PrometheusTextfile, ALinkIsWrittenThrough) {
  char made[] = "/tmp/hpctrain-prom-XXXXXX";
  ASSERT_NE(::mkdtemp(made), nullptr);
  const std::filesystem::path dir(made);
  std::filesystem::create_directory(dir / "data");
  std::filesystem::create_directory_symlink("data", dir / "to-data");
  std::filesystem::create_symlink("to-data/target.prom", dir / "link.prom");  // dangling: written as the file
  PrometheusTextfile file((dir / "link.prom").string(), {});
  for (double step : {3.0, 4.0}) {
    ASSERT_TRUE(file.write({{"step", "Global training steps done.", step}}));
    EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.prom"));
    std::stringstream text;
    text << std::ifstream(dir / "data" / "target.prom").rdbuf();
    EXPECT_NE(text.str().find("hpctrain_step " + std::to_string(static_cast<int>(step)) + "\n"), std::string::npos)
        << text.str();
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir / "data"), {}), 1) << "no temporary file left";
  std::filesystem::remove_all(made);
}

// Rank 0 of a world of `size` ranks whose other ranks buffer as many trace events as this one: what
// one gather would bring rank 0 in all, and whether MPI could carry it (counts and displacements
// are ints: dist/mpi.cpp refuses a part of INT_MAX / size bytes or more).
class GatheringComm final : public dist::Communicator {
 public:
  explicit GatheringComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  std::vector<uint64_t> allgather(uint64_t v) override { return std::vector<uint64_t>(size_, v); }
  void barrier() override {}
  std::vector<std::string> gather_bytes(const std::string& mine, int) override {
    ++gathers;
    most_in_all = std::max(most_in_all, static_cast<double>(mine.size()) * size_);
    fits_mpi = fits_mpi && mine.size() < INT_MAX / static_cast<size_t>(size_);
    return {mine};
  }
  std::unique_ptr<dist::Communicator> duplicate() override { return std::make_unique<GatheringComm>(size_); }
  [[noreturn]] void abort(int) override { std::abort(); }

  int gathers = 0;
  double most_in_all = 0;  // bytes
  bool fits_mpi = true;

 private:
  int size_;
};

// A rank's events are gathered every gather_period() steps; what rank 0 takes in then is every
// rank's. The period bounded each rank's events alone (20000): 4096 ranks of 96 buckets gathered
// 100 steps of ~200 events, ~3 MB a rank and 12 GB in all, which MPI cannot carry (dist/mpi.cpp's
// check ends the run). Now rank 0 takes in at most about a million events a gather, and the
// period shortens with the world.
TEST(TraceGather, RankZeroGathersABoundedAmountInALargeWorld) {
  for (const int world : {2, 64, 4096}) {
    SCOPED_TRACE(world);
    GatheringComm comm(world);
    constexpr size_t kBuckets = 96;
    Trace trace(comm, nullptr, "host", kBuckets);
    dist::BucketTimeline t;
    t.start = Trace::Clock::now();
    t.averaged = true;
    t.statistics = {0, 1000, 0.001, 0.002, 0.003};
    for (size_t b = 0; b < kBuckets; ++b)
      t.buckets.push_back({static_cast<int64_t>(b) * 1000, static_cast<int64_t>(b + 1) * 1000, 0.01, 0.02, 0.03});
    StepResult r;
    const Trace::Clock::time_point t0 = Trace::Clock::now();
    r.phases = {t0, t0 + std::chrono::milliseconds(1), t0 + std::chrono::milliseconds(2),
                t0 + std::chrono::milliseconds(3), t0 + std::chrono::milliseconds(4)};
    for (int64_t step = 1; step <= trace.gather_period(); ++step) {
      trace.step(step, t0, 0.001, r, t, t0 + std::chrono::milliseconds(5));
      trace.at_boundary(step);
    }
    EXPECT_EQ(comm.gathers, 1);
    EXPECT_TRUE(comm.fits_mpi) << comm.most_in_all << " bytes in all";
    EXPECT_LT(comm.most_in_all, 512e6);
    if (world == 2) {
      EXPECT_EQ(trace.gather_period(), 100);  // a small world's, as before
    }
  }
}

// A step may hold more events than a gather's share: tiny buckets (--bucket-mb 0.001, as
// bench/scaling_check.sh's) make tens of thousands a step, ~6 MB a rank, and the period cannot go
// below 1. Each rank's buffer was capped at 16 MB alone: 1024 such ranks gathered 6 GB. A rank now
// keeps at most its share of 1 GiB (the rest of the step's events dropped, said once).
TEST(TraceGather, AStepOfTinyBucketsKeepsRankZerosGatherBounded) {
  GatheringComm comm(1024);
  constexpr size_t kBuckets = 20000;
  Trace trace(comm, nullptr, "host", kBuckets);
  ASSERT_EQ(trace.gather_period(), 1);
  dist::BucketTimeline t;
  t.start = Trace::Clock::now();
  for (size_t b = 0; b < kBuckets; ++b)
    t.buckets.push_back({static_cast<int64_t>(b) * 10, static_cast<int64_t>(b + 1) * 10, 0.01, 0.02, 0.03});
  const Trace::Clock::time_point t0 = Trace::Clock::now();
  testing::internal::CaptureStderr();
  for (int64_t step = 1; step <= 3; ++step) {
    trace.step(step, t0, 0.001, StepResult{}, t, t0 + std::chrono::milliseconds(5));
    trace.at_boundary(step);
  }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(comm.gathers, 3);
  EXPECT_TRUE(comm.fits_mpi) << comm.most_in_all << " bytes in all";
  EXPECT_LE(comm.most_in_all, 1.1 * (1 << 30));
  // Once, not at every gather: every step here, on every rank.
  size_t lines = 0;
  for (size_t at = said.find("buffer of trace events is full"); at != std::string::npos;
       at = said.find("buffer of trace events is full", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << said;
}

}  // namespace
}  // namespace hpc::train
