#include "train/options/options.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/choice.hpp"
#include "core/cpus.hpp"
#include "core/device.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "core/revision.hpp"
#include "data/dataset.hpp"
#include "nn/gemm.hpp"
#include "nn/model.hpp"
#include "optim/schedule.hpp"
#include "train/options/option_table.hpp"
#include "train/stop/signals.hpp"

namespace hpc::train {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

void require_finite(double v, const char* option) {
  HPC_REQUIRE(std::isfinite(v), "--", option, " must be a finite number, got ", v);
}

constexpr int64_t kMaxEpochs = 1'000'000;
// A bucket must hold at least one float; 1 kB also keeps the number of buckets sane.
constexpr double kMinBucketMb = 0.001, kMaxBucketMb = 4096;

// Each value on its own (a count, a range, a finite number). A config file's values must meet
// these even where the command line overrides them: the line is used once the override goes.
void validate_each_value(const TrainOptions& o) {
  // Values are records of one line each (a checkpoint's meta section, the ranks' comparison): a
  // path with a line break passed every check, trained, and ended in an internal error at the
  // first checkpoint.
  for (const auto& [name, value] : all_option_values(o))
    HPC_REQUIRE(value.find_first_of("\n\r") == std::string::npos, "--", name, " holds a line break ('",
                one_line(value), "'): give it without one");
  require_positive(o.epochs, "epochs");
  require_batch_size(o.batch_size, "batch-size");
  require_batch_size(o.eval_batch_size, "eval-batch-size");
  for (auto [v, name] : {std::pair{o.seed, "seed"}, {o.max_steps, "max-steps"}, {o.train_samples, "train-samples"},
                         {o.test_samples, "test-samples"}, {o.global_batch_size, "global-batch-size"},
                         {o.image_size, "image-size"},
                         {o.checkpoint_every_steps, "checkpoint-every-steps"}, {o.log_every, "log-every"},
                         {o.metrics_every_steps, "metrics-every-steps"}})
    require_non_negative(v, name);
  HPC_REQUIRE(o.epochs <= kMaxEpochs, "--epochs must be at most ", kMaxEpochs, ", got ", o.epochs);
  if (o.global_batch_size > 0) require_batch_size(o.global_batch_size, "global-batch-size");
  require_thread_count(o.threads);
  HPC_REQUIRE(o.image_size <= 4096, "--image-size must be at most 4096 pixels, got ", o.image_size);
  HPC_REQUIRE(o.keep_checkpoints >= 1 && o.keep_checkpoints <= 1000000,
              "--keep-checkpoints must be from 1 to 1000000, got ", o.keep_checkpoints);
  cpus::memory_size(o.snapshot_max_memory, cpus::host_memory_bytes(), "--snapshot-max-memory");

  // As optim::Sgd and optim::LrSchedule would refuse them (they check again for their own callers).
  for (auto [v, name] : {std::pair{o.lr, "lr"}, {o.momentum, "momentum"}, {o.weight_decay, "weight-decay"},
                         {o.label_smoothing, "label-smoothing"}, {o.warmup_epochs, "warmup-epochs"},
                         {o.lr_gamma, "lr-gamma"}, {o.min_lr, "min-lr"}, {o.onecycle_pct_start, "onecycle-pct-start"},
                         {o.onecycle_div_factor, "onecycle-div-factor"},
                         {o.onecycle_final_div_factor, "onecycle-final-div-factor"},
                         {o.onecycle_base_momentum, "onecycle-base-momentum"},
                         {o.onecycle_max_momentum, "onecycle-max-momentum"}})
    require_finite(v, name);
  HPC_REQUIRE(o.lr > 0, "--lr must be a positive number, got ", o.lr);
  HPC_REQUIRE(o.momentum >= 0 && o.momentum < 1, "--momentum must be in [0, 1), got ", o.momentum);
  HPC_REQUIRE(o.weight_decay >= 0, "--weight-decay must not be negative, got ", o.weight_decay);
  HPC_REQUIRE(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
              o.label_smoothing);
  HPC_REQUIRE(o.warmup_epochs >= 0, "--warmup-epochs must not be negative, got ", o.warmup_epochs);
  HPC_REQUIRE(o.lr_gamma > 0, "--lr-gamma must be positive, got ", o.lr_gamma);
  HPC_REQUIRE(o.onecycle_pct_start > 0 && o.onecycle_pct_start < 1, "--onecycle-pct-start must be in (0, 1), got ",
              o.onecycle_pct_start);
  HPC_REQUIRE(o.onecycle_div_factor >= 1 && o.onecycle_final_div_factor >= 1,
              "--onecycle-div-factor and --onecycle-final-div-factor must be at least 1, got ", o.onecycle_div_factor,
              " and ", o.onecycle_final_div_factor);

  HPC_REQUIRE(std::isfinite(o.bucket_mb) && o.bucket_mb >= kMinBucketMb && o.bucket_mb <= kMaxBucketMb,
              "--bucket-mb must be a size in MB from ", kMinBucketMb, " (1 kB) to ", kMaxBucketMb, ", got ",
              o.bucket_mb);
  require_watchdog_timeout(o.step_timeout_seconds, "step-timeout");
  require_watchdog_timeout(o.start_timeout_seconds, "start-timeout");
  for (const auto& [seconds, option] : {std::pair{o.checkpoint_lock_wait_seconds, "checkpoint-lock-wait"},
                                        std::pair{o.checkpoint_interval_seconds, "checkpoint-interval"},
                                        std::pair{o.progress_interval_seconds, "progress-interval"}})
    HPC_REQUIRE(seconds <= kLongestWait, "--", option, " must be at most 1000h, got ", show_duration(seconds));
}

// The values that contradict each other (the choices themselves were parsed with the table),
// and those that contradict --lr or --epochs.
void validate_together(const TrainOptions& o) {
  const int64_t least = nn::smallest_image_side(o.model);
  HPC_REQUIRE(o.image_size == 0 || o.image_size >= least, "--image-size ", o.image_size, " is too small for --model ",
              nn::model_name(o.model), " (at least ", least, " pixels)");
  HPC_REQUIRE(o.lr_schedule != optim::Schedule::Step || !o.lr_step_epochs.empty(),
              "--lr-schedule step needs --lr-step-epochs (e.g. 30,60)");
  HPC_REQUIRE(!o.nesterov || o.momentum > 0, "Nesterov momentum needs --momentum > 0 (or --no-nesterov)");
  HPC_REQUIRE(o.warmup_epochs <= static_cast<double>(o.epochs), "--warmup-epochs ", o.warmup_epochs,
              " is longer than the run (--epochs ", o.epochs, ")");
  HPC_REQUIRE(o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr must be in [0, --lr ", o.lr, "] (the cosine schedule "
              "falls from --lr to it), got ", o.min_lr);
  for (double e : o.lr_step_epochs)
    HPC_REQUIRE(o.lr_schedule != optim::Schedule::Step || e < static_cast<double>(o.epochs), "--lr-step-epochs ", e,
                " is not within the run (--epochs ", o.epochs, "): the learning rate would never change there");
  HPC_REQUIRE(o.onecycle_base_momentum >= 0 && o.onecycle_base_momentum <= o.onecycle_max_momentum &&
                  o.onecycle_max_momentum < 1,
              "one-cycle momentum needs 0 <= --onecycle-base-momentum <= --onecycle-max-momentum < 1, got ",
              o.onecycle_base_momentum, " and ", o.onecycle_max_momentum);
}

// How long a read of the config file waits at a time before it looks for a stop signal.
constexpr int kConfigWaitSliceMs = 100;

// Up to `limit` bytes of a config file, which may be a FIFO or a pipe (--config <(generate)):
// opened without waiting for a writer and read as its bytes come, in short slices, so that a
// stop signal ends a wait for a writer that never comes (before the options are read, the signal
// thread only keeps it: signals.hpp). A blocking open or read would wait forever, SIGTERM or not.
std::string read_config_bytes(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  HPC_REQUIRE(fd >= 0, "cannot read config file ", path, ": ", std::strerror(errno));
  const struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // A regular file never waits: a stop signal taken while it is read waits for the options, as ever.
  struct stat st {};
  const bool stream = ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode);
  const std::string waiting = "--config " + path + " to be written (a FIFO or pipe whose writer has not finished)";
  std::string text;
  char chunk[1 << 16];
  while (text.size() < limit) {
    if (stream) end_wait_if_stopped(waiting);
    pollfd ready{fd, POLLIN, 0};
    // Regular files are always ready; a FIFO no writer has opened yet is not (nor is it at its
    // end: a read would say 0 bytes), a pipe at its end is (POLLHUP: the read says 0 bytes).
    const int polled = ::poll(&ready, 1, kConfigWaitSliceMs);
    HPC_REQUIRE(polled >= 0 || errno == EINTR, "cannot read config file ", path, ": ", std::strerror(errno));
    if (polled <= 0) continue;
    const ssize_t n = ::read(fd, chunk, std::min(sizeof chunk, limit - text.size()));
    if (n == 0) break;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    HPC_REQUIRE(n > 0, "cannot read config file ", path, ": ", std::strerror(errno));
    text.append(chunk, static_cast<size_t>(n));
  }
  return text;
}

// The text of a config file, without a UTF-8 byte-order mark (Windows editors write one).
std::string read_config_text(const std::string& path) {
  options::refuse_blank(path, "--config");
  std::error_code ec;
  HPC_REQUIRE(!fs::is_directory(path, ec), "--config ", path, " is a directory, not a file of name = value lines");
  constexpr size_t kMax = options::kMaxConfigFileBytes;
  std::string text = read_config_bytes(path, kMax + 1);
  HPC_REQUIRE(text.size() <= kMax, "config file ", path, " is larger than ", kMax >> 20,
              " MB: not a config file of name = value lines?");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  // Control characters other than tabs and line ends mean a binary file, whose bytes would
  // otherwise reach the error line raw.
  const auto bad = std::find_if(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f;
  });
  HPC_REQUIRE(bad == text.end(), "config file ", path, " is not a text file (byte ", bad - text.begin(),
              " is a control character): it should hold name = value lines");
  // "= 3" (a name lost in editing): Boost's error would name no option and no line.
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const std::string shown = line.substr(first, line.find_last_not_of(" \t\r") + 1 - first);
    HPC_REQUIRE(line[first] != '=', "config file ", path, " line ", number, ": '", shown,
                "' names no option before its '='");
    // Boost would read the names after it as SECTION.NAME, and a section with none, not at all.
    HPC_REQUIRE(line[first] != '[', "config file ", path, " line ", number, ": '", shown,
                "': sections such as [train] are not read (write name = value lines)");
    // Boost ends a value at any '#': "checkpoint-dir = run#1" would write into ./run. A comment
    // after a value is taken where a shell takes one, after a space ("lr = 0.1  # the peak").
    const size_t hash = line.find('#', first);
    HPC_REQUIRE(hash == std::string::npos || hash == first || line[hash - 1] == ' ' || line[hash - 1] == '\t',
                "config file ", path, " line ", number, ": '", shown, "': a '#' ends the value there (what follows "
                "is a comment), so a value cannot hold one; a comment after a value needs a space before its '#'");
  }
  return text;
}

