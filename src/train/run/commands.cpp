#include "train/run/commands.hpp"

#include <boost/program_options.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/hash.hpp"
#include "core/json.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "core/spelling.hpp"
#include "data/facts.hpp"
#include "dist/agree.hpp"
#include "nn/gemm.hpp"
#include "train/observe/metrics.hpp"
#include "train/options/options.hpp"
#include "train/options/subcommand.hpp"
#include "train/run/boundary.hpp"
#include "train/run/trainer.hpp"
#include "train/serve/serving.hpp"
#include "train/state/checkpointing.hpp"
#include "train/stop/watchdog.hpp"

namespace hpc::train {
namespace po = boost::program_options;
namespace fs = std::filesystem;
namespace {

std::string utc_time(int64_t unix_seconds) {
  // Years 1970 to 9999 (a crafted file's time printed as year -1126091476); "?" otherwise.
  if (unix_seconds < 0 || unix_seconds > 253402300799) return "?";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string human_bytes(double n) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (n >= 1000 && u < 4) n /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
  return buf;
}

// inspect's lines escaped as predict's (one_line_unambiguous): a checkpoint's or heartbeat's
// bytes (a value edited or damaged, a name from another system's encoding) never reach the
// terminal raw, and a backslash doubled tells a name's "\n" (backslash, n) from an escaped newline.
void print_lines(const std::string& text) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    out += one_line_unambiguous(text.substr(at, end - at)) + "\n";
    at = end + 1;
  }
  log::write_standard_output(out);
}

std::string meta_or(const std::map<std::string, std::string>& meta, const std::string& key,
                    const std::string& otherwise = "?") {
  auto it = meta.find(key);
  return it == meta.end() ? otherwise : it->second;
}

}  // namespace

void require_known_command(const char* word) {
  const std::vector<std::string> known(std::begin(kCommandNames), std::end(kCommandNames));
  if (std::find(known.begin(), known.end(), word) != known.end()) return;
  std::string names;
  for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
  usage_error("unknown command '", word, "'", did_you_mean(known, word), "; the commands are ", names,
              " (hpctrain --help lists the training options)");
}

