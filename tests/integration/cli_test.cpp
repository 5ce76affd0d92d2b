// The command line as a user meets it: every bad input is exit code 2 and exactly one line on
// stderr, "hpctrain: error: ..." naming the problem (DESIGN.md principle 4); --help and
// --version exit 0.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

// Every case also gets these, unless it sets the option itself, so that a bad input the
// program failed to reject ends in a quick successful run (and the test fails on exit code 0).
// They go first: the case's own arguments end the line ("--epochs" with its value missing).
std::vector<std::string> with_quick_defaults(const std::vector<std::string>& args, const std::string& data_dir) {
  const std::vector<std::pair<std::string, std::string>> defaults{
      {"--data-dir", data_dir}, {"--threads", "1"}, {"--max-steps", "1"}, {"--batch-size", "16"},
      {"--test-samples", "16"}};
  std::vector<std::string> line{"--quiet"};
  for (const auto& [opt, value] : defaults) {
    bool given = false;
    for (const auto& a : args) given = given || a == opt || a.rfind(opt + "=", 0) == 0;
    if (!given) {
      line.push_back(opt);
      line.push_back(value);
    }
  }
  line.insert(line.end(), args.begin(), args.end());
  return line;
}

// Checks the error contract and that the message contains every one of `expect`.
void expect_usage_error(const RunResult& r, const std::vector<std::string>& expect) {
  SCOPED_TRACE(r.command);
  EXPECT_EQ(r.exit_code, 2) << "stderr: " << r.err << "\nstdout: " << r.out;
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr must be exactly one line, got:\n" << r.err;
  const std::string prefix = "hpctrain: error: ";
  ASSERT_EQ(lines[0].rfind(prefix, 0), 0u) << lines[0];
  EXPECT_GT(lines[0].size(), prefix.size() + 10) << "message too short to name a problem: " << lines[0];
  for (const auto& e : expect) EXPECT_NE(lines[0].find(e), std::string::npos) << "'" << e << "' not in: " << lines[0];
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override { write_small_fashion_mnist(data_.str()); }
  RunResult run(const std::vector<std::string>& args) { return run_hpctrain(with_quick_defaults(args, data_.str())); }
  TempDir data_{"cli-data"};
};