// No shell reads the file: a value in quotes, or with ~ or $HOME, was taken as written, and
// 'checkpoint-dir = "/data/ck"' trained into a directory named with the quotes, under this one.
void require_unexpanded_value(const std::string& path, const std::string& name, const std::string& value) {
  const char first = value.front(), last = value.back();
  HPC_REQUIRE(value.size() < 2 || !((first == '"' || first == '\'') && last == first), "config file ", path, ": '",
              name, "' is ", value, ", in quotes, which would be part of it: write the value without them");
  HPC_REQUIRE(first != '~', "config file ", path, ": '", name, "' is ", value,
              ": a config file's ~ is not your home directory (no shell reads it): write the whole path");
  for (size_t dollar = value.find('$'); dollar != std::string::npos; dollar = value.find('$', dollar + 1)) {
    const char next = dollar + 1 < value.size() ? value[dollar + 1] : ' ';
    HPC_REQUIRE(!(std::isalpha(static_cast<unsigned char>(next)) || next == '_' || next == '{'), "config file ", path,
                ": '", name, "' is ", value, ": a config file's variables are not expanded (no shell reads it): ",
                "write the value itself");
  }
}

// The table's own reads: the values Boost stores as text (choices, durations, lists, switches).
void read_table(const po::variables_map& vm, TrainOptions& o) {
  for (const OptionGroup& group : option_table())
    for (const Option& option : group.options)
      if (option.read) option.read(vm, o);
}