namespace {

// ---- inspect -------------------------------------------------------------------------------

struct Inspected {
  std::string path;
  uint64_t size = 0;
  ckpt::Layout layout;
  std::string problem;  // empty: valid
  bool misfit = false;  // it reads, but does not fit its model: --resume auto refuses it, not passes it by
  bool refused = false;  // misfit, unreadable or of a newer format: refused by --resume auto, not passed by
  std::string param_checksum, state_checksum;  // of a valid one (as a done line gives them)
};

Inspected inspect_file(const std::string& path) {
  Inspected r;
  r.path = path;
  std::error_code ec;
  r.size = fs::file_size(path, ec);
  if (ec) r.size = 0;  // not a regular file (a FIFO, a device): its problem says so below
  try {
    const ckpt::Checkpoint c = ckpt::load_checkpoint(path, &r.layout);
    r.param_checksum = param_checksum(c);
    r.state_checksum = state_checksum(c);
    // Its arenas as its model has them: a file made or edited elsewhere may hold other counts.
    if (const std::optional<std::string> misfit = model_misfit(c)) {
      r.problem = *misfit;
      r.misfit = r.refused = true;
    }
  } catch (const ckpt::RefusedCheckpoint& e) {  // unreadable, or of a newer format
    r.problem = e.what();
    r.refused = true;
  } catch (const Error& e) {
    r.problem = e.what();
  }
  return r;
}

// The whole value as a number, else -1 (stoll took "12abc" for 12: a heartbeat "1796380319 s ago").
int64_t integer_or(const std::map<std::string, std::string>& meta, const std::string& key) {
  const std::string text = meta_or(meta, key, "-1");
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && end == text.data() + text.size() ? v : -1;
}

// Where in the run a checkpoint stands, as people count epochs: "after epoch 2" or
// "in epoch 2, 15 steps into it".
std::string position_text(const std::map<std::string, std::string>& meta) {
  const int64_t epoch = integer_or(meta, "epoch"), into = integer_or(meta, "step_in_epoch");
  if (epoch < 0 || into < 0 || epoch == std::numeric_limits<int64_t>::max()) return "epoch ?";  // (a crafted file)
  if (into == 0) return epoch == 0 ? "at the start" : "after epoch " + std::to_string(epoch);
  return "in epoch " + std::to_string(epoch + 1) + ", " + std::to_string(into) + " steps into it";
}

std::string json_key(std::string name) {
  for (char& ch : name)
    if (ch == ' ' || ch == '-') ch = '_';
  return name;
}

// One flat JSON object per checkpoint: the header fields (numbers where they are numbers),
// the options it was made with as "option.NAME" strings, validity and sizes. A header field under
// a key inspect sets itself is left out: a file whose header said valid=yes printed "yes" in
// inspect's place, and a path of its own.
std::string inspected_json(const Inspected& r) {
  static const std::set<std::string> integers{"step", "epoch", "step_in_epoch", "global_batch_size", "world_size",
                                              "time"};
  static const std::set<std::string> own{"path",  "path_escaped",   "valid",          "size_bytes",
                                         "error", "format_version", "param_checksum", "state_checksum"};
  JsonObject f{{"path", r.path}};
  // Two paths that are not UTF-8 could read the same in "path" (U+FFFD): this one tells them
  // apart, as the text form does (\xNN for each such byte), as predict's --json does.
  if (!is_utf8(r.path)) f["path_escaped"] = one_line_unambiguous(r.path);
  f["valid"] = r.problem.empty() ? "yes" : "no";
  f["size_bytes"] = static_cast<int64_t>(r.size);
  f["format_version"] = static_cast<int64_t>(r.layout.version);
  if (!r.problem.empty()) f["error"] = r.problem;
  for (const auto& [key, value] : r.layout.meta) {
    if (own.count(key) || key.rfind("bytes.", 0) == 0) continue;
    if (integers.count(key)) f[key] = integer_or(r.layout.meta, key);
    else if (key == "samples_seen") f[key] = std::atof(value.c_str());
    else f[key] = value;
  }
  if (r.problem.empty()) {
    f["param_checksum"] = r.param_checksum;
    f["state_checksum"] = r.state_checksum;
  }
  for (const auto& s : r.layout.sections) f["bytes." + json_key(s.name)] = static_cast<int64_t>(s.bytes);
  return json_text(f);
}

void print_inspected(const Inspected& r) {
  const auto& m = r.layout.meta;
  std::ostringstream out;
  out << "checkpoint: " << r.path << "\n";
  out << "valid: " << (r.problem.empty() ? "yes" : "no: " + r.problem) << "\n";
  out << "size: " << human_bytes(static_cast<double>(r.size)) << " (" << r.size << " bytes)\n";
  if (r.layout.version) out << "format: version " << r.layout.version << "\n";
  if (!m.empty()) {
    out << "written by: hpctrain " << meta_or(m, "hpctrain_version")
        << (m.count("hpctrain_revision") ? " (revision " + m.at("hpctrain_revision") + ")" : std::string()) << " on "
        << meta_or(m, "world_size")
        << " rank(s), " << utc_time(integer_or(m, "time")) << "\n";
    out << "model: " << meta_or(m, "model") << " (layout signature " << meta_or(m, "model_signature") << ")\n";
    if (m.count("max_pools"))  // not recorded before resnet18/50's ImageNet stem became torchvision's
      out << "max pools: " << (m.at("max_pools").empty() ? "none" : m.at("max_pools")) << "\n";
    out << "position: step " << meta_or(m, "step") << ", " << position_text(m) << "; " << meta_or(m, "samples_seen")
        << " samples seen\n";
    out << "global batch: " << meta_or(m, "global_batch_size") << "\n";
    if (m.count("kernels"))  // recorded since 2026-12-06: a resume on others says its bits differ
      out << "computed with: " << m.at("kernels") << "\n";
    if (r.problem.empty())
      out << "checksums: state " << r.state_checksum << ", parameters " << r.param_checksum << "\n";
    out << "seed: " << meta_or(m, "option.seed") << ", dataset: " << meta_or(m, "option.dataset") << "\n";
    if (m.count("class_names"))  // packed shards' (the other datasets' names are fixed)
      out << "class names: " << m.at("class_names") << " (digest " << meta_or(m, "classes_digest") << ")\n";
    if (m.count("training_set_digest"))  // a resume refuses other data
      out << "training set: digest " << m.at("training_set_digest") << " (its count, image shape and labels in order)\n";
  }
  if (!r.layout.sections.empty()) {
    out << "sections:";
    for (const auto& s : r.layout.sections)
      out << " " << s.name << " " << human_bytes(static_cast<double>(s.bytes)) << (s.checksum_ok ? "" : " (BAD CRC)")
          << ";";
    out << "\n";
  }
  if (!m.empty()) {
    out << "options:";
    for (const auto& [key, value] : m)
      if (key.rfind("option.", 0) == 0) out << " --" << key.substr(7) << "=" << value;
    out << "\n";
  }
  print_lines(out.str());
}

// One line per checkpoint of a directory, newest first, then the heartbeat.
void print_directory_line(const Inspected& r) {
  const auto& m = r.layout.meta;
  std::ostringstream out;
  out << fs::path(r.path).filename().string() << "  step " << meta_or(m, "step") << "  " << position_text(m) << "  "
      << meta_or(m, "model") << "  "
      << (m.count("time") ? utc_time(integer_or(m, "time")) : std::string("?")) << "  "
      << human_bytes(static_cast<double>(r.size)) << "  " << (r.problem.empty() ? "valid" : "INVALID: " + r.problem)
      << "\n";
  print_lines(out.str());
}

void print_heartbeat(const std::string& dir) {
  const std::map<std::string, std::string> beat = ckpt::read_heartbeat(dir);
  if (beat.empty()) return;
  const int64_t t = integer_or(beat, "unix_time");
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  print_lines(detail::concat("heartbeat: ", meta_or(beat, "state"), ", step ", meta_or(beat, "step"), ", ",
                             meta_or(beat, "epoch"), " epoch(s) done, pid ", meta_or(beat, "pid"), ", ",
                             t >= 0 ? std::to_string(now - t) + " s ago" : "time unknown", "\n"));
}

int inspect(const std::string& path, bool json) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::vector<std::string> files = ckpt::list_checkpoints(path);
    int valid = 0;
    std::optional<Inspected> newest;  // that reads: the one --resume auto takes, or refuses
    for (const std::string& file : files) {
      const Inspected r = inspect_file(file);
      valid += r.problem.empty();
      if (!newest && (r.problem.empty() || r.refused)) newest = r;
      if (json) log::write_standard_output(inspected_json(r) + "\n");
      else print_directory_line(r);
    }
    if (!json) print_heartbeat(path);
    log::flush_standard_output();
    HPC_REQUIRE(!files.empty(), "no checkpoints (ckpt-*.hpck) in ", path);
    HPC_REQUIRE(!newest || !newest->misfit, "the newest checkpoint that reads, ", newest->path,
                ", does not fit its model (", newest->problem, "): --resume auto refuses it rather than pass it by "
                "for an older one; move it aside to continue from the one before");
    HPC_REQUIRE(!newest || !newest->refused, newest->problem, ": --resume auto refuses it rather than pass it by for an "
                "older one; move it aside to continue from the one before");
    HPC_REQUIRE(valid > 0, "none of the ", files.size(), " checkpoint(s) in ", path, " is valid");
    return kExitSuccess;
  }
  // Named as evaluate names it, with the system's reason: exists() took a path through a file
  // (ckpt-1.hpck/) for one not there, "no such file or directory" where it is "Not a directory".
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) usage_error("cannot read checkpoint ", path, ": ", std::strerror(errno));
  const Inspected r = inspect_file(path);
  if (json) log::write_standard_output(inspected_json(r) + "\n");
  else print_inspected(r);
  log::flush_standard_output();
  if (!r.problem.empty()) usage_error(r.problem);
  return kExitSuccess;
}