// The control for every case below: the quick defaults on good files run to the end.
TEST_F(Cli, GoodSmallDatasetTrains) {
  const RunResult r = run({});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// ---- Options ---------------------------------------------------------------------------------

struct BadArgs {
  const char* name;
  std::vector<std::string> args;
  std::vector<std::string> expect;  // substrings of the message
};
void PrintTo(const BadArgs& c, std::ostream* os) { *os << c.name; }

class CliBadOption : public Cli, public ::testing::WithParamInterface<BadArgs> {};

TEST_P(CliBadOption, IsOneLineUsageError) { expect_usage_error(run(GetParam().args), GetParam().expect); }

INSTANTIATE_TEST_SUITE_P(
    Options, CliBadOption,
    ::testing::Values(
        BadArgs{"unknown_option", {"--bogus"}, {"unrecognised option", "--bogus"}},
        BadArgs{"unknown_option_with_value", {"--bogus=3"}, {"--bogus"}},
        BadArgs{"stray_word", {"resnet20"}, {"positional"}},
        BadArgs{"epochs_not_a_number", {"--epochs", "abc"}, {"--epochs", "abc"}},
        BadArgs{"epochs_zero", {"--epochs", "0"}, {"--epochs", "positive", "0"}},
        BadArgs{"epochs_negative", {"--epochs", "-2"}, {"--epochs"}},
        BadArgs{"epochs_fraction", {"--epochs", "1.5"}, {"--epochs", "1.5"}},
        BadArgs{"epochs_missing_value", {"--epochs"}, {"--epochs"}},
        BadArgs{"batch_size_negative", {"--batch-size", "-1"}, {"--batch-size", "positive", "-1"}},
        BadArgs{"batch_size_zero", {"--batch-size=0"}, {"--batch-size"}},
        BadArgs{"eval_batch_size_zero", {"--eval-batch-size", "0"}, {"--eval-batch-size"}},
        BadArgs{"lr_negative", {"--lr", "-1"}, {"--lr", "positive"}},
        BadArgs{"lr_zero", {"--lr", "0"}, {"--lr"}},
        BadArgs{"lr_nan", {"--lr", "nan"}, {"--lr"}},
        BadArgs{"lr_not_a_number", {"--lr", "fast"}, {"--lr", "fast"}},
        BadArgs{"model_unknown", {"--model", "nope"}, {"model", "'nope'", "resnet20"}},
        BadArgs{"dataset_unknown", {"--dataset", "nope"}, {"--dataset", "'nope'", "fashion-mnist"}},
        BadArgs{"schedule_unknown", {"--lr-schedule", "nope"}, {"--lr-schedule", "'nope'", "onecycle"}},
        BadArgs{"schedule_step_without_epochs", {"--lr-schedule", "step"}, {"--lr-step-epochs"}},
        BadArgs{"step_epochs_malformed", {"--lr-schedule", "step", "--lr-step-epochs", "1,x"}, {"--lr-step-epochs", "1,x"}},
        BadArgs{"seed_negative", {"--seed", "-1"}, {"--seed", "negative"}},
        BadArgs{"seed_too_large", {"--seed", "99999999999999999999"}, {"--seed"}},
        BadArgs{"threads_negative", {"--threads", "-1"}, {"--threads"}},
        BadArgs{"image_size_negative", {"--image-size", "-5"}, {"--image-size", "negative"}},
        BadArgs{"image_size_huge", {"--image-size", "5000"}, {"--image-size", "4096"}},
        BadArgs{"image_size_not_for_mnist", {"--image-size", "32"}, {"--image-size", "packed shards and synthetic data only"}},
        BadArgs{"max_steps_negative", {"--max-steps", "-1"}, {"--max-steps"}},
        BadArgs{"train_samples_negative", {"--train-samples", "-5"}, {"--train-samples"}},
        BadArgs{"momentum_one", {"--momentum", "1"}, {"--momentum"}},
        BadArgs{"weight_decay_negative", {"--weight-decay", "-0.1"}, {"--weight-decay"}},
        BadArgs{"label_smoothing_one", {"--label-smoothing", "1"}, {"--label-smoothing"}},
        BadArgs{"warmup_negative", {"--warmup-epochs", "-1"}, {"--warmup-epochs"}},
        BadArgs{"pct_start_outside", {"--onecycle-pct-start", "1.5"}, {"--onecycle-pct-start"}},
        BadArgs{"cycle_momentum_inverted", {"--onecycle-base-momentum", "0.99"}, {"momentum", "0.99", "0.95"}},
        BadArgs{"cycle_momentum_one", {"--onecycle-max-momentum", "1"}, {"momentum"}},
        BadArgs{"augment_unknown", {"--augment", "maybe"}, {"--augment", "maybe"}},
        BadArgs{"device_unknown", {"--device", "gpu"}, {"--device", "gpu"}},
        BadArgs{"precision_unknown", {"--precision", "fp8"}, {"--precision", "'fp8'", "tf32"}},
        BadArgs{"precision_mixed_on_the_cpu", {"--device", "cpu", "--precision", "fp16"},
                {"--precision fp16", "mixed precision on the GPU", "--precision fp32"}},
        BadArgs{"cuda_graphs_on_the_cpu", {"--device", "cpu", "--cuda-graphs"},
                {"--cuda-graphs", "trains on the CPU", "leave out --cuda-graphs"}},
        BadArgs{"cuda_graphs_with_fp16", {"--cuda-graphs", "--precision", "fp16"},
                {"--cuda-graphs does not take --precision fp16", "bf16"}},
        BadArgs{"batch_larger_than_dataset", {"--batch-size", "100"}, {"64", "100"}},
        BadArgs{"repeated_option", {"--epochs", "1", "--epochs", "2"}, {"--epochs"}}),
    [](const ::testing::TestParamInfo<BadArgs>& i) { return std::string(i.param.name); });

// ---- Paths -----------------------------------------------------------------------------------

// --device cuda where no GPU can train is an error naming why, never a silent CPU run. (On a
// machine with a GPU the GPU tests, label gpu, cover --device cuda.)
TEST_F(Cli, DeviceCudaWithoutAGpuIsAUsageError) {
  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "a GPU is present: --device cuda would train";
  expect_usage_error(run({"--device", "cuda"}), {"--device cuda", "--device cpu"});
}

TEST_F(Cli, MissingDataDirectory) {
  expect_usage_error(run({"--data-dir", "/nonexistent/hpctrain-data"}),
                     {"data directory", "/nonexistent/hpctrain-data", "does not exist"});
}

TEST_F(Cli, ConfigFileMissing) {
  expect_usage_error(run({"--config", "/nonexistent/hpctrain.cfg"}), {"config file", "/nonexistent/hpctrain.cfg"});
}

TEST_F(Cli, ConfigFileProblems) {
  TempDir dir("cli-config");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"bogus = 1\n", {"bogus"}},                       // unknown key
      {"epochs = abc\n", {"epochs", "abc"}},            // bad value
      {"epochs\n", {"epochs"}},                         // not key = value
      {"lr = -3\n", {"--lr", "positive"}},              // validated like the command line
      {"model = nope\n", {"'nope'"}}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file(std::to_string(i).append(".cfg"));  // not "c" + ...: GCC 12 -Wrestrict
    write_text(path, cases[i].first);
    expect_usage_error(run({"--config", path}), cases[i].second);
  }
}