po::options_description description(TrainOptions& o, std::string* config);

bool given(const po::variables_map& vm, const char* name);

// Reads --config PATH into vm after the command line (whose values win). Boost's messages
// are prefixed with the file; the options that only make sense on a command line are refused.
void store_config_file(const std::string& path, const po::options_description& all, po::variables_map& vm) {
  const std::string text = read_config_text(path);
  std::istringstream in(text);
  try {
    po::parsed_options parsed = po::parse_config_file(in, all);
    for (const po::option& opt : parsed.options) {
      HPC_REQUIRE(opt.string_key != "config" && opt.string_key != "help" && opt.string_key != "version",
                  "config file ", path, " sets '", opt.string_key, "', which only the command line can give");
      // "checkpoint-dir =": a generated file whose variable was unset.
      HPC_REQUIRE(opt.value.empty() || !opt.value.front().empty(), "config file ", path, ": '", opt.string_key,
                  "' is empty (an unset variable?)");
      if (!opt.value.empty()) require_unexpanded_value(path, opt.string_key, opt.value.front());
    }
    // "cuda-graphs = 1" in the file and --no-cuda-graphs on the command line: the command line's
    // switch wins, as its values do (both reached the switch pair, which refused them together).
    std::erase_if(parsed.options, [&](const po::option& opt) {
      const std::string& name = opt.string_key;
      const std::string partner = name.rfind("no-", 0) == 0 ? name.substr(3) : "no-" + name;
      return all.find_nothrow(partner, false) && given(vm, partner.c_str());
    });
    // The file on its own first: po::store passes over a name that vm holds already, so where the
    // command line sets it too, a name given twice, a value that cannot be read or one out of its
    // range would go unseen. Read into options of its own (Boost writes the numbers into the
    // options its description names).
    TrainOptions alone;
    std::string alone_config;
    std::istringstream again(text);
    po::variables_map own;
    const po::options_description alone_all = description(alone, &alone_config);
    po::store(po::parse_config_file(again, alone_all), own);
    po::notify(own);
    try {
      read_table(own, alone);
      validate_each_value(alone);
    } catch (const Error& e) {
      usage_error("config file ", path, ": ", e.what());
    }
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const bool dotted = e.get_option_name().find('.') != std::string::npos;
    usage_error("config file ", path, ": ", options::what_of(e),
                dotted ? " (sections such as [train] are not read: write name = value lines)" : "");
  } catch (const po::error& e) {
    usage_error("config file ", path, ": ", options::value_error_text(e, all));
  }
}