// evaluate on another dataset than the checkpoint's: refused where the model cannot take its
// images or classes, else said once (an accuracy on other data is rarely what was meant).
void check_evaluation_data(const ckpt::Checkpoint& c, const nn::Model<float>& model, data::DatasetKind dataset,
                           bool speak) {
  if (!records_option(c.meta, "dataset")) return check_model(c, model);
  const data::DatasetKind trained = recorded_options(c.meta, {"dataset"}).dataset;
  if (trained == dataset) return check_model(c, model);
  const char* trained_on = data::dataset_name(trained);
  const char* name = data::dataset_name(dataset);
  try {
    check_model(c, model);
  } catch (const Error&) {
    usage_error("--dataset ", name, ": the checkpoint's ", c.text("model"), " was trained on ", trained_on,
                " and cannot take ", name, "'s images or classes (evaluate it on ", trained_on, ")");
  }
  if (speak)
    log::warn("--dataset ", name, " is not the dataset the checkpoint was trained on (", trained_on,
              "): this is its accuracy on other data");
}

// The same refusal before the test set is read, where its shape and classes are known without it
// (every dataset but packed shards, whose classes come from their manifests as they are opened):
// a model that cannot take them was refused only after the whole set was read (synthetic's 2048
// images made), or after a missing directory of a dataset it could never take was the error.
void check_evaluation_fit(const ckpt::Checkpoint& c, data::DatasetKind dataset, int64_t image_size) {
  if (dataset == data::DatasetKind::Shards) return;
  const data::DatasetFacts f = data::dataset_facts(data::dataset_name(dataset), image_size);
  data::Dataset shape;  // the model's view of its dataset: the sample shape and the classes
  shape.height = f.height, shape.width = f.width, shape.channels = f.channels, shape.classes = f.classes;
  check_evaluation_data(c, nn::Model<float>(model_spec_of(c, shape)), dataset, /*speak=*/false);
}

