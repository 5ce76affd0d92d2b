// How long one checkpoint stalls the step loop, against writing the same bytes synchronously.
//   checkpoint_stall [--dir DIR] [--repeats N]     (default: a temporary directory, 5)
// For cnn (Fashion-MNIST shape) and resnet18 (CIFAR shape): the asynchronous path's stall is
// what the trainer pays (copy the state into the recycled snapshot, hand it to the writer; the
// first checkpoint of a run also maps the snapshot's memory, so the median is taken); the
// synchronous path copies, encodes (CRC-32) and writes + fsyncs + renames on the spot. The
// medians over N checkpoints are printed with their ratio (target: stall < 10% of sync).
// Between asynchronous checkpoints the loop waits for the writer, as steps would take time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli.hpp"
#include "ckpt/store.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "train/state/checkpointing.hpp"

using namespace hpc;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int repeats = 5;
  bench::po::options_description desc(
      "Usage: checkpoint_stall [options]\nHow long one checkpoint stalls the step loop, against writing it synchronously");
  desc.add_options()("dir", bench::po::value(&dir), "where to write (default: a temporary directory, removed after)")(
      "repeats", bench::po::value(&repeats)->default_value(repeats), "checkpoints a case (the median is kept)");
  const auto done = bench::read_command_line("checkpoint_stall", argc, argv, desc, [&] {
    bench::require(repeats > 0 && repeats <= 10000, "--repeats must be 1 to 10000");
  });
  if (done) return *done;
  return bench::run_main("checkpoint_stall", [&] {
    const bool own_dir = dir.empty();
    if (own_dir) dir = (std::filesystem::temp_directory_path() / "hpctrain-checkpoint-stall").string();
    std::printf("checkpoint_stall: writing to %s, %d checkpoint(s) per case\n", dir.c_str(), repeats);
    std::printf("%-9s %10s %12s %12s %8s\n", "model", "MB", "stall ms", "sync ms", "ratio");
    for (const auto& [name, input] : {std::pair<std::string, Shape>{"cnn", Shape{28, 28, 1}},
                                      {"resnet18", Shape{32, 32, 3}}}) {
      nn::ModelSpec spec;
      spec.kind = parse_named(nn::kModelNames, name, "model");
      spec.input = input;
      nn::Model<float> model(spec);
      model.init(1);
      optim::Sgd<float> sgd(model.params(), {});
      train::TrainOptions o;
      o.model = spec.kind;
      const train::ModelIdentity identity = train::ModelIdentity::of(model);
      ckpt::CheckpointStore store(dir + "/" + name, 2);
      std::vector<double> stall, sync;
      size_t bytes = 0;
      {
        ckpt::AsyncWriter writer(store);
        for (int r = 0; r < repeats; ++r) {
          const train::RunPosition at{r + 1, 0, r + 1, 64, 64.0 * (r + 1)};
          const auto t0 = Clock::now();  // as the trainer does it
          ckpt::Checkpoint snapshot = writer.recycled();
          train::record_run(snapshot, o, identity, 1, at);
          train::copy_state(snapshot, model, sgd);
          writer.submit(std::move(snapshot), at.step);
          stall.push_back(seconds_since(t0));
          writer.wait();  // the steps in between
        }
      }
      for (int r = 0; r < repeats; ++r) {
        const train::RunPosition at{100 + r, 0, r, 64, 64.0 * r};
        const auto t0 = Clock::now();
        const ckpt::Checkpoint c = train::make_checkpoint(o, model, sgd, 1, at);
        const ckpt::Encoded encoded(c);
        store.write(encoded, at.step);
        sync.push_back(seconds_since(t0));
        bytes = encoded.size();
      }
      std::printf("%-9s %10.1f %12.3f %12.3f %8.3f\n", name.c_str(), bytes / 1e6, 1e3 * median(stall), 1e3 * median(sync),
                  median(stall) / median(sync));
    }
    if (own_dir) std::filesystem::remove_all(dir);
    return 0;
  });
}