TEST_F(Cli, UnwritableMetricsFile) {
  expect_usage_error(run({"--metrics-file", "/nonexistent/dir/m.jsonl"}),
                     {"metrics file", "/nonexistent/dir/m.jsonl", "No such file"});
  TempDir dir("cli-metrics");
  expect_usage_error(run({"--metrics-file", dir.str()}), {"metrics file", dir.str()});  // a directory
}

// ---- Malformed dataset files -----------------------------------------------------------------

struct BadData {
  const char* name;
  const char* file;  // which of the four files is replaced (or removed)
  std::function<Bytes()> content;
  std::vector<std::string> expect;
  bool gzip = false, remove = false;
};
void PrintTo(const BadData& c, std::ostream* os) { *os << c.name; }

class CliBadData : public Cli, public ::testing::WithParamInterface<BadData> {};

TEST_P(CliBadData, IsOneLineUsageErrorNamingTheFile) {
  const BadData& c = GetParam();
  const std::string path = data_.file(c.file);
  fs::remove(path);
  if (!c.remove) {
    if (c.gzip) {
      write_bytes(path + ".gz", c.content());
    } else {
      write_bytes(path, c.content());
    }
  }
  std::vector<std::string> expect = c.expect;
  expect.push_back(c.file);
  expect_usage_error(run({}), expect);
}

Bytes gzip_of(const Bytes& b) {
  TempDir t("gz");
  write_gzip(t.file("x.gz"), b);
  return read_bytes(t.file("x.gz"));
}

Bytes cut(Bytes b, size_t drop) {
  b.resize(b.size() - drop);
  return b;
}

INSTANTIATE_TEST_SUITE_P(
    Files, CliBadData,
    ::testing::Values(
        BadData{"images_wrong_magic", "train-images-idx3-ubyte", [] { return idx_images(64, 28, 28, 0x0802); },
                {"not an IDX image file"}},
        BadData{"labels_wrong_magic", "t10k-labels-idx1-ubyte", [] { return idx_labels(16, 0x0803); },
                {"not an IDX label file"}},
        BadData{"images_truncated", "train-images-idx3-ubyte", [] { return cut(idx_images(64), 100); }, {"truncated"}},
        BadData{"images_header_only_partly", "t10k-images-idx3-ubyte", [] { return cut(idx_images(16), 16 * 784 + 4); },
                {"truncated"}},
        BadData{"images_empty_file", "train-images-idx3-ubyte", [] { return Bytes{}; }, {"truncated"}},
        BadData{"labels_truncated", "train-labels-idx1-ubyte", [] { return cut(idx_labels(64), 1); }, {"truncated"}},
        BadData{"gzip_truncated", "train-images-idx3-ubyte",
                [] {
                  const Bytes gz = gzip_of(idx_images(64));
                  return Bytes(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2));
                },
                {"corrupt"}, true},
        BadData{"gzip_trailer_missing", "t10k-labels-idx1-ubyte", [] { return cut(gzip_of(idx_labels(16)), 8); },
                {"corrupt"}, true},
        BadData{"count_mismatch", "train-labels-idx1-ubyte", [] { return idx_labels(63); }, {"disagree", "64", "63"}},
        BadData{"label_out_of_range", "t10k-labels-idx1-ubyte",
                [] {
                  Bytes b = idx_labels(16);
                  b[8 + 5] = 10;
                  return b;
                },
                {"label 10", "out of range"}},
        BadData{"wrong_image_size", "train-images-idx3-ubyte", [] { return idx_images(64, 32, 32); },
                {"32x32", "28x28"}},
        BadData{"extra_trailing_bytes", "t10k-images-idx3-ubyte",
                [] {
                  Bytes b = idx_images(16);
                  b.insert(b.end(), 5, 0);
                  return b;
                },
                {"5 bytes follow"}},
        BadData{"missing_file", "train-labels-idx1-ubyte", [] { return Bytes{}; }, {"does not exist"}, false, true}),
    [](const ::testing::TestParamInfo<BadData>& i) { return std::string(i.param.name); });

// A directory that is not a dataset at all.
TEST_F(Cli, DirectoryWithoutDatasetFiles) {
  TempDir empty("cli-empty");
  expect_usage_error(run({"--data-dir", empty.str()}), {empty.str(), "-ubyte", "does not exist"});
}

// ---- Help and version ------------------------------------------------------------------------