struct EvaluateArgs {
  std::string checkpoint, dataset, data_dir, metrics_file;
  int64_t test_samples = 0, batch_size = 1000;
  int threads = 0;
  double start_timeout = 1800, step_timeout = 600;  // the watchdogs', as training's (0: off)
};

// evaluate's options, through the kit every command line uses (core/option_kit.hpp). --dataset is
// text until the checkpoint is read (none: the checkpoint's), then read as training reads it.
const std::vector<options::Entry<EvaluateArgs>>& evaluate_table() {
  using O = EvaluateArgs;
  static const std::vector<options::Entry<O>> table{
      subcommand_options::checkpoint(&O::checkpoint, "its newest valid checkpoint"),
      options::path("dataset", &O::dataset,
                    "fashion-mnist, mnist, cifar10, cifar100 or shards (default: the checkpoint's)",
                    options::Presence::NotBlank),
      options::path("data-dir", &O::data_dir, "directory of the dataset files (default: the dataset's usual place)",
                    options::Presence::NotBlank),
      options::number("test-samples", &O::test_samples, "evaluate on the first N test samples only (0: all; at most as many as the set holds)"),
      options::number("eval-batch-size", &O::batch_size, "samples per batch"),
      subcommand_options::threads(&O::threads, "math-library threads"),
      options::path("metrics-file", &O::metrics_file,
                    "append the result as a JSON line (event \"evaluate\") to FILE", options::Presence::NotBlank),
      options::duration("start-timeout", &O::start_timeout,
                        "end (exit code 124) when reading the checkpoint and the test set takes this long, as when a "
                        "peer rank stopped or died (0: never; else 1s to 1000h)"),
      options::duration("step-timeout", &O::step_timeout,
                        "end (exit code 124) when no batch finishes for this long, as when a peer rank stopped or "
                        "died (0: never; else 1s to 1000h)"),
  };
  return table;
}

// evaluate's options, checked on every rank alike; nullopt when --help was handled.
std::optional<EvaluateArgs> parse_evaluate(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  return parse_subcommand_options<EvaluateArgs>(
      argc, argv, ctx,
      "Usage: hpctrain evaluate --checkpoint PATH [options]\n"
      "Prints the test accuracy and loss of a checkpoint's model (batch inference; under mpirun each rank\n"
      "evaluates a part of the test set)",
      evaluate_table(), {}, [](EvaluateArgs& a, const po::variables_map&) {
        require_non_negative(a.test_samples, "test-samples");
        require_batch_size(a.batch_size, "eval-batch-size");
        require_thread_count(a.threads);
        require_watchdog_timeout(a.start_timeout, "start-timeout");
        require_watchdog_timeout(a.step_timeout, "step-timeout");
        require_distinct_files({{"--metrics-file", a.metrics_file}},
                               ckpt::checkpoint_inputs("--checkpoint", a.checkpoint));
      });
}

// A checkpoint's model and the test set it is evaluated on.
struct Evaluation {
  data::DatasetKind dataset = data::DatasetKind::FashionMnist;
  data::DatasetPair ds;
  std::unique_ptr<nn::Model<float>> model;
  std::unique_ptr<MetricsWriter> metrics;  // rank 0's, with --metrics-file
  int threads = 0;
};

