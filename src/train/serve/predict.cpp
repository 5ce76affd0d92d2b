// `hpctrain predict`: a checkpoint's model on the user's own images. Rank 0 lists the images;
// global batch b of the list runs on rank b % world, framed (data/image_file.hpp) and
// normalised exactly as evaluation normalises (data::BatchAssembler), on the CPU or the GPU
// (train/engine/inference.hpp). After each round of batches rank 0 gathers every rank's lines and
// prints them, so the output follows the list's order on any number of ranks.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/json.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "data/image_file.hpp"
#include "data/loader.hpp"
#include "dist/agree.hpp"
#include "nn/gemm.hpp"
#include "train/engine/engine.hpp"
#include "train/engine/inference.hpp"
#include "train/options/options.hpp"
#include "train/options/subcommand.hpp"
#include "train/serve/serving.hpp"

namespace hpc::train {
namespace po = boost::program_options;
namespace fs = std::filesystem;
namespace {

struct PredictOptions {
  std::string checkpoint, data_dir;
  Device device = Device::Auto;
  std::vector<std::string> inputs;
  int64_t top_k = 5, batch_size = 64;
  int threads = 0;
  bool json = false, logits = false, skip_bad = false;
  bool top_k_given = false;  // the default, 5, is the model's classes where it has fewer
};

// ---- the list of images ----------------------------------------------------------------------

bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The PNG and JPEG files (by name) under dir, sorted, through links to directories as well (a
// loop of them is refused, naming it); a directory that cannot be walked is a problem. An
// entry named as an image that is no directory is listed whatever it is (a dangling link, a
// FIFO): reading it says what is wrong, as for a path given alone, rather than passing it by.
std::vector<std::string> walk(const std::string& dir) {
  std::vector<std::string> found;
  walk_files(dir, [&](const fs::directory_entry& e) {
    if (has_image_extension(e.path())) found.push_back(e.path().string());
  });
  std::sort(found.begin(), found.end());
  HPC_REQUIRE(!found.empty(), "no PNG or JPEG images (*.png, *.jpg, *.jpeg) in directory ", dir);
  return found;
}

// Every input as image files: a file as it is (its content is checked when it is read), a
// directory walked. A path that cannot be used is a problem: refused, or with --skip-bad a warning.
std::vector<std::string> list_images(const PredictOptions& o, int64_t& skipped) {
  std::vector<std::string> files;
  for (const std::string& input : o.inputs) {
    try {
      struct stat st {};
      if (::stat(input.c_str(), &st) != 0) usage_error("cannot read image ", input, ": ", std::strerror(errno));
      if (!S_ISDIR(st.st_mode)) {
        files.push_back(input);
        continue;
      }
      const std::vector<std::string> found = walk(input);
      files.insert(files.end(), found.begin(), found.end());
    } catch (const Error& e) {
      if (!o.skip_bad || e.kind() != ErrorKind::Usage) throw;
      log::warn("skipped: ", e.what());
      ++skipped;
    }
  }
  HPC_REQUIRE(!files.empty(), "no images to classify", o.skip_bad ? " (every input was skipped)" : "");
  return files;
}

std::vector<std::string> broadcast_list(dist::ProcessContext& ctx, const std::vector<std::string>& files) {
  std::string joined;
  for (const std::string& f : files) joined += f + '\0';  // NUL: the one byte no path holds
  joined = dist::broadcast_string(ctx.world(), joined, 0);
  std::vector<std::string> out;
  for (size_t b = 0, e; (e = joined.find('\0', b)) != std::string::npos; b = e + 1)
    out.push_back(joined.substr(b, e - b));
  return out;
}

// ---- one batch ---------------------------------------------------------------------------------

// What a rank has to say for its batch of a round: lines for stdout and stderr, in order.
struct Said {
  std::string out, err;
  int64_t classified = 0, skipped = 0;
};

class Predictor {
 public:
  Predictor(const PredictOptions& o, ServingModel& m, Inference& inference)
      : o_(o), m_(m), inference_(inference), top_k_(std::min<int64_t>(o.top_k, m.facts.classes)) {
    // A script asking for 1000 classes of a 10-class model got 10 rows without a word.
    HPC_REQUIRE(!o.top_k_given || o.top_k <= m.facts.classes, "--top-k ", o.top_k, " is more than the ",
                m.facts.classes, " classes of the checkpoint's model");
  }

  // Classifies files[begin, end) into said. A bad image is a usage error naming it, or with
  // --skip-bad a warning line.
  void classify(const std::vector<std::string>& files, int64_t begin, int64_t end, Said& said) {
    const data::DatasetFacts& f = m_.facts;
    data::Dataset frames;
    frames.height = f.height, frames.width = f.width, frames.channels = f.channels;
    const std::vector<Problem> problems = frame_all(files, begin, end, frames);
    const std::vector<uint32_t> good = keep_good(problems, frames, said);
    if (good.empty()) return;
    // Evaluation's normalisation (a table per channel), to the same floats.
    const data::BatchAssembler assembler(frames, f.norm, {}, 0);
    assembler.assemble(good, 0, false, batch_);
    inference_.logits(batch_.images, logits_);
    int64_t row = 0;
    for (size_t i = 0; i < problems.size(); ++i)
      if (problems[i].message.empty()) said.out += line(files[static_cast<size_t>(begin) + i], row++);
    said.classified += row;
  }

 private:
  struct Problem {
    std::string message;  // empty: the image is framed
    bool internal = false;
  };

  // Reads and frames files[begin, end) into frames.images, in parallel (decoding is most of the
  // work on small models); what went wrong with each, kept (exceptions must not leave the loop).
  std::vector<Problem> frame_all(const std::vector<std::string>& files, int64_t begin, int64_t end,
                                 data::Dataset& frames) const {
    const int64_t n = end - begin, bytes = frames.sample_bytes();
    std::vector<Problem> problems(static_cast<size_t>(n));
    frames.images.resize(static_cast<size_t>(n * bytes));
#pragma omp parallel for schedule(dynamic) num_threads(o_.threads)
    for (int64_t i = 0; i < n; ++i) {
      Problem& p = problems[static_cast<size_t>(i)];
      try {
        data::frame_for_model(data::read_image_file(files[static_cast<size_t>(begin + i)]), m_.facts,
                              frames.images.data() + i * bytes);
      } catch (const Error& e) {
        p = {e.what(), e.kind() != ErrorKind::Usage};
      } catch (const std::bad_alloc&) {
        // An image too big for the memory left (a small PNG can hold 16384 x 16384 pixels of
        // nothing): that image's problem, which --skip-bad passes by, not hpctrain's.
        p = {"image " + files[static_cast<size_t>(begin + i)] +
                 " does not fit in the memory left to decode it (fewer --threads decode fewer at once)",
             false};
      } catch (const std::exception& e) {
        p = {e.what(), true};
      }
    }
    return problems;
  }

  // The framed images moved to the front of frames (the assembler takes samples by index) and
  // their indices; each bad one refused, or with --skip-bad said as a warning.
  std::vector<uint32_t> keep_good(const std::vector<Problem>& problems, data::Dataset& frames, Said& said) const {
    const int64_t bytes = frames.sample_bytes();
    std::vector<uint32_t> good;
    for (size_t i = 0; i < problems.size(); ++i) {
      const Problem& p = problems[i];
      HPC_CHECK(!p.internal, p.message);
      if (!p.message.empty()) {
        if (!o_.skip_bad) usage_error(p.message);
        said.err += "hpctrain: warning: skipped: " + one_line(p.message) + "\n";
        ++said.skipped;
        continue;
      }
      uint8_t* images = frames.images.data();
      if (good.size() != i) std::memmove(images + good.size() * bytes, images + i * bytes, static_cast<size_t>(bytes));
      good.push_back(static_cast<uint32_t>(good.size()));
    }
    frames.count = static_cast<int64_t>(good.size());
    frames.labels.assign(good.size(), 0);
    return good;
  }

  // The line for image `path`, row `row` of the logits.
  std::string line(const std::string& path, int64_t row) const {
    const int64_t classes = m_.facts.classes;
    const float* z = logits_.data() + row * classes;
    const double mx = *std::max_element(z, z + classes);
    std::vector<double> p(static_cast<size_t>(classes));
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) sum += p[static_cast<size_t>(j)] = std::exp(z[j] - mx);
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(static_cast<size_t>(classes));
    std::iota(order.begin(), order.end(), 0);
    // The most probable first; ties in class order (as evaluation's argmax takes the first).
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return z[a] > z[b];
    });
    order.resize(static_cast<size_t>(top_k_));
    return o_.json ? json_line(path, order, p, z) : text_line(path, order, p);
  }