// Every option, with its default as --help must show it ("" for options without one).
const std::vector<std::pair<std::string, std::string>> kOptions{
    {"help", ""},
    {"version", ""},
    {"config", ""},
    {"quiet", ""},
    {"metrics-file", ""},
    {"log-every", "0"},
    {"seed", "1"},
    {"threads", "0"},
    {"device", "auto"},
    {"precision", "tf32"},
    {"no-deterministic", ""},
    {"cuda-graphs", ""},
    {"model", "cnn"},
    {"no-batch-norm", ""},
    {"init", "kaiming-uniform"},
    {"dataset", "fashion-mnist"},
    {"data-dir", ""},
    {"train-samples", "0"},
    {"test-samples", "0"},
    {"augment", "auto"},
    {"image-size", "0"},
    {"epochs", "3"},
    {"max-steps", "0"},
    {"batch-size", "64"},
    {"global-batch-size", "0"},
    {"keep-last-batch", ""},
    {"eval-batch-size", "1000"},
    {"lr", "0.1"},
    {"lr-schedule", "onecycle"},
    {"warmup-epochs", "0"},
    {"lr-step-epochs", ""},
    {"lr-gamma", "0.1"},
    {"min-lr", "0"},
    {"onecycle-pct-start", "0.3"},
    {"onecycle-div-factor", "25"},
    {"onecycle-final-div-factor", "10000"},
    {"onecycle-base-momentum", "0.85"},
    {"onecycle-max-momentum", "0.95"},
    {"no-cycle-momentum", ""},
    {"momentum", "0.9"},
    {"no-nesterov", ""},
    {"weight-decay", "0.0005"},
    {"decay-bias-and-norm", ""},
    {"label-smoothing", "0"},
    {"bucket-mb", "25"},
    {"no-overlap", ""},
    {"sync-batch-norm", ""},
    {"timeline-file", ""},
    {"checkpoint-dir", ""},
    {"keep-checkpoints", "3"},
    {"checkpoint-every-steps", "0"},
    {"checkpoint-interval", "10m"},
    {"checkpoint-each-epoch", ""},
    {"resume", "auto"},
    {"step-timeout", "10m"},
};

// Whether `prefix` (the start of a help line) is what comes before an option's name there:
// Boost indents option lines by two spaces ("  --lr", "  -h [ --help ]"); the deeper indented
// lines continue a description.
bool is_option_prefix(const std::string& prefix) {
  if (prefix == "  ") return true;
  return prefix.size() == 7 && prefix.compare(0, 3, "  -") == 0 && prefix.compare(4, 3, " [ ") == 0;
}

// The default shown for --NAME in the help text ("" when none), or nullopt if NAME is absent.
// Only the option's own line counts, not a mention in another option's description.
std::optional<std::string> shown_default(const std::string& help, const std::string& name) {
  const std::string opt = "--" + name;
  for (size_t at = help.find(opt); at != std::string::npos; at = help.find(opt, at + 1)) {
    const size_t end = at + opt.size();
    if (end < help.size() && (std::isalnum(static_cast<unsigned char>(help[end])) || help[end] == '-')) continue;
    const size_t line_start = at == 0 ? 0 : help.rfind('\n', at - 1) + 1;
    if (!is_option_prefix(help.substr(line_start, at - line_start))) continue;
    const size_t eol = help.find('\n', at);
    const std::string rest = help.substr(end, eol - end);
    const size_t open = rest.find("(=");
    if (open == std::string::npos || rest.find_first_not_of(" ]arg") < open) return std::string();
    const size_t close = rest.find(')', open);
    return rest.substr(open + 2, close - open - 2);
  }
  return std::nullopt;
}

TEST(CliHelp, ListsEveryOptionWithItsDefault) {
  for (const char* flag : {"--help", "-h"}) {
    const RunResult r = run_hpctrain({flag});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("Usage: hpctrain"), std::string::npos) << r.out;
    for (const auto& [name, def] : kOptions) {
      const auto shown = shown_default(r.out, name);
      ASSERT_TRUE(shown.has_value()) << "--" << name << " missing from --help";
      if (def.empty()) {
        EXPECT_EQ(*shown, "") << "--" << name;
        continue;
      }
      EXPECT_EQ(*shown, def) << "--" << name;  // as people write it: 0.1, not 0.10000000000000001
    }
    // And nothing it offers is missing from the list above (a new option needs a test).
    size_t listed = 0;
    for (const std::string& line : lines_of(r.out)) {
      const size_t dashes = line.find("--");
      if (dashes != std::string::npos && dashes > 0 && is_option_prefix(line.substr(0, dashes))) ++listed;
    }
    EXPECT_EQ(listed, kOptions.size()) << r.out;
  }
}

TEST(CliHelp, HelpWinsOverOtherOptions) {
  const RunResult r = run_hpctrain({"--epochs", "2", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--epochs"), std::string::npos);
}

TEST(CliVersion, PrintsVersionAndExitsZero) {
  const RunResult r = run_hpctrain({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_EQ(lines[0].rfind(std::string("hpctrain ") + HPCTRAIN_TEST_VERSION, 0), 0u) << lines[0];
}

}  // namespace
}  // namespace hpc::itest
