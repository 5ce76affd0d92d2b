// The command line as a user meets it: every bad input is exit code 2 and exactly one line on
// stderr, "hpctrain: error: ..." naming the problem (DESIGN.md principle 4); --help and
// --version exit 0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// A bad input that hpctrain failed to refuse may hang (a FIFO read to its end) or train: the
// quick job ends in seconds, so a run that takes this long has gone wrong.
constexpr double kDeadline = 60;

// Checks the error contract and that the message contains every one of `expect`.
void expect_usage_error(const RunResult& r, const std::vector<std::string>& expect) {
  SCOPED_TRACE(r.command);
  ASSERT_FALSE(r.timed_out) << "hpctrain ran past " << kDeadline << " s";
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
  RunResult run(const std::vector<std::string>& args) {
    return run_hpctrain(with_quick_defaults(in_work(args), data_.str()), kDeadline);
  }
  // A bad input: exit code 2, one line naming the problem, and the data and the work
  // directories (where checkpoints and metrics go) exactly as they were.
  // Subcommands (evaluate, inspect) take `args` as they are (quick = false).
  void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& expect,
                      bool quick = true) {
    const auto before = snapshots({data_.str(), work_.str()});
    expect_usage_error(quick ? run(args) : run_hpctrain(in_work(args), kDeadline), in_work(expect));
    EXPECT_EQ(snapshots({data_.str(), work_.str()}), before) << "the refused run changed files";
  }
  // "@WORK" in arguments and messages (a table knows no temporary directory) is the work
  // directory.
  std::vector<std::string> in_work(std::vector<std::string> args) const {
    for (auto& a : args)
      for (size_t at = a.find("@WORK"); at != std::string::npos; at = a.find("@WORK", at))
        a.replace(at, 5, work_.str());
    return args;
  }
  TempDir data_{"cli-data"}, work_{"cli-work"};
};

// A first word that names no subcommand: the one it most likely meant and the list, not Boost's
// "too many positional options" from the training options it fell through to. (As typed: the
// harness would put --device cpu in front of a word it does not know as a subcommand.)
TEST_F(Cli, MisspeltCommandIsNamed) {
  const auto typed = [](std::vector<std::string> args) {
    args.insert(args.begin(), hpctrain_binary());
    return run_program(args, kDeadline);
  };
  expect_usage_error(typed({"evalute", "--checkpoint", work_.str()}),
                     {"unknown command 'evalute' (did you mean evaluate?); the commands are train, evaluate, inspect, "
                      "export, predict"});
  expect_usage_error(typed({"inpsect", work_.str()}), {"unknown command 'inpsect' (did you mean inspect?)"});
  expect_usage_error(typed({"bogus"}), {"unknown command 'bogus'; the commands are train,"});
}

// clean-snapshots' duration is named as every other option's ("----older-than" before); inspect
// of a device says its size is 0, not 16 EB (the error of file_size shown as a size).
TEST_F(Cli, SmallCommandsSayTheirProblemsPlainly) {
  expect_usage_error(run_program({hpctrain_binary(), "clean-snapshots", "--older-than", "-1"}, kDeadline),
                     {"error: --older-than must be a duration such as 90s, 10m or 1.5h, got '-1'"});
  // No end: "kept ... last written within 1000000000000000052504760255204420248704... h".
  expect_usage_error(run_program({hpctrain_binary(), "clean-snapshots", "--older-than", "1e300h"}, kDeadline),
                     {"error: --older-than must be at most 1000h, got "});
  // stod took hex (16 s), leading spaces and a '+', which numbers are refused.
  for (const char* text : {"0x10", " 5s", "+5s"})
    expect_usage_error(run_program({hpctrain_binary(), "clean-snapshots", "--older-than", text}, kDeadline),
                       {"error: --older-than must be a duration such as 90s, 10m or 1.5h, got '" + std::string(text) + "'"});
  const RunResult r = run_program({hpctrain_binary(), "inspect", "/dev/zero"}, kDeadline);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.out.find("valid: no: cannot read checkpoint /dev/zero: not a regular file\nsize: 0 B (0 bytes)\n"),
            std::string::npos)
      << r.out;
}

// A blank --older-than (an unset variable: --older-than "$AGE") cleaned with the default age, as
// if it had not been given. A folder of its own: the default one is every run's on this host.
TEST_F(Cli, ABlankCleanSnapshotsAgeIsRefused) {
  const std::string dir = work_.file("snapshots");
  expect_usage_error(
      run_program({hpctrain_binary(), "clean-snapshots", "--snapshot-dir", dir, "--older-than", ""}, kDeadline),
      {"error: --older-than is empty (an unset variable?)"});
}

// A --snapshot-dir that does not exist is a host where no run kept snapshots: nothing to clean,
// exit 0 as documented (`mpirun --map-by ppr:1:node hpctrain clean-snapshots` reaches such hosts),
// in one line that names the directory, so that a mistyped path shows. A path that cannot be a
// directory is an error.
TEST_F(Cli, CleanSnapshotsInADirectoryThatIsNotThere) {
  const std::string none = work_.file("none");
  const RunResult r = run_program({hpctrain_binary(), "clean-snapshots", "--snapshot-dir", none}, kDeadline);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find(": no snapshots (no " + none + ")\n"), std::string::npos) << r.out;
  write_text(work_.file("file"), "x");
  expect_usage_error(
      run_program({hpctrain_binary(), "clean-snapshots", "--snapshot-dir", work_.file("file") + "/x"}, kDeadline),
      {"cannot read " + work_.file("file") + "/x: Not a directory"});
}

// A subcommand's options are named whole too (OptionErrors.AnOptionIsNamedWhole: training's).
TEST_F(Cli, ASubcommandsOptionIsNamedWhole) {
  expect_usage_error(run_program({hpctrain_binary(), "evaluate", "--checkp", work_.str()}, kDeadline),
                     {"unrecognised option '--checkp' (options are named whole: --checkpoint?)"});
}

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

TEST_P(CliBadOption, IsOneLineUsageError) { expect_refused(GetParam().args, GetParam().expect); }

