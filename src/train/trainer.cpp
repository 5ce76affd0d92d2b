#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/device.hpp"
#include "core/log.hpp"
#include "data/loader.hpp"
#include "nn/gemm.hpp"
#include "optim/schedule.hpp"
#include "optim/sgd.hpp"
#include "train/checksum.hpp"
#include "train/metrics.hpp"
#include "train/progress.hpp"

namespace hpc::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t count_correct(const Tensor& prob, const int32_t* labels) {
  const int64_t n = prob.shape()[0], k = prob.shape()[1];
  const float* p = prob.data<float>();
  int64_t correct = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = p + r * k;
    correct += (std::max_element(row, row + k) - row) == labels[r];
  }
  return correct;
}

void resolve_device(const TrainOptions& o) {
  const int gpus = device::cuda_device_count();
  // The GPU path is the subject of its own issue; until it lands, asking for it is an error
  // rather than a silent CPU run (DESIGN.md principle 3).
  HPC_REQUIRE(o.device != "cuda", "--device cuda: this build trains on the CPU only (",
              device::describe(), "); use --device cpu");
  if (o.device == "auto" && gpus > 0)
    log::info(gpus, " GPU(s) visible, but GPU training is not available in this build; training on the CPU");
}

data::AugmentSpec augment_spec(const TrainOptions& o) {
  const bool on = o.augment == "on" || (o.augment == "auto" && o.dataset == "cifar10");
  if (!on) return {};
  return {o.dataset == "cifar10" ? 4 : 2, o.dataset == "cifar10"};  // digits and clothes are not mirrored
}

optim::ScheduleSpec schedule_spec(const TrainOptions& o, double samples_per_epoch, double total_samples) {
  optim::ScheduleSpec s;
  s.kind = o.lr_schedule;
  s.lr = o.lr;
  s.total_samples = total_samples;
  s.warmup_samples = o.warmup_epochs * samples_per_epoch;
  for (double e : o.lr_step_epochs) s.step_samples.push_back(e * samples_per_epoch);
  s.gamma = o.lr_gamma;
  s.min_lr = o.min_lr;
  s.pct_start = o.onecycle_pct_start;
  s.div_factor = o.onecycle_div_factor;
  s.final_div_factor = o.onecycle_final_div_factor;
  s.cycle_momentum = o.cycle_momentum;
  s.base_momentum = o.onecycle_base_momentum;
  s.max_momentum = o.onecycle_max_momentum;
  return s;
}

}  // namespace

EvalResult evaluate(nn::Model<float>& model, const data::Dataset& ds, const data::Normalization& norm,
                    int64_t batch_size) {
  data::BatchAssembler assembler(ds, norm, {}, 0);
  data::Batch batch;
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < ds.count; start += batch_size) {
    const int64_t n = std::min(batch_size, ds.count - start);
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(start));
    assembler.assemble(idx, 0, false, batch);
    const Tensor& logits = model.forward(batch.images, false);
    loss_sum += model.loss(logits, batch.labels.data()) * static_cast<double>(n);
    correct += count_correct(model.probabilities(), batch.labels.data());
  }
  r.samples = ds.count;
  r.loss = loss_sum / static_cast<double>(ds.count);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(ds.count);
  return r;
}

