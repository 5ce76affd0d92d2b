// What operators see (issue 25): the math threads a rank takes by default follow the CPUs it may
// run on, and the output fits where it goes: a live line only on a terminal a person watches,
// plain timestamped lines in files and under mpirun; metrics to stdout (issue 41).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

class Output : public ::testing::Test {
 protected:
  void SetUp() override {
    write_small_fashion_mnist(data_.str());
    // As from a person's shell: a terminal type, and no launcher's variables (a pseudo-terminal
    // is then taken for a person's, and only the launcher's variables tell them apart).
    setenv("TERM", "xterm", 1);
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID",
                          "HPCRUN_ATTEMPT"})
      unsetenv(v);
  }
  // A short run printing progress at every step.
  std::vector<std::string> quick(std::vector<std::string> more = {}) const {
    std::vector<std::string> a{"--data-dir", data_.str(), "--max-steps", "3", "--batch-size", "16",
                               "--test-samples", "16", "--log-every", "1", "--epochs", "1"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
  TempDir data_{"output"};
};

// The CPUs this test may run on.
int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

int first_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) return c;
  return 0;
}

TEST_F(Output, DefaultThreadsFollowTheAffinityMask) {
  // Bound to one CPU: one thread, whatever the host has.
  auto args = hpctrain_argv(quick({"--log-level", "debug"}));
  args.insert(args.begin(), {"/usr/bin/taskset", "-c", std::to_string(first_cpu())});
  RunResult r = run_program(args, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("CPU, 1 thread(s) per rank"), std::string::npos) << r.out;
  // Unbound: every CPU of the test's own mask (not the host's when the mask is smaller), within
  // the cgroup's quota, which the debug line names.
  args.erase(args.begin(), args.begin() + 3);
  r = run_program(args, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch quota;
  int expected = affinity_cpus();
  if (std::regex_search(r.out, quota, std::regex("cgroup quota ([0-9.]+) CPUs")))
    expected = std::max(1, std::min(expected, static_cast<int>(std::stod(quota[1]))));
  else
    EXPECT_NE(r.out.find("cgroup quota none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CPU, " + std::to_string(expected) + " thread(s) per rank"), std::string::npos) << r.out;
}

// Every line of `text` starts with an ISO 8601 UTC time with milliseconds, then `program`.
void expect_stamped(const std::string& text, const std::string& program) {
  const std::regex stamped("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z " + program +
                           "(\\[[0-9]+\\])?: .*");
  ASSERT_FALSE(text.empty());
  for (const std::string& line : lines_of(text)) EXPECT_TRUE(std::regex_match(line, stamped)) << "'" << line << "'";
}

void expect_no_control_bytes(const std::string& text) {
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
}

TEST_F(Output, AFileGetsPlainTimestampedLines) {
  RunResult r = run_hpctrain(quick(), 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_no_control_bytes(r.out);
  expect_stamped(r.out, "hpctrain");
  EXPECT_EQ(count_of(r.out, "  step "), 3) << r.out;  // --log-every 1
  // Asked otherwise: no stamps; no progress lines; nothing below warnings.
  r = run_hpctrain(quick({"--log-timestamps", "off"}), 120);
  for (const std::string& line : lines_of(r.out)) EXPECT_EQ(line.rfind("hpctrain: ", 0), 0u) << line;
  r = run_hpctrain(quick({"--progress", "off"}), 120);
  EXPECT_EQ(count_of(r.out, "  step "), 0) << r.out;
  EXPECT_NE(r.out.find("hpctrain: done"), std::string::npos) << r.out;
  r = run_hpctrain(quick({"--log-level", "warn"}), 120);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  // Debug adds the thread count's reasons.
  r = run_hpctrain(quick({"--log-level", "debug"}), 120);
  EXPECT_NE(r.out.find("threads: this rank's share of its CPUs"), std::string::npos) << r.out;
}

// In a file, warnings on stderr are stamped as stdout's lines are (auto); an error line keeps
// "hpctrain: error: " first, which launchers and scripts match, unless --log-timestamps on.
TEST_F(Output, AFileGetsTimestampedWarningsAndPlainErrors) {
  setenv("OMP_NUM_THREADS", "lots", 1);  // a warning, once
  const RunResult warned = run_hpctrain(quick({"--quiet"}), 120);
  const RunResult off = run_hpctrain(quick({"--quiet", "--log-timestamps", "off"}), 120);
  unsetenv("OMP_NUM_THREADS");
  ASSERT_EQ(warned.exit_code, 0) << warned.raw_err;
  std::vector<std::string> ours;
  for (const std::string& line : lines_of(warned.raw_err))
    if (line.find("hpctrain: ") != std::string::npos) ours.push_back(line);  // not the OpenMP runtime's own
  ASSERT_EQ(ours.size(), 1u) << warned.raw_err;
  expect_stamped(ours[0] + "\n", "hpctrain");
  EXPECT_NE(ours[0].find("Z hpctrain: warning: OMP_NUM_THREADS='lots'"), std::string::npos) << ours[0];
  EXPECT_NE(off.raw_err.find("\nhpctrain: warning: OMP_NUM_THREADS='lots'"), std::string::npos) << off.raw_err;
  EXPECT_EQ(off.raw_err.find("Z hpctrain: "), std::string::npos) << off.raw_err;

  // An error of the run (not of its command line, read before --log-timestamps is known).
  const std::string missing = data_.str() + "/missing.hpck";
  const RunResult failed = run_hpctrain(quick({"--resume", missing}), 120);
  EXPECT_EQ(failed.exit_code, 2);
  EXPECT_EQ(failed.raw_err.rfind("hpctrain: error: cannot read checkpoint", 0), 0u) << failed.raw_err;
  const RunResult stamped = run_hpctrain(quick({"--resume", missing, "--log-timestamps", "on"}), 120);
  EXPECT_EQ(stamped.exit_code, 2);
  expect_stamped(stamped.raw_err, "hpctrain");
}

TEST_F(Output, UnderMpirunToAFilePlainTimestampedLines) {
  // Open MPI gives rank 0 a pseudo-terminal for its stdout even when mpirun's goes to a file.
  const RunResult r = run_mpi(2, quick({"--threads", "1", "--train-samples", "64"}), 180);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_no_control_bytes(r.out);
  expect_stamped(r.out, "hpctrain");
  EXPECT_EQ(count_of(r.out, "  step "), 2) << r.out;  // 64 samples in global batches of 32
}

TEST_F(Output, ATerminalShowsTheLiveLine) {
  // script(1) runs the command on a real pseudo-terminal and copies what it shows to stdout.
  std::string command;
  for (const std::string& a : hpctrain_argv(quick({"--threads", "1"}))) command += "'" + a + "' ";
  const RunResult r = run_program({"/usr/bin/script", "-qec", command, "/dev/null"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\r\x1b[Kepoch 1/1  step 3/"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Z hpctrain: "), std::string::npos) << "no timestamps on a terminal: " << r.out;
  // --progress lines there: the plain lines.
  command.clear();
  for (const std::string& a : hpctrain_argv(quick({"--threads", "1", "--progress", "lines"}))) command += "'" + a + "' ";
  const RunResult lines = run_program({"/usr/bin/script", "-qec", command, "/dev/null"}, 120);
  ASSERT_EQ(lines.exit_code, 0) << lines.out << lines.err;
  EXPECT_EQ(lines.out.find('\x1b'), std::string::npos) << lines.out;
  EXPECT_EQ(count_of(lines.out, "  step "), 3) << lines.out;
}

// Metrics to stdout (issue 41): --metrics-file /dev/stdout into a pipe, or on a terminal, trains
// and prints the events there. (hpctrain read the first byte of every existing file, to check it
// held JSON Lines: of a pipe, its own empty one; of a terminal, the keyboard's. It waited forever.)
TEST_F(Output, MetricsToStdoutAsAStream) {
  const std::vector<std::string> args = hpctrain_argv(quick({"--quiet", "--threads", "1", "--metrics-file",
                                                             "/dev/stdout"}));
  std::string command;
  for (const std::string& a : args) command += "'" + a + "' ";
  const RunResult piped = run_program({"/bin/bash", "-c", "set -o pipefail; " + command + "| cat"}, 60);
  ASSERT_FALSE(piped.timed_out) << "it waited on its own pipe";
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  const std::vector<std::string> lines = lines_of(piped.out);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) EXPECT_NO_THROW(FlatJsonParser(line).parse()) << line;
  EXPECT_EQ(FlatJsonParser(lines.back()).parse().at("steps").number, 3) << piped.out;
  // On a terminal of its own (Python's pty.spawn; script(1) would end the terminal's input when
  // its own stdin, /dev/null, ends, and the old read would have seen that end instead of waiting).
  std::vector<std::string> on_a_terminal{"/usr/bin/python3", "-c",
                                         "import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn("
                                         "sys.argv[1:])))"};
  on_a_terminal.insert(on_a_terminal.end(), args.begin(), args.end());
  const RunResult terminal = run_program(on_a_terminal, 60);
  ASSERT_FALSE(terminal.timed_out) << "it waited on the terminal";
  ASSERT_EQ(terminal.exit_code, 0) << terminal.out << terminal.err;
  EXPECT_NE(terminal.out.find("{\"event\":\"done\",\"steps\":3,"), std::string::npos) << terminal.out;
}

// Metrics and the log both to stdout redirected to a file with `>` (no O_APPEND: Slurm's output
// too). Opened again by name, the metrics file had a position of its own, and the log's lines
// written through fd 1 landed over its events: the config event lost its beginning.
TEST_F(Output, MetricsToStdoutRedirectedToAFileKeepEveryEvent) {
  const TempDir out("stdout-file");
  std::string command;
  for (const std::string& a : hpctrain_argv(quick({"--threads", "1", "--progress", "lines", "--metrics-file",
                                                   "/dev/stdout"})))
    command += "'" + a + "' ";
  const RunResult r = run_program({"/bin/bash", "-c", command + "> " + out.str() + "/out.txt"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_text(out.str() + "/out.txt");
  int events = 0;
  for (const std::string& line : lines_of(text)) {
    if (line.find("\"event\"") == std::string::npos) continue;
    ++events;
    EXPECT_EQ(line.rfind("{\"event\":", 0), 0u) << "an event cut or written over: " << line;
    EXPECT_NO_THROW(FlatJsonParser(line).parse()) << line;
  }
  EXPECT_EQ(count_of(text, "{\"event\":\"config\","), 1) << text;
  EXPECT_EQ(count_of(text, "{\"event\":\"done\","), 1) << text;
  EXPECT_EQ(events, 3) << text;  // config, epoch, done
  EXPECT_NE(text.find("step 3/"), std::string::npos) << "the log's lines are there too: " << text;
}

// A --metrics-file or --timeline-file that is a link to a file not there yet: the file is made
// where the link leads (as a shell's `>` would), not "cannot open m.jsonl: No such file or
// directory" (open's O_EXCL refuses to create through a link; the retry without O_CREAT found it
// missing).
TEST_F(Output, MetricsAndTraceThroughALinkToNothingAreMade) {
  const TempDir out("links");
  fs::create_symlink("real.jsonl", out.str() + "/m.jsonl");
  fs::create_symlink(out.str() + "/real.json", out.str() + "/t.json");
  const RunResult r = run_hpctrain(quick({"--quiet", "--threads", "1", "--metrics-file", out.str() + "/m.jsonl",
                                          "--timeline-file", out.str() + "/t.json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(out.str() + "/m.jsonl"));
  EXPECT_EQ(FlatJsonParser(lines_of(read_text(out.str() + "/real.jsonl")).back()).parse().at("event").str, "done");
  EXPECT_EQ(read_text(out.str() + "/real.json").rfind("[\n{", 0), 0u) << read_text(out.str() + "/real.json");
}

// Standard output's reader gone before the first line (`| head` that has ended; a pipe whose
// read end is closed): the run goes on to its end, says so once on stderr, and ends as any run
// does (its checkpoint directory's lock released, its heartbeat "done"), instead of dying of
// SIGPIPE (exit 141) unannounced.
TEST_F(Output, AClosedStandardOutputIsNotTheEndOfTheRun) {
  const TempDir ck("closed-stdout");
  std::vector<std::string> args{"/usr/bin/python3", "-c",
                                "import os, subprocess, sys\n"
                                "r, w = os.pipe()\n"
                                "os.close(r)\n"
                                "sys.exit(subprocess.call(sys.argv[1:], stdout=w))"};  // SIGPIPE as a shell leaves it
  for (const std::string& a : hpctrain_argv(quick({"--threads", "1", "--checkpoint-dir", ck.str()}))) args.push_back(a);
  const RunResult r = run_program(args, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string said = "warning: standard output is closed (its reader exited): the run goes on";
  const size_t at = r.err.find(said);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(said, at + 1), std::string::npos) << "said more than once: " << r.err;
  EXPECT_FALSE(fs::exists(ck.str() + "/lock"));
  const std::string heartbeat = read_text(ck.str() + "/heartbeat");
  EXPECT_NE(heartbeat.find("state=done"), std::string::npos) << heartbeat;
}


// Standard output on a full disk (`hpctrain ... > log` with no room left; /dev/full here): the
// training goes on to its end and says once on stderr that its progress lines are lost, rather
// than ending with exit 0 and an empty log without a word.
TEST_F(Output, AStandardOutputThatCannotBeWrittenIsSaidOnceAndTheRunGoesOn) {
  const TempDir ck("full-stdout");
  std::vector<std::string> args{"/usr/bin/python3", "-c",
                                "import subprocess, sys\n"
                                "with open('/dev/full', 'w') as full:\n"
                                "    sys.exit(subprocess.call(sys.argv[1:], stdout=full))"};
  for (const std::string& a : hpctrain_argv(quick({"--threads", "1", "--checkpoint-dir", ck.str()}))) args.push_back(a);
  const RunResult r = run_program(args, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string said =
      "warning: standard output cannot be written (No space left on device): the run goes on without its progress lines";
  const size_t at = r.err.find(said);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("standard output", at + said.size()), std::string::npos) << "said more than once: " << r.err;
  const std::string heartbeat = read_text(ck.str() + "/heartbeat");
  EXPECT_NE(heartbeat.find("state=done"), std::string::npos) << heartbeat;
}

// A file system that fills up during the run (a tmpfs of 1 MiB, mounted here, filled but for two
// pages): a write to an output file that fails is not the end of the run.
class FullOutputFileSystem : public Output {
 protected:
  void SetUp() override {
    Output::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root (CI runs as root)";
    fs::create_directories(full_);
    ASSERT_EQ(mount("tmpfs", full_.c_str(), "tmpfs", 0, "size=1m"), 0) << std::strerror(errno);
    mounted_ = true;
    const auto room = static_cast<size_t>(2 * sysconf(_SC_PAGESIZE));
    write_bytes(full_ + "/pad", Bytes((1 << 20) - room, 0));
  }
  void TearDown() override {
    if (mounted_) umount2(full_.c_str(), MNT_DETACH);
  }
  // A run of 40 steps with a checkpoint directory, and `more`; the checkpoint of its last step.
  RunResult run(std::vector<std::string> more) {
    std::vector<std::string> a{"--data-dir", data_.str(), "--max-steps", "40", "--batch-size", "16",
                               "--test-samples", "16", "--epochs", "1", "--threads", "1", "--quiet",
                               "--checkpoint-dir", ck_, "--checkpoint-every-steps", "15"};
    a.insert(a.end(), more.begin(), more.end());
    return run_hpctrain(a, 120);
  }
  std::string last_checkpoint() const { return ck_ + "/ckpt-000000040.hpck"; }

  // One warning, naming the option, the file and the cause; nothing else on stderr.
  // The run went on to its end past the failed writes: exit 0, one warning naming the file, and
  // its last checkpoint written.
  void expect_trained_past_it(const RunResult& r, const std::string& option, const std::string& file) const {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("hpctrain: warning: cannot write " + option + " " + file + ": No space left on device "
                          "(said once; training goes on", 0), 0u) << r.err;
    EXPECT_TRUE(fs::exists(last_checkpoint())) << r.err;
  }

  TempDir dir_{"full-output"};
  const std::string full_ = dir_.file("small"), ck_ = dir_.file("ck");
  bool mounted_ = false;
};

// --metrics-file: one warning, and the file keeps the whole lines written before (the part of
// the line that did not fit is cut off again); the run trains to its end and saves its state.
// (The run ended with exit 2 and the steps since its last checkpoint were lost.)
TEST_F(FullOutputFileSystem, AMetricsFileThatFillsUpIsAWarning) {
  const std::string m = full_ + "/m.jsonl";
  const RunResult r = run({"--metrics-file", m, "--metrics-every-steps", "1"});
  ASSERT_FALSE(r.timed_out);
  expect_trained_past_it(r, "--metrics-file", m);
  const std::string text = read_text(m);
  ASSERT_FALSE(text.empty()) << "the first lines fit";
  EXPECT_EQ(text.back(), '\n') << "a line cut short: " << text.substr(text.size() - std::min<size_t>(text.size(), 80));
  std::vector<JsonObject> lines;
  ASSERT_NO_THROW(lines = read_all_json_lines(m));
  EXPECT_EQ(lines.front().at("event").str, "config");
  EXPECT_LT(lines.size(), 40u) << "the file system was not full";
  // No room at all: the file made for the run stays empty and is removed; the run goes on as well.
  fs::remove(m);
  fs::remove_all(ck_);
  std::ofstream(full_ + "/more", std::ios::binary) << std::string(static_cast<size_t>(2 * sysconf(_SC_PAGESIZE)), 'x');
  const RunResult none = run({"--metrics-file", m, "--metrics-every-steps", "1"});
  expect_trained_past_it(none, "--metrics-file", m);
  EXPECT_FALSE(fs::exists(m)) << "an empty file left behind";
}

// --timeline-file, a Chrome trace (gathered at every step) and the JSON Lines form: the same. The
// trace stays one loadable JSON array: the failed write's part is cut off, and its "]" put back.
TEST_F(FullOutputFileSystem, ATimelineFileThatFillsUpIsAWarning) {
  for (const std::string name : {"t.json", "t.jsonl"}) {
    SCOPED_TRACE(name);
    const std::string t = full_ + "/" + name;
    fs::remove_all(ck_);
    setenv("HPCTRAIN_TEST_TRACE_GATHER_STEPS", "1", 1);
    const RunResult r = run({"--timeline-file", t});
    unsetenv("HPCTRAIN_TEST_TRACE_GATHER_STEPS");
    ASSERT_FALSE(r.timed_out);
    expect_trained_past_it(r, "--timeline-file", t);
    const std::string text = read_text(t);
    ASSERT_FALSE(text.empty()) << "the first steps fit";
    if (name == "t.jsonl") {
      EXPECT_EQ(text.back(), '\n');
      std::vector<JsonObject> lines;
      ASSERT_NO_THROW(lines = read_all_json_lines(t));
      EXPECT_LT(lines.back().at("step").number, 39) << "the file system was not full";
    } else {
      EXPECT_EQ(count_of(text, "step 40"), 0) << "the file system was not full";
      EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
      const RunResult loads = run_program({"/usr/bin/python3", "-c",
                                           "import json, sys; print(len(json.load(open(sys.argv[1]))))", t});
      EXPECT_EQ(loads.exit_code, 0) << "not a JSON array: " << loads.err;
    }
    fs::remove(t);
  }
}

// --prometheus-file, whose rewrites fail once the file system is full (each needs a temporary
// file beside it): the run's last state is written over the old file in place, "done" or
// "stopped" at once (SIGINT), never "training" for ever, which a watcher takes for a hang.
TEST_F(FullOutputFileSystem, APrometheusFileEndsWithTheRunsLastStateOnAFullDisk) {
  for (const bool interrupted : {false, true}) {
    SCOPED_TRACE(interrupted ? "SIGINT" : "to its end");
    const std::string prom = full_ + "/run.prom";
    fs::remove_all(ck_);
    const auto p = start_hpctrain({"--data-dir", data_.str(), "--max-steps", interrupted ? "100000" : "300",
                                   "--batch-size", "16", "--test-samples", "16", "--epochs", "1000", "--threads", "1",
                                   "--quiet", "--checkpoint-dir", ck_, "--snapshot-every-steps", "0",  // none kept by SIGINT
                                   "--prometheus-file", prom});
    ASSERT_TRUE(wait_until([&] { return fs::exists(prom) || !p->running(); }, 60));
    ASSERT_TRUE(p->running()) << "it ended before its Prometheus file could be watched";
    {  // no block left: no temporary file for a rewrite
      std::ofstream fill(full_ + "/more", std::ios::binary);
      const std::string block(4096, 'x');
      while (fill << block && fill.flush()) {
      }
    }
    if (interrupted) {
      usleep(300000);
      kill(p->pid(), SIGINT);
    }
    const RunResult r = p->finish(120);
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, interrupted ? 128 + SIGINT : 0) << r.err;
    const std::string text = read_text(prom);
    const std::string state = interrupted ? "stopped" : "done";
    EXPECT_NE(text.find(",state=\"" + state + "\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find(",state=\"training\"} 0\n"), std::string::npos) << text;
    fs::remove(full_ + "/more");
    fs::remove(prom);
  }
}

// export to a full file system: one error naming --output and the cause (it named the temporary
// file, OUTPUT.tmp.PID, which the user never gave and which is gone), nothing left there, and a
// file --force was to replace as it was. evaluate's --metrics-file there: an error, and no file.
TEST_F(FullOutputFileSystem, AnExportOrEvaluationThatDoesNotFitLeavesNothing) {
  ASSERT_EQ(run({}).exit_code, 0);
  const auto names = [&] {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(full_)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  };
  const std::string onnx = full_ + "/m.onnx";
  for (const bool existed : {false, true}) {
    SCOPED_TRACE(existed ? "--force over a file" : "a new file");
    if (existed) write_text(onnx, "the old one");
    const std::vector<std::string> before = names();
    std::vector<std::string> args{"export", "--checkpoint", ck_, "--output", onnx};
    if (existed) args.push_back("--force");
    const RunResult r = run_hpctrain(args, 120);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    ASSERT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("hpctrain: error: cannot write --output " + onnx + " (", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
    EXPECT_EQ(names(), before);
    if (existed) {
      EXPECT_EQ(read_text(onnx), "the old one");
    }
  }
  fs::remove(onnx);
  std::ofstream(full_ + "/more", std::ios::binary) << std::string(static_cast<size_t>(2 * sysconf(_SC_PAGESIZE)), 'x');
  const std::string m = full_ + "/e.jsonl";
  const RunResult e = run_hpctrain({"evaluate", "--checkpoint", ck_, "--data-dir", data_.str(), "--threads", "1",
                                    "--metrics-file", m}, 120);
  EXPECT_EQ(e.exit_code, 2) << e.err;
  EXPECT_NE(e.err.find("hpctrain: error: cannot write --metrics-file " + m + ": No space left on device"),
            std::string::npos) << e.err;
  EXPECT_FALSE(fs::exists(m)) << "an empty file left behind";
}

// A periodic checkpoint that a full file system refused does not stop the stop's checkpoint from
// being tried: room came back (the volume grown) before the stop signal, and the stop writes its
// checkpoint, with a warning of the earlier failure, and exits 75. (The stop gave up at once
// with the earlier write's error, exit 2, and the steps since the last checkpoint were lost.)
// Slowed steps (800 ms) give the write of step 4 time to fail before step 5, and the test time to
// act before the next checkpoint, of step 8, would throw that failure (the heartbeat, which it
// watches, beats at most once a second).
TEST_F(FullOutputFileSystem, AStopWritesItsCheckpointAfterAnEarlierOneFailed) {
  ASSERT_EQ(mount("tmpfs", full_.c_str(), "tmpfs", MS_REMOUNT, "size=2m"), 0) << std::strerror(errno);
  fs::remove(full_ + "/pad");
  write_bytes(full_ + "/pad", Bytes((2 << 20) - (512 << 10), 0));  // 512 KB left: no cnn checkpoint fits
  const std::string ck = full_ + "/ck";
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:800", 1);
  const auto job = start_hpctrain({"--data-dir", data_.str(), "--max-steps", "40", "--batch-size", "16",
                                   "--test-samples", "16", "--epochs", "1", "--threads", "1", "--checkpoint-dir", ck,
                                   "--checkpoint-every-steps", "4", "--checkpoint-interval", "0",
                                   "--snapshot-every-steps", "0"});
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  const auto step = [&] {
    const std::string beat = read_text(ck + "/heartbeat");
    return beat.rfind("step=", 0) == 0 ? std::atoll(beat.c_str() + 5) : -1;
  };
  ASSERT_TRUE(wait_until([&] { return step() >= 5 || !job->running(); }, 60)) << read_text(job->err_path());
  ASSERT_TRUE(job->running()) << read_text(job->err_path());
  ASSERT_EQ(mount("tmpfs", full_.c_str(), "tmpfs", MS_REMOUNT, "size=16m"), 0) << std::strerror(errno);
  ASSERT_EQ(::kill(job->pid(), SIGTERM), 0);
  const RunResult r = job->finish(60);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_NE(r.err.find("hpctrain: warning: an earlier checkpoint could not be written ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(ck + "/ckpt-000000004.hpck"));
  std::vector<std::string> written;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().extension() == ".hpck") written.push_back(e.path().filename().string());
  ASSERT_EQ(written.size(), 1u) << r.err;
  EXPECT_GE(std::atoll(written[0].c_str() + 5), 6) << written[0];  // ckpt-<step>.hpck
}

// A JSON document that is not JSON Lines (hpcrun's summary.json, a pretty-printed object that
// begins with '{' and ends with '}') named as --metrics-file: one error line, and it stays as it
// was. (hpctrain looked at its first and last byte only, and appended to it.) So does a file
// whose first line is a JSON object and whose last line is not.
TEST_F(Output, AJsonDocumentIsNotTakenForAMetricsFile) {
  const TempDir dir("json-document");
  for (const std::string& text : {std::string("{\n  \"exit_code\": 0,\n  \"attempts\": [\n    {\"code\": 0}\n  ]\n}"),
                                  std::string("{\n  \"exit_code\": 0\n}\n"),
                                  std::string("{\"event\":\"config\"}\nnot a JSON object\n")}) {
    const std::string m = dir.file("summary.json");
    write_text(m, text);
    const std::string before = describe_path(m);
    const RunResult r = run_hpctrain(quick({"--quiet", "--metrics-file", m}), 120);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(lines_of(r.err), std::vector<std::string>{"hpctrain: error: --metrics-file " + m + " exists and is "
                                                        "not a JSON Lines file: not appending to it (another file "
                                                        "named by mistake?)"});
    EXPECT_EQ(describe_path(m), before);
    EXPECT_EQ(read_text(m), text);
  }
}

}  // namespace
}  // namespace hpc::itest