INSTANTIATE_TEST_SUITE_P(
    Options, CliBadOption,
    ::testing::Values(
        BadArgs{"unknown_option", {"--bogus"}, {"unrecognised option", "--bogus"}},
        BadArgs{"unknown_option_with_value", {"--bogus=3"}, {"--bogus"}},
        BadArgs{"prefix_of_an_option", {"--res", "none"}, {"unrecognised option '--res'", "--resume?"}},
        BadArgs{"stray_word", {"resnet20"}, {"'resnet20' is no option"}},
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
        BadArgs{"progress_unknown", {"--progress", "fancy"}, {"--progress", "'fancy'", "lines"}},
        BadArgs{"progress_interval_bad", {"--progress-interval", "soon"}, {"--progress-interval", "soon"}},
        BadArgs{"progress_interval_endless", {"--progress-interval", "2000h"}, {"--progress-interval must be at most 1000h"}},
        BadArgs{"checkpoint_interval_endless", {"--checkpoint-interval", "1e300h", "--checkpoint-dir", "ck"},
                {"--checkpoint-interval must be at most 1000h"}},
        BadArgs{"step_timeout_in_hex", {"--step-timeout", "0x10"}, {"--step-timeout must be a duration", "'0x10'"}},
        BadArgs{"log_level_unknown", {"--log-level", "loud"}, {"--log-level", "'loud'", "debug"}},
        BadArgs{"log_timestamps_unknown", {"--log-timestamps", "yes"}, {"--log-timestamps", "'yes'", "auto"}},
        BadArgs{"image_size_negative", {"--image-size", "-5"}, {"--image-size", "negative"}},
        BadArgs{"image_size_huge", {"--image-size", "5000"}, {"--image-size", "4096"}},
        BadArgs{"image_size_not_for_mnist", {"--image-size", "32"}, {"--image-size", "packed shards and synthetic data only"}},
        BadArgs{"max_steps_negative", {"--max-steps", "-1"}, {"--max-steps"}},
        BadArgs{"train_samples_negative", {"--train-samples", "-5"}, {"--train-samples"}},
        // More than the set holds was taken as all of it, and recorded as given (a resume had to repeat it).
        BadArgs{"train_samples_above_the_set", {"--train-samples", "60001"},
                {"--train-samples 60001 is more than the 60000 training samples of ", "(0: all of them)"}},
        BadArgs{"test_samples_above_the_set", {"--test-samples", "10001"},
                {"--test-samples 10001 is more than the 10000 test samples of "}},
        BadArgs{"momentum_one", {"--momentum", "1"}, {"--momentum"}},
        BadArgs{"weight_decay_negative", {"--weight-decay", "-0.1"}, {"--weight-decay"}},
        BadArgs{"decay_bias_both_ways", {"--decay-bias-and-norm", "--no-decay-bias-and-norm"},
                {"--decay-bias-and-norm", "--no-decay-bias-and-norm", "contradict"}},
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
        BadArgs{"jpeg_decode_unknown", {"--jpeg-decode", "fpga"}, {"--jpeg-decode", "'fpga'", "gpu"}},
        BadArgs{"jpeg_decode_gpu_on_the_cpu", {"--device", "cpu", "--jpeg-decode", "gpu"},
                {"--jpeg-decode gpu", "trains on the CPU", "--jpeg-decode cpu"}},
        BadArgs{"cuda_graphs_on_and_off", {"--cuda-graphs", "--no-cuda-graphs"},
                {"--cuda-graphs and --no-cuda-graphs contradict"}},
        BadArgs{"batch_larger_than_dataset", {"--train-samples", "64", "--batch-size", "100"}, {"64", "100"}},
        BadArgs{"repeated_option", {"--epochs", "1", "--epochs", "2"}, {"--epochs"}},
        // Extreme values: each was an internal error, a hang, a silent overflow or a silent no-op.
        BadArgs{"bucket_mb_tiny", {"--bucket-mb", "1e-9"}, {"--bucket-mb", "0.001", "1e-09"}},
        BadArgs{"bucket_mb_huge", {"--bucket-mb", "1e300"}, {"--bucket-mb", "4096"}},
        // Past what the option's type holds: Boost said "the argument ('...') ... is invalid", naming no range.
        BadArgs{"threads_past_an_int", {"--threads", "99999999999"},
                {"--threads must be a whole number, got '99999999999' (out of range)"}},
        BadArgs{"epochs_not_whole", {"--epochs", "1e3"}, {"--epochs must be a whole number, got '1e3'"}},
        BadArgs{"lr_past_a_double", {"--lr", "1e999"}, {"--lr must be a number, got '1e999' (out of range)"}},
        BadArgs{"step_timeout_huge", {"--step-timeout", "1e300"}, {"--step-timeout", "1000h"}},
        BadArgs{"step_timeout_subsecond", {"--step-timeout", "0.5s"}, {"--step-timeout", "from 1s", "0.5 s"}},
        BadArgs{"start_timeout_subsecond", {"--start-timeout", "0.5s"}, {"--start-timeout", "from 1s", "0.5 s"}},
        BadArgs{"stop_signals_unknown", {"--stop-signals", "TERM,USR3"},
                {"--stop-signals: unknown signal 'USR3'", "choose from TERM,USR1,USR2,HUP"}},
        BadArgs{"stop_signals_empty", {"--stop-signals", ""}, {"--stop-signals names no signal"}},
        BadArgs{"stop_signals_empty_name", {"--stop-signals", "TERM,,HUP"}, {"--stop-signals has an empty name"}},
        BadArgs{"stop_signals_kill", {"--stop-signals", "KILL"}, {"--stop-signals: SIGKILL cannot be caught"}},
        BadArgs{"stop_signals_stop", {"--stop-signals", "sigstop"}, {"--stop-signals: SIGSTOP cannot be caught"}},
        BadArgs{"stop_signals_int", {"--stop-signals", "INT"}, {"--stop-signals: SIGINT always stops at once"}},
        BadArgs{"stop_signals_other", {"--stop-signals", "QUIT"}, {"--stop-signals: SIGQUIT cannot be a stop signal"}},
        BadArgs{"stop_signals_a_number", {"--stop-signals", "15"}, {"--stop-signals: unknown signal '15'"}},
        BadArgs{"stop_signals_twice", {"--stop-signals", "USR2,sigusr2"}, {"--stop-signals names SIGUSR2 twice"}},
        BadArgs{"epochs_overflowing_the_step_count", {"--epochs", "4611686018427387904", "--max-steps", "0"},
                {"--epochs", "at most 1000000"}},
        BadArgs{"batch_size_huge", {"--batch-size", "4611686018427387904", "--keep-last-batch"},
                {"--batch-size", "at most 1000000000"}},
        BadArgs{"eval_batch_size_huge", {"--eval-batch-size", "9223372036854775807"},
                {"--eval-batch-size", "at most 1000000000"}},
        BadArgs{"image_size_too_small_for_cnn", {"--dataset", "synthetic", "--image-size", "3"},
                {"--image-size 3", "--model cnn", "at least 4"}},
        BadArgs{"onecycle_div_factor_inf", {"--onecycle-div-factor", "inf"}, {"--onecycle-div-factor", "finite"}},
        BadArgs{"step_epochs_inf", {"--lr-schedule", "step", "--lr-step-epochs", "inf"}, {"--lr-step-epochs", "inf"}},
        BadArgs{"value_with_a_newline", {"--epochs", "1\n2"}, {"--epochs", "1\\n2"}},
        // Values that contradict each other.
        BadArgs{"min_lr_above_lr", {"--lr-schedule", "cosine", "--min-lr", "5"}, {"--min-lr", "--lr 0.1", "5"}},
        BadArgs{"min_lr_negative", {"--lr-schedule", "cosine", "--min-lr", "-0.1"}, {"--min-lr", "-0.1"}},
        BadArgs{"warmup_longer_than_the_run", {"--warmup-epochs", "4", "--epochs", "3"},
                {"--warmup-epochs 4", "--epochs 3"}},
        BadArgs{"step_epoch_after_the_run", {"--lr-schedule", "step", "--lr-step-epochs", "2,30"},
                {"--lr-step-epochs 30", "--epochs 4"}},
        BadArgs{"checkpoint_every_steps_without_a_directory", {"--checkpoint-every-steps", "5"},
                {"--checkpoint-every-steps needs --checkpoint-dir"}},
        BadArgs{"checkpoint_each_epoch_without_a_directory", {"--checkpoint-each-epoch"},
                {"--checkpoint-each-epoch needs --checkpoint-dir"}},
        BadArgs{"keep_checkpoints_without_a_directory", {"--keep-checkpoints", "5"},
                {"--keep-checkpoints needs --checkpoint-dir"}},
        BadArgs{"checkpoint_interval_without_a_directory", {"--checkpoint-interval", "5m"},
                {"--checkpoint-interval needs --checkpoint-dir"}},
        BadArgs{"snapshot_every_steps_without_a_directory", {"--snapshot-every-steps", "5"},
                {"--snapshot-every-steps needs --checkpoint-dir", "no snapshot resumed"}},
        BadArgs{"snapshot_dir_without_a_directory", {"--snapshot-dir", "/tmp/s"}, {"--snapshot-dir needs --checkpoint-dir"}},
        BadArgs{"snapshot_every_steps_negative", {"--snapshot-every-steps", "-1"},
                {"--snapshot-every-steps takes auto or a number of steps", "'-1'"}},
        BadArgs{"snapshot_every_steps_a_word", {"--snapshot-every-steps", "often"}, {"--snapshot-every-steps", "'often'"}},
        BadArgs{"snapshot_every_steps_fraction", {"--snapshot-every-steps", "2.5"}, {"--snapshot-every-steps", "'2.5'"}},
        BadArgs{"snapshot_max_memory_unit", {"--snapshot-max-memory", "4X"}, {"--snapshot-max-memory takes a size", "'4X'"}},
        BadArgs{"snapshot_max_memory_percent_over", {"--snapshot-max-memory", "150%"}, {"--snapshot-max-memory", "'150%'"}},
        BadArgs{"snapshot_max_memory_negative", {"--snapshot-max-memory", "-1G"}, {"--snapshot-max-memory", "'-1G'"}},
        BadArgs{"snapshot_dir_empty", {"--snapshot-dir", ""}, {"--snapshot-dir is empty"}},
        BadArgs{"snapshot_max_memory_empty", {"--snapshot-max-memory", ""}, {"--snapshot-max-memory is empty"}},
        BadArgs{"metrics_and_timeline_the_same_file", {"--metrics-file", "@WORK/m.jsonl", "--timeline-file",
                                                       "@WORK/m.jsonl"},
                {"--metrics-file @WORK/m.jsonl and --timeline-file @WORK/m.jsonl are the same file"}},
        BadArgs{"metrics_every_steps_without_a_metrics_file", {"--metrics-every-steps", "5"},
                {"--metrics-every-steps needs --metrics-file"}},
        BadArgs{"metrics_every_steps_negative", {"--metrics-file", "@WORK/m.jsonl", "--metrics-every-steps", "-1"},
                {"--metrics-every-steps", "negative"}},
        BadArgs{"prometheus_file_not_prom", {"--prometheus-file", "@WORK/metrics.txt"},
                {"--prometheus-file @WORK/metrics.txt", "ending in .prom", "node_exporter"}},
        BadArgs{"prometheus_file_hidden", {"--prometheus-file", "@WORK/.prom"}, {"--prometheus-file", ".prom"}},
        BadArgs{"prometheus_file_the_metrics_file", {"--metrics-file", "@WORK/m.prom", "--prometheus-file", "@WORK/m.prom"},
                {"--metrics-file @WORK/m.prom and --prometheus-file @WORK/m.prom are the same file"}},
        BadArgs{"prometheus_file_empty", {"--prometheus-file", ""}, {"--prometheus-file is empty"}},
        BadArgs{"prometheus_file_in_no_directory", {"--prometheus-file", "@WORK/nodir/m.prom"},
                {"cannot write --prometheus-file @WORK/nodir/m.prom: its directory @WORK/nodir does not exist"}},
        // An empty value is an unset variable, never the option's default.
        BadArgs{"checkpoint_dir_empty", {"--checkpoint-dir", ""}, {"--checkpoint-dir is empty"}},
        // "$UNSET/" is the root directory, never a place to write checkpoints or snapshots.
        BadArgs{"checkpoint_dir_root", {"--checkpoint-dir", "/"},
                {"--checkpoint-dir / is the root directory / (an unset variable?)"}},
        BadArgs{"checkpoint_dir_root_spelled_otherwise", {"--checkpoint-dir", "/tmp/.."},
                {"--checkpoint-dir /tmp/.. is the root directory /"}},
        // Where every user may write, another could plant a checkpoint for --resume, or a link to follow.
        BadArgs{"checkpoint_dir_writable_by_others", {"--checkpoint-dir", "/tmp"},
                {"--checkpoint-dir /tmp: it is writable by others (mode 1777): another user could replace what is "
                 "read back there"}},
        BadArgs{"snapshot_dir_root", {"--checkpoint-dir", "@WORK/ck", "--snapshot-dir", "//"},
                {"--snapshot-dir // is the root directory /"}},
        BadArgs{"data_dir_empty", {"--data-dir", ""}, {"--data-dir is empty"}},
        BadArgs{"data_dir_blank", {"--data-dir", " \t"}, {"--data-dir is empty", "give a value or leave the option out"}},
        BadArgs{"config_blank", {"--config", "  "}, {"--config is empty"}},
        BadArgs{"device_blank", {"--device", " "}, {"--device is empty"}},
        BadArgs{"snapshot_every_steps_empty", {"--snapshot-every-steps", ""}, {"--snapshot-every-steps is empty"}},
        BadArgs{"metrics_file_empty", {"--metrics-file", ""}, {"--metrics-file is empty"}},
        BadArgs{"timeline_file_empty", {"--timeline-file", ""}, {"--timeline-file is empty"}},
        BadArgs{"config_empty", {"--config", ""}, {"--config is empty"}},
        BadArgs{"resume_empty", {"--resume", ""}, {"--resume is empty"}},
        BadArgs{"init_from_empty", {"--init-from", ""}, {"--init-from is empty"}},
        // Recorded in the checkpoint's one-line fields: it trained, then failed at the first checkpoint.
        BadArgs{"init_from_with_a_line_break", {"--init-from", "@WORK/a\nb"},
                {"--init-from holds a line break ('@WORK/a\\nb'): give it without one"}},
        BadArgs{"lr_step_epochs_empty", {"--lr-schedule", "step", "--lr-step-epochs", ""},
                {"--lr-step-epochs is empty"}},
        // Paths that are not what the option takes.
        BadArgs{"resume_a_directory", {"--resume", "@WORK"}, {"--resume @WORK is a directory"}},
        BadArgs{"resume_a_character_device", {"--resume", "/dev/zero"}, {"/dev/zero", "not a regular file"}},
        BadArgs{"init_from_a_directory_without_checkpoints", {"--init-from", "@WORK"},
                {"no checkpoints (ckpt-*.hpck) in @WORK"}},
        BadArgs{"init_from_a_character_device", {"--init-from", "/dev/zero"}, {"/dev/zero", "not a regular file"}},
        BadArgs{"timeline_file_in_a_missing_directory", {"--timeline-file", "@WORK/no/t.jsonl"},
                {"cannot open --timeline-file @WORK/no/t.jsonl", "No such file or directory"}},
        BadArgs{"metrics_file_in_a_missing_directory", {"--metrics-file", "@WORK/no/m.jsonl"},
                {"cannot open --metrics-file @WORK/no/m.jsonl", "No such file or directory"}},
        BadArgs{"metrics_file_a_directory", {"--metrics-file", "@WORK"}, {"--metrics-file @WORK", "Is a directory"}},
        BadArgs{"data_dir_a_file", {"--data-dir", "/dev/null"}, {"data directory /dev/null is not a directory"}},
        BadArgs{"checkpoint_dir_a_file", {"--checkpoint-dir", "/dev/null"}, {"/dev/null", "Not a directory"}},
        BadArgs{"config_a_directory", {"--config", "@WORK"}, {"--config @WORK is a directory"}},
        BadArgs{"config_endless", {"--config", "/dev/zero"}, {"config file /dev/zero is larger than 1 MB"}}),
    [](const ::testing::TestParamInfo<BadArgs>& i) { return std::string(i.param.name); });

// ---- Paths -----------------------------------------------------------------------------------