TrainResult run_training(const TrainOptions& o) {
  const auto t_start = Clock::now();
  if (o.quiet) log::set_level(log::Level::Warn);
  resolve_device(o);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nn::set_math_threads(threads);

  const std::string dir = o.data_dir.empty() ? data::default_data_dir(o.dataset) : o.data_dir;
  data::DatasetPair ds = data::load_dataset(o.dataset, dir);
  ds.train.truncate(o.train_samples);
  ds.test.truncate(o.test_samples);

  nn::ModelSpec spec;
  spec.name = o.model;
  spec.batch_norm = o.batch_norm;
  spec.input = Shape{ds.train.height, ds.train.width, ds.train.channels};
  spec.classes = ds.train.classes;
  spec.label_smoothing = o.label_smoothing;
  nn::Model<float> model(spec);
  model.init(static_cast<uint64_t>(o.seed));

  data::ShardedSampler sampler(ds.train.count, o.batch_size, static_cast<uint64_t>(o.seed), 0, 1, o.drop_last);
  const int64_t spe = sampler.steps_per_epoch();
  const int64_t planned = o.epochs * spe;
  const int64_t total_steps = o.max_steps > 0 ? std::min(o.max_steps, planned) : planned;
  const double samples_per_epoch = static_cast<double>(o.drop_last ? spe * o.batch_size : ds.train.count);
  optim::LrSchedule schedule(
      schedule_spec(o, samples_per_epoch, static_cast<double>(total_steps) * samples_per_epoch / spe));
  optim::Sgd<float> sgd(model.params(), {o.momentum, o.nesterov, o.weight_decay, o.decay_bias_and_norm});
  data::Loader loader(ds.train, ds.norm, augment_spec(o), sampler, static_cast<uint64_t>(o.seed));
  MetricsWriter metrics = o.metrics_file.empty() ? MetricsWriter() : MetricsWriter(o.metrics_file);

  log::info("hpctrain ", HPCTRAIN_VERSION, ": ", model.summary());
  log::info("data: ", o.dataset, " from ", dir, " (", ds.train.count, " train, ", ds.test.count,
            " test); batch ", o.batch_size, ", ", spe, " steps per epoch, ", total_steps, " steps; ", threads,
            " thread(s), GEMM ", nn::gemm_backend());

  Progress progress(o.quiet, o.log_every, o.epochs, spe, total_steps);
  TrainResult result;
  double samples_seen = 0, train_seconds = 0;
  int64_t step = 0;
  EvalResult eval;
  for (int64_t epoch = 0; epoch < o.epochs && step < total_steps; ++epoch) {
    const auto t_epoch = Clock::now();
    loader.start_epoch(epoch);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    while (step < total_steps) {
      const data::Batch* batch = loader.next();
      if (!batch) break;
      const double loss = model.train_step(batch->images, batch->labels.data());
      correct += count_correct(model.probabilities(), batch->labels.data());
      sgd.step(model.params(), schedule.lr(samples_seen), schedule.momentum(samples_seen, o.momentum));
      samples_seen += static_cast<double>(batch->size());
      seen += batch->size();
      loss_sum += loss * static_cast<double>(batch->size());
      ++step;
      const double el = seconds_since(t_epoch);
      const double ips = static_cast<double>(seen) / std::max(el, 1e-9);
      const double eta = (train_seconds + el) / static_cast<double>(step) * static_cast<double>(total_steps - step);
      progress.step(epoch, batch->step, step - 1, loss_sum / static_cast<double>(seen),
                    static_cast<double>(correct) / static_cast<double>(seen), ips, eta);
    }
    const double epoch_seconds = seconds_since(t_epoch);
    train_seconds += epoch_seconds;
    eval = evaluate(model, ds.test, ds.norm, o.eval_batch_size);
    const double train_loss = loss_sum / static_cast<double>(std::max<int64_t>(seen, 1));
    const double ips = static_cast<double>(seen) / std::max(epoch_seconds, 1e-9);
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "epoch %lld/%lld: train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.0f img/s  %s",
                  static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs), train_loss, eval.loss,
                  100 * eval.accuracy, ips, format_duration(epoch_seconds).c_str());
    progress.line(buf);
    if (!std::isfinite(train_loss)) log::warn("the training loss is not finite: training diverged (try a lower --lr)");
    metrics.write({{"event", std::string("epoch")},
                   {"epoch", epoch + 1},
                   {"step", step},
                   {"train_loss", train_loss},
                   {"train_accuracy", static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1))},
                   {"test_loss", eval.loss},
                   {"test_accuracy", eval.accuracy},
                   {"images_per_second", ips},
                   {"elapsed_seconds", seconds_since(t_start)}});
  }
  const Tensor& values = model.params().values();
  result.steps = step;
  result.test_accuracy = eval.accuracy;
  result.test_loss = eval.loss;
  result.train_seconds = train_seconds;
  result.images_per_second = samples_seen / std::max(train_seconds, 1e-9);
  result.param_checksum = fnv1a_hex(values.raw(), values.bytes());
  metrics.write({{"event", std::string("done")},
                 {"steps", step},
                 {"test_accuracy", eval.accuracy},
                 {"param_checksum", result.param_checksum},
                 {"images_per_second", result.images_per_second},
                 {"train_flops_per_sample", model.train_flops_per_sample()},
                 {"train_seconds", train_seconds},
                 {"elapsed_seconds", seconds_since(t_start)}});
  char buf[200];
  std::snprintf(buf, sizeof buf, "done: %lld steps, test accuracy %.2f%%, %.0f img/s, param checksum %s",
                static_cast<long long>(step), 100 * eval.accuracy, result.images_per_second,
                result.param_checksum.c_str());
  log::info(buf);
  return result;
}

}  // namespace hpc::train