bool given(const po::variables_map& vm, const char* name) { return vm.count(name) && !vm[name].defaulted(); }

// The options of one schedule, given (on the command line or in --config) for a run of another,
// and the momentum options that onecycle's choice leaves out: they do nothing there. Said, not
// refused: every checkpoint records them all (rule Match), so a resume that repeats a run's
// command line must go on being accepted.
void warn_other_schedules_options(const TrainOptions& o, const po::variables_map& vm) {
  using optim::Schedule;
  static const std::pair<const char*, Schedule> owned[] = {
      {"lr-step-epochs", Schedule::Step},           {"lr-gamma", Schedule::Step},
      {"min-lr", Schedule::Cosine},                 {"onecycle-pct-start", Schedule::OneCycle},
      {"onecycle-div-factor", Schedule::OneCycle},  {"onecycle-final-div-factor", Schedule::OneCycle},
      {"onecycle-base-momentum", Schedule::OneCycle}, {"onecycle-max-momentum", Schedule::OneCycle}};
  for (const auto& [name, kind] : owned)
    if (kind != o.lr_schedule && given(vm, name))
      log::warn("--", name, " is ignored: it is for --lr-schedule ", name_of(optim::kScheduleNames, kind),
                ", and this run's is ", name_of(optim::kScheduleNames, o.lr_schedule));
  // Under onecycle the momentum is the schedule's (as PyTorch's OneCycleLR sets it), or --momentum.
  if (o.lr_schedule != Schedule::OneCycle) return;
  if (o.cycle_momentum && given(vm, "momentum"))
    log::warn("--momentum is ignored: --lr-schedule onecycle cycles the momentum between "
              "--onecycle-max-momentum and --onecycle-base-momentum (--no-cycle-momentum keeps --momentum)");
  for (const char* name : {"onecycle-base-momentum", "onecycle-max-momentum"})
    if (!o.cycle_momentum && given(vm, name))
      log::warn("--", name, " is ignored under --no-cycle-momentum (the momentum is --momentum's)");
}