// No output replaces an input or another output: spelled otherwise, through a link (a dangling
// one, whose target a write would create), or a hard link, whether it exists yet or not. The
// work directory is left as it was (expect_refused), so every file keeps its bytes.
TEST_F(Cli, AnOutputIsNeverAnInputOrAnotherOutput) {
  const std::string w = work_.str();
  fs::create_directories(w + "/sub");
  fs::create_directories(w + "/ck");
  std::ofstream(w + "/ck/ckpt-00000007.hpck") << "a run's checkpoint";
  std::ofstream(w + "/m.jsonl") << "{\"event\":\"start\"}\n";
  fs::create_hard_link(w + "/m.jsonl", w + "/hard.jsonl");
  fs::create_symlink("t.jsonl", w + "/dangling.jsonl");
  std::ofstream(w + "/run.cfg") << "epochs = 1\n";
  fs::create_symlink(w + "/run.cfg", w + "/cfg-link");
  std::ofstream(w + "/resume.hpck") << "a checkpoint to resume";
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--metrics-file", "@WORK/t.jsonl", "--timeline-file", "@WORK/./t.jsonl"},
       {"--metrics-file @WORK/t.jsonl and --timeline-file @WORK/./t.jsonl are the same file"}},
      {{"--metrics-file", "@WORK/t.jsonl", "--timeline-file", "@WORK/sub/../t.jsonl"}, {"are the same file"}},
      {{"--metrics-file", "@WORK/t.jsonl", "--timeline-file", "@WORK/dangling.jsonl"},
       {"--metrics-file @WORK/t.jsonl and --timeline-file @WORK/dangling.jsonl are the same file"}},
      {{"--metrics-file", "@WORK/m.jsonl", "--timeline-file", "@WORK/hard.jsonl"}, {"are the same file"}},
      {{"--metrics-file", "@WORK/m.jsonl", "--prometheus-file", "@WORK/sub/../m.jsonl"}, {"are the same file"}},
      {{"--config", "@WORK/run.cfg", "--metrics-file", "@WORK/cfg-link"},
       {"--metrics-file @WORK/cfg-link is the same file as --config @WORK/run.cfg, which is read"}},
      {{"--resume", "@WORK/resume.hpck", "--timeline-file", "@WORK/./resume.hpck"},
       {"--timeline-file @WORK/./resume.hpck is the same file as --resume @WORK/resume.hpck"}},
      {{"--checkpoint-dir", "@WORK/ck", "--metrics-file", "@WORK/sub/../ck/ckpt-00000007.hpck"},
       {"is the same file as --checkpoint-dir @WORK/ck's checkpoint @WORK/ck/ckpt-00000007.hpck"}},
      // Not there yet, but the checkpoints' own: replaced or moved away once they are written.
      {{"--checkpoint-dir", "@WORK/fresh", "--metrics-file", "@WORK/fresh/heartbeat"},
       {"--metrics-file @WORK/fresh/heartbeat is in --checkpoint-dir under a name its own files take (heartbeat)"}},
      {{"--checkpoint-dir", "@WORK/ck", "--timeline-file", "@WORK/sub/../ck/run-id"},
       {"--timeline-file @WORK/sub/../ck/run-id is in --checkpoint-dir", "(run-id)"}},
      {{"--checkpoint-dir", "@WORK/fresh/", "--timeline-file", "@WORK/./fresh/ckpt-000000004.hpck"},
       {"is in --checkpoint-dir under a name its own files take (ckpt-000000004.hpck)"}},
      {{"--checkpoint-dir", "@WORK/fresh", "--metrics-file", "@WORK/fresh/.spare"},
       {"is in --checkpoint-dir under a name its own files take (.spare)"}},
  };
  for (const auto& [args, expect] : cases) expect_refused(args, expect);
}

// A file too large for the process's memory (here a sparse 64 GiB checkpoint whose parameters
// section fills it, a 6 GiB IDX file, under a 4 GB address-space limit) is named with its size in
// one line, exit 2, not "out of memory (a smaller --batch-size ...)"; --resume auto passes such a
// newest checkpoint by.
TEST_F(Cli, AFileTooLargeForMemoryIsNamed) {
  const std::string w = work_.str();
  auto limited = [&](const std::string& command) {
    return run_program({"/bin/bash", "-c", "ulimit -v 4000000 && exec " + command}, kDeadline);
  };
  const std::string big = w + "/big.hpck";
  const auto make_big = [](const std::string& path) {
    {
      // The header, then a section header: kind 2 (parameters), its length (the rest of the
      // file), a CRC that the read never gets to.
      const uint64_t size = uint64_t{64} << 30, params = size - 8 - 4 - 16;
      const uint32_t version = 1, kind = 2, crc = 0;
      std::ofstream out(path, std::ios::binary);
      out << "HPCTCKPT";
      for (const auto& [p, n] : std::initializer_list<std::pair<const void*, size_t>>{
               {&version, 4}, {&kind, 4}, {&params, 8}, {&crc, 4}})
        out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    }
    fs::resize_file(path, uint64_t{64} << 30);
  };
  make_big(big);
  const RunResult inspect = limited("'" + hpctrain_binary() + "' inspect '" + big + "'");
  EXPECT_EQ(inspect.exit_code, 2) << inspect.out << inspect.err;
  EXPECT_NE(inspect.err.find("cannot read checkpoint " + big + ": its 68719476736 bytes do not fit in this process's "
                             "memory"), std::string::npos) << inspect.err;
  // Beside an older valid checkpoint, under a newer step's name: passed by with a warning.
  fs::create_directories(w + "/ck");
  const RunResult first = run({"--checkpoint-dir", "@WORK/ck"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  fs::rename(big, w + "/ck/ckpt-000000099.hpck");
  std::string resume = "'" + hpctrain_binary() + "'";
  for (const std::string& a : with_quick_defaults(in_work({"--checkpoint-dir", "@WORK/ck"}),
                                                  data_.str()))
    resume += " '" + a + "'";
  const RunResult resumed = limited(resume);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("ckpt-000000099.hpck: its 68719476736 bytes do not fit"), std::string::npos) << resumed.err;
  // Every checkpoint alike too large: memory is short (a tight ulimit -v, strict overcommit),
  // not the files wrong. Exit 2 and every file kept where it is; the run had started afresh and
  // moved them all aside, and the requeue after it, with memory to spare, began at step 0.
  fs::create_directories(w + "/short");
  make_big(w + "/short/ckpt-000000020.hpck");
  make_big(w + "/short/ckpt-000000010.hpck");
  std::string short_run = "'" + hpctrain_binary() + "'";
  for (const std::string& a : with_quick_defaults(in_work({"--checkpoint-dir", "@WORK/short"}), data_.str()))
    short_run += " '" + a + "'";
  const RunResult afresh = limited(short_run);
  EXPECT_EQ(afresh.exit_code, 2) << afresh.err;
  EXPECT_NE(afresh.err.find("ckpt-000000020.hpck: its 68719476736 bytes do not fit in this process's memory; not "
                            "passed by: no older checkpoint fits either, so this process's memory is short"),
            std::string::npos)
      << afresh.err;
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(w + "/short")) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"ckpt-000000010.hpck", "ckpt-000000020.hpck"}));
  // A dataset file: its header says 8 million images, its size is theirs (5.8 GiB). (One of more
  // bytes than its header declares is refused by its size before it is read: data_test.)
  const std::string data = w + "/big-data";
  fs::create_directories(data);
  for (const char* f : {"train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    fs::copy_file(data_.file(f), data + "/" + f);
  fs::copy_file(data_.file("train-images-idx3-ubyte"), data + "/train-images-idx3-ubyte");
  {
    const uint8_t count[4] = {0x00, 0x7a, 0x12, 0x00};  // 8000000, big-endian
    std::fstream header(data + "/train-images-idx3-ubyte", std::ios::in | std::ios::out | std::ios::binary);
    header.seekp(4);
    header.write(reinterpret_cast<const char*>(count), 4);
  }
  fs::resize_file(data + "/train-images-idx3-ubyte", 16 + uint64_t{8000000} * 784);
  const RunResult read = limited("'" + hpctrain_binary() + "' --device cpu --quiet --threads 1 --data-dir '" + data + "'");
  EXPECT_EQ(read.exit_code, 2) << read.err;
  EXPECT_NE(read.err.find("dataset file " + data + "/train-images-idx3-ubyte does not fit in this process's memory"),
            std::string::npos) << read.err;
  EXPECT_EQ(lines_of(read.err).size(), 1u) << read.err;
}

// A run that ends for want of memory under an address-space limit (ulimit -v: Slurm's
// VSizeFactor, a login's limit) ends within seconds. Its own end was done at once, but the
// process's exit waited in OpenBLAS's shutdown for a worker that retried its buffer's allocation
// without end: ten minutes, until --step-timeout's bound said "a file system that does not
// answer?". The libraries' exit handlers now have 10 s (bound_the_exit), then a warning line.
TEST_F(Cli, ARunOutOfMemoryUnderAnAddressSpaceLimitEndsWithinSeconds) {
  std::string line = "ulimit -v 400000 && exec '" + hpctrain_binary() + "'";
  for (const std::string& a : with_quick_defaults(
           in_work({"--checkpoint-dir", "@WORK/ck", "--model", "resnet50", "--device", "cpu", "--threads", "2"}),
           data_.str()))
    line += " '" + a + "'";
  const RunResult r = run_program({"/bin/bash", "-c", line}, kDeadline);
  ASSERT_FALSE(r.timed_out) << "still running after " << kDeadline << " s: " << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.rfind("hpctrain: error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find("--step-timeout"), std::string::npos) << r.err;
}

// A thread that cannot start (this user's process limit reached, ulimit -u) is one line and exit 1
// saying so, wherever it happens: the signal thread before MPI (bare 'terminate called' and
// SIGABRT before), the loader's and the others' later (a bare "Resource temporarily unavailable").
// ulimit -u binds users other than root only: run as nobody, with OpenBLAS's pool kept off.
TEST_F(Cli, AThreadThatCannotStartIsOneLineSayingWhy) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (setpriv to another user); CI runs as root";
  if (!fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "no setpriv (util-linux)";
  for (const int limit : {1, 3}) {
    const RunResult r = run_program(
        {"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/bin/bash", "-c",
         "ulimit -u " + std::to_string(limit) + " && OPENBLAS_NUM_THREADS=1 exec '" + hpctrain_binary() +
             "' --device cpu --quiet --threads 1 --max-steps 1"},
        kDeadline);
    EXPECT_EQ(r.exit_code, 1) << limit << ": " << r.err;
    EXPECT_EQ(r.err.rfind("hpctrain: error: cannot start a thread (Resource temporarily unavailable): this user's "
                          "limit of processes and threads (ulimit -u",
                          0),
              0u)
        << limit << ": " << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << limit << ": " << r.err;
  }
}

// Streams are shared by intent: /dev/stdout for both files is no conflict, and identity is told
// without opening anything.
TEST_F(Cli, StreamsMayBeSharedByOutputs) {
  const RunResult r = run({"--metrics-file", "/dev/stdout", "--timeline-file", "/dev/stdout"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"event\""), std::string::npos) << r.out;
}

// An output that fails while written (a full disk: /dev/full) is one warning naming it, the same
// for each, and the run goes on to its end: a lost log line never costs the training.
TEST_F(Cli, AnOutputThatCannotBeWrittenIsOneWarning) {
  for (const std::string option : {"--metrics-file", "--timeline-file"}) {
    const RunResult r = run({option, "/dev/full"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(lines_of(r.err), std::vector<std::string>{"hpctrain: warning: cannot write " + option +
                                                        " /dev/full: No space left on device (said once; training "
                                                        "goes on, and no more " +
                                                        (option == "--metrics-file" ? "lines" : "events") +
                                                        " are written to it)"});
  }
}

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

// A refused run leaves no checkpoint directory behind: one in a folder others may write to was
// made before the folder was judged, and of new/a/b only b was taken away again.
TEST_F(Cli, ARefusedRunLeavesNoCheckpointDirectoryBehind) {
  const fs::path open_folder = work_.path() / "open";
  fs::create_directory(open_folder);
  fs::permissions(open_folder, fs::perms::all);  // 0777, whatever the umask
  expect_usage_error(run({"--checkpoint-dir", (open_folder / "ck").string(), "--max-steps", "1"}),
                     {"is writable by others (mode 777)"});
  EXPECT_FALSE(fs::exists(open_folder / "ck"));
  fs::create_directory(work_.path() / "kept");
  for (const std::string dir : {"new/a/b/", "kept/c/d", "new/./e/../f"}) {
    expect_usage_error(run({"--checkpoint-dir", work_.file(dir), "--data-dir", "/nonexistent/hpctrain-data"}),
                       {"/nonexistent/hpctrain-data", "does not exist"});
    EXPECT_FALSE(fs::exists(work_.path() / "new")) << dir;
    EXPECT_FALSE(fs::exists(work_.path() / "kept" / "c")) << dir;
    EXPECT_TRUE(fs::exists(work_.path() / "kept")) << dir;
  }
}

// No --data-dir, and nothing at the dataset's usual place (relative: data/NAME here): the line
// says how to get the dataset, not only "pass --data-dir" (which left the user to find out how
// to fill that directory).
TEST_F(Cli, AMissingDatasetSaysHowToGetIt) {
  for (const std::string name : {"cifar100", "shards"})
    if (fs::exists("data/" + name)) GTEST_SKIP() << "data/" << name << " exists where the test runs";
  expect_usage_error(run_hpctrain({"--dataset", "cifar100", "--threads", "1", "--max-steps", "1"}, kDeadline),
                     {"data directory data/cifar100 does not exist (hpcdata prepare cifar100 --out DIR fetches it; "
                      "then pass --data-dir DIR)"});
  expect_usage_error(run_hpctrain({"--dataset", "shards", "--threads", "1", "--max-steps", "1"}, kDeadline),
                     {"data directory data/shards does not exist (pack an image folder with hpcdata pack SRC DIR, "
                      "then pass --data-dir DIR)"});
}

// Unreadable data is reported with its real cause, never as "does not exist" (run without
// root's override, so that the test means the same as root, as CI runs it).
TEST_F(Cli, UnreadableDataNamesTheRealCause) {
  auto quick = [&](const std::string& dir) { return with_quick_defaults({"--data-dir", dir}, data_.str()); };
  const std::string file = data_.file("train-labels-idx1-ubyte");
  fs::permissions(file, fs::perms::none);
  auto before = snapshots({data_.str()});
  expect_usage_error(run_hpctrain_without_override(quick(data_.str())), {file, "Permission denied"});
  EXPECT_EQ(snapshots({data_.str()}), before);
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(data_.str(), fs::perms::none);  // the directory: its entries cannot be looked up
  before = snapshots({data_.str()});
  expect_usage_error(run_hpctrain_without_override(quick(data_.str())), {data_.str(), "Permission denied"});
  EXPECT_EQ(snapshots({data_.str()}), before);
  fs::permissions(data_.str(), fs::perms::owner_all);
  const std::string inside = data_.file("sub/data");
  fs::create_directories(inside);
  fs::permissions(data_.file("sub"), fs::perms::none);  // --data-dir itself cannot be reached
  expect_usage_error(run_hpctrain_without_override(quick(inside)),
                     {"cannot read data directory", inside, "Permission denied"});
  fs::permissions(data_.file("sub"), fs::perms::owner_all);
}

TEST_F(Cli, UnreadableConfigFileNamesTheRealCause) {
  write_text(work_.file("c.cfg"), "epochs = 1\n");
  fs::permissions(work_.file("c.cfg"), fs::perms::none);
  expect_usage_error(
      run_hpctrain_without_override(with_quick_defaults({"--config", work_.file("c.cfg")}, data_.str())),
      {"cannot read config file", work_.file("c.cfg"), "Permission denied"});
}

// A dataset file that is a directory is named as one, not as missing.
TEST_F(Cli, DatasetFileThatIsADirectory) {
  const std::string file = data_.file("t10k-images-idx3-ubyte");
  fs::remove(file);
  fs::create_directory(file);
  expect_refused({}, {file, "not a regular file (a directory)"});
}

TEST_F(Cli, ConfigFileMissing) {
  expect_usage_error(run({"--config", "/nonexistent/hpctrain.cfg"}), {"config file", "/nonexistent/hpctrain.cfg"});
}

TEST_F(Cli, ConfigFileProblems) {
  TempDir dir("cli-config");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"bogus = 1\n", {"bogus"}},                       // unknown key
      {"epochs = abc\n", {"config file", "--epochs must be a whole number, got 'abc'"}},  // bad value
      {"lr = 1e999\n", {"config file", "--lr must be a number, got '1e999' (out of range)"}},
      {"epochs\n", {"epochs"}},                         // not key = value
      {"lr = -3\n", {"--lr", "positive"}},              // validated like the command line
      {"model = nope\n", {"'nope'"}},
      {"epochs = 1\nepochs = 2\n", {"config file", "'epochs' cannot be specified more than once"}},  // duplicate
      {"[train]\nepochs = 1\n", {"config file", "line 1: '[train]'", "sections such as [train] are not read"}},
      {"epochs = 1\n [train] \n", {"line 2: '[train]': sections such as [train] are not read"}},  // was: accepted
      {"config = other.cfg\n", {"sets 'config', which only the command line can give"}},  // not followed
      // Boost cuts a value at '#': was ./run written silently
      {"checkpoint-dir = run#1\n", {"line 1: 'checkpoint-dir = run#1': a '#' ends the value there"}},
      {"help = 1\n", {"sets 'help'"}},       // was: help printed, exit 0, nothing trained
      {"version = 1\n", {"sets 'version'"}},
      {"checkpoint-dir =\n", {"'checkpoint-dir' is empty"}},  // an unset variable in a generated file
      {"epochs = 1\n  = 3\n", {"line 2: '= 3' names no option before its '='"}},  // was: "unrecognised option"
      {"epochs = 1\n\x01\x02\x03\x7f\n", {"is not a text file (byte 11"}},  // binary
      {std::string(2 << 20, '#'), {"is larger than 1 MB"}},  // huge
      // No shell reads the file: each trained into a directory named as written, under this one.
      {"checkpoint-dir = \"/tmp/ck\"\n", {"'checkpoint-dir' is \"/tmp/ck\", in quotes, which would be part of it"}},
      {"model = 'cnn'\n", {"'model' is 'cnn', in quotes"}},
      {"checkpoint-dir = ~/runs\n", {"'checkpoint-dir' is ~/runs: a config file's ~ is not your home directory"}},
      {"checkpoint-dir = /data/$USER/runs\n", {"'checkpoint-dir' is /data/$USER/runs: a config file's variables are "
                                               "not expanded"}},
      {"metrics-file = ${HOME}/m.jsonl\n", {"variables are not expanded"}}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file(std::to_string(i).append(".cfg"));  // not "c" + ...: GCC 12 -Wrestrict
    write_text(path, cases[i].first);
    SCOPED_TRACE(cases[i].first.substr(0, 40));
    auto expect = cases[i].second;
    if (i >= 5) expect.push_back(path);  // the file is named
    expect_refused({"--config", path}, expect);
  }
  // A NUL byte (a binary file named by mistake) is refused the same way, not cut short.
  write_bytes(dir.file("nul.cfg"), Bytes{'e', 'p', 'o', 'c', 'h', 's', '=', '1', 0, '\n'});
  expect_refused({"--config", dir.file("nul.cfg")}, {"nul.cfg", "not a text file (byte 8"});
}

// What is wrong in a config file is refused also where the command line sets the same option
// (whose value wins): Boost passes over such a name, and a name given twice, a bad value or one
// out of its range went unseen.
TEST_F(Cli, ConfigFileProblemsWhereTheCommandLineSetsTheOptionToo) {
  TempDir dir("cli-config");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"epochs = 1\nepochs = 2\n", {"'epochs' cannot be specified more than once"}},
      {"epochs = abc\n", {"epochs", "abc"}},
      {"model = nope\n", {"'nope'"}},
      // Out of its range (read, but refused only by the checks after the table's).
      {"epochs = 2000000\n", {"--epochs must be at most 1000000, got 2000000"}},
      {"seed = -1\n", {"--seed", "-1"}},
      {"lr = -0.5\n", {"--lr must be a positive number, got -0.5"}},
      {"bucket-mb = 0\n", {"--bucket-mb must be a size in MB"}},
      // A size read only when the run starts, once: passed over where the command line set it.
      {"snapshot-max-memory = banana\n", {"--snapshot-max-memory", "banana"}}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file(std::to_string(i).append(".cfg"));
    write_text(path, cases[i].first);
    SCOPED_TRACE(cases[i].first);
    auto expect = cases[i].second;
    expect.push_back("config file " + path);
    expect_refused({"--config", path, "--epochs", "1", "--model", "cnn", "--seed", "3", "--lr", "0.1", "--bucket-mb",
                    "25", "--snapshot-max-memory", "10%"},
                   expect);
  }
}

