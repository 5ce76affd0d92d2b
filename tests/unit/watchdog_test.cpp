// The step watchdog fires when progress stops for the timeout, and only then.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "train/stop/watchdog.hpp"

namespace hpc::train {
namespace {

using namespace std::chrono_literals;

TEST(StepWatchdog, FiresWhenNoStepFinishesWithinTheTimeout) {
  std::promise<std::string> fired;
  const auto t0 = std::chrono::steady_clock::now();
  StepWatchdog dog(0.3, "rank 1 on node7", [&](const std::string& m) { fired.set_value(m); });
  dog.progress(7);
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the watchdog never fired";
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.3);
  const std::string m = f.get();
  EXPECT_NE(m.find("rank 1 on node7: no step finished within --step-timeout 0.3 s (the last was step 7)"),
            std::string::npos) << m;
  EXPECT_NE(m.find("Exiting with code 124"), std::string::npos) << m;
}

TEST(StepWatchdog, StaysQuietWhileStepsKeepFinishing) {
  std::atomic<bool> fired{false};
  {
    StepWatchdog dog(1.0, "rank 0", [&](const std::string&) { fired = true; });
    for (int step = 1; step <= 150; ++step) {  // 1.5 s of 10 ms steps: longer than the timeout
      std::this_thread::sleep_for(10ms);
      dog.progress(step);
    }
  }  // stopping it does not fire it either
  EXPECT_FALSE(fired);
}

// While the loop waits for a checkpoint's write, a chunk synced is progress: a write that moves
// keeps the watchdog quiet for longer than the timeout; slices without a chunk do not count.
TEST(StepWatchdog, AWriteThatMovesIsProgressAndOneThatDoesNotIsNot) {
  std::atomic<bool> fired{false};
  {
    StepWatchdog dog(0.5, "rank 0", [&](const std::string&) { fired = true; });
    dog.progress(11);
    for (int chunk = 1; chunk <= 15; ++chunk) {  // 1.5 s of 100 ms chunks: longer than the timeout
      std::this_thread::sleep_for(100ms);
      dog.writing(11, (uint64_t{1} << 24) * static_cast<uint64_t>(chunk), true, true);
    }
  }
  EXPECT_FALSE(fired);
  std::promise<std::string> expired;
  StepWatchdog dog(0.3, "rank 1 on node7", [&](const std::string& m) { expired.set_value(m); });
  dog.progress(11);
  dog.writing(11, 1234, false, true);
  auto f = expired.get_future();
  for (int slice = 0; slice < 1000 && f.wait_for(10ms) != std::future_status::ready; ++slice)
    dog.writing(11, 1234, false, false);  // slices that synced nothing
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready) << "a write that synced nothing never fired";
  const std::string m = f.get();
  EXPECT_NE(m.find("rank 1 on node7: rank 0's checkpoint of step 11 made no progress within --step-timeout 0.3 s (1234 "
                   "bytes written and synced): its file system does not answer, or rank 0 stopped, died or lost its "
                   "network? Exiting with code 124"),
            std::string::npos) << m;
}

// Rank 0's own write names its file system; progress() ends the wait (the message names steps again).
TEST(StepWatchdog, RankZerosOwnWriteNamesItsFileSystemAndProgressEndsTheWait) {
  for (const bool ended : {false, true}) {
    std::promise<std::string> expired;
    StepWatchdog dog(0.3, "rank 0 on node1", [&](const std::string& m) { expired.set_value(m); },
                     StepWatchdog::Poll{}, Watched::SetUp);
    dog.writing(3, 0, true, false);
    if (ended) dog.progress(0);
    auto f = expired.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    const std::string m = f.get();
    const std::string write = "rank 0 on node1: the checkpoint of step 3 made no progress within --start-timeout 0.3 s "
                              "(0 bytes written and synced): a file system that does not answer?";
    EXPECT_EQ(m.find(write) != std::string::npos, !ended) << m;
    EXPECT_EQ(m.find("set-up did not end within --start-timeout 0.3 s") != std::string::npos, ended) << m;
  }
}