// Options given that the run's other options leave without effect, each said in one warning (as
// the other schedules' options are: a resume that repeats a run's command line stays accepted).
void warn_options_without_effect(const TrainOptions& o, const po::variables_map& vm) {
  if (o.sync_batch_norm && !o.batch_norm)
    log::warn("--sync-batch-norm is ignored: --no-batch-norm leaves the model without batch norm");
  if (!o.deterministic && o.device == Device::Cpu)
    log::warn("--no-deterministic is ignored on the CPU (--device cpu): it lets cuDNN choose its algorithms on the "
              "GPU, and CPU runs repeat bit for bit");
  if (o.log_every > 0 && given(vm, "progress-interval"))
    log::warn("--progress-interval is ignored beside --log-every ", o.log_every,
              ": it spaces the progress lines under --log-every 0 only");
  if (o.quiet && o.log_level < log::Level::Warn && given(vm, "log-level"))
    log::warn("--log-level ", name_of(kLogLevelNames, o.log_level),
              " is ignored under --quiet, which prints only warnings and errors");
}

// Neither output folder may be the root directory ("$UNSET/"), and the files hpctrain writes
// must be neither one another nor a file it reads (the config, the checkpoint it resumes, the
// run's checkpoints): their bytes would be lost. By identity, so that another spelling or a link
// is no way around it; streams (a pipe, /dev/stdout) may be shared.
void validate_distinct_files(const TrainOptions& o, const po::variables_map& vm) {
  require_not_root_dir(o.checkpoint_dir, "--checkpoint-dir");
  require_not_root_dir(o.snapshot_dir, "--snapshot-dir");
  std::vector<NamedPath> inputs;
  if (vm.count("config")) inputs.push_back({"--config", vm["config"].as<std::string>()});
  if (o.resume == ResumeFrom::File) inputs.push_back({"--resume", o.resume_file});
  if (!o.checkpoint_dir.empty())
    for (NamedPath& p : ckpt::checkpoint_inputs("--checkpoint-dir", o.checkpoint_dir)) inputs.push_back(std::move(p));
  if (!o.init_from.empty())
    for (NamedPath& p : ckpt::checkpoint_inputs("--init-from", o.init_from)) inputs.push_back(std::move(p));
  const std::vector<NamedPath> outputs{{"--metrics-file", o.metrics_file},
                                       {"--timeline-file", o.timeline_file},
                                       {"--prometheus-file", o.prometheus_file}};
  require_distinct_files(outputs, inputs);
  // A file the checkpoints will write (or move away) later, not yet there to compare with.
  if (!o.checkpoint_dir.empty())
    for (const NamedPath& out : outputs) ckpt::require_not_its_own_name(out, o.checkpoint_dir, "--checkpoint-dir");
}