// A switch in the file and its opposite on the command line: the command line's wins, as its
// values do (both reached the pair, which refused them as contradicting each other). Both in
// one place still contradict. The checkpoint records which won.
TEST_F(Cli, TheCommandLinesSwitchWinsOverTheFilesOpposite) {
  TempDir dir("cli-config");
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "--decay-bias-and-norm over the file's no-" : "--no-decay-bias-and-norm over the file's");
    const std::string cfg = dir.file(on ? "on.cfg" : "off.cfg"), ck = dir.file(on ? "ck_on" : "ck_off");
    write_text(cfg, on ? "no-decay-bias-and-norm = 1\n" : "decay-bias-and-norm = 1\n");
    const RunResult r = run({"--config", cfg, on ? "--decay-bias-and-norm" : "--no-decay-bias-and-norm",
                             "--checkpoint-dir", ck});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const RunResult shown = run_program({hpctrain_binary(), "inspect", ck + "/ckpt-000000001.hpck"}, kDeadline);
    EXPECT_NE(shown.out.find(on ? " --decay-bias-and-norm=1 " : " --decay-bias-and-norm=0 "), std::string::npos)
        << shown.out;
  }
  write_text(dir.file("both.cfg"), "decay-bias-and-norm = 1\nno-decay-bias-and-norm = 1\n");
  expect_refused({"--config", dir.file("both.cfg")}, {"--decay-bias-and-norm and --no-decay-bias-and-norm contradict"});
  expect_refused({"--decay-bias-and-norm", "--no-decay-bias-and-norm"}, {"contradict each other"});
}

// What editors write is read: a UTF-8 byte-order mark, CRLF line ends, comments, no final
// newline.
TEST_F(Cli, ConfigFileAsEditorsWriteIt) {
  TempDir dir("cli-config");
  write_text(dir.file("c.cfg"), "\xEF\xBB\xBF# from Notepad\r\nepochs = 1 # one\r\nlr = 0.05");
  const std::string m = dir.file("m.jsonl");
  const RunResult r = run({"--config", dir.file("c.cfg"), "--metrics-file", m});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(done_of(m).at("steps").number, 1);
}