// Collective: any rank's problem (a missing file on one host) is every rank's. `path`: the
// checkpoint file read.
Evaluation prepare_evaluation(const EvaluateArgs& a, const ckpt::Checkpoint& c, const std::string& path,
                              dist::ProcessContext& ctx) {
  Evaluation e;
  const bool lead = ctx.rank() == 0;
  dist::collectively(ctx, [&] {
    // Again for the file actually read: a run may have written a newer checkpoint since parsing.
    require_distinct_files({{"--metrics-file", a.metrics_file}}, {{"the checkpoint", path}});
    // A position no run writes (step -5): refused as inspect and a resume refuse it, where it was
    // reported, and written to the metrics file, as the step evaluated.
    recorded_position(c);
    // Not under a name the checkpoint's directory's own files take (its lock, its heartbeat): the
    // next run there replaced the results, or moved them away.
    ckpt::require_not_its_own_name({"--metrics-file", a.metrics_file}, ckpt::checkpoint_folder(path),
                                   "the checkpoint's directory");
    // Its one line is evaluate's result: a write that fails is an error, not a warning and exit 0.
    if (lead && !a.metrics_file.empty())
      e.metrics = std::make_unique<MetricsWriter>(a.metrics_file, "--metrics-file", MetricsWriter::OnFailure::Fail);
    e.threads = dist::math_threads(ctx, a.threads);
    nn::set_math_threads(e.threads);
    e.dataset = a.dataset.empty() ? recorded_options(c.meta, {"dataset"}).dataset : data::parse_dataset(a.dataset);
    const std::string dir = a.data_dir.empty() ? data::default_data_dir(e.dataset) : a.data_dir;
    // Packed shards are cropped (synthetic images made) to the size the model was trained on.
    const bool sized = e.dataset == data::DatasetKind::Shards || e.dataset == data::DatasetKind::Synthetic;
    const bool recorded = records_option(c.meta, "image-size");
    const int64_t image_size = sized && recorded ? recorded_options(c.meta, {"image-size"}).image_size : 0;
    check_evaluation_fit(c, e.dataset, image_size);
    e.ds = data::load_dataset(e.dataset, dir, image_size, /*test_only=*/true);
    e.ds.test.truncate_to_option(a.test_samples, "--test-samples", "test");
    e.model = std::make_unique<nn::Model<float>>(model_spec_of(c, e.ds.test));
    check_evaluation_data(c, *e.model, e.dataset, lead);
    require_same_classes(c, e.ds.test.class_names, "the packed dataset " + e.ds.test.source);
    ckpt::require_finite_state(c, path);  // as export and predict refuse it
    apply_model_state(c, *e.model);
  });
  // Each rank evaluates its part of one test set in batches of one size: a rank given another
  // (a per-rank --test-samples, --eval-batch-size, --dataset or --data-dir contents) mixed its
  // figures into rank 0's, or died in a collective of another size.
  const std::string mine = detail::concat(data::dataset_name(e.dataset), ", ", e.ds.test.count, " test samples, ",
                                          "batches of ", a.batch_size);
  const uint64_t labels = fnv1a(e.ds.test.labels.data(), e.ds.test.labels.size() * sizeof e.ds.test.labels[0]);
  dist::require_same_text(
      ctx, mine, ErrorKind::Usage,
      [&](int r, const std::string& theirs) {
        return detail::concat("rank ", r, " evaluates another test set than rank 0 (", theirs, " there; ", mine,
                              " on rank 0, or other labels): every rank needs the same options and --data-dir contents");
      },
      labels);
  return e;
}

// Rank 0's line, and the metrics file's.
void report_evaluation(const Evaluation& e, const EvalResult& r, const ckpt::Checkpoint& c, const std::string& path,
                       double eval_seconds, double elapsed_seconds, int world) {
  const int64_t step = c.integer("step");
  const char* dataset = data::dataset_name(e.dataset);
  char line[400];
  std::snprintf(line, sizeof line, "test accuracy %.2f%%, test loss %.4f on %lld %s test samples: %s (%s at step %lld, %s)",
                100 * r.accuracy, r.loss, static_cast<long long>(r.samples), dataset, path.c_str(),
                c.text("model").c_str(), static_cast<long long>(step), position_text(c.meta).c_str());
  log::write_standard_output(detail::concat(line, "\n"));
  if (e.metrics)
    e.metrics->write({{"event", std::string("evaluate")},
                      {"checkpoint", path},
                      {"model", c.text("model")},
                      {"step", step},
                      {"dataset", std::string(dataset)},
                      {"samples", r.samples},
                      {"test_loss", r.loss},
                      {"test_accuracy", r.accuracy},
                      {"images_per_second", static_cast<double>(r.samples) / std::max(eval_seconds, 1e-9)},
                      {"world_size", world},
                      {"threads", e.threads},
                      {"elapsed_seconds", elapsed_seconds}});
}

}  // namespace