// What the step metrics need: a metrics file to add the step events to, and a name
// node_exporter's textfile collector reads (it skips all but *.prom, so another would be
// written for nobody).
void validate_step_metrics(const TrainOptions& o) {
  HPC_REQUIRE(o.metrics_every_steps == 0 || !o.metrics_file.empty(),
              "--metrics-every-steps needs --metrics-file: the step events go there");
  const std::string name = fs::path(o.prometheus_file).filename().string();
  HPC_REQUIRE(o.prometheus_file.empty() || (name.size() > 5 && name.ends_with(".prom") && name[0] != '.'),
              "--prometheus-file ", o.prometheus_file, " must name a file ending in .prom (and not starting with "
              "a dot): node_exporter's textfile collector reads no other");
  std::error_code ec;
  const fs::file_status there = fs::status(o.prometheus_file, ec);
  HPC_REQUIRE(o.prometheus_file.empty() || !fs::exists(there) || fs::is_regular_file(there), "--prometheus-file ",
              o.prometheus_file, " is not a regular file (a FIFO, a device): each rewrite renames a new file over "
              "it, which would replace it, and a stream cannot be rewritten; name a file of its own");
}

// Checkpoint settings without a directory to write to would silently save nothing.
void validate_checkpointing(const TrainOptions& o, const po::variables_map& vm) {
  HPC_REQUIRE(o.init_from.empty() || o.resume != ResumeFrom::File, "--init-from starts a new run from a checkpoint's "
              "weights and --resume ", o.resume_file, " continues the run of that checkpoint: give one of them");
  if (!o.checkpoint_dir.empty()) return;
  const std::pair<bool, const char*> asks[] = {
      {o.checkpoint_every_steps > 0, "--checkpoint-every-steps"},
      {o.checkpoint_each_epoch, "--checkpoint-each-epoch"},
      {given(vm, "keep-checkpoints"), "--keep-checkpoints"},
      {given(vm, "checkpoint-interval") && o.checkpoint_interval_seconds > 0, "--checkpoint-interval"},
      {o.snapshot_every_steps > 0, "--snapshot-every-steps"},
      {given(vm, "snapshot-dir"), "--snapshot-dir"},
      {given(vm, "checkpoint-lock-wait"), "--checkpoint-lock-wait"}};
  for (const auto& [asked, option] : asks)
    HPC_REQUIRE(!asked, option, " needs --checkpoint-dir: without it no checkpoint is written",
                std::strncmp(option, "--snapshot", 10) == 0 ? " and no snapshot resumed" : "");
}

// The table's options in their groups, bound to o, under the usage line; with the command
// line's own (help, version, config) first.
po::options_description description(TrainOptions& o, std::string* config) {
  po::options_description all("Usage: hpctrain [train] [options]\n"
                              "  or:  hpctrain evaluate --checkpoint PATH [options]    (test accuracy of a checkpoint)\n"
                              "  or:  hpctrain inspect PATH [--json]                   (what a checkpoint holds)\n"
                              "  or:  hpctrain export --checkpoint PATH --output FILE  (the model as an ONNX file)\n"
                              "  or:  hpctrain predict --checkpoint PATH IMAGES...     (classify PNG and JPEG images)\n"
                              "  or:  hpctrain clean-snapshots [options]               (free old snapshots' host memory)\n"
                              "  or:  hpctrain persist-snapshot --checkpoint-dir DIR   (the newest snapshot into DIR)\n"
                              "Trains a model; with no options, the default job (cnn on Fashion-MNIST, 4 epochs). "
                              "Run under mpirun for data parallelism");
  for (const OptionGroup& group : option_table()) {
    po::options_description d(group.caption);
    if (&group == &option_table().front())
      d.add_options()("help,h", "print this help and exit")("version", "print the version and exit")(
          "config", po::value(config), "read options from FILE (name = value lines with the long options' names, "
                                       "# comments; a text file of at most 1 MB); the command line wins");
    for (const Option& option : group.options) option.add(d, o);
    all.add(d);
  }
  return all;
}