// Every option a command line can give but --config, --help and --version, paths included, can
// come from a config file alone. (A file's paths were refused as "empty": the file's own check
// looked at options the file's values never reached.)
TEST_F(Cli, ConfigFileGivesPaths) {
  TempDir dir("cli-config");
  const std::string m = dir.file("m.jsonl"), ck = dir.file("ck"), t = dir.file("t.jsonl");
  write_text(dir.file("c.cfg"), "data-dir = " + data_.str() + "\nmetrics-file = " + m + "\ncheckpoint-dir = " + ck +
                                    "\ntimeline-file = " + t + "\nthreads = 1\nmax-steps = 1\nbatch-size = 16\n"
                                    "test-samples = 16\n");
  const RunResult r = run_hpctrain({"--config", dir.file("c.cfg"), "--quiet"}, kDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(done_of(m).at("steps").number, 1);
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000001.hpck"));
  EXPECT_GT(fs::file_size(t), 0u);
}

TEST_F(Cli, UnwritableMetricsFile) {
  expect_usage_error(run({"--metrics-file", "/nonexistent/dir/m.jsonl"}),
                     {"--metrics-file", "/nonexistent/dir/m.jsonl", "No such file"});
  TempDir dir("cli-metrics");
  expect_usage_error(run({"--metrics-file", dir.str()}), {"--metrics-file", dir.str()});  // a directory
}

// hpctrain appends to metrics and timeline files: never to a file that holds something else
// (a dataset file named by mistake would be damaged), and a refused run leaves no file of
// its own behind.
TEST_F(Cli, MetricsFilesAreNeverDamagedNorLeftBehind) {
  const std::string data_file = data_.file("t10k-labels-idx1-ubyte");
  expect_refused({"--metrics-file", data_file}, {"--metrics-file", data_file, "is not a JSON Lines file"});
  // A name that does not end in .jsonl is a Chrome trace (issue 44): a JSON array or nothing.
  expect_refused({"--timeline-file", data_file}, {"--timeline-file", data_file, "is not a Chrome trace"});
  write_text(work_.file("lines.json"), "{\"step\":0}\n");
  expect_refused({"--timeline-file", "@WORK/lines.json"},
                 {"--timeline-file @WORK/lines.json exists and is not a Chrome trace", "ending in .jsonl"});
  // Opened, then the run refused (the checkpoint directory cannot be made): the files are gone.
  expect_refused({"--metrics-file", "@WORK/m.jsonl", "--timeline-file", "@WORK/t.jsonl", "--checkpoint-dir",
                  "/dev/null/ckpt", "--resume", "none"},
                 {"cannot create checkpoint directory /dev/null/ckpt"});
  EXPECT_FALSE(fs::exists(work_.file("m.jsonl")));
  // An existing metrics file stays, and is appended to.
  write_text(work_.file("m.jsonl"), "{\"event\":\"earlier\"}\n");
  ASSERT_EQ(run({"--metrics-file", "@WORK/m.jsonl"}).exit_code, 0);
  const auto lines = read_json_lines(work_.file("m.jsonl"));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.front().at("event").str, "earlier");
  EXPECT_EQ(lines.back().at("event").str, "done");
}

// Another schedule's options (here step's and onecycle's under cosine), given on the command line
// or in --config, do nothing: one warning each, and the run goes on (a resume repeating the
// command line of its run stays accepted). So do --momentum under onecycle's cycled momentum
// and the cycle's bounds without it. The run's own schedule's options and the defaults of the
// others say nothing.
TEST_F(Cli, AnotherSchedulesOptionsAreSaidToBeIgnored) {
  write_text(work_.file("run.cfg"), "onecycle-pct-start = 0.4\n");
  const RunResult r = run({"--lr-schedule", "cosine", "--min-lr", "0.01", "--lr-step-epochs", "1", "--lr-gamma", "0.5",
                           "--config", "@WORK/run.cfg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_of(r.err),
            (std::vector<std::string>{
                "hpctrain: warning: --lr-step-epochs is ignored: it is for --lr-schedule step, and this run's is cosine",
                "hpctrain: warning: --lr-gamma is ignored: it is for --lr-schedule step, and this run's is cosine",
                "hpctrain: warning: --onecycle-pct-start is ignored: it is for --lr-schedule onecycle, and this run's "
                "is cosine"}));
  const RunResult own = run({"--lr-schedule", "step", "--lr-step-epochs", "1", "--lr-gamma", "0.5", "--momentum", "0.8"});
  ASSERT_EQ(own.exit_code, 0) << own.err;
  EXPECT_EQ(own.err, "");
  // onecycle (the default) cycles the momentum unless told not to: then its bounds are unused.
  const RunResult cycled = run({"--momentum", "0.8", "--onecycle-max-momentum", "0.9"});
  ASSERT_EQ(cycled.exit_code, 0) << cycled.err;
  EXPECT_EQ(lines_of(cycled.err), std::vector<std::string>{
                                      "hpctrain: warning: --momentum is ignored: --lr-schedule onecycle cycles the "
                                      "momentum between --onecycle-max-momentum and --onecycle-base-momentum "
                                      "(--no-cycle-momentum keeps --momentum)"});
  const RunResult fixed = run({"--no-cycle-momentum", "--momentum", "0.8", "--onecycle-base-momentum", "0.7"});
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  EXPECT_EQ(lines_of(fixed.err), std::vector<std::string>{"hpctrain: warning: --onecycle-base-momentum is ignored "
                                                          "under --no-cycle-momentum (the momentum is --momentum's)"});
}

// Options that the run's other options leave without effect: one warning each, and the run goes
// on. They were taken in silence: --sync-batch-norm with --no-batch-norm, --no-deterministic on
// the CPU, --progress-interval beside --log-every N, --log-level debug under --quiet.
TEST_F(Cli, OptionsWithoutEffectAreSaidToBeIgnored) {
  const RunResult r = run({"--device", "cpu", "--sync-batch-norm", "--no-batch-norm", "--no-deterministic",
                           "--log-every", "5", "--progress-interval", "5s", "--log-level", "debug"});  // (and --quiet)
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_of(r.err),
            (std::vector<std::string>{
                "hpctrain: warning: --sync-batch-norm is ignored: --no-batch-norm leaves the model without batch norm",
                "hpctrain: warning: --no-deterministic is ignored on the CPU (--device cpu): it lets cuDNN choose its "
                "algorithms on the GPU, and CPU runs repeat bit for bit",
                "hpctrain: warning: --progress-interval is ignored beside --log-every 5: it spaces the progress lines "
                "under --log-every 0 only",
                "hpctrain: warning: --log-level debug is ignored under --quiet, which prints only warnings and errors"}));
  // Each with what gives it effect says nothing.
  const RunResult used = run({"--device", "cpu", "--sync-batch-norm", "--progress-interval", "5s", "--log-level", "error"});
  ASSERT_EQ(used.exit_code, 0) << used.err;
  EXPECT_EQ(used.err, "");
}

// A metrics file whose last line was cut (a run killed while writing it) gets the new events on
// lines of their own, with one warning; the cut line stays as it was. (They were glued onto it,
// and hpctrain-plot refused the whole file.) The cut line may be the file's only one, a run killed
// while writing its config event (that file was refused as not JSON Lines, and every later run).
TEST_F(Cli, MetricsFileWithACutLastLine) {
  for (const std::string before :
       {"{\"event\":\"earlier\"}\n{\"event\":\"epoch\",\"ep", "{\"event\":\"config\",\"hpctrain_ver"}) {
    SCOPED_TRACE(before);
    const std::string m = work_.file("m.jsonl");
    std::filesystem::remove(m);
    write_text(m, before);
    const RunResult r = run({"--metrics-file", m});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(lines_of(r.err), std::vector<std::string>{"hpctrain: warning: --metrics-file " + m + " ends in a cut "
                                                        "line (a run killed while writing it?): it stays as it is, "
                                                        "and this run's events start on a new line after it"});
    const std::string text = read_text(m);
    ASSERT_EQ(text.rfind(before + "\n{", 0), 0u) << text;
    const auto lines = lines_of(text.substr(before.size() + 1));
    for (const std::string& line : lines) EXPECT_NO_THROW(FlatJsonParser(line).parse()) << line;
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(FlatJsonParser(lines.back()).parse().at("event").str, "done");
  }
}

// A Chrome trace whose last event was cut (a run killed while writing it) loses that event, with
// one warning, and stays one JSON array with the new run's events after the last whole one.
TEST_F(Cli, ChromeTraceWithACutLastEvent) {
  const std::string t = work_.file("t.json");
  const std::string kept = "[\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"}\"}}";
  write_text(t, kept + ",\n{\"name\":\"step 3\",\"ph\":\"X\",\"args\":{\"step\":3}");
  const RunResult r = run({"--timeline-file", t});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_of(r.err), std::vector<std::string>{"hpctrain: warning: --timeline-file " + t + " ends in a cut "
                                                      "event (a run killed while writing it?): that event is "
                                                      "dropped and this run's events follow the one before it"});
  const std::string text = read_text(t);
  EXPECT_EQ(text.rfind(kept + ",\n{\"name\":\"process_name\"", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  EXPECT_EQ(count_of(text, "step 3"), 0) << text;
}

// An empty file given as the Chrome trace (mktemp's, touch's) holds an empty array from the start,
// as a new one does: a run killed before its first gather left it 0 bytes, which no trace viewer
// or JSON reader loads. The next run appends its events to it.
TEST_F(Cli, AnEmptyTimelineFileIsAnArrayFromTheStart) {
  const std::string t = work_.file("t.json");
  write_text(t, "");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "1", 1);
  const RunResult killed = run({"--timeline-file", t, "--max-steps", "2"});
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_NE(killed.exit_code, 0) << killed.err;
  EXPECT_EQ(read_text(t), "[\n]\n");
  // A run that fails before its first gather, and ends by itself, leaves it as it was (as it
  // removes a file it created).
  write_text(t, "");
  const RunResult diverged = run({"--timeline-file", t, "--max-steps", "5", "--lr", "1e30"});
  EXPECT_EQ(diverged.exit_code, 2) << diverged.err;
  EXPECT_NE(diverged.err.find("training diverged"), std::string::npos) << diverged.err;
  EXPECT_EQ(read_text(t), "");
  const RunResult r = run({"--timeline-file", t});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_text(t);
  EXPECT_EQ(text.rfind("[\n{\"name\":\"process_name\"", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
}

// A Chrome trace another run is writing (its file locked) is left as it is, said once, and the run
// goes on without it (the holder may be a lost host's run, whose lock an NFS server keeps a while:
// a relaunch must not end there): two runs given one --timeline-file each wrote their events from
// the end they had found, over each other's, and the file was no JSON array any more; both exited
// 0. Once it is free, appended to.
TEST_F(Cli, ATimelineFileAnotherRunWritesIsLeftToIt) {
  const std::string t = work_.file("t.json");
  write_text(t, "[\n]\n");
  const int held = ::open(t.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(held, F_OFD_SETLK, &l), 0);
  const RunResult busy = run({"--timeline-file", t});
  EXPECT_EQ(busy.exit_code, 0) << busy.err;
  EXPECT_EQ(count_of(busy.err, "--timeline-file " + t + " is being written by another process"), 1) << busy.err;
  EXPECT_EQ(read_text(t), "[\n]\n");
  ::close(held);
  const RunResult r = run({"--timeline-file", t});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(t).rfind("[\n{\"name\":\"process_name\"", 0), 0u);
}

// Outputs that are streams (issue 41). A FIFO that nothing reads is refused at once, and stays
// (opening it to write waits for a reader: hpctrain waited forever, before training, reading its
// own empty FIFO); --prometheus-file, rewritten by renaming a new file over it, takes no stream.
TEST_F(Cli, OutputFifoWithoutAReaderIsRefusedAtOnce) {
  const std::string fifo = work_.file("fifo"), prom = work_.file("p.prom");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(prom.c_str(), 0600), 0);
  expect_refused({"--metrics-file", fifo}, {"--metrics-file " + fifo + " is a FIFO that has no reader"});
  expect_refused({"--timeline-file", fifo}, {"--timeline-file " + fifo + " is a FIFO that has no reader"});
  expect_refused({"--prometheus-file", prom}, {"--prometheus-file " + prom + " is not a regular file"});
}