namespace {
struct InspectArgs {
  std::string path;
  bool json = false;
};
}  // namespace

int run_inspect(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  static const std::vector<options::Entry<InspectArgs>> table{
      options::flag("json", &InspectArgs::json, "one JSON object per checkpoint instead of text"),
      options::path("path", &InspectArgs::path, "a checkpoint file or a checkpoint directory"),
  };
  po::positional_options_description positional;
  positional.add("path", 1);
  const std::optional<InspectArgs> a = parse_subcommand_options<InspectArgs>(
      argc, argv, ctx,
      "Usage: hpctrain inspect PATH [--json]\n"
      "Prints a checkpoint's header (step, epoch, model, time, size, sections, options) and whether it is valid;\n"
      "for a directory, one line per checkpoint, newest first, and the heartbeat. Exit code 0: valid (a directory:\n"
      "the newest checkpoint that reads is valid, so --resume auto can continue from it), 2: not",
      table, positional, [](InspectArgs& given, const po::variables_map& vm) {
        HPC_REQUIRE(vm.count("path"), "hpctrain inspect needs a PATH: a checkpoint file or directory");
        HPC_REQUIRE(!given.path.empty(), "the PATH of hpctrain inspect is empty (an unset variable?): give a "
                    "checkpoint file or directory");
      });
  if (!a) return kExitSuccess;
  int code = kExitSuccess;
  dist::collectively(ctx, [&] {  // rank 0 reads; its verdict is every rank's
    if (ctx.rank() == 0) code = inspect(a->path, a->json);
  });
  return code;
}

int run_evaluate(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  const std::optional<EvaluateArgs> args = parse_evaluate(argc, argv, ctx);
  if (!args) return kExitSuccess;
  const bool lead = ctx.rank() == 0;
  if (!lead) log::set_level(log::Level::Warn);
  const auto t0 = std::chrono::steady_clock::now();
  // Under mpirun every part waits for the peers: a rank that stopped or died would hold the rest.
  auto watchdog =
      std::make_unique<StepWatchdog>(args->start_timeout, ctx.where(), StepWatchdog::Expire{}, StepWatchdog::Poll{},
                                     Watched::EvaluationSetUp, ctx.world_size() > 1);
  std::string path;
  const std::optional<ckpt::Checkpoint> c = read_on_rank0(
      ctx,
      [&]() -> std::optional<std::pair<std::string, ckpt::Checkpoint>> {
        return load_checkpoint_or_latest(args->checkpoint);
      },
      &path);
  // The watchdogs' test hooks: HPCTRAIN_TEST_SIGNAL_IN_SETUP=1@r:stop stops rank r once the
  // checkpoint is read, HPCTRAIN_TEST_SIGNAL_AFTER_STEP=k@r:stop after its batch k.
  const auto stop_if = [&](const char* hook, int64_t at) {
    if (const TestHook h = TestHook::from_environment(hook, SIGSTOP); h.fires(at, ctx.rank())) ::kill(::getpid(), h.signal);
  };
  stop_if("HPCTRAIN_TEST_SIGNAL_IN_SETUP", 1);
  const Evaluation e = prepare_evaluation(*args, *c, path, ctx);
  const auto t_eval = std::chrono::steady_clock::now();
  watchdog.reset();
  watchdog = std::make_unique<StepWatchdog>(args->step_timeout, ctx.where(), StepWatchdog::Expire{},
                                            StepWatchdog::Poll{}, Watched::EvaluationBatches, ctx.world_size() > 1);
  int64_t batches = 0;
  const EvalResult r = evaluate(*e.model, e.ds.test, e.ds.norm, args->batch_size, &ctx.world(),
                                [&] {
                                  watchdog->progress(++batches);
                                  stop_if("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", batches);
                                },
                                e.threads);
  watchdog.reset();
  const auto t_end = std::chrono::steady_clock::now();
  if (lead)
    report_evaluation(e, r, *c, path, std::chrono::duration<double>(t_end - t_eval).count(),
                      std::chrono::duration<double>(t_end - t0).count(), ctx.world_size());
  return kExitSuccess;
}

}  // namespace hpc::train