TEST(StepWatchdog, ZeroMeansOff) {
  std::atomic<bool> fired{false};
  {
    StepWatchdog dog(0, "rank 0", [&](const std::string&) { fired = true; });
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(fired);
}

// An error the poll reports (NCCL's asynchronous error on the GPU) fires the watchdog at the
// next poll, long before the timeout, with the poll's message; while the poll reports nothing,
// steps that keep finishing keep it quiet.
TEST(StepWatchdog, FiresOnAPolledErrorBeforeTheTimeout) {
  std::promise<std::string> fired;
  std::atomic<int> polls{0};
  const auto t0 = std::chrono::steady_clock::now();
  StepWatchdog dog(600, "rank 2 on node3", [&](const std::string& m) { fired.set_value(m); }, [&] {
    return ++polls < 2 ? std::string() : std::string("NCCL error during a collective: remote process exited");
  });
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the polled error never fired the watchdog";
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 5.0);
  EXPECT_GE(polls.load(), 2);
  const std::string m = f.get();
  EXPECT_NE(m.find("rank 2 on node3: NCCL error during a collective: remote process exited"), std::string::npos) << m;
  EXPECT_NE(m.find("Exiting with code 124"), std::string::npos) << m;
}

// Set-up's watchdog names set-up and --start-timeout; a hold (the wait for the checkpoint
// directory's lock, which has its own limit) does not count, and the clock runs again after it.
TEST(StepWatchdog, SetUpsWatchdogDoesNotCountAHold) {
  std::promise<std::string> fired;
  const auto t0 = std::chrono::steady_clock::now();
  StepWatchdog dog(1.0, "rank 0 on node1", [&](const std::string& m) { fired.set_value(m); }, {}, Watched::SetUp);
  dog.hold_for(1.0);
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the watchdog never fired";
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 2.0) << "it counted the hold";
  const std::string m = f.get();
  EXPECT_NE(m.find("rank 0 on node1: set-up did not end within --start-timeout 1 s: a peer rank stopped"),
            std::string::npos) << m;
  EXPECT_NE(m.find("Exiting with code 124 so that the job can be relaunched"), std::string::npos) << m;
}

// evaluate's watchdogs name its batches, and promise no relaunch.
TEST(StepWatchdog, EvaluationsWatchdogNamesTheBatch) {
  std::promise<std::string> fired;
  StepWatchdog dog(1.0, "rank 1 on node2", [&](const std::string& m) { fired.set_value(m); }, {},
                   Watched::EvaluationBatches);
  dog.progress(3);
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the watchdog never fired";
  const std::string m = f.get();
  EXPECT_NE(m.find("rank 1 on node2: no evaluation batch finished within --step-timeout 1 s (the last was batch 3)"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("relaunched"), std::string::npos) << m;
}

// A process without peers (one rank) blames no peer: a file system or device that does not answer.
TEST(StepWatchdog, AProcessWithoutPeersBlamesNoPeer) {
  for (const Watched watched : {Watched::Steps, Watched::SetUp}) {
    std::promise<std::string> fired;
    StepWatchdog dog(1.0, "rank 0 on node1", [&](const std::string& m) { fired.set_value(m); }, {}, watched, false);
    auto f = fired.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the watchdog never fired";
    const std::string m = f.get();
    EXPECT_NE(m.find(": a file system or device that does not answer? Exiting with code 124"), std::string::npos) << m;
    EXPECT_EQ(m.find("peer"), std::string::npos) << m;
  }
}

// A hold ended early by progress (the lock taken at once) starts the clock again: the watchdog
// fires a timeout after the progress, not after the hold (it slept through it: 34 s instead of 3).
TEST(StepWatchdog, ProgressEndsAHold) {
  std::promise<std::string> fired;
  StepWatchdog dog(1.0, "rank 0 on node1", [&](const std::string& m) { fired.set_value(m); }, {}, Watched::SetUp);
  dog.hold_for(30.0);
  std::this_thread::sleep_for(100ms);  // the watchdog's thread sees the hold
  const auto t0 = std::chrono::steady_clock::now();
  dog.progress(0);
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the watchdog slept through the end of the hold";
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 1.0 + StepWatchdog::kPollSeconds + 1.0);
}

}  // namespace
}  // namespace hpc::train