// A .prom file hpctrain did not write is not replaced (it was, silently, by the first rewrite);
// one it wrote, or an empty one, is.
TEST_F(Cli, APrometheusFileOfAnotherWriterIsKept) {
  const std::string prom = work_.file("node.prom");
  write_text(prom, "node_disk_ok 1\n");
  expect_refused({"--prometheus-file", prom}, {"--prometheus-file " + prom + " holds a file hpctrain did not write"});
  EXPECT_EQ(read_text(prom), "node_disk_ok 1\n");
  write_text(prom, "");
  const RunResult first = run({"--prometheus-file", prom});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(read_text(prom).rfind("# HELP hpctrain_", 0), 0u);
  const RunResult again = run({"--prometheus-file", prom});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  // A path through a file: refused at start, as a missing directory is (Cli.BadArgs), not only
  // warned of at each write.
  expect_refused({"--prometheus-file", prom + "/x.prom"},
                 {"cannot write --prometheus-file " + prom + "/x.prom: " + prom + " is not a directory"});
}

// The new file that replaces --prometheus-file is made under a name no one can guess: in a
// collector directory other users write to, a link planted at a fixed name (.NAME.prom.tmp, as it
// was) made the run overwrite the link's target, another of its user's files.
TEST_F(Cli, APrometheusFilesTemporaryFollowsNoPlantedLink) {
  const std::string prom = work_.file("job.prom"), victim = work_.file("victim.txt");
  write_text(victim, "years of work\n");
  fs::create_symlink(victim, work_.file(".job.prom.tmp"));
  const RunResult r = run({"--prometheus-file", prom});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(victim), "years of work\n");
  EXPECT_EQ(read_text(prom).rfind("# HELP hpctrain_", 0), 0u);
  EXPECT_EQ(fs::status(prom).permissions(), fs::perms(0644));  // node_exporter reads it as another user
  for (const auto& e : fs::directory_iterator(work_.str()))  // no temporary left
    EXPECT_EQ(e.path().filename().string().find(".job.prom.tmp."), std::string::npos) << e.path();
}

// A collector directory every job may write to (sticky, as /tmp): a link another user planted
// there under the job's file name was followed (through_links reads it, which the kernel's
// fs.protected_symlinks never sees), and the run created or replaced the file it chose, one of
// this user's. Refused as --metrics-file's is; this user's own link there is still followed.
// Needs root, to give the link to another user.
TEST_F(Cli, APrometheusFileLinkPlantedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (lchown to another user); CI runs as root";
  const std::string shared = work_.file("collector"), victim = work_.file("victim.prom");
  fs::create_directory(shared);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  const std::string planted = shared + "/job.prom";
  fs::create_symlink(victim, planted);
  ASSERT_EQ(::lchown(planted.c_str(), 4343, 4343), 0);
  expect_refused({"--prometheus-file", planted},
                 {"refusing --prometheus-file " + planted + ": the link " + planted + " belongs to uid 4343 in " +
                  shared + " (mode 1777, writable by every user): another user may have put it there"});
  EXPECT_FALSE(fs::exists(fs::symlink_status(victim)));
  const std::string own = shared + "/own.prom";
  fs::create_symlink(victim, own);
  const RunResult r = run({"--prometheus-file", own});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(victim).rfind("# HELP hpctrain_", 0), 0u);
}

// --config from a pipe, as bash's process substitution gives it, is read as a file is.
TEST_F(Cli, ConfigFromAPipe) {
  const std::string m = work_.file("m.jsonl");
  std::string command = "exec";
  for (const std::string& a : hpctrain_argv({"--quiet", "--data-dir", data_.str(), "--threads", "1", "--batch-size",
                                             "16", "--test-samples", "16", "--metrics-file", m, "--config"}))
    command += " '" + a + "'";
  command += " <(printf 'max-steps = 2\\n')";
  const RunResult r = run_program({"/bin/bash", "-c", command}, kDeadline);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(done_of(m).at("steps").number, 2);
}

// Whether process `pid` has `path` open (/proc/PID/fd).
bool has_open(pid_t pid, const std::string& path) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    if (fs::read_symlink(e.path(), ec) == path) return true;
  return false;
}

// A FIFO as --config that nothing writes to: hpctrain waits for its lines, but a stop signal ends
// the wait at once, in one line (it was kept for the options, which never came: SIGTERM did
// nothing, and only SIGKILL ended the run). The signal comes once hpctrain waits on the FIFO
// (it came after a fixed 1.5 s, which a start-up on a loaded machine may outlast: the default
// action then ends it with 143 and no line), and after half a second more of waiting.
TEST_F(Cli, ConfigFifoWithoutAWriterEndsOnSigterm) {
  const std::string fifo = work_.file("c.cfg");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Started run(hpctrain_argv(with_quick_defaults({"--config", fifo}, data_.str())));
  ASSERT_TRUE(wait_until([&] { return (blocks_signal(run.pid(), SIGTERM) && has_open(run.pid(), fifo)) || !run.running(); },
                         kDeadline));
  usleep(500 * 1000);
  ASSERT_TRUE(run.running()) << "it did not wait for the FIFO's writer";
  ASSERT_EQ(kill(run.pid(), SIGTERM), 0);
  const double signalled = run.seconds();
  const RunResult r = run.finish(kDeadline);
  ASSERT_FALSE(r.timed_out) << "SIGTERM did not end the wait";
  EXPECT_LT(r.seconds - signalled, 5);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_EQ(lines_of(r.err), std::vector<std::string>{"hpctrain: stopped at once by SIGTERM while waiting for "
                                                      "--config " + fifo + " to be written (a FIFO or pipe whose "
                                                      "writer has not finished): nothing to save yet"});
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
        BadData{"count_mismatch", "train-labels-idx1-ubyte", [] { return idx_labels(63); },
                {"disagree", "60000", "63"}},
        BadData{"label_out_of_range", "t10k-labels-idx1-ubyte",
                [] {
                  Bytes b = idx_labels(10000);
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

// Fashion-MNIST's files hold their published counts (60000 training and 10000 test records):
// the test files copied over the training files (training on the test set) are refused, and so
// is a training set of another size; each as one line naming the files.
TEST_F(Cli, FashionMnistFilesHoldThePublishedRecords) {
  const std::string train_images = data_.file("train-images-idx3-ubyte");
  const std::string test_images = data_.file("t10k-images-idx3-ubyte");
  fs::copy_file(test_images, train_images, fs::copy_options::overwrite_existing);
  fs::copy_file(data_.file("t10k-labels-idx1-ubyte"), data_.file("train-labels-idx1-ubyte"),
                fs::copy_options::overwrite_existing);
  expect_refused({}, {train_images, test_images, "hold the same records", "the test set would be trained on"});
  write_idx_images(train_images, 59999, 64);
  write_bytes(data_.file("train-labels-idx1-ubyte"), idx_labels(59999));
  expect_refused({}, {train_images, "holds 59999 images", "fashion-mnist's training set has 60000"});
}

// CIFAR-10 as published: five training batches and a test batch of 10000 records each. A batch
// with records appended (the test batch: test images leaking into training) or cut off is
// refused; the files as published train.
TEST_F(Cli, CifarBatchesHoldThePublishedRecords) {
  TempDir cifar("cli-cifar");
  constexpr uintmax_t kRecord = 3073, kRecords = 10000;
  // Sparse zeros (label 0, black images) but for the first label, which tells the files apart.
  const auto batch = [&](const std::string& name, uintmax_t records, uint8_t first_label) {
    write_bytes(cifar.file(name), {first_label});
    fs::resize_file(cifar.file(name), records * kRecord);
  };
  for (int i = 1; i <= 5; ++i) batch("data_batch_" + std::to_string(i) + ".bin", kRecords, static_cast<uint8_t>(i));
  batch("test_batch.bin", kRecords, 0);
  const std::vector<std::string> args{"--dataset", "cifar10", "--data-dir", cifar.str(), "--model", "mlp"};
  const RunResult good = run(args);
  ASSERT_EQ(good.exit_code, 0) << good.err;
  batch("data_batch_1.bin", 2 * kRecords, 1);
  const std::string path = cifar.file("data_batch_1.bin");
  auto before = snapshot(cifar.str());
  expect_refused(args, {path, "holds 20000 CIFAR-10 records", "published data_batch_1.bin holds 10000",
                        "10000 too many"});
  EXPECT_EQ(snapshot(cifar.str()), before);
  batch("data_batch_1.bin", kRecords - 1, 1);
  expect_refused(args, {path, "holds 9999 CIFAR-10 records", "1 missing"});
  // The test batch copied over a training batch, or one training batch over another.
  batch("data_batch_1.bin", kRecords, 1);
  batch("data_batch_4.bin", kRecords, 0);
  expect_refused(args, {cifar.file("data_batch_4.bin"), cifar.file("test_batch.bin"), "hold the same records",
                        "the test set would be trained on"});
  batch("data_batch_4.bin", kRecords, 2);
  expect_refused(args, {cifar.file("data_batch_2.bin"), cifar.file("data_batch_4.bin"), "hold the same records"});
}

// A directory that is not a dataset at all.
TEST_F(Cli, DirectoryWithoutDatasetFiles) {
  TempDir empty("cli-empty");
  expect_usage_error(run({"--data-dir", empty.str()}), {empty.str(), "-ubyte", "does not exist"});
}

// ---- Checkpoints given to --resume, evaluate and inspect -------------------------------------

// One step of the quick job, checkpointed: ckpt-000000001.hpck in the work directory.
class CliCheckpoint : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    const RunResult r = run({"--checkpoint-dir", dir_});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(fs::exists(file_));
  }
  // A copy of the checkpoint's bytes, changed by `damage`, in the work directory.
  std::string damaged(const std::string& name, const std::function<void(Bytes&)>& damage) const {
    Bytes b = read_bytes(file_);
    damage(b);
    write_bytes(work_.file(name), b);
    return work_.file(name);
  }
  const std::string dir_ = work_.file("ckpt"), file_ = dir_ + "/ckpt-000000001.hpck";
};

// Damaged or unsuitable files given to --resume: refused before anything is written.
TEST_F(CliCheckpoint, BadResumeFilesAreRefused) {
  const std::string truncated = damaged("cut.hpck", [](Bytes& b) { b.resize(b.size() / 2); });
  const std::string flipped = damaged("flip.hpck", [](Bytes& b) { b[b.size() / 2] ^= 0x04; });
  const std::string empty = damaged("empty.hpck", [](Bytes& b) { b.clear(); });
  const std::string appended = damaged("long.hpck", [](Bytes& b) { b.push_back(0); });
  ASSERT_EQ(run({"--checkpoint-dir", "@WORK/mlp", "--model", "mlp"}).exit_code, 0);
  mkfifo(work_.file("fifo").c_str(), 0600);
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {truncated, {truncated, "is truncated"}},
      {flipped, {flipped, "is corrupt (checksum mismatch"}},
      {empty, {empty, "is truncated (0 bytes"}},
      {appended, {appended, "1 stray bytes after its end"}},
      {work_.file("mlp/ckpt-000000001.hpck"), {"the checkpoint is of model mlp, not cnn"}},
      {data_.file("train-images-idx3-ubyte"), {"train-images-idx3-ubyte is not an hpctrain checkpoint"}},
      {work_.file("fifo"), {"fifo: not a regular file"}},  // was: waiting forever for a writer
      {dir_, {"--resume", dir_, "is a directory"}}};        // was: exit 1, "basic_filebuf::underflow"
  for (const auto& [file, expect] : cases) expect_refused({"--resume", file, "--checkpoint-dir", dir_}, expect);
}