  std::string name_of(int64_t k) const {
    const auto& names = m_.facts.class_names;
    return names.empty() ? std::to_string(k) : names[static_cast<size_t>(k)];
  }

  // A path or class name in the text form: control characters escaped as in error lines
  // (one_line) and, so that such an escape is told apart from the same characters in a name,
  // a backslash doubled. "a\nb.png" (newline) and "a\\nb.png" (backslash, n) print apart.
  static std::string text_field(const std::string& text) { return one_line_unambiguous(text); }

  std::string text_line(const std::string& path, const std::vector<int64_t>& order,
                        const std::vector<double>& p) const {
    std::ostringstream s;
    s << text_field(path) << ":";
    for (size_t i = 0; i < order.size(); ++i) {
      char prob[32];
      std::snprintf(prob, sizeof prob, "%.4f", p[static_cast<size_t>(order[i])]);
      s << (i ? ", " : " ") << text_field(name_of(order[i])) << " " << prob;
    }
    return s.str() + "\n";
  }

  std::string json_line(const std::string& path, const std::vector<int64_t>& order, const std::vector<double>& p,
                        const float* z) const {
    nlohmann::ordered_json j;
    j["path"] = path;
    // A path that is not UTF-8 is written with U+FFFD where its bytes are not, and two such paths
    // could read the same: "path_escaped" then gives it as the text form does (\xNN for each such
    // byte, a backslash doubled), one string for one path.
    if (!is_utf8(path)) j["path_escaped"] = text_field(path);
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (int64_t k : order)
      top.push_back({{"class", k}, {"name", name_of(k)}, {"probability", p[static_cast<size_t>(k)]}});
    j["top"] = std::move(top);
    if (o_.logits) j["logits"] = std::vector<float>(z, z + m_.facts.classes);
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }

  const PredictOptions& o_;
  ServingModel& m_;
  Inference& inference_;
  int64_t top_k_;
  data::Batch batch_;
  std::vector<float> logits_;
};

// Rank 0 prints every rank's lines in rank order (= the list's order within a round). Lines that
// cannot be written (a full disk, a pipe closed early) are an error on every rank: the run went on
// to its summary and exit 0 as if every result were there.
void speak(dist::ProcessContext& ctx, const Said& mine) {
  for (int r = 0; r < ctx.world_size(); ++r) {
    const std::string out = ctx.world_size() == 1 ? mine.out : dist::broadcast_string(ctx.world(), mine.out, r);
    const std::string err = ctx.world_size() == 1 ? mine.err : dist::broadcast_string(ctx.world(), mine.err, r);
    if (ctx.rank() != 0) continue;
    log::write_standard_output(out);  // before the lines on stderr that go with them
    std::cerr << err << std::flush;
  }
  dist::collectively(ctx, log::require_standard_output_written);
}

std::unique_ptr<Inference> make_inference(const PredictOptions& o, ServingModel& m, dist::ProcessContext& ctx) {
  std::string why;
  const bool gpu = o.device != Device::Cpu && gpu_training_available(&why);
  // As training: --device cuda without a usable GPU is an error, never a quiet fallback.
  HPC_REQUIRE(gpu || o.device != Device::Cuda, "--device cuda: ", why, "; or use --device cpu");
  if (gpu) return make_gpu_inference(*m.model, ctx.local_rank());
  return make_cpu_inference(*m.model, o.threads);
}

// predict's options, through the kit every command line uses (core/option_kit.hpp); --device is
// the choice training takes.
const std::vector<options::Entry<PredictOptions>>& predict_table() {
  using O = PredictOptions;
  static const std::vector<options::Entry<O>> table{
      subcommand_options::checkpoint(&O::checkpoint),
      options::list("images", &O::inputs, "image files or directories (also as positional arguments)"),
      options::noting_given(options::number("top-k", &O::top_k, "classes per image (default 5, or all the model's "
                                                                "where it has fewer; at most the model's)"),
                            &O::top_k_given),
      options::flag("json", &O::json,
                    "JSON Lines instead of text: {\"path\", \"top\": [{\"class\", \"name\", \"probability\"}, ...]} "
                    "(and \"path_escaped\" for a path that is not UTF-8)"),
      options::flag("logits", &O::logits, "with --json: add \"logits\", the model's raw outputs for every class"),
      options::number("batch-size", &O::batch_size, "images per batch"),
      subcommand_options::threads(&O::threads, "decoding and math threads"),
      options::flag("skip-bad", &O::skip_bad,
                    "warn about an image that cannot be read (or a path that cannot be used) and classify the rest"),
      subcommand_options::served_data_dir(&O::data_dir),
      options::choice("device", &O::device, kDeviceNames,
                      "auto (this rank's GPU when the build and the machine have one), cpu or cuda"),
  };
  return table;
}

