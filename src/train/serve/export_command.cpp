// `hpctrain export`: a checkpoint's model as an ONNX file (export/onnx_export.hpp), with what a
// server needs to feed it in the file's metadata.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/exit_codes.hpp"
#include "core/option_kit.hpp"
#include "dist/agree.hpp"
#include "export/onnx_export.hpp"
#include "train/options/options.hpp"
#include "train/options/subcommand.hpp"
#include "train/serve/serving.hpp"
#include "train/state/checkpointing.hpp"

namespace hpc::train {
namespace po = boost::program_options;
namespace fs = std::filesystem;
namespace {

enum class ExportFormat { Onnx };
inline constexpr Named<ExportFormat> kExportFormatNames[] = {{"onnx", ExportFormat::Onnx}};

struct ExportOptions {
  std::string checkpoint, output, data_dir;
  ExportFormat format = ExportFormat::Onnx;
  bool fold_batch_norm = false, force = false;
};

// export's options, through the kit every command line uses (core/option_kit.hpp).
const std::vector<options::Entry<ExportOptions>>& export_table() {
  using O = ExportOptions;
  static const std::vector<options::Entry<O>> table{
      subcommand_options::checkpoint(&O::checkpoint),
      options::path("output", &O::output,
                    "the file to write (replaced only with --force, and then by the rename of a complete file)",
                    options::Presence::Required),
      options::choice("format", &O::format, kExportFormatNames, "onnx (the only format)"),
      options::flag("fold-batch-norm", &O::fold_batch_norm,
                    "fold each batch norm into the convolution (or linear layer) before it, instead of "
                    "BatchNormalization nodes"),
      options::flag("force", &O::force, "replace --output if it exists"),
      subcommand_options::served_data_dir(&O::data_dir),
  };
  return table;
}

// Checked before any work: the file is not the checkpoint (nor, for a directory, any of its
// checkpoints), can be written where asked, and replaces nothing unless --force says so (then
// only by the rename of a complete file).
void check_output(const ExportOptions& o) {
  // Not even with --force: the ONNX file would take the place of the checkpoint it is made from.
  require_distinct_files({{"--output", o.output}}, ckpt::checkpoint_inputs("--checkpoint", o.checkpoint));
  // An ONNX file under a checkpoint's name is one that --resume auto, evaluate, predict and inspect
  // take for the directory's newest checkpoint and find damaged.
  HPC_REQUIRE(ckpt::step_of(fs::path(o.output).filename().string()) < 0, "--output ", o.output,
              " is named as hpctrain names its checkpoints (ckpt-N.hpck): give the ONNX file another name");
  // Nor, with or without --force, under a name the checkpoint directory's own files take, as
  // evaluate refuses its --metrics-file there: "--output ck/heartbeat --force" replaced the run's
  // heartbeat with the model, and an ONNX file named lock or run-id was the next run's to trip on.
  ckpt::require_not_its_own_name({"--output", o.output}, ckpt::checkpoint_folder(o.checkpoint),
                                  "the checkpoint's directory");
  struct stat st {};
  if (::stat(o.output.c_str(), &st) == 0) {
    HPC_REQUIRE(!S_ISDIR(st.st_mode), "--output ", o.output, " is a directory: name the file to write");
    HPC_REQUIRE(S_ISREG(st.st_mode), "--output ", o.output, " exists and is not a regular file");
    HPC_REQUIRE(o.force, "--output ", o.output, " exists (--force replaces it)");
  } else {
    HPC_REQUIRE(errno == ENOENT, "cannot use --output ", o.output, ": ", std::strerror(errno));
    // A link to nothing is a file that exists too: the rename would replace it.
    HPC_REQUIRE(::lstat(o.output.c_str(), &st) != 0 || o.force, "--output ", o.output,
                " exists, a link to a missing file (--force replaces the link)");
  }
  const fs::path parent = fs::path(o.output).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (::stat(dir.c_str(), &st) != 0)
    usage_error("cannot write --output ", o.output, ": directory ", dir,
                errno == ENOENT ? " does not exist" : std::string(": ") + std::strerror(errno));
  HPC_REQUIRE(S_ISDIR(st.st_mode), "cannot write --output ", o.output, ": ", dir, " is not a directory");
  // Found now, not after the model is made, as "cannot create OUTPUT.tmp.PID", a file never named.
  HPC_REQUIRE(::access(dir.c_str(), W_OK) == 0, "cannot write --output ", o.output, ": directory ", dir,
              " is not writable (", std::strerror(errno), ")");
  // The file is written as NAME.tmp.PID first (write_file_atomically): a name the file system
  // takes, but with no room for that tail, failed after the model was made, naming the temporary.
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name = fs::path(o.output).filename().string().size(), tail = ckpt::kLongestTemporaryTail;
  HPC_REQUIRE(name_max <= 0 || name + tail <= static_cast<size_t>(name_max), "cannot write --output ", o.output,
              ": its name is ", name, " bytes, and it is written first as NAME.tmp.PID, ", tail,
              " bytes longer, where ", dir, " takes names of at most ", name_max, " bytes: give a name of at most ",
              name_max - static_cast<long>(tail), " bytes");
}

std::string joined(const std::vector<float>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

// What a server needs to feed the model and to know which one it is (ONNX metadata_props).
onnx_export::ExportSpec spec_of(const ServingModel& m, bool fold) {
  const data::DatasetFacts& f = m.facts;
  const ckpt::Checkpoint& c = m.checkpoint;
  onnx_export::ExportSpec spec;
  spec.fold_batch_norm = fold;
  spec.norm = f.norm;
  spec.model_version = c.integer("step");
  spec.doc = detail::concat("hpctrain ", c.text("model"), " trained on ", f.name, ", checkpoint step ", c.text("step"),
                            ". Input: float32 N x ", f.channels, " x ", f.height, " x ", f.width,
                            ", pixel values 0..255 (", f.channels == 1 ? "grey" : "RGB",
                            "); the graph normalises them. Output: logits N x ", f.classes, ".");
  const std::string crop = f.crop_fraction < 1 ? "the centre crop of 7/8 of the shorter side, resized bilinearly to "
                                               : "the centre square, resized to ";
  spec.metadata = {
      {"model", c.text("model")},
      {"dataset", f.name},
      {"step", c.text("step")},
      {"epoch", c.text("epoch")},
      // The checkpoint's checksums, as the run's done line and hpctrain inspect report them:
      // of everything that decides the rest of the run, and of the parameters alone.
      {"state_checksum", state_checksum(c)},
      {"param_checksum", m.param_checksum()},
      {"hpctrain_version", c.text("hpctrain_version")},
      {"input_layout", "NCHW float32, pixel values 0..255"},
      {"input_channels", std::to_string(f.channels)},
      {"input_height", std::to_string(f.height)},
      {"input_width", std::to_string(f.width)},
      {"color", f.channels == 1 ? "grey (BT.601 luma)" : "RGB"},
      {"mean", joined(f.norm.mean)},
      {"std", joined(f.norm.std)},
      {"normalization", "in the graph: (input / 255 - mean) / std per channel"},
      {"preprocessing", crop + std::to_string(f.height) + "x" + std::to_string(f.width) + " (as hpctrain predict)"},
      // A model trained --no-batch-norm has none to fold or to keep: it said it had one.
      {"batch_norm", !m.model->spec().batch_norm ? "none"
                     : fold                      ? "folded into the convolutions"
                                                 : "BatchNormalization with the running statistics"},
      {"classes", std::to_string(f.classes)},
  };
  if (!f.class_names.empty()) spec.metadata.emplace_back("class_names", nlohmann::json(f.class_names).dump());
  return spec;
}

std::string human_size(size_t bytes) {
  char buf[32];
  if (bytes < 1000000) std::snprintf(buf, sizeof buf, "%.1f kB", static_cast<double>(bytes) / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

void export_model(const ExportOptions& o, const ServingModel& m) {
  // Again for the file actually read: a run may have written a newer checkpoint since check_output.
  require_distinct_files({{"--output", o.output}}, {{"the checkpoint", m.path}});
  const bool folded = o.fold_batch_norm && m.model->spec().batch_norm;
  if (o.fold_batch_norm && !folded)
    log::warn("--fold-batch-norm: the model was trained --no-batch-norm, and has no batch norm to fold");
  const std::vector<char> bytes = onnx_export::export_onnx(*m.model, spec_of(m, o.fold_batch_norm));
  // An export killed before its rename left OUTPUT.tmp.PID: the next export to OUTPUT removes it.
  ckpt::remove_abandoned_writes(o.output);
  try {
    // (locked: seen by remove_abandoned_writes. Without --force, a file another process put at
    // OUTPUT while the model was made is kept: the check above was made before it.)
    ckpt::write_file_atomically(o.output, bytes, "", /*locked=*/true, /*replace=*/o.force);
  } catch (const Error& e) {
    // Its words name the temporary file (OUTPUT.tmp.PID, removed again), which the user never
    // named: a full file system was "cannot write m.onnx.tmp.4711: No space left on device".
    if (e.kind() != ErrorKind::Usage) throw;
    usage_error("cannot write --output ", o.output, " (", human_size(bytes.size()), "; nothing was written there): ",
                e.what());
  }
  const data::DatasetFacts& f = m.facts;
  log::write_standard_output(detail::concat(
      "exported ", m.checkpoint.text("model"), " (", m.path, ", step ", m.checkpoint.text("step"),
      folded ? ", batch norm folded" : "", ") to ", o.output, ": ONNX opset ", onnx_export::kOpset, ", ",
      human_size(bytes.size()), ", input float32 N x ", f.channels, " x ", f.height, " x ", f.width,
      " (pixel values 0..255), output logits N x ", f.classes, "\n"));
}

}  // namespace

int run_export(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  const std::optional<ExportOptions> o = parse_subcommand_options<ExportOptions>(
      argc, argv, ctx,
      "Usage: hpctrain export --checkpoint PATH --output FILE [options]\n"
      "Writes a checkpoint's model as an ONNX file (opset 13, dynamic batch) for other runtimes (ONNX Runtime,\n"
      "TensorRT, OpenCV, Triton). The graph takes float32 N x C x H x W pixel values 0..255 (RGB, or grey for\n"
      "one channel) and normalises them itself; its output is the logits N x classes. The file's metadata\n"
      "holds the input size, mean and std, class names, the checkpoint's step, state and parameter checksums",
      export_table(), {}, [&](ExportOptions& given, const po::variables_map&) {
        if (ctx.rank() == 0) check_output(given);
      });
  if (!o) return kExitSuccess;
  const ServingModel m = load_serving_model(o->checkpoint, o->data_dir, ctx);
  dist::collectively(ctx, [&] {
    if (ctx.rank() == 0) export_model(*o, m);
  });
  return kExitSuccess;
}

}  // namespace hpc::train