// What else may stand in a checkpoint directory: a FIFO named lock (the run waited for a writer
// for ever), a directory named as the checkpoint the run will write (the whole run trained, then
// its final checkpoint could not be written), a FIFO heartbeat or one of escape sequences (inspect
// waited for ever, or sent them to the terminal as they were, and bytes that are not UTF-8 too).
TEST_F(CliCheckpoint, FifosAndDirectoriesInACheckpointDirectory) {
  const std::string fifo_lock = work_.file("fifo-lock");
  fs::create_directory(fifo_lock);
  ASSERT_EQ(mkfifo((fifo_lock + "/lock").c_str(), 0600), 0);
  expect_refused({"--checkpoint-dir", fifo_lock}, {fifo_lock + "/lock is not a regular file"});

  // A FIFO named run-id: read at the start (the run waited on it for ever, and a stop signal did
  // not end the wait); now taken for no id, and replaced by the run's own.
  const std::string fifo_id = work_.file("fifo-run-id");
  fs::create_directory(fifo_id);
  ASSERT_EQ(mkfifo((fifo_id + "/run-id").c_str(), 0600), 0);
  const RunResult ran = run({"--checkpoint-dir", fifo_id, "--snapshot-every-steps", "1"});
  ASSERT_FALSE(ran.timed_out) << "the run waited for the FIFO run-id";
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_TRUE(fs::is_regular_file(fifo_id + "/run-id"));

  const std::string blocked = work_.file("blocked");
  fs::create_directories(blocked + "/ckpt-000000001.hpck");
  expect_usage_error(run({"--checkpoint-dir", blocked}),
                     {blocked + "/ckpt-000000001.hpck is a directory, not a checkpoint"});

  fs::remove(dir_ + "/heartbeat");
  ASSERT_EQ(mkfifo((dir_ + "/heartbeat").c_str(), 0600), 0);
  const RunResult fifo = run_hpctrain({"inspect", dir_}, kDeadline);
  ASSERT_FALSE(fifo.timed_out) << "inspect waited for the FIFO heartbeat";
  EXPECT_EQ(fifo.exit_code, 0) << fifo.err;
  EXPECT_EQ(fifo.out.find("heartbeat:"), std::string::npos) << fifo.out;
  fs::remove(dir_ + "/heartbeat");
  write_text(dir_ + "/heartbeat", "step=1\nstate=\x1b]0;owned\x07training\nunix_time=1\n");
  const RunResult escaped = run_hpctrain({"inspect", dir_}, kDeadline);
  EXPECT_EQ(escaped.exit_code, 0) << escaped.err;
  EXPECT_NE(escaped.out.find("heartbeat: ?, step 1"), std::string::npos) << escaped.out;
  EXPECT_EQ(escaped.out.find('\x1b'), std::string::npos) << "an escape sequence reached the terminal";
  // Bytes that are not UTF-8 (another system's encoding, a damaged file) are escaped as in errors.
  write_text(dir_ + "/heartbeat", "step=1\nstate=caf\xe9\nunix_time=1\n");
  const RunResult latin1 = run_hpctrain({"inspect", dir_}, kDeadline);
  EXPECT_EQ(latin1.exit_code, 0) << latin1.err;
  EXPECT_NE(latin1.out.find("heartbeat: caf\\xe9, step 1"), std::string::npos) << latin1.out;
  // A backslash is doubled, as predict's lines have it: a value holding a backslash and an n read
  // as the escape of a newline (state=a\nb printed "heartbeat: a\nb").
  write_text(dir_ + "/heartbeat", "step=1\nstate=a\\nb\\x1b\nunix_time=1\n");
  const RunResult backslash = run_hpctrain({"inspect", dir_}, kDeadline);
  EXPECT_EQ(backslash.exit_code, 0) << backslash.err;
  EXPECT_NE(backslash.out.find("heartbeat: a\\\\nb\\\\x1b, step 1"), std::string::npos) << backslash.out;
}

// A checkpoint directory whose heartbeat path is taken by a directory: refused at the start,
// not a warning every second of the run.
TEST_F(CliCheckpoint, HeartbeatThatIsADirectory) {
  fs::remove(dir_ + "/heartbeat");
  fs::create_directory(dir_ + "/heartbeat");
  expect_refused({"--checkpoint-dir", dir_}, {dir_ + "/heartbeat is a directory"});
  fs::remove(dir_ + "/heartbeat");
  // So is the path it writes the heartbeat through (the run wrote none at all, with one warning),
  // and the run id's, which a rename replaces (refused once the data and the model were loaded).
  for (const std::string name : {"heartbeat.tmp", "run-id"}) {
    const std::string path = dir_ + "/" + name, was = fs::exists(path) ? read_text(path) : "";
    fs::remove(path);
    fs::create_directory(path);
    expect_refused({"--checkpoint-dir", dir_}, {path + " is a directory: hpctrain replaces that path"});
    fs::remove(path);
    if (!was.empty()) write_text(path, was);
  }
}