// What the table cannot check alone: images given, none blank; the ranges; --logits with --json.
void check_options(PredictOptions& o, const po::variables_map&) {
  HPC_REQUIRE(!o.inputs.empty(), "hpctrain predict needs IMAGES: image files or directories of them");
  for (const std::string& input : o.inputs)
    HPC_REQUIRE(!input.empty(), "an IMAGE given to hpctrain predict is empty (an unset variable?)");
  require_positive(o.top_k, "top-k");
  require_batch_size(o.batch_size, "batch-size");
  require_thread_count(o.threads);
  HPC_REQUIRE(!o.logits || o.json, "--logits adds the logits to --json's lines: give --json too");
}

// predict's options; nullopt when --help was handled.
std::optional<PredictOptions> parse_predict(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  po::positional_options_description positional;
  positional.add("images", -1);
  return parse_subcommand_options<PredictOptions>(
      argc, argv, ctx,
      "Usage: hpctrain predict --checkpoint PATH [options] IMAGES...\n"
      "Classifies PNG and JPEG images (files, or directories walked for *.png, *.jpg, *.jpeg) with a checkpoint's\n"
      "model: each image is framed as evaluation frames the test images (the centre square resized to the model's\n"
      "size; packed shards: the centre crop of 7/8 of the shorter side), made grey or RGB as the model takes it and\n"
      "normalised as in training. One line per image, in the order given (directories sorted): its top classes and\n"
      "their probabilities. Under mpirun the batches are shared among the ranks. A file that is not a readable\n"
      "image is an error (exit 2) unless --skip-bad",
      predict_table(), positional, check_options);
}

}  // namespace

int run_predict(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  std::optional<PredictOptions> parsed = parse_predict(argc, argv, ctx);
  if (!parsed) return kExitSuccess;
  PredictOptions& o = *parsed;
  if (ctx.rank() != 0) log::set_level(log::Level::Warn);
  ServingModel m = load_serving_model(o.checkpoint, o.data_dir, ctx);
  std::unique_ptr<Inference> inference;
  std::vector<std::string> files;
  int64_t unusable = 0;  // inputs skipped while listing
  dist::collectively(ctx, [&] {
    o.threads = dist::math_threads(ctx, o.threads);
    nn::set_math_threads(o.threads);
    inference = make_inference(o, m, ctx);
    if (ctx.rank() == 0) files = list_images(o, unusable);
  });
  files = broadcast_list(ctx, files);
  const auto t0 = std::chrono::steady_clock::now();
  Predictor predictor(o, m, *inference);
  const auto n = static_cast<int64_t>(files.size());
  const int64_t batches = (n + o.batch_size - 1) / o.batch_size, world = ctx.world_size();
  double counts[2] = {0, static_cast<double>(unusable)};  // classified, skipped
  for (int64_t round = 0; round * world < batches; ++round) {
    const int64_t b = round * world + ctx.rank();
    Said said;
    dist::collectively(ctx, [&] {
      if (b < batches) predictor.classify(files, b * o.batch_size, std::min(n, (b + 1) * o.batch_size), said);
    });
    speak(ctx, said);
    counts[0] += static_cast<double>(said.classified), counts[1] += static_cast<double>(said.skipped);
  }
  ctx.world().allreduce_sum(counts, 2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  dist::collectively(ctx, [&] {
    HPC_REQUIRE(counts[0] > 0, "none of the ", n, " image(s) could be classified");
  });
  if (ctx.rank() == 0) {
    char line[300];
    std::snprintf(line, sizeof line, "hpctrain: classified %.0f image(s) in %.3f s: %.1f images/s on %s, %d rank(s)",
                  counts[0], seconds, counts[0] / std::max(seconds, 1e-9), inference->describe().c_str(),
                  ctx.world_size());
    std::cerr << line << (counts[1] > 0 ? detail::concat("; skipped ", counts[1], " bad image(s)") : "") << std::endl;
  }
  return kExitSuccess;
}

}  // namespace hpc::train
