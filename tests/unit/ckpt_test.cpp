// The checkpoint format: round trip, and every truncation or flipped bit is caught; the
// heartbeat's fields read back as written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ckpt/checkpoint.hpp"
#include "ckpt/store.hpp"
#include "core/error.hpp"

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

TEST(Heartbeat, ReadsBackWhatWasWritten) {
  std::string dir = (std::filesystem::temp_directory_path() / "hpctrain-beat-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  EXPECT_TRUE(ckpt::read_heartbeat(dir).empty());
  ckpt::write_heartbeat(dir, 12, 1, "stopped");
  const auto beat = ckpt::read_heartbeat(dir);
  EXPECT_EQ(beat.at("step"), "12");
  EXPECT_EQ(beat.at("epoch"), "1");
  EXPECT_EQ(beat.at("state"), "stopped");
  EXPECT_EQ(beat.at("pid"), std::to_string(::getpid()));
  EXPECT_GT(std::stoll(beat.at("unix_time")), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hpc::testing

#include "train/checkpointing.hpp"

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
  EXPECT_EQ(train::check_resumable(c, o, model).step, 10);
  const std::optional<optim::LossScalerState> back = train::loss_scaler_of(c);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->scale, 8192.0);
  EXPECT_EQ(back->good_steps, 37);
  EXPECT_EQ(back->skipped, 3);
  EXPECT_NE(train::state_checksum(c), train::state_checksum(plain)) << "the scaler is part of the state";

  c.meta["loss_scale"] = "0.25";
  try {
    train::check_resumable(c, o, model);
    ADD_FAILURE() << "a loss scale below 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scale"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hpc::testing