// A checkpoint directory that cannot be listed is an error: it must not look empty, which
// would start the run afresh beside the checkpoints it could not see.
TEST_F(CliCheckpoint, UnreadableCheckpointsNameTheRealCause) {
  fs::permissions(dir_, fs::perms::owner_write | fs::perms::owner_exec);
  auto before = snapshots({work_.str()});
  expect_usage_error(run_hpctrain_without_override(with_quick_defaults({"--checkpoint-dir", dir_}, data_.str())),
                     {"cannot list checkpoint directory", dir_, "Permission denied"});
  EXPECT_EQ(snapshots({work_.str()}), before);
  fs::permissions(dir_, fs::perms::owner_all);
  fs::permissions(file_, fs::perms::none);
  expect_usage_error(run_hpctrain_without_override({"inspect", file_}), {file_, "Permission denied"});
  expect_usage_error(run_hpctrain_without_override({"evaluate", "--checkpoint", file_, "--data-dir", data_.str()}),
                     {file_, "Permission denied"});
  fs::permissions(file_, fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(CliCheckpoint, BadEvaluateAndInspectInputsAreRefused) {
  const std::string empty_dir = work_.file("none");
  fs::create_directory(empty_dir);
  const std::string bad_dir = work_.file("bad");
  fs::create_directory(bad_dir);
  write_bytes(bad_dir + "/ckpt-000000007.hpck", Bytes{'H', 'P', 'C'});
  const std::string fifo = work_.file("fifo");  // that nothing reads
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A link to itself (inspect said "no such file"), apart from work_, whose snapshots it would stop.
  TempDir elsewhere("cli-loop");
  const std::string loop = elsewhere.file("loop");
  fs::create_symlink("loop", loop);
  const std::string data = data_.str();
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases{
      {{"evaluate", "--checkpoint", ""}, {"--checkpoint is empty"}},
      {{"evaluate", "--checkpoint", " "}, {"--checkpoint is empty"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", ""}, {"--data-dir is empty"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--dataset", ""}, {"--dataset is empty"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--metrics-file", ""}, {"--metrics-file is empty"}},
      {{"evaluate", "--checkpoint", empty_dir, "--data-dir", data}, {"no checkpoints (ckpt-*.hpck) in", empty_dir}},
      {{"evaluate", "--checkpoint", bad_dir, "--data-dir", data},
       {"none of the 1 checkpoint(s) in", bad_dir, "is valid; the newest:", "ckpt-000000007.hpck is truncated"}},
      {{"evaluate", "--checkpoint", "/dev/zero", "--data-dir", data}, {"/dev/zero: not a regular file"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--metrics-file", "@WORK/no/m.jsonl"},
       {"cannot open --metrics-file", "No such file"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--metrics-file", fifo},
       {"--metrics-file " + fifo + " is a FIFO that has no reader"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", "/dev/null"}, {"/dev/null is not a directory"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--eval-batch-size", "9223372036854775807"},
       {"--eval-batch-size must be at most 1000000000"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--threads", "99999999999"},
       {"--threads must be a whole number, got '99999999999' (out of range)"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--step-timeout", "0.5s"},
       {"--step-timeout must be 0 (never) or from 1s to 1000h, got 0.5 s"}},
      {{"evaluate", "--checkpoint", dir_, "--data-dir", data, "--start-timeout", "1001h"},
       {"--start-timeout must be 0 (never) or from 1s to 1000h"}},
      {{"inspect", ""}, {"the PATH of hpctrain inspect is empty"}},
      {{"inspect", empty_dir}, {"no checkpoints (ckpt-*.hpck) in", empty_dir}},
      {{"inspect", "/dev/zero"}, {"/dev/zero: not a regular file"}},
      {{"inspect", loop}, {"cannot read checkpoint " + loop + ": Too many levels of symbolic links"}},
      {{"evaluate", "--checkpoint", loop, "--data-dir", data},
       {"cannot read checkpoint " + loop + ": Too many levels of symbolic links"}}};
  for (const auto& [args, expect] : cases) expect_refused(args, expect, false);
}

// Results printed to a standard output that cannot take them (`> file` on a full disk: /dev/full):
// every command that prints its results, and --help and --version, went on to exit 0 with the
// file cut short or empty (predict alone said so). Now one line, exit 2.
TEST_F(CliCheckpoint, ResultsThatCannotBeWrittenAreAnError) {
  const TempDir snapshots("cli-full-stdout"), many("cli-full-stdout-many");
  const std::string data = data_.str(), onnx = work_.file("m.onnx");
  // Four checkpoints' JSON (some 7 kB) is more than stdout's buffer holds: the write that failed
  // was inside `std::cout <<`, and the error said "a write failed" instead of naming ENOSPC.
  for (int i = 1; i <= 4; ++i) fs::copy_file(file_, many.file("ckpt-00000000" + std::to_string(i) + ".hpck"));
  const std::vector<std::vector<std::string>> commands{
      {"inspect", file_},
      {"inspect", file_, "--json"},
      {"inspect", dir_},
      {"inspect", many.str(), "--json"},
      {"evaluate", "--checkpoint", dir_, "--data-dir", data, "--threads", "1"},
      {"export", "--checkpoint", file_, "--output", onnx},
      {"clean-snapshots", "--snapshot-dir", snapshots.str()},
      {"clean-snapshots", "--snapshot-dir", snapshots.file("none")},
      {"--help"},
      {"--version"},
      {"evaluate", "--help"},
      {"inspect", "--help"}};
  for (const auto& args : commands) {
    std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" > /dev/full"};
    for (const std::string& a : hpctrain_argv(args)) argv.push_back(a);
    expect_usage_error(run_program(argv, kDeadline),
                       {"cannot write the results to standard output: No space left on device"});
  }
  EXPECT_TRUE(fs::exists(onnx)) << "the model was written; its message was not";
  // A command's line longer than stdio's buffer (clean-snapshots' "kept DIR/...", DIR 4 kB deep, as
  // a relative path under PATH_MAX) failed inside the call that wrote it, and the error said "a
  // write failed (a full disk? its reader gone?)" instead of naming ENOSPC.
  {
    std::string deep = "d";
    for (int i = 0; i < 17; ++i) deep += "/" + std::string(238, 'x');
    const RunResult r = run_program(
        {"/bin/sh", "-c",
         "cd \"$0\" && mkdir -p \"$1/0123456789abcdef\" && echo x > \"$1/0123456789abcdef/notes.txt\" || exit 99; "
         "\"$2\" clean-snapshots --snapshot-dir \"$1\" --all > /dev/full; code=$?; rm -rf d; exit $code",
         snapshots.str(), deep, hpctrain_binary()},
        kDeadline);
    expect_usage_error(r, {"cannot write the results to standard output: No space left on device"});
  }
  // A reader that left (a pipe's read end closed; SIGPIPE is ignored): an error for results, but
  // --help's and --version's reader read what it wanted (`hpctrain --help | head`).
  const auto into_closed_pipe = [](const std::vector<std::string>& args) {
    std::vector<std::string> argv{"/usr/bin/python3", "-c",
                                  "import os, subprocess, sys\n"
                                  "r, w = os.pipe()\n"
                                  "os.close(r)\n"
                                  "sys.exit(subprocess.call(sys.argv[1:], stdout=w))"};
    for (const std::string& a : hpctrain_argv(args)) argv.push_back(a);
    return run_program(argv, kDeadline);
  };
  expect_usage_error(into_closed_pipe({"inspect", file_}), {"cannot write the results to standard output: Broken pipe"});
  expect_usage_error(into_closed_pipe({"inspect", many.str(), "--json"}),
                     {"cannot write the results to standard output: Broken pipe"});
  // A command's lines before its results (clean-snapshots' "kept ...") met the closed pipe first:
  // a training's warning ("the run goes on without its progress lines") came before the error.
  fs::create_directory(snapshots.file("0123456789abcdef"));
  write_text(snapshots.file("0123456789abcdef/notes.txt"), "not a snapshot\n");
  expect_usage_error(into_closed_pipe({"clean-snapshots", "--snapshot-dir", snapshots.str(), "--all"}),
                     {"cannot write the results to standard output: Broken pipe"});
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"}, {"--version"}, {"inspect", "--help"}}) {
    const RunResult r = into_closed_pipe(args);
    EXPECT_EQ(r.exit_code, 0) << r.command << ": " << r.err;
    EXPECT_EQ(r.err, "") << r.command;
  }
}

// A standard output or error closed at the start (`>&-`, `2>&-`): the first file hpctrain opened
// took its number, and what was printed there went into that file: evaluate's result line (exit
// 0) or its warning into its --metrics-file, which the next evaluate then refused as no JSON
// Lines; a training's progress lines and warnings into the checkpoint directory's lock. Now a
// result is one line, exit 2, as for any standard output that cannot take it, a warning is lost,
// and the metrics file holds its events alone.
TEST_F(CliCheckpoint, AClosedStandardStreamIsNoFilesNumber) {
  const std::string metrics = work_.file("closed.jsonl");
  // (mnist: a warning on stderr, as the model takes its images and classes)
  const auto evaluate = [&](const std::string& redirect, const std::string& dataset) {
    std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" " + redirect};
    for (const std::string& a : hpctrain_argv({"evaluate", "--checkpoint", dir_, "--dataset", dataset, "--data-dir",
                                               data_.str(), "--threads", "1", "--metrics-file", metrics}))
      argv.push_back(a);
    return run_program(argv, kDeadline);
  };
  expect_usage_error(evaluate(">&-", "fashion-mnist"), {"cannot write the results to standard output: Bad file "
                                                         "descriptor"});
  const RunResult no_stderr = evaluate("2>&-", "mnist");
  EXPECT_EQ(no_stderr.exit_code, 0);
  EXPECT_NE(no_stderr.out.find("test accuracy"), std::string::npos) << no_stderr.out;
  const std::vector<std::string> lines = lines_of(read_text(metrics));
  EXPECT_EQ(lines.size(), 2u) << read_text(metrics);
  for (const std::string& line : lines) EXPECT_EQ(line.rfind("{\"event\":\"evaluate\"", 0), 0u) << line;
}

// evaluate on another dataset than the checkpoint's: one warning where the model takes its
// images and classes (MNIST for Fashion-MNIST), refused where it cannot.
TEST_F(CliCheckpoint, EvaluateOnAnotherDataset) {
  const RunResult other = run_hpctrain({"evaluate", "--checkpoint", dir_, "--dataset", "mnist", "--data-dir",
                                        data_.str()});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(lines_of(other.err),
            std::vector<std::string>{"hpctrain: warning: --dataset mnist is not the dataset the checkpoint was "
                                     "trained on (fashion-mnist): this is its accuracy on other data"});
  const RunResult same = run_hpctrain({"evaluate", "--checkpoint", dir_, "--data-dir", data_.str()});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.err, "");
  // A checkpoint of 8x8 RGB images in 1000 classes cannot take Fashion-MNIST's.
  ASSERT_EQ(run({"--dataset", "synthetic", "--image-size", "8", "--train-samples", "32", "--checkpoint-dir",
                 "@WORK/synthetic"})
                .exit_code,
            0);
  expect_refused({"evaluate", "--checkpoint", "@WORK/synthetic", "--dataset", "fashion-mnist", "--data-dir",
                  data_.str()},
                 {"--dataset fashion-mnist: the checkpoint's cnn was trained on synthetic and cannot take "
                  "fashion-mnist's images or classes"},
                 false);
  // Refused before the test set is read, from the dataset's shape alone: a directory without its
  // files was the error (or, with them, the whole set was read first, and synthetic's made).
  for (const std::string dataset : {"cifar10", "synthetic"})
    expect_refused({"evaluate", "--checkpoint", dir_, "--dataset", dataset, "--data-dir", "@WORK/none-here"},
                   {"--dataset " + dataset + ": the checkpoint's cnn was trained on fashion-mnist and cannot take " +
                    dataset + "'s images or classes (evaluate it on fashion-mnist)"},
                   false);
}

// A run that does not continue the newest checkpoint of its directory (here --resume none over
// another run's steps 3 and 4) moves the ones that would outrank its own aside, untouched:
// left in place, retention (the highest steps) deleted this run's checkpoints as it wrote them,
// and --resume auto then continued the other run.
TEST_F(CliCheckpoint, AFreshRunKeepsItsCheckpointsBesideAnotherRuns) {
  const std::vector<std::string> every_step{"--checkpoint-dir", "@WORK/run", "--checkpoint-every-steps", "1",
                                            "--keep-checkpoints", "2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), every_step.begin(), every_step.end());
    return extra;
  };
  ASSERT_EQ(run(with({"--max-steps", "4"})).exit_code, 0);
  const Bytes step4 = read_bytes(work_.file("run/ckpt-000000004.hpck"));
  const RunResult fresh = run(with({"--max-steps", "2", "--resume", "none", "--seed", "2"}));
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(count_of(fresh.err, "warning: moved 2 checkpoint(s) this run does not continue"), 1) << fresh.err;
  std::vector<std::string> top, aside;
  for (const auto& e : fs::directory_iterator(work_.file("run"))) {
    top.push_back(e.path().filename().string());
    if (e.is_directory())
      for (const auto& f : fs::directory_iterator(e.path())) aside.push_back(f.path().filename().string());
  }
  std::sort(top.begin(), top.end());
  std::sort(aside.begin(), aside.end());
  ASSERT_EQ(top.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(top.begin(), top.begin() + 4),
            (std::vector<std::string>{"ckpt-000000001.hpck", "ckpt-000000002.hpck", "heartbeat", "run-id"}));
  EXPECT_EQ(top[4].rfind("superseded-", 0), 0u) << top[4];
  EXPECT_EQ(aside, (std::vector<std::string>{"ckpt-000000003.hpck", "ckpt-000000004.hpck"}));
  EXPECT_EQ(read_bytes(work_.file("run/" + top[4] + "/ckpt-000000004.hpck")), step4);
  // --resume auto continues this run, not the other.
  const std::string m = work_.file("m.jsonl");
  ASSERT_EQ(run(with({"--max-steps", "2", "--seed", "2", "--metrics-file", m})).exit_code, 0);
  EXPECT_EQ(done_of(m).at("resumed_from_step").number, 2);
}

// ---- Help and version ------------------------------------------------------------------------

// Every option, with its default as --help must show it ("" for options without one).
const std::vector<std::pair<std::string, std::string>> kOptions{
    {"help", ""},
    {"version", ""},
    {"config", ""},
    {"quiet", ""},
    {"metrics-file", ""},
    {"metrics-every-steps", "0"},
    {"prometheus-file", ""},
    {"progress", "auto"},
    {"log-every", "0"},
    {"progress-interval", "30s"},
    {"log-level", "info"},
    {"log-timestamps", "auto"},
    {"seed", "1"},
    {"threads", "0"},
    {"device", "auto"},
    {"precision", "tf32"},
    {"no-deterministic", ""},
    {"cuda-graphs", ""},
    {"no-cuda-graphs", ""},
    {"jpeg-decode", "auto"},
    {"model", "cnn"},
    {"no-batch-norm", ""},
    {"init", "kaiming-uniform"},
    {"dataset", "fashion-mnist"},
    {"data-dir", ""},
    {"train-samples", "0"},
    {"test-samples", "0"},
    {"augment", "auto"},
    {"image-size", "0"},
    {"epochs", "4"},
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
    {"no-decay-bias-and-norm", ""},
    {"label-smoothing", "0.1"},
    {"bucket-mb", "25"},
    {"no-overlap", ""},
    {"sync-batch-norm", ""},
    {"timeline-file", ""},
    {"checkpoint-dir", ""},
    {"keep-checkpoints", "3"},
    {"checkpoint-every-steps", "0"},
    {"checkpoint-interval", "10m"},
    {"checkpoint-each-epoch", ""},
    {"checkpoint-lock-wait", "0"},
    {"resume", "auto"},
    {"init-from", ""},
    {"extend-epochs", ""},
    {"step-timeout", "10m"},
    {"start-timeout", "30m"},
    {"snapshot-every-steps", "auto"},
    {"snapshot-dir", ""},
    {"snapshot-max-memory", ""},
    {"stop-signals", "TERM,USR1,USR2,HUP"},
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

// --help and --version answer whatever --config names (a missing file ended them with its error).
TEST(CliHelp, HelpAndVersionDoNotReadTheConfigFile) {
  for (const char* flag : {"--help", "--version"}) {
    const RunResult r = run_hpctrain({flag, "--config", "/nonexistent/hpctrain.cfg"});
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    EXPECT_EQ(r.err, "") << flag;
    EXPECT_NE(r.out.find(std::string(flag) == "--help" ? "Usage: hpctrain" : "hpctrain "), std::string::npos) << r.out;
  }
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
  // The release, then which build of it (core/revision.cpp) and what computes its bits.
  EXPECT_EQ(lines[0].rfind(std::string("hpctrain ") + HPCTRAIN_TEST_VERSION + " (revision " + tree_revision() +
                               "; CPU GEMM: ",
                           0),
            0u)
      << lines[0];
}

// A crash says where before the process dies: a call through a null function pointer (which no
// backtrace unwinds from: Open MPI's shows one frame) names the code that made the call. The
// process still dies of the signal, as before. Where MPI runs (HPCTRAIN_USE_MPI=1 here: the
// singleton; under mpirun the same), Open MPI's own report follows; a process no launcher started
// has no MPI and no such report.
TEST(CliCrash, ACrashNamesTheCodeThatMadeIt) {
  setenv("HPCTRAIN_TEST_CRASH", "null-call", 1);
  for (bool mpi : {false, true}) {
    SCOPED_TRACE(mpi ? "with MPI" : "without MPI");
    if (mpi) setenv("HPCTRAIN_USE_MPI", "1", 1);
    const RunResult r = run_hpctrain({"--max-steps", "1"});
    unsetenv("HPCTRAIN_USE_MPI");
    EXPECT_EQ(r.exit_code, -1) << "not killed by the signal: " << r.err;
    const auto lines = lines_of(r.err);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0].rfind("hpctrain: crashed (pid ", 0), 0u) << r.err;
    EXPECT_NE(lines[0].find("): SIGSEGV at address 0x0, instruction 0x0, called from "), std::string::npos) << r.err;
    EXPECT_NE(lines[0].find("hpctrain+0x"), std::string::npos) << r.err;
    // The caller, by name (-rdynamic): main, or the hook itself where the call is not a tail call.
    EXPECT_TRUE(lines[0].find("(main+0x") != std::string::npos || lines[0].find("crash_if_asked") != std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("Signal: Segmentation fault") != std::string::npos, mpi)
        << "Open MPI's handler follows where MPI runs, and only there: " << r.err;
  }
  unsetenv("HPCTRAIN_TEST_CRASH");
}

}  // namespace
}  // namespace hpc::itest