// The command line, then the config file (whose values the command line's win); nullopt when
// --help or --version was handled.
std::optional<po::variables_map> parse_into(int argc, const char* const* argv, TrainOptions& o, bool speak) {
  std::string config;
  const po::options_description all = description(o, &config);
  po::variables_map vm;
  try {
    // No positional options: a stray word ("hpctrain resnet20") is an error, not ignored.
    po::store(po::command_line_parser(argc, argv).options(all).positional({}).style(options::kCommandLineStyle).run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(options::error_text(e, argc, argv, all, {}));
  }
  // --help and --version first: a --config file that is missing or wrong ended them with its error.
  if (vm.count("help")) {
    if (speak) log::write_help(detail::concat(all, "\n"));
    return std::nullopt;
  }
  if (vm.count("version")) {
    if (speak)
      log::write_help(detail::concat("hpctrain ", HPCTRAIN_VERSION, " (revision ", build_revision(), "; CPU GEMM: ",
                                     nn::gemm_backend(), ", ", nn::cpu_kernels(), "; ", device::describe(), ")\n"));
    return std::nullopt;
  }
  // Stored after the command line, so options given there win.
  if (vm.count("config")) store_config_file(vm["config"].as<std::string>(), all, vm);
  return vm;
}

const Option* find_option(const std::string& name) {
  for (const OptionGroup& group : option_table())
    for (const Option& option : group.options)
      if (option.name == name) return &option;
  return nullptr;
}

}  // namespace

std::optional<TrainOptions> parse_options(int argc, const char* const* argv, bool speak) {
  TrainOptions o;
  const std::optional<po::variables_map> vm = parse_into(argc, argv, o, speak);
  if (!vm) return std::nullopt;
  read_table(*vm, o);
  validate_distinct_files(o, *vm);
  validate_step_metrics(o);
  HPC_REQUIRE(o.global_batch_size == 0 || (*vm)["batch-size"].defaulted(),
              "give --batch-size (per rank) or --global-batch-size (over all ranks), not both");
  validate_each_value(o);
  validate_together(o);
  if (speak) {
    warn_other_schedules_options(o, *vm);
    warn_options_without_effect(o, *vm);
  }
  validate_checkpointing(o, *vm);
  return o;
}

std::string help_text() {
  TrainOptions o;
  std::string config;
  std::ostringstream os;
  os << description(o, &config);
  return os.str();
}

std::vector<OptionRule> option_rules() {
  std::vector<OptionRule> rules;
  for (const OptionGroup& group : option_table())
    for (const Option& option : group.options) rules.push_back({option.name, option.rule});
  return rules;
}

std::vector<std::pair<std::string, std::string>> option_values(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const OptionGroup& group : option_table())
    for (const Option& option : group.options)
      if (option.rule != Rule::Local) v.emplace_back(option.name, option.value(o));
  return v;
}

std::vector<std::pair<std::string, std::string>> all_option_values(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const OptionGroup& group : option_table())
    for (const Option& option : group.options) v.emplace_back(option.name, option.value(o));
  return v;
}

std::vector<std::pair<std::string, std::string>> values_every_rank_shares(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> v = option_values(o);
  for (const char* name : {"checkpoint-dir", "resume", "snapshot-every-steps", "checkpoint-every-steps",
                           "checkpoint-each-epoch", "timeline-file", "stop-signals"})
    v.emplace_back(name, find_option(name)->value(o));
  return v;
}

bool must_match_on_resume(const std::string& name) {
  const Option* option = find_option(name);
  return option && option->rule == Rule::Match;
}

bool records_option(const std::map<std::string, std::string>& meta, const std::string& name) {
  return meta.count("option." + name) > 0;
}

TrainOptions recorded_options(const std::map<std::string, std::string>& meta,
                              const std::vector<std::string>& names) {
  TrainOptions o;
  for (const std::string& name : names) {
    const Option* option = find_option(name);
    HPC_CHECK(option && option->rule != Rule::Local, "--", name, " is not an option checkpoints record");
    const auto it = meta.find("option." + name);
    HPC_REQUIRE(it != meta.end(), "the checkpoint does not record --", name);
    try {
      option->parse(it->second, o);
    } catch (const Error& e) {
      usage_error(e.what(), " (as the checkpoint records it)");
    }
  }
  return o;
}

}  // namespace hpc::train
