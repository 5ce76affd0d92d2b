// hpcrun as a user meets it on one machine: every bad input is exit code 2 and one
// "hpcrun: error: ..." line naming the problem, with no retry loop; a program's own usage error
// is not retried; failures are retried up to --max-restarts, then hpcrun gives up with code 1.
// (Several hosts, lost and cut ones: tests/launch/*.sh, in network namespaces.)
#include <fcntl.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "integration/harness.hpp"

namespace hpc::itest {
namespace {

std::string hpcrun_binary() { return HPCRUN_BIN; }

RunResult hpcrun(std::vector<std::string> args, double deadline = 60) {
  args.insert(args.begin(), hpcrun_binary());
  return run_program(std::move(args), deadline);
}

// LOG_DIR/summary.json, parsed (a parse error fails the test).
nlohmann::json summary(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

int error_lines(const std::string& err) {
  int n = 0;
  for (const std::string& l : lines_of(err)) n += l.rfind("hpcrun: error: ", 0) == 0;
  return n;
}

struct BadCase {
  std::vector<std::string> args;
  std::string says;
  std::vector<std::pair<std::string, std::string>> env = {};  // set while it runs
  double within = 30;                                         // seconds it may take
};

// Every file under `dir` with its size and time: what a refused command must leave as it was.
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[e.path().string()] = e.is_directory() ? "dir" : std::to_string(e.file_size()) + "@" +
        std::to_string(e.last_write_time().time_since_epoch().count());
  return out;
}

// What changed between two contents(), for a failure message ("" when nothing did).
std::string changes(const std::map<std::string, std::string>& before, const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto& [path, what] : after)
    if (!before.count(path) || before.at(path) != what) out += (before.count(path) ? " changed " : " new ") + path;
  for (const auto& [path, what] : before)
    if (!after.count(path)) out += " gone " + path;
  return out;
}

std::string script(const TempDir& dir, const std::string& name, const std::string& body, bool executable = true) {
  write_text(dir.file(name), "#!/bin/sh\n" + body + "\n");
  fs::permissions(dir.file(name), executable ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write);
  return dir.file(name);
}

// A program (for sh -c) that writes the heartbeat of step 1 at once and runs up to 60 s, until
// asked to stop (SIGUSR1, which runs `on_stop`); its second attempt ends at once.
std::string until_asked_to_stop(const TempDir& dir, const std::string& on_stop) {
  return "trap '" + on_stop + "' USR1; [ \"$HPCRUN_ATTEMPT\" = 2 ] && exit 0; echo step=1 > " + dir.file("heartbeat") +
         "; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
}

TEST(HpcrunCli, BadInputIsOneClearErrorAndExitCode2) {
  TempDir dir("hpcrun_cli");
  write_text(dir.file("empty_hostfile"), "# no hosts here\n");
  write_text(dir.file("bad_hostfile"), "node1 cores=4\n");
  write_text(dir.file("nul_hostfile"), std::string("localhost slots=1\0\n", 19));
  write_text(dir.file("a_file"), "not a directory\n");
  fs::create_directory(dir.file("a_dir"));
  write_text(dir.file("ck_b.conf"), "# where\nepochs = 2\ncheckpoint-dir = " + dir.file("ck_b") + "  # ours\n");
  write_text(dir.file("slash.conf"), "lr = 0.1\ncheckpoint-dir = /\n");
  const std::string garbage = script(dir, "garbage", "echo '!!! garbage'");
  const std::string hangs = script(dir, "hangs", "exec sleep 30");
  const std::string fails = script(dir, "fails", "echo 'no cloud credentials' >&2; exit 3");
  const std::string zero = script(dir, "zero_slots", "echo localhost:0");
  const std::string twice = script(dir, "twice", "echo localhost:1; echo localhost:1");
  // Its host after 1.2 MB of comments was lost without a word (the output is kept to 1 MiB).
  const std::string long_output =
      script(dir, "long_output", "yes '# a comment line, one of many' | head -n 40000; echo localhost:1");
  const std::string not_executable = script(dir, "not_executable", "echo localhost:1", false);
  // Files another user may write to: hpcrun runs the discovery script as this user at every
  // discovery, and the hosts decide where the job runs (sshd refuses such an authorized_keys).
  const std::string open_script = script(dir, "open_script", "echo localhost:1");
  fs::permissions(open_script, fs::perms(0757));
  write_text(dir.file("open_hostfile"), "localhost slots=1\n");
  fs::permissions(dir.file("open_hostfile"), fs::perms(0646));
  fs::create_directory(dir.file("open"));  // a folder every user may write to, not sticky
  const std::string script_in_open = script(dir, "open/discover", "echo localhost:1");
  write_text(dir.file("open/hostfile"), "localhost slots=1\n");
  fs::permissions(dir.file("open"), fs::perms(0777));
  const std::string in_open = ": " + dir.file("open") + " is writable by others (mode 777)";
  const auto slurm = [](const std::string& nodes, const std::string& tasks) {
    return std::vector<std::pair<std::string, std::string>>{
        {"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", nodes}, {"SLURM_TASKS_PER_NODE", tasks}};
  };
  const std::vector<BadCase> cases = {
      {{"-np", "1"}, "no program to run"},
      {{"-np", "1", "/no/such/program"}, "program /no/such/program: no such file"},
      {{"-np", "1", "no-such-program-anywhere"}, "not found in PATH"},
      {{"-H", "no-such-host.invalid:1", "true"}, "unknown host 'no-such-host.invalid'"},
      // Without it the job could not start either: --min-np is 2
      {{"-H", "localhost:1,no-such-host.invalid:1", "-np", "2", "true"}, "unknown host 'no-such-host.invalid'"},
      {{"-H", "", "true"}, "-H is empty"},
      {{"-H", "a,,b", "true"}, "empty host name"},
      {{"-H", "localhost:0", "true"}, "slots must be"},
      {{"--hostfile", dir.file("empty_hostfile"), "true"}, "names no host"},
      {{"--hostfile", dir.file("bad_hostfile"), "true"}, "line 1"},
      {{"--hostfile", dir.file("missing"), "true"}, "cannot open"},
      {{"-H", "localhost:2", "--min-np", "3", "true"}, "--min-np 3 needs more slots than the hosts have"},
      {{"-H", "localhost:2", "-np", "4", "true"}, "-np 4 needs more slots"},
      // (-np sets --min-np by default: the refusal named --min-np, an option never given.)
      {{"-H", "localhost:2", "-np", "3", "true"}, "hpcrun: error: -np 3 needs more slots than the hosts have"},
      {{"-np", "2", "--min-np", "3", "true"}, "-np 2 is below --min-np 3"},
      {{"-np", "2", "--max-np", "1", "true"}, "-np 2 is above --max-np 1"},
      {{"-H", "a", "--hostfile", dir.file("bad_hostfile"), "true"}, "not several"},
      {{"true"}, "no hosts"},
      {{"-np", "1", "--bogus", "true"}, "unrecognised option '--bogus'"},
      {{"-np", "1", "--max-rest", "2", "true"}, "unrecognised option '--max-rest' (options are named whole: --max-restarts?)"},
      // -np's value left out: it took the program, whose options then read as hpcrun's.
      {{"-H", "localhost:1", "--np", "true", "--max-steps", "1"},
       "unrecognised option '--max-steps' (--np took the program true as its value: give --np one)"},
      {{"-np", "1", "--blacklist-cooldown", "60", "true"}, "MIN:MAX"},
      {{"-np", "1", "--stall-timeout", "soon", "true"}, "--stall-timeout must be a duration"},
      {{"-np", "x", "true"}, "-np must be a whole number from 1 to 1000000, got 'x'"},
      {{"-np", "1", "--max-restarts", "-1", "true"}, "--max-restarts must be 0 or more, got -1"},
      {{"-np", "1", "--mpirun", "/no/mpirun", "true"}, "--mpirun /no/mpirun"},
      {{"-H", "a", "--host-discovery-script", "/no/script", "true"}, "not several"},
      {{"--host-discovery-script", "/no/script", "true"}, "--host-discovery-script /no/script"},
      {{"--host-discovery-script", "false", "true"}, "host discovery script false failed"},
      // Host lists
      {{"--hostfile", dir.file("a_dir"), "true"}, "is a directory, not a hostfile"},
      {{"--hostfile", dir.file("nul_hostfile"), "true"}, "got '1\\x00'"},
      {{"true"}, "SLURM_JOB_NODELIST 'node[1-' is not a Slurm host list", slurm("node[1-", "1")},
      {{"true"}, "SLURM_JOB_NODELIST names 3 node(s), SLURM_TASKS_PER_NODE 1", slurm("node[1-3]", "2")},
      {{"true"}, "slots must be a whole number", slurm("node1", "0")},
      // Discovery scripts
      {{"--host-discovery-script", "", "true"}, "--host-discovery-script is empty"},
      {{"--host-discovery-script", not_executable, "true"}, "it is not an executable file"},
      {{"--host-discovery-script", dir.file("a_dir"), "true"}, "it is a directory"},
      {{"--host-discovery-script", garbage, "true"}, "line 1: '!!! garbage' is not a host name"},
      {{"--probe-timeout", "1s", "--host-discovery-script", hangs, "true"}, "no answer (timed out)", {}, 5},
      {{"--host-discovery-script", fails, "true"}, "failed: exit code 3: no cloud credentials"},
      {{"--host-discovery-script", zero, "true"}, "'localhost:0': slots must be"},
      {{"--host-discovery-script", twice, "true"}, "line 2: host localhost is named again (first on line 1)"},
      {{"--elastic-timeout", "1s", "--host-discovery-script", long_output, "true"},
       "printed more than 1 MiB, more than a host list"},
      // hpcrun's own options
      {{"-np", "1", "--stall-timeout", "0.5s", "true"}, "--stall-timeout 0.5 s is shorter than a start-up needs"},
      {{"-np", "1", "--start-timeout", "2s", "true"}, "--start-timeout 2 s is shorter than a start-up needs"},
      {{"-np", "1", "--start-timeout", "soon", "true"}, "--start-timeout must be a duration"},
      {{"-np", "1", "--teardown-timeout", "0", "true"}, "--teardown-timeout must be more than 0"},
      {{"-np", "1", "--stop-timeout", "0s", "true"}, "--stop-timeout must be more than 0"},
      {{"--min-np", "4", "--max-np", "2", "-H", "localhost:4", "true"}, "--max-np 2 is below --min-np 4"},
      {{"-np", "1", "--blacklist-cooldown", "10m:1m", "true"}, "0 < MIN <= MAX"},
      {{"-np", "1", "--discovery-interval", "0", "true"}, "--discovery-interval must be more than 0"},
      {{"-np", "1", "--straggler-time", "0", "true"}, "--straggler-time must be more than 0"},
      {{"-np", "1", "--straggler-time", "later", "true"}, "--straggler-time must be a duration"},
      {{"-np", "1", "--straggler-factor", "1", "true"}, "--straggler-factor must be more than 1"},
      {{"-np", "1", "--straggler-factor", "nan", "true"}, "--straggler-factor must be more than 1"},
      {{"-np", "1", "--straggler-factor", "fast", "true"}, "--straggler-factor must be more than 1 (a host's busy time "
                                                            "per step over the median host's), got 'fast'"},
      {{"-np", "1", "-x", "=1", "true"}, "-x '=1' is not NAME or NAME=VALUE"},
      {{"--log-dir", "", "-np", "1", "true"}, "--log-dir is empty"},
      {{"--log-dir", dir.file("a_file") + "/logs", "-np", "1", "true"}, "a_file is not a directory"},
      {{"-np", "1", "--checkpoint-dir", "", "true"}, "--checkpoint-dir is empty"},
      {{"-np", "1", "--checkpoint-dir", dir.file("a_file"), "true"}, "a_file: not a directory"},
      // "$UNSET/": never the root directory, by any spelling, given to hpcrun or only to the program
      {{"--log-dir", "/", "-np", "1", "true"}, "--log-dir / is the root directory / (an unset variable?)"},
      {{"--log-dir", "/tmp/..", "-np", "1", "true"}, "--log-dir /tmp/.. is the root directory /"},
      {{"-np", "1", "--checkpoint-dir", "//", "true"}, "--checkpoint-dir // is the root directory /"},
      // hpcrun's --resume auto would make any other command refuse itself, in every attempt
      {{"-np", "1", hpctrain_binary(), "evaluate", "--checkpoint", dir.str()},
       "hpcrun runs trainings (hpctrain [train] ...), not '" + hpctrain_binary() + " evaluate'"},
      {{"-np", "1", hpctrain_binary(), "predict", "x.png"}, "not '" + hpctrain_binary() + " predict': run it without"},
      {{"-np", "1", hpctrain_binary(), "--checkpoint-dir", "/"}, "--checkpoint-dir / is the root directory /"},
      // Where every user may write, another could plant a link that hpcrun's writes would follow.
      {{"--log-dir", "/tmp", "-np", "1", "true"}, "--log-dir /tmp: it is writable by others (mode 1777)"},
      {{"-np", "1", "--checkpoint-dir", "/tmp", "true"}, "--checkpoint-dir /tmp: it is writable by others (mode 1777)"},
      // ... or where they could make it first, or rename it away: refused before it is made
      {{"--log-dir", dir.file("open/logs"), "-np", "1", "true"}, "--log-dir " + dir.file("open/logs") + in_open},
      {{"-np", "1", "--checkpoint-dir", dir.file("open/ck"), "true"}, "--checkpoint-dir " + dir.file("open/ck") + in_open},
      {{"--host-discovery-script", open_script, "true"},
       "--host-discovery-script " + open_script + ": it is writable by others (mode 757): another user could change "
       "what is read or run from it; chmod o-w it"},
      {{"--hostfile", dir.file("open_hostfile"), "true"},
       "--hostfile " + dir.file("open_hostfile") + ": it is writable by others (mode 646)"},
      {{"--host-discovery-script", script_in_open, "true"}, script_in_open + in_open + " and not sticky"},
      {{"--hostfile", dir.file("open/hostfile"), "true"}, dir.file("open/hostfile") + in_open + " and not sticky"},
      // hpcrun would watch a heartbeat nobody writes, and kill every attempt as stalled
      {{"--checkpoint-dir", dir.file("ck_a"), "-np", "1", hpctrain_binary(), "--checkpoint-dir", dir.file("ck_b")},
       "is not the program's"},
      // ... or none at all: hpctrain refused the options hpcrun added for it (--checkpoint-lock-wait)
      {{"--checkpoint-dir", dir.file("ck_a"), "-np", "1", hpctrain_binary(), "--epochs", "1"},
       "hpcrun's --checkpoint-dir " + dir.file("ck_a") + " is not given to hpctrain"},
      // ... given in hpctrain's config file too (among other options and comments)
      {{"--checkpoint-dir", dir.file("ck_a"), "-np", "1", hpctrain_binary(), "--config", dir.file("ck_b.conf")},
       "is not the program's (" + dir.file("ck_b") + ")"},
      {{"-np", "1", hpctrain_binary(), "--config", dir.file("slash.conf")}, "--checkpoint-dir / is the root directory /"},
      {{"-np", "1", "-x", "HPCRUN_TEST_SURELY_UNSET", "true"}, "-x HPCRUN_TEST_SURELY_UNSET: not set in hpcrun's environment"},
      {{"-H", "localhost", "--slots-per-host", "5000", "true"}, "--slots-per-host must be a whole number from 1 to 4096"},
      // Numbers past what an int or a double holds, or no number of the kind: the option's range, not Boost's
      // "the argument ('...') for option '...' is invalid"
      {{"-np", "1", "--max-restarts", "99999999999", "true"},
       "--max-restarts must be a whole number from 0 to 2147483647, got '99999999999' (out of range)"},
      {{"-np", "1", "--max-restarts", "1e3", "true"},
       "--max-restarts must be a whole number from 0 to 2147483647, got '1e3'"},
      {{"-np", "99999999999999999999", "true"},
       "-np must be a whole number from 1 to 1000000, got '99999999999999999999'"},
      {{"-np", "1", "--min-np", "4294967297", "true"},
       "--min-np must be a whole number from 1 to 1000000, got '4294967297'"},
      {{"-np", "1", "--max-np", "-99999999999", "true"},
       "--max-np must be a whole number from 1 to 1000000, got '-99999999999'"},
      {{"-H", "localhost", "--slots-per-host", "99999999999", "true"},
       "--slots-per-host must be a whole number from 1 to 4096, got '99999999999'"},
      {{"-np", "1", "--straggler-factor", "1e999", "true"},
       "--straggler-factor must be more than 1 (a host's busy time per step over the median host's), got '1e999' "
       "(out of range)"},
      // Durations: at most 1000h (1e300h was an endless wait; --probe-timeout 1e300 a 1 s ssh ConnectTimeout)
      {{"-np", "1", "--probe-timeout", "1e300", "true"}, "--probe-timeout must be at most 1000h, got 1e+300s"},
      {{"-np", "1", "--elastic-timeout", "1e300h", "true"}, "--elastic-timeout must be at most 1000h, got 3.6e+303s"},
      {{"-np", "1", "--stall-timeout", "1e308h", "true"}, "--stall-timeout must be at most 1000h, got an endless one"},
      {{"-np", "1", "--start-timeout", "1001h", "true"}, "--start-timeout must be at most 1000h, got 1001h"},
      {{"-np", "1", "--teardown-timeout", "1e300h", "true"}, "--teardown-timeout must be at most 1000h"},
      {{"-np", "1", "--stop-timeout", "1e300h", "true"}, "--stop-timeout must be at most 1000h"},
      {{"-np", "1", "--discovery-interval", "1e300h", "true"}, "--discovery-interval must be at most 1000h"},
      {{"-np", "1", "--straggler-time", "1e300h", "true"}, "--straggler-time must be at most 1000h"},
      {{"-np", "1", "--blacklist-cooldown", "1m:2000h", "true"},
       "--blacklist-cooldown's MAX must be at most 1000h, got 2000h"},
      {{"-np", "1", "--mpirun", "", "true"}, "--mpirun is empty"},
      {{"-np", "1", "--mpi-args", "-np 4", "true"}, "--mpi-args: -np is hpcrun's to set"},
      // Placements per node, and -np's alias: mpirun's dry run printed its refusal and exited 0, and
      // every attempt failed as a lost host; --n 1 ran one rank of two, judged failed.
      {{"-np", "1", "--mpi-args", "-N 1", "true"}, "--mpi-args: -N is hpcrun's to set"},
      {{"-np", "1", "--mpi-args", "--npernode 1", "true"}, "--mpi-args: --npernode is hpcrun's to set"},
      {{"-np", "1", "--mpi-args", "--n 1", "true"}, "--mpi-args: --n is hpcrun's to set"},
      // Output in another form hides the rank tags: every finished job was judged failed.
      {{"-np", "1", "--mpi-args", "--timestamp-output", "true"}, "--mpi-args: --timestamp-output changes the form"},
      {{"-np", "1", "--mpi-args", "--xml", "true"}, "--mpi-args: --xml changes the form of the ranks' output"},
      {{"-np", "1", "--mpi-args", "--mca btl 'self", "true"}, "quote is not closed"},
      // (mpirun would have taken hpcrun's rank wrapper as the parameter: every attempt a failure)
      {{"-np", "1", "--mpi-args", "--mca", "true"}, "--mpi-args '--mca': --mca needs two words after it (--mca NAME VALUE)"},
      {{"-np", "1", "--mpi-args", "-x A --gmca btl", "true"}, "--gmca needs two words after it"},
      {{"-np", "1", "--mpi-args", "--bind-to none -x", "true"}, "-x needs a word after it (-x NAME[=VALUE])"},
      // mpirun's own usage error: quoted, not retried as if a host had failed
      {{"-np", "1", "--mpi-args", "--bind-to bogus", "true"},
       "mpirun refused its arguments (exit code 1; check --mpi-args and -x): The specified binding policy is not "
       "recognized: Policy: bogus"},
      // MCA settings mpirun takes without a word: a parameter it does not know is ignored, a component it
      // has not fails every rank in MPI_Init, which looked like a lost host (localhost blacklisted)
      {{"-np", "1", "--mpi-args", "--mca btl_tcp_if_inclde lo", "true"},
       "--mpi-args: this Open MPI has no MCA parameter btl_tcp_if_inclde (did you mean btl_tcp_if_include?)"},
      {{"-np", "1", "--mpi-args", "--mca btl tpc,self", "true"},
       "--mpi-args: --mca btl tpc,self: this Open MPI has no btl component tpc (did you mean tcp?); it has "},
      {{"-np", "1", "--mpi-args", "-mca pml ^ob2", "true"}, "no pml component ob2 (did you mean ob1?)"},
      // A local typo in the launch agent is not the remote host's failure
      {{"--launch-agent", "/nonexistent", "-H", "otherhost", "true"}, "--launch-agent /nonexistent: no such file"},
      {{"--launch-agent", dir.file("a_dir"), "-H", "otherhost", "true"}, "it is a directory"},
      {{"--launch-agent", open_script, "-H", "otherhost", "true"},
       "--launch-agent " + open_script + ": it is writable by others (mode 757)"},
  };
  for (const BadCase& c : cases) {
    const auto before = contents(dir.str());
    const bool had_default_logs = fs::exists("hpcrun-logs");
    std::vector<std::string> args = c.args;
    if (std::find(args.begin(), args.end(), "--log-dir") == args.end())
      args.insert(args.begin(), {"--log-dir", dir.file("logs")});
    for (const auto& [name, value] : c.env) ::setenv(name.c_str(), value.c_str(), 1);
    const RunResult r = hpcrun(args);
    for (const auto& [name, value] : c.env) ::unsetenv(name.c_str());
    EXPECT_EQ(r.exit_code, 2) << r.command << "\n" << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << r.command << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.command << "\nexpected: " << c.says << "\ngot: " << r.err;
    EXPECT_EQ(r.err.find("attempt 1"), std::string::npos) << r.command << ": launched despite bad input";
    EXPECT_EQ(r.err.find("blacklisted"), std::string::npos) << r.command << ": blamed a host for bad input";
    EXPECT_LT(r.seconds, c.within) << r.command;
    const auto after = contents(dir.str());
    EXPECT_EQ(changes(before, after), "") << r.command << ": refused, but changed files";
    fs::remove_all(dir.file("logs"));  // for the next case, after a failure
    EXPECT_TRUE(had_default_logs || !fs::exists("hpcrun-logs")) << r.command << ": wrote the default log directory";
  }
}

// A word of --mpi-args that is no option's value becomes mpirun's program, which fails the same
// way on every host: a usage error after the first attempt (exit 2, its last line naming the
// word), not four attempts and a blamed host. (mpirun's --do-not-launch check cannot see it: it
// does not look for the program.)
TEST(HpcrunCli, AStrayWordInMpiArgsIsAUsageErrorNotRetried) {
  TempDir dir("hpcrun_stray");
  for (const std::string word : {"0", "/nonexistent/dir/x"}) {
    const RunResult r =
        hpcrun({"--log-dir", dir.file(word == "0" ? "a" : "b"), "-np", "1", "--quiet", "--mpi-args", word, "true"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.find("attempt 2"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("blacklisted"), std::string::npos) << r.err;
    const std::string last = r.err.substr(r.err.find_last_of('\n', r.err.size() - 2) + 1);
    EXPECT_NE(last.find("gave up: mpirun took '" + word + "' for the program to run"), std::string::npos) << r.err;
  }
}

// Under umask 000 hpcrun made its log directory 0777 and then refused it as writable by others,
// leaving it behind; its logs were 0666. Now the directories are never others' to write in, and
// the logs and the summary are 0644, as hpctrain's checkpoints beside them.
TEST(HpcrunCli, UnderUmask000ItsLogsAreNoOneElsesToWrite) {
  TempDir dir("hpcrun_umask");
  const std::string logs = dir.file("job/logs");
  const mode_t umask_before = ::umask(0);
  const RunResult r = hpcrun({"--log-dir", logs, "-np", "1", "sh", "-c", "echo ran"});
  ::umask(umask_before);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"hpcrun.log", "attempt-1.log", "summary.json"})
    EXPECT_EQ(fs::status(logs + "/" + name).permissions(), fs::perms(0644)) << name;
  for (const auto& e : fs::recursive_directory_iterator(dir.str()))
    EXPECT_EQ(e.symlink_status().permissions() & fs::perms::others_write, fs::perms::none)
        << e.path() << " is writable by others";
}

// Root trusts a log directory another user owns, who can put links in it: hpcrun.log as a link
// to one of root's files had hpcrun's lines appended to that file, and summary.json.tmp.PID (the
// pid in ps) had it replaced by the summary. Neither is written through now: the log refused, the
// summary's temporary file made anew; the file behind the links stays as it was.
TEST(HpcrunCli, LinksPutInTheLogDirectoryAreNeverWrittenThrough) {
  TempDir dir("hpcrun_links");
  const std::string victim = dir.file("victim");
  write_text(victim, "root's own\n");
  fs::create_directories(dir.file("a"));
  fs::create_symlink(victim, dir.file("a/hpcrun.log"));
  const RunResult r = hpcrun({"--log-dir", dir.file("a"), "-np", "1", "true"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "hpcrun: error: --log-dir " + dir.file("a") + ": hpcrun.log there is a symbolic link: remove it\n");
  fs::create_directories(dir.file("b"));
  Started job({hpcrun_binary(), "--log-dir", dir.file("b"), "-np", "1", "--quiet", "sh", "-c", "sleep 1"});
  fs::create_symlink(victim, dir.file("b/summary.json.tmp." + std::to_string(job.pid())));
  const RunResult ran = job.finish(60);
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_EQ(read_text(victim), "root's own\n");
  EXPECT_EQ(summary(dir.file("b/summary.json")).at("attempts").size(), 1u);
  EXPECT_FALSE(fs::is_symlink(dir.file("b/summary.json")));
}

// A rank takes hpcrun's umask, not the one of what started it: over ssh that was sshd's (022),
// and a job run under `umask 077`, as the README advises for a run's weights on shared storage,
// wrote its checkpoints readable by all. hpcrun passes its umask on (HPCRUN_UMASK) and the rank's
// wrapper sets it, whatever its own.
TEST(HpcrunCli, RanksTakeHpcrunsUmask) {
  TempDir dir("hpcrun_umask_ranks");
  const mode_t before = ::umask(027);
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "sh", "-c", "umask; echo \"$HPCRUN_UMASK\""});
  ::umask(022);  // the wrapper's own, as sshd's would be
  setenv("HPCRUN_UMASK", "0077", 1);
  const RunResult wrapped = run_program({hpcrun_binary(), "--rank-exec", "sh", "-c", "umask"}, 30);
  unsetenv("HPCRUN_UMASK");
  ::umask(before);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[a1:r0] 0027\n[a1:r0] 0027\n"), std::string::npos) << r.out;
  EXPECT_EQ(wrapped.exit_code, 0) << wrapped.err;
  EXPECT_EQ(wrapped.out, "0077\n") << wrapped.err;
}

// The MCA check's control: known parameters (a synonym too), components and exclusions run.
TEST(HpcrunCli, KnownMcaSettingsRun) {
  TempDir dir("hpcrun_mca");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "--mpi-args",
                              "--mca btl self,vader,tcp --mca pml ^ucx --mca orte_rsh_agent ssh --mca "
                              "btl_tcp_if_include lo",
                              "sh", "-c", "echo ran"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[a1:r0] ran"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// The ends of the ranges are taken as before: the most restarts an int holds, the longest waits.
TEST(HpcrunCli, TheEndsOfTheRangesRun) {
  TempDir dir("hpcrun_ranges");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-H", "localhost", "--slots-per-host", "4096", "-np", "1",
                              "--max-np", "1000000", "--max-restarts", "2147483647", "--stall-timeout", "1000h",
                              "--elastic-timeout", "1000h", "--blacklist-cooldown", "1000h:1000h", "--straggler-factor",
                              "1.01", "sh", "-c", "echo ran"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[a1:r0] ran"), std::string::npos) << r.out;
}

// hpcrun learns of stragglers from hpctrain's heartbeat alone. A --straggler-* option given to a job
// that has none is said, once, to do nothing, at the first moment hpcrun knows: before the first
// attempt where there is no checkpoint directory to read it from; after the first attempt of another
// program that wrote none. Nothing is said where a heartbeat came, where no such option was given, or
// for hpctrain, whose attempt may end before its first heartbeat (a crash at start-up; here a stand-in
// of that name) and which writes one in every attempt that runs.
TEST(HpcrunCli, StragglerOptionsAreSaidToDoNothingWithoutAHeartbeat) {
  TempDir dir("hpcrun_straggler_options");
  const auto warnings = [](const RunResult& r) {
    int n = 0;
    for (const std::string& l : lines_of(r.err)) n += l.find("does nothing here") != std::string::npos;
    return n;
  };
  const auto before = [](const RunResult& r, const std::string& a, const std::string& b) {
    return r.err.find(a) != std::string::npos && r.err.find(a) < r.err.find(b);
  };

  // Known before the first attempt; said once, not again after it.
  const RunResult none = hpcrun({"--log-dir", dir.file("a"), "--drain-stragglers", "-np", "1", "true"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(warnings(none), 1) << none.err;
  EXPECT_TRUE(before(none, "hpcrun: warning: --drain-stragglers does nothing here: stragglers are judged from "
                           "hpctrain's heartbeat, and there is no checkpoint directory to read one from (give "
                           "--checkpoint-dir",
                     "attempt 1:"))
      << none.err;

  // Known once the attempt has ended.
  const RunResult silent = hpcrun({"--checkpoint-dir", dir.file("b"), "--straggler-time", "3s", "-np", "1", "true"});
  EXPECT_EQ(silent.exit_code, 0) << silent.err;
  EXPECT_EQ(warnings(silent), 1) << silent.err;
  EXPECT_TRUE(before(silent, "attempt 1 succeeded", "warning: --straggler-time does nothing here")) << silent.err;
  EXPECT_TRUE(before(silent, "and attempt 1 ended without one in " + dir.file("b") + "/heartbeat (hpctrain writes "
                             "it; this program did not)", "summary:"))
      << silent.err;

  const std::string beat = "printf 'step=1\\nstate=training\\n' > " + dir.file("c") + "/heartbeat; sleep 1";
  const RunResult beating =
      hpcrun({"--checkpoint-dir", dir.file("c"), "--straggler-factor", "2", "-np", "1", "sh", "-c", beat});
  EXPECT_EQ(beating.exit_code, 0) << beating.err;
  EXPECT_EQ(warnings(beating), 0) << beating.err;

  const RunResult not_given = hpcrun({"--checkpoint-dir", dir.file("d"), "-np", "1", "true"});
  EXPECT_EQ(not_given.exit_code, 0) << not_given.err;
  EXPECT_EQ(warnings(not_given), 0) << not_given.err;

  fs::create_directory(dir.file("bin"));
  const std::string hpctrain = script(dir, "bin/hpctrain", "exit 0");
  const RunResult trainer =
      hpcrun({"--straggler-factor", "2", "-np", "1", hpctrain, "--checkpoint-dir", dir.file("e")});
  EXPECT_EQ(trainer.exit_code, 0) << trainer.err;
  EXPECT_EQ(warnings(trainer), 0) << trainer.err;
}

// hpctrain under hpcrun with a checkpoint directory is given hpcrun's start-up limit as its own
// set-up limit (--start-timeout), unless its command line gives one: its 30m default ended, exit
// 124 at every relaunch, a start-up hpcrun was told to wait longer for.
TEST(HpcrunCli, HpctrainIsGivenHpcrunsStartUpLimit) {
  TempDir dir("hpcrun_start_limit");
  fs::create_directory(dir.file("bin"));
  const std::string hpctrain = script(dir, "bin/hpctrain", "echo \"args: $*\"");
  const RunResult longer = hpcrun({"--start-timeout", "2h", "-np", "1", hpctrain, "--checkpoint-dir", dir.file("a")});
  EXPECT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_NE(longer.out.find(" --start-timeout 2h"), std::string::npos) << longer.out;
  const RunResult by_default = hpcrun({"-np", "1", hpctrain, "--checkpoint-dir", dir.file("b")});
  EXPECT_NE(by_default.out.find(" --start-timeout 10m"), std::string::npos) << by_default.out;  // --stall-timeout's
  const RunResult own = hpcrun({"--start-timeout", "2h", "-np", "1", hpctrain, "--checkpoint-dir", dir.file("c"),
                                "--start-timeout", "5m"});
  EXPECT_NE(own.out.find("--start-timeout 5m"), std::string::npos) << own.out;
  EXPECT_EQ(own.out.find("--start-timeout 2h"), std::string::npos) << own.out;
}

TEST(HpcrunCli, HelpAndVersion) {
  const RunResult help = hpcrun({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* opt : {"--hosts", "--hostfile", "--host-discovery-script", "--np", "--min-np", "--max-np",
                          "--slots-per-host", "--launch-agent", "--stall-timeout", "--start-timeout", "--blacklist-cooldown",
                          "--elastic-timeout", "--max-restarts", "--log-dir"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  const RunResult version = hpcrun({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("hpcrun ", 0), 0u);
  // Where they cannot be written (`> file` on a full disk): one line and exit 2, not exit 0.
  for (const char* flag : {"--help", "--version"}) {
    const RunResult full = run_program({"/bin/sh", "-c", "exec \"$0\" \"$1\" > /dev/full", hpcrun_binary(), flag}, 60);
    EXPECT_EQ(full.exit_code, 2) << flag << ": " << full.err;
    EXPECT_EQ(full.err, "hpcrun: error: cannot write the results to standard output: No space left on device\n") << flag;
  }
}

// The job's output relayed to a standard output that cannot take it (`hpcrun ... > log` on a full
// disk: /dev/full; `hpcrun ... | head` once head has gone: a pipe with its reader closed) went
// without a word: the job's lines were lost and no one knew. Now said once, on stderr and in
// hpcrun.log; the job goes on to its end, hpcrun is not killed by SIGPIPE, its exit code is the
// job's, and the lines are in the attempt's log.
TEST(HpcrunCli, AStandardOutputThatCannotBeWrittenIsSaidOnceAndTheJobGoesOn) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> outputs{
      {{"/bin/sh", "-c", "exec \"$0\" \"$@\" > /dev/full"}, "cannot be written (No space left on device)"},
      {{"/usr/bin/python3", "-c",
        "import os, subprocess, sys\n"
        "r, w = os.pipe()\n"
        "os.close(r)\n"
        "sys.exit(subprocess.call(sys.argv[1:], stdout=w))"},
       "is closed (its reader exited)"}};
  for (const auto& [into, why] : outputs) {
    TempDir dir("hpcrun_stdout");
    std::vector<std::string> argv = into;
    for (const std::string& a : {hpcrun_binary(), std::string("--log-dir"), dir.str(), std::string("-np"),
                                 std::string("1"), std::string("sh"), std::string("-c"),
                                 std::string("for i in 1 2 3; do echo line $i; sleep 0.1; done")})
      argv.push_back(a);
    const RunResult r = run_program(argv, 60);
    ASSERT_FALSE(r.timed_out) << why;
    EXPECT_EQ(r.exit_code, 0) << why << ": " << r.err;
    const std::string said = "hpcrun: warning: standard output " + why + ": the job goes on, its output kept in " +
                             (fs::path(dir.str()) / "attempt-N.log").string() + " alone\n";
    const size_t at = r.err.find(said);
    EXPECT_NE(at, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("standard output", at + said.size()), std::string::npos) << "said more than once: " << r.err;
    EXPECT_NE(r.err.find("hpcrun: attempt 1 succeeded"), std::string::npos) << r.err;
    EXPECT_NE(read_text(dir.file("attempt-1.log")).find("[a1:r0] line 3"), std::string::npos) << why;
    EXPECT_NE(read_text(dir.file("hpcrun.log")).find("standard output " + why), std::string::npos) << why;
  }
}

// The job's stderr relayed to a standard error that cannot take it (`2>/dev/full`; `2>&-`, held
// as a read-only /dev/null: EBADF) was lost without a word anywhere: the writes' errors were not
// looked at. The job goes on to its end, its exit code is hpcrun's, and hpcrun.log and the
// attempt's log say once that the terminal's copy is lost; the lines themselves are in the log.
TEST(HpcrunCli, AStandardErrorThatCannotBeWrittenIsSaidOnceInTheLogsAndTheJobGoesOn) {
  const std::vector<std::pair<std::string, std::string>> errors{
      {"2>/dev/full", "No space left on device"}, {"2>&-", "Bad file descriptor"}};
  for (const auto& [redirect, why] : errors) {
    TempDir dir("hpcrun_stderr");
    const RunResult r = run_program({"/bin/sh", "-c", "exec \"$0\" \"$@\" " + redirect, hpcrun_binary(), "--log-dir",
                                     dir.str(), "-np", "1", "sh", "-c",
                                     "for i in 1 2 3; do echo err $i >&2; sleep 0.1; done; echo out"},
                                    60);
    ASSERT_FALSE(r.timed_out) << redirect;
    EXPECT_EQ(r.exit_code, 0) << redirect << ": " << r.err;
    EXPECT_NE(r.out.find("[a1:r0] out"), std::string::npos) << redirect << ": " << r.out;
    const std::string said =
        "warning: standard error cannot be written (" + why + "): the job goes on, its errors and hpcrun's lines kept in "
        "the logs alone";
    const std::string log = read_text(dir.file("hpcrun.log")), attempt = read_text(dir.file("attempt-1.log"));
    const size_t at = log.find(said);
    EXPECT_NE(at, std::string::npos) << redirect << ": " << log;
    EXPECT_EQ(log.find(said, at + 1), std::string::npos) << "said more than once: " << log;
    EXPECT_NE(log.find("attempt 1 succeeded"), std::string::npos) << log;
    EXPECT_NE(attempt.find("hpcrun: " + said), std::string::npos) << attempt;
    EXPECT_NE(attempt.find("[a1:r0] err 3"), std::string::npos) << attempt;
  }
}

// A value given with -x NAME=VALUE (a token, a key), here or in --mpi-args, reaches every rank
// but not the attempt's log, which lies beside the checkpoints on shared storage: the logged
// mpirun command says NAME=(not logged).
TEST(HpcrunCli, ValuesGivenWithXReachTheRanksButNotTheLog) {
  TempDir dir("hpcrun_env");
  const RunResult r =
      hpcrun({"--log-dir", dir.str(), "-np", "2", "-x", "HPCRUN_TEST_TOKEN=s3cr3t-v4lue", "--mpi-args",
              "-x HPCRUN_TEST_OTHER=0th3r-v4lue", "sh", "-c",
              // the values spelt out with a _ after each character: nothing here names them whole
              "echo \"$HPCRUN_TEST_TOKEN $HPCRUN_TEST_OTHER\" | sed 's/./&_/g'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* rank : {"[a1:r0] ", "[a1:r1] "})
    EXPECT_NE(r.out.find(std::string(rank) + "s_3_c_r_3_t_-_v_4_l_u_e_ _0_t_h_3_r_-_v_4_l_u_e_"), std::string::npos)
        << r.out;
  const std::string log = read_text(dir.file("attempt-1.log"));
  EXPECT_NE(log.find("-x HPCRUN_TEST_TOKEN=(not logged)"), std::string::npos) << log;
  EXPECT_NE(log.find("-x HPCRUN_TEST_OTHER=(not logged)"), std::string::npos) << log;
  EXPECT_EQ(log.find("s3cr3t"), std::string::npos) << log;
  EXPECT_EQ(log.find("0th3r"), std::string::npos) << log;
}

// A log directory's earlier attempts are kept and numbered on from (a requeued job); a stray
// file whose number no run reaches is no attempt of ours: attempt-2147483647.log made the next
// one "attempt -2147483648".
TEST(HpcrunCli, AttemptsAreNumberedOnFromTheLogDirectorys) {
  TempDir dir("hpcrun_numbers");
  for (const char* name : {"attempt-4.log", "attempt-2147483647.log", "attempt-99999999999.log", "attempt-x.log"})
    std::ofstream(dir.file(name)) << "earlier\n";
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "true"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("attempt-5.log"))) << r.err;
  EXPECT_EQ(r.err.find("attempt -"), std::string::npos) << r.err;
}

// Two hpcruns on one log directory (two jobs started from one working directory share the
// default hpcrun-logs): a number the other took while this one ran is passed over, not truncated.
// The program plays the other hpcrun, taking attempt 2 during attempt 1.
TEST(HpcrunCli, AnAttemptNumberAnotherHpcrunTookIsPassedOver) {
  TempDir dir("hpcrun_shared_logs");
  const std::string other = dir.file("attempt-2.log");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "--max-restarts", "1", "--blacklist-cooldown",
                              "0.1s:0.2s", "sh", "-c",
                              "if [ \"$HPCRUN_ATTEMPT\" = 1 ]; then echo the other job > " + other +
                                  "; exit 3; fi; echo attempt $HPCRUN_ATTEMPT"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(other), "the other job\n");
  EXPECT_NE(r.out.find("[a3:r0] attempt 3"), std::string::npos) << r.out;
  EXPECT_NE(read_text(dir.file("attempt-3.log")).find("attempt 3"), std::string::npos);
}

TEST(HpcrunCli, RunsAProgramToCompletionOnThisMachine) {
  TempDir dir("hpcrun_ok");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "2", "sh", "-c", "echo hello from $OMPI_COMM_WORLD_RANK"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[a1:r0] hello from 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[a1:r1] hello from 1"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("summary: 1 attempt(s), 0 failure(s)"), std::string::npos) << r.err;
  const std::string log = read_text(dir.file("attempt-1.log"));
  EXPECT_NE(log.find("hello from 1"), std::string::npos);
  EXPECT_NE(log.find("hpcrun-rank-status: rank=1 exit=0"), std::string::npos) << log;
  const nlohmann::json sum = summary(dir.file("summary.json"));
  EXPECT_EQ(sum["exit_code"], 0);
  EXPECT_EQ(sum["failures"], 0);
  ASSERT_EQ(sum["attempts"].size(), 1u) << sum;
  const nlohmann::json& a = sum["attempts"][0];
  EXPECT_EQ(a["attempt"], 1);
  EXPECT_EQ(a["np"], 2);
  EXPECT_EQ(a["hosts"], "localhost:2");
  EXPECT_EQ(a["result"], "success");
  EXPECT_EQ(a["outcome"], "every rank finished");
  EXPECT_EQ(a["failed_hosts"], nlohmann::json::array());
  EXPECT_LE(a["start"].get<double>(), a["end"].get<double>());
  EXPECT_LE(a["end"].get<double>(), sum["seconds"].get<double>());
  EXPECT_FALSE(a.contains("failed_at")) << a;
}

// A host name that does not resolve, where the other hosts give --min-np slots: one line naming it
// (from the health probe, through ssh, the default launch agent), and the job runs without it.
TEST(HpcrunCli, HostThatDoesNotResolveIsLeftOutWhereMinNpAllows) {
  TempDir dir("hpcrun_unresolved");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-H", "localhost:1,no-such-host.invalid:1", "-np", "1", "sh",
                              "-c", "echo ran"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("host no-such-host.invalid failed its health probe (exit code 255: ssh: Could not resolve "
                       "hostname no-such-host.invalid"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[a1:r0] ran"), std::string::npos) << r.out;
}

// Not retried, and not buried: hpctrain prints its error on rank 0 alone, and mpirun follows it
// with a dozen lines of its own; hpcrun's last line repeats the program's.
// The discovery script's stdout is its answer; a warning on its stderr is not a host.
TEST(HpcrunCli, DiscoveryScriptMayWarnOnStderr) {
  TempDir dir("hpcrun_discovery");
  const std::string noisy = script(dir, "noisy", "echo localhost:1; echo 'note: using the cached list' >&2");
  const RunResult r = hpcrun({"--log-dir", dir.file("logs"), "--host-discovery-script", noisy, "sh", "-c", "echo ran"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[a1:r0] ran"), std::string::npos) << r.out;
}

// A discovery script or hostfile of another user (or another user's link to one of this user's,
// as one planted in /tmp, where the kernel's protected_symlinks may be off) is refused as one
// they may write to is: they may change it at any moment. For root too, whose run of another
// user's script is theirs. This user's own, and a link of theirs, run. Needs root, to give files
// to another user.
TEST(HpcrunCli, ADiscoveryScriptOrHostfileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown to another user); CI runs as root";
  TempDir dir("hpcrun_theirs");
  fs::permissions(dir.path(), fs::perms(01777));  // shared and sticky, as /tmp
  const std::string mine = script(dir, "mine", "echo localhost:1"), theirs = script(dir, "theirs", "echo localhost:1");
  write_text(dir.file("hosts"), "localhost slots=1\n");
  ASSERT_EQ(::chown(theirs.c_str(), 4343, 4343), 0);
  for (const char* name : {"my_link", "their_link", "their_hosts_link"})
    fs::create_symlink(std::string(name) == "their_hosts_link" ? dir.file("hosts") : mine, dir.file(name));
  ASSERT_EQ(::lchown(dir.file("their_link").c_str(), 4343, 4343), 0);
  ASSERT_EQ(::lchown(dir.file("their_hosts_link").c_str(), 4343, 4343), 0);
  const std::vector<BadCase> cases = {
      {{"--host-discovery-script", theirs, "true"},
       "--host-discovery-script " + theirs + ": it belongs to uid 4343, another user, not of your groups: another "
       "user could change what is read or run from it; use a file of your own"},
      {{"--host-discovery-script", dir.file("their_link"), "true"},
       "--host-discovery-script " + dir.file("their_link") + ": the link " + dir.file("their_link") +
           " belongs to uid 4343"},
      {{"--hostfile", dir.file("their_hosts_link"), "true"}, ": the link " + dir.file("their_hosts_link") + " belongs"},
  };
  for (const BadCase& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.begin(), {"--log-dir", dir.file("logs")});
    const RunResult r = hpcrun(args);
    EXPECT_EQ(r.exit_code, 2) << r.command << "\n" << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << r.command << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.command << "\nexpected: " << c.says << "\ngot: " << r.err;
    EXPECT_EQ(r.err.find("attempt 1"), std::string::npos) << r.command << ": launched despite bad input";
  }
  for (const std::string& fine : {mine, dir.file("my_link")}) {
    const RunResult r = hpcrun({"--log-dir", dir.file("logs"), "--host-discovery-script", fine, "sh", "-c", "echo ran"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  const RunResult r = hpcrun({"--log-dir", dir.file("logs"), "--hostfile", dir.file("hosts"), "sh", "-c", "echo ran"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A discovery script that another user may write to by a later discovery (here it opens itself)
// is not run again: one warning each time, and the job goes on with its previous answer.
TEST(HpcrunCli, ADiscoveryScriptOthersMayWriteToIsNotRunAgain) {
  TempDir dir("hpcrun_discovery_opened");
  const std::string runs = dir.file("runs");
  const std::string discover = script(dir, "discover", "echo run >> " + runs + "; chmod o+w \"$0\"; echo localhost:1");
  const std::string program = "echo step=1 > " + dir.file("heartbeat") + "; sleep 2; echo done";
  const RunResult r = hpcrun({"--log-dir", dir.file("logs"), "--checkpoint-dir", dir.str(), "--host-discovery-script",
                              discover, "--discovery-interval", "0.2s", "sh", "-c", program});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("done"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(read_text(runs), "run\n") << r.err;
  EXPECT_NE(r.err.find("warning: --host-discovery-script " + discover + ": it is writable by others (mode 702)"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; not running it, keeping its previous answer"), std::string::npos) << r.err;
}

TEST(HpcrunCli, ProgramUsageErrorIsNotRetried) {
  TempDir dir("hpcrun_usage");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "2", hpctrain_binary(), "--model", "nope"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("reported a usage error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("attempt 2"), std::string::npos) << r.err;
  const std::vector<std::string> lines = lines_of(r.err);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("hpcrun: gave up: the program's usage error: hpctrain: error: unknown model 'nope'", 0), 0u)
      << r.err;
  EXPECT_EQ(r.err.find("[a1:mpirun]"), std::string::npos) << "mpirun's boilerplate on the terminal:\n" << r.err;
  EXPECT_NE(read_text(dir.file("attempt-1.log")).find("[a1:mpirun]"), std::string::npos) << "but kept in the log";
}

// A stall's liveness query (SIGUSR2 through the real mpirun) reaches the rank wrappers alone:
// Open MPI 4's daemons signal a rank's whole process group unless told otherwise, and a program
// that does not handle SIGUSR2 died of it, its host blamed and blacklisted. Now the healthy ranks
// answer, nobody is blamed, and the job is relaunched on the same host.
TEST(HpcrunCli, StallQueryLeavesHealthyRanksAlive) {
  TempDir dir("hpcrun_stall");
  const RunResult r = hpcrun({"--checkpoint-dir", dir.str(), "--stall-timeout", "5s", "--max-restarts", "1",
                              "--elastic-timeout", "1s", "-np", "2", "sh", "-c",
                              "if [ \"$HPCRUN_ATTEMPT\" = 1 ]; then exec sleep 60; fi; echo relaunched"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no step finished for 5 s (--stall-timeout"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("blacklisted"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("signal 12"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attempt 2: 2 rank(s) on localhost:2"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[a2:r1] relaunched"), std::string::npos) << r.out;
  const std::string log = read_text(dir.file("hpcrun/attempt-1.log"));
  EXPECT_NE(log.find("hpcrun-rank-alive: rank=0"), std::string::npos) << log;
  EXPECT_NE(log.find("hpcrun-rank-alive: rank=1"), std::string::npos) << log;
  EXPECT_EQ(log.find("signal=12"), std::string::npos) << log;
  const nlohmann::json sum = summary(dir.file("hpcrun/summary.json"));
  ASSERT_EQ(sum["attempts"].size(), 2u) << sum;
  EXPECT_EQ(sum["attempts"][0]["result"], "failure");
  EXPECT_EQ(sum["attempts"][0]["failed_hosts"], nlohmann::json::array());
  EXPECT_EQ(sum["attempts"][1]["result"], "success");
}

// A relaunch whose program started afresh (hpctrain's heartbeat: resumed_source=none,
// resumed_from=-1) is said to have, not "resumed from the none of step -1"; an attempt of one
// step is "step 1", not "steps 1-1".
TEST(HpcrunCli, TheSummarySaysAnAttemptStartedAfresh) {
  TempDir dir("hpcrun_afresh");
  const std::string beat = "printf 'step=%s\\nstate=training\\nresumed_source=none\\nresumed_from=-1\\n' "
                           "\"$HPCRUN_ATTEMPT\" > " + dir.file("heartbeat");
  const RunResult r = hpcrun({"--checkpoint-dir", dir.str(), "--max-restarts", "1", "--elastic-timeout", "1s",
                              "--blacklist-cooldown", "1s:1s", "-np", "1", "sh", "-c",
                              beat + "; sleep 1; [ \"$HPCRUN_ATTEMPT\" != 1 ]"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("; started afresh (no saved state to resume from)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("the none of step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", step 1: "), std::string::npos) << r.err;
}

// --start-timeout gives the start-up its own limit: a program whose first step comes after 7 s
// is no stall under --stall-timeout 5s --start-timeout 20s, but one that then finishes no further
// step for 5 s is. Without a first step within --start-timeout, the stall says so.
TEST(HpcrunCli, TheStartTimeoutLimitsTheStartUpAndTheStallTimeoutTheSteps) {
  TempDir dir("hpcrun_start");
  const std::string beat = "printf 'step=1\\nstate=training\\n' > " + dir.file("heartbeat");
  const RunResult r = hpcrun({"--checkpoint-dir", dir.str(), "--stall-timeout", "5s", "--start-timeout", "20s",
                              "--max-restarts", "1", "--elastic-timeout", "1s", "-np", "1", "sh", "-c",
                              "if [ \"$HPCRUN_ATTEMPT\" = 1 ]; then sleep 7; " + beat + "; exec sleep 60; fi; echo relaunched"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no step finished for 5 s (--stall-timeout"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", step 1: the job stalled (no finished step within --stall-timeout)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[a2:r0] relaunched"), std::string::npos) << r.out;

  TempDir slow("hpcrun_start_slow");
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult s = hpcrun({"--checkpoint-dir", slow.str(), "--stall-timeout", "5s", "--start-timeout", "8s",
                              "--max-restarts", "0", "-np", "1", "sleep", "60"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.exit_code, 1) << s.err;
  EXPECT_NE(s.err.find("no first step within 8 s of the launch (--start-timeout"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("the job stalled (no first step within --start-timeout)"), std::string::npos) << s.err;
  EXPECT_GE(took, 8.0) << s.err;
}

// hpctrain's beats name its hpcrun and attempt (hpcrun_token=, hpcrun_attempt=); a heartbeat that
// another writer keeps beating (another hpcrun's job on the directory) is not this attempt's
// progress: its start clock runs out as for a job that trains nothing. Before, such beats were
// its steps, in its log and summary.json. The same beats with this hpcrun's token count.
TEST(HpcrunCli, AnotherWritersHeartbeatIsNotThisAttemptsProgress) {
  TempDir dir("hpcrun_foreign_beat");
  const auto beats = [&](const std::string& token, int count) {
    // The last beat just before the end, as hpctrain's last step is.
    return "i=0; while [ $i -lt " + std::to_string(count) + " ]; do i=$((i+1)); sleep 0.2; printf 'step=%s\\n"
           "state=training\\nhpcrun_token=%s\\nhpcrun_attempt=%s\\n' $i " + token + " \"$HPCRUN_ATTEMPT\" > " +
           dir.file("heartbeat") + "; done";
  };
  // Another's beats never end the start-up; the attempt's own do (given time: a start-up under load is slow).
  const auto hpcrun_args = [&](const char* start_timeout) {
    return std::vector<std::string>{"--checkpoint-dir", dir.str(), "--start-timeout", start_timeout,
                                    "--max-restarts",   "0",       "-np",             "1", "sh", "-c"};
  };
  auto args = hpcrun_args("5s");
  args.push_back(beats("0000000000000000", 100));
  const RunResult foreign = hpcrun(args);
  EXPECT_EQ(foreign.exit_code, 1) << foreign.err;
  EXPECT_NE(foreign.err.find("no first step within 5 s of the launch (--start-timeout"), std::string::npos)
      << foreign.err;
  args = hpcrun_args("60s");
  args.push_back(beats("\"$HPCRUN_TOKEN\"", 10));
  const RunResult own = hpcrun(args);
  EXPECT_EQ(own.exit_code, 0) << own.err;
  // Its beats are progress, found by a poll every 0.1 s and read once more when the job has
  // ended: the last, step 10, always (the first may come before the first poll under load). In
  // CI, and here beside a booting slurm_node_failure cluster, hpcrun once reported steps 4-5 and
  // 1-9: the first part's rank had outlived its mpirun and went on writing its foreign beats over
  // these (ARankEndsWhenItsLauncherDies).
  EXPECT_TRUE(std::regex_search(own.err, std::regex("steps [1-9]-10: every rank finished"))) << own.err;
}

// A rank outlives no launcher. Open MPI gives each rank a process group of its own, out of reach
// of hpcrun's signals to mpirun's group; mpirun once ended (beside a booting Slurm test cluster)
// without ending its rank, which went on writing the heartbeat the next attempt read. The rank
// wrapper passes on a SIGTERM when its launcher dies: here mpirun, killed outright.
TEST(HpcrunCli, ARankEndsWhenItsLauncherDies) {
  TempDir dir("hpcrun_orphan");
  const std::string pid_file = dir.file("rank.pid");
  Started job({hpcrun_binary(), "--log-dir", dir.file("logs"), "--max-restarts", "0", "-np", "1", "sh", "-c",
               "echo $$ > " + pid_file + ".new && mv " + pid_file + ".new " + pid_file + "; while :; do sleep 0.1; done"});
  while (!fs::exists(pid_file) && job.running() && job.seconds() < 60) usleep(100 * 1000);
  ASSERT_TRUE(fs::exists(pid_file)) << read_text(job.err_path());
  const pid_t rank = static_cast<pid_t>(std::stol(read_text(pid_file)));
  pid_t mpirun = 0;
  for (pid_t c : child_pids(job.pid()))
    if (read_text("/proc/" + std::to_string(c) + "/comm") == "mpirun\n") mpirun = c;
  ASSERT_GT(mpirun, 0) << "no mpirun under hpcrun " << job.pid();
  ASSERT_EQ(::kill(mpirun, SIGKILL), 0);
  const double killed = job.seconds();
  while (::kill(rank, 0) == 0 && job.seconds() - killed < 10) usleep(100 * 1000);
  const bool orphan = ::kill(rank, 0) == 0;
  if (orphan) ::kill(rank, SIGKILL);
  EXPECT_FALSE(orphan) << "the rank's program outlived mpirun by 10 s";
  const RunResult r = job.finish(60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
}

// A second signal kills the job without a checkpoint: exit 130 (README), not 75's "stopped after
// a checkpoint, requeue me". Here the program ignores the first's stop request (SIGUSR1).
TEST(HpcrunCli, ASecondSignalKillsTheJobWith130) {
  TempDir dir("hpcrun_second_signal");
  const std::string pid_file = dir.file("rank.pid");
  Started job({hpcrun_binary(), "--log-dir", dir.file("logs"), "--max-restarts", "0", "-np", "1", "sh", "-c",
               "trap '' USR1; echo $$ > " + pid_file + ".new && mv " + pid_file + ".new " + pid_file +
                   "; while :; do sleep 0.1; done"});
  while (!fs::exists(pid_file) && job.running() && job.seconds() < 60) usleep(100 * 1000);
  ASSERT_TRUE(fs::exists(pid_file)) << read_text(job.err_path());
  ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
  const double first = job.seconds();
  while (read_text(job.err_path()).find("asking the job to checkpoint and stop") == std::string::npos &&
         job.seconds() - first < 30)
    usleep(100 * 1000);
  ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
  const RunResult r = job.finish(60);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("again: killing the job without a checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed on request"), std::string::npos) << r.err;
}

// mpirun drops a signal that comes while it starts the ranks (a Ctrl-C 20 ms after the launch
// and hpctrain trained to its end): a stop asked for before the first step is asked again at it.
// Here the program takes no stop before its first step, as if the first request never came (it
// may indeed not come): it traps the request (a shell cannot trap before it starts, so the test
// asks only once the trap is set), writes its first step once the request came, and stops on the
// next request.
TEST(HpcrunCli, AStopAskedBeforeTheFirstStepIsAskedAgainAtIt) {
  TempDir dir("hpcrun_early_stop");
  const std::string ready = dir.file("trap-set");
  const std::string program = "trap 'echo a request before the first step; asked=1' USR1; touch " + ready +
                              "; i=0; while [ -z \"$asked\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
                              "trap 'echo stopped on the second request; exit 75' USR1; "
                              "echo step=1 > " + dir.file("heartbeat") + "; while :; do sleep 0.05; done";
  Started job({hpcrun_binary(), "--checkpoint-dir", dir.str(), "--stop-timeout", "10s", "-np", "1",
               "--max-restarts", "0", "sh", "-c", program});
  while (!fs::exists(ready) && job.running() && job.seconds() < 60) usleep(20 * 1000);
  ASSERT_TRUE(fs::exists(ready)) << read_text(job.err_path());
  ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
  const RunResult r = job.finish(60);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_NE(r.out.find("a request before the first step"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("stopped on the second request"), std::string::npos) << r.out << r.err;
  EXPECT_NE(read_text(dir.file("hpcrun/attempt-1.log")).find("hpcrun: asking again (the job had not started"),
            std::string::npos);
}

// A signal while hpcrun probes its hosts (here a probe that takes 3 s, through a launch agent that
// runs everything on this machine): hpcrun waited for the probes, then launched the job and asked it
// to stop. Now nothing is launched, and it exits 75 as when stopped while waiting for hosts. The
// signal comes once the probe has begun (it came a fixed second after hpcrun's start, which a
// start-up on a loaded machine may outlast).
TEST(HpcrunCli, ASignalDuringTheProbesLaunchesNothing) {
  TempDir dir("hpcrun_signal_probing");
  const std::string agent = dir.file("agent"), ran = dir.file("ran"), probing = dir.file("probing");
  std::ofstream(agent) << "#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\nshift\n"
                          "if [ \"$*\" = true ]; then touch " << probing << "; sleep 3; fi\nexec sh -c \"$*\"\n";
  fs::permissions(agent, fs::perms::owner_all);
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    fs::remove(probing);
    Started job({hpcrun_binary(), "--log-dir", dir.file("logs"), "--launch-agent", agent, "-H", "198.51.100.7:1",
                 "--probe-timeout", "20s", "touch", ran});
    while (!fs::exists(probing) && job.running() && job.seconds() < 60) usleep(20 * 1000);
    ASSERT_TRUE(fs::exists(probing)) << read_text(job.err_path());
    ASSERT_EQ(::kill(job.pid(), sig), 0);
    const RunResult r = job.finish(60);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_NE(r.err.find(std::string("stopping on ") + strsignal(sig) + " while probing hosts"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("attempt 1"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(ran));
  }
}

// Dispositions hpcrun inherits. An ignored SIGCHLD (a launcher that ignores it to leave no
// zombies) made the kernel reap mpirun itself: waitpid never saw it end, and the attempt never
// ended. An ignored SIGHUP (nohup) is the user's wish that the job outlive the terminal: the
// hangup asked the job to checkpoint and stop.
TEST(HpcrunCli, InheritedSignalDispositionsAreKeptOrMended) {
  TempDir dir("hpcrun_dispositions");
  const RunResult quick = run_program({"/usr/bin/env", "--ignore-signal=CHLD", hpcrun_binary(), "--log-dir",
                                       dir.file("logs-chld"), "--max-restarts", "0", "-np", "1", "true"},
                                      60);
  EXPECT_FALSE(quick.timed_out) << "hpcrun started with SIGCHLD ignored did not end\n" << quick.err;
  EXPECT_EQ(quick.exit_code, 0) << quick.err;
  Started job({"/usr/bin/env", "--ignore-signal=HUP", hpcrun_binary(), "--log-dir", dir.file("logs-hup"),
               "--max-restarts", "0", "-np", "1", "sh", "-c", "sleep 3"});
  while (read_text(job.err_path()).find("attempt 1:") == std::string::npos && job.running() && job.seconds() < 60)
    usleep(20 * 1000);
  ASSERT_EQ(::kill(job.pid(), SIGHUP), 0);
  const RunResult r = job.finish(60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("asking the job to checkpoint and stop"), std::string::npos) << r.err;
}

// hpcrun's own descriptors (its log files, opened by std::ofstream without O_CLOEXEC) stayed
// open in mpirun, its ssh agents, the probes and the discovery script. The mpirun here lists
// what it was given, then runs the real one.
TEST(HpcrunCli, ItsChildrenInheritNoneOfItsFiles) {
  TempDir dir("hpcrun_descriptors");
  const std::string list = dir.file("fds"), wrapper = dir.file("mpirun");
  std::ofstream(wrapper) << "#!/bin/sh\nfor f in /proc/$$/fd/*; do readlink \"$f\"; done >> " << list
                         << "\nexec " << mpiexec() << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  const RunResult r = run_program({hpcrun_binary(), "--mpirun", wrapper, "--log-dir", dir.file("logs"),
                                   "--max-restarts", "0", "-np", "1", "true"},
                                  60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string fds = read_text(list);
  EXPECT_NE(fds.find("pipe:"), std::string::npos) << fds;  // its stdout, hpcrun's pipe
  EXPECT_EQ(fds.find(dir.file("logs")), std::string::npos) << fds;
}

// A signal that comes after mpirun ended, while its launch agents still hold its output: it
// waited in hpcrun's pipe, and the failed attempt was relaunched (the stop came only after the
// next attempt's start-up, Slurm's KillWait perhaps gone). The mpirun here fails at once,
// leaving a child that holds its output for 4 s. SIGUSR2 (submitit's, `sbatch --signal=B:USR2`)
// is a stop as SIGTERM is: it ended hpcrun with 140, no summary and no checkpoint. The signal
// comes once hpcrun has reaped this mpirun (a fixed second after its last command, which a loaded
// machine may outlast: the signal then came during the attempt), well within the 4 s.
TEST(HpcrunCli, ASignalAsAnAttemptEndsStopsTheJob) {
  for (const int sig : {SIGTERM, SIGUSR2}) {
    SCOPED_TRACE(::strsignal(sig));
    TempDir dir("hpcrun_late_signal");
    const std::string ended = dir.file("ended"), wrapper = dir.file("mpirun");
    std::ofstream(wrapper) << "#!/bin/sh\ncase \" $* \" in *' --do-not-launch '*) exec " << mpiexec()
                           << " \"$@\";; esac\nsleep 4 &\necho $$ > " << ended << ".new\nmv " << ended << ".new "
                           << ended << "\nexit 1\n";
    fs::permissions(wrapper, fs::perms::owner_all);
    Started job({hpcrun_binary(), "--mpirun", wrapper, "--log-dir", dir.file("logs"), "--max-restarts", "2", "-np",
                 "1", "true"});
    while (!fs::exists(ended) && job.running() && job.seconds() < 60) usleep(20 * 1000);
    ASSERT_TRUE(fs::exists(ended)) << read_text(job.err_path());
    const pid_t mpirun = static_cast<pid_t>(std::stol(read_text(ended)));
    // Gone, not a zombie: hpcrun's wait took it, and hpcrun knows it ended.
    while (::kill(mpirun, 0) == 0 && job.running() && job.seconds() < 60) usleep(20 * 1000);
    ASSERT_NE(::kill(mpirun, 0), 0) << "hpcrun never reaped its mpirun";
    ASSERT_EQ(::kill(job.pid(), sig), 0);
    const RunResult r = job.finish(60);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_EQ(r.err.find("relaunching"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("as the attempt ended: nothing more is launched"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the attempt failed while hpcrun was asked to stop"), std::string::npos) << r.err;
    // A failure that spent no restart: summary.json's count is said beside the line's.
    EXPECT_NE(r.err.find("summary: 1 attempt(s), 1 failure(s) (0 counted against --max-restarts), "),
              std::string::npos)
        << r.err;
    EXPECT_EQ(summary(dir.file("logs/summary.json")).at("failures"), 0);
  }
}

// hpcrun's attempts wait for the checkpoint directory's lock (hpctrain --checkpoint-lock-wait,
// which hpcrun adds): a relaunch can find the last attempt's rank 0 still alive on a host cut off
// from the others, holding it until its own watchdog ends it, up to its --step-timeout after its
// last step (mpirun, naming the lost daemon, ends the rest at once): the wait is that and a
// minute (90 s here; 11 min by default), not a minute alone, which refused such a relaunch as a
// usage error and ended the job. Here a holder lets go once the attempt waits, and the job runs;
// the same hpctrain alone is refused at once. The wait is no hang of the start-up: held past
// --start-timeout 8s (the holder rewriting its record, as a live one does), the attempt was
// killed as a stall; --start-timeout counts from the release.
TEST(HpcrunCli, AnAttemptWaitsForTheCheckpointDirectorysLock) {
  TempDir dir("hpcrun_lock");
  const std::string lock = dir.file("lock");
  const int fd = hold_directory_lock(dir.str());
  const std::vector<std::string> train{hpctrain_binary(), "--checkpoint-dir", dir.str(), "--max-steps", "2",
                                       "--train-samples", "640", "--test-samples", "100", "--threads", "1",
                                       "--device", "cpu", "--data-dir", fashion_mnist_dir(), "--step-timeout", "30s"};
  const RunResult alone = run_program(train, 60);
  EXPECT_EQ(alone.exit_code, 2) << alone.err;
  EXPECT_NE(alone.err.find("is in use by another run (host elsewhere pid 1)"), std::string::npos) << alone.err;
  std::vector<std::string> args{hpcrun_binary(), "-np", "1", "--max-restarts", "0", "--start-timeout", "8s"};
  args.insert(args.end(), train.begin(), train.end());
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:300", 1);
  Started job(args);
  // The lock is let go once the attempt says it waits for it (a fixed sleep raced a slow start
  // under load: the lock was free before hpctrain looked, and nothing waited), and 12 s more.
  const std::string waiting = "waiting up to 90 s for the checkpoint directory's lock, held by host elsewhere";
  const auto said = [&] { return (read_text(job.out_path()) + read_text(job.err_path())).find(waiting); };
  while (said() == std::string::npos && job.running() && job.seconds() < 60) usleep(100 * 1000);
  for (const double until = job.seconds() + 12; job.running() && job.seconds() < until; usleep(500 * 1000)) {
    const std::string record = "host=elsewhere\npid=1\nunix_time=" + std::to_string(::time(nullptr)) + "\nstate=held\n";
    ASSERT_EQ(::pwrite(fd, record.data(), record.size(), 0), static_cast<ssize_t>(record.size()));
  }
  ::close(fd);  // lets go
  // The attempt's own lock names it (hpcrun tells it from another's by that): 300 ms steps.
  bool named = false;
  std::string seen;
  while (job.running() && !named) {
    const std::string record = "\n" + read_text(lock);
    if (record.size() > 1) seen = record;
    named = record.find("\nstate=held\n") != std::string::npos && record.find("\nhpcrun_attempt=1\n") != std::string::npos &&
            record.find("\nhpcrun_token=") != std::string::npos;
    usleep(20 * 1000);
  }
  const RunResult r = job.finish(120);
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  EXPECT_TRUE(named) << "the attempt's lock did not name it: " << seen;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(waiting), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.err.find("hpcrun: attempt 1 waits for the checkpoint directory's lock, held by host elsewhere pid 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(": another run; its --start-timeout counts from the release"), std::string::npos) << r.err;
}

TEST(HpcrunCli, FailuresAreRetriedThenItGivesUp) {
  TempDir dir("hpcrun_fail");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "--max-restarts", "2", "--blacklist-cooldown",
                              "0.1s:0.2s", "sh", "-c", "echo attempt $HPCRUN_ATTEMPT restart $HPCRUN_RESTART_COUNT; exit 3"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("[a3:r0] attempt 3 restart 2"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("attempt 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gave up: 3 failure(s), --max-restarts is 2; the last: rank 0 on localhost ended with exit code 3"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("summary: 3 attempt(s), 3 failure(s)"), std::string::npos) << r.err;
  const nlohmann::json sum = summary(dir.file("summary.json"));
  EXPECT_EQ(sum["exit_code"], 1);
  EXPECT_EQ(sum["failures"], 3);
  ASSERT_EQ(sum["attempts"].size(), 3u) << sum;
  for (const nlohmann::json& a : sum["attempts"]) {
    EXPECT_EQ(a["result"], "failure") << a;
    EXPECT_EQ(a["outcome"], "rank 0 on localhost ended with exit code 3") << a;
    EXPECT_EQ(a["failed_hosts"], nlohmann::json::array({"localhost"})) << a;
    EXPECT_GE(a["failed_at"].get<double>(), a["start"].get<double>()) << a;
    EXPECT_FALSE(a.contains("recovery_seconds")) << "no heartbeat showed a step: " << a;
  }
}

// A job on one host that failed waits out the host's cooldown, however short --elastic-timeout
// is: it ended "after waiting --elastic-timeout 1s" with its restarts left (the cooldown is
// hpcrun's own doing, not a host that may never come). With no cooldown to wait for, the
// timeout still ends a wait for hosts that are not there.
TEST(HpcrunCli, TheOnlyHostsCooldownIsWaitedOutPastTheElasticTimeout) {
  TempDir dir("hpcrun_cooldown");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", "--max-restarts", "1", "--blacklist-cooldown", "3s:3s",
                              "--elastic-timeout", "1s", "sh", "-c", "[ \"$HPCRUN_ATTEMPT\" = 2 ] || exit 3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("host localhost blacklisted for 3 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" for hosts: 0 healthy slot(s), --min-np 1 needed (past --elastic-timeout 1 s: "
                       "hosts in their --blacklist-cooldown make them up when they are back)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("attempt 2 succeeded"), std::string::npos) << r.err;
}

// Exit 1's reason is the last line (launch/README.md's exit codes): a job whose hosts are gone for
// longer than --elastic-timeout said "gave up: ..." before its summary, whose last attempt's line
// was then the last.
TEST(HpcrunCli, AJobWithoutHostsSaysWhyOnItsLastLine) {
  TempDir dir("hpcrun_no_hosts");
  // localhost at the first discovery, then none: the failed attempt's host is not found again.
  const std::string asked = dir.file("asked");
  const std::string discover = script(dir, "discover", "[ -e " + asked + " ] || { : > " + asked + "; echo localhost:1; }");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "--host-discovery-script", discover, "--discovery-interval", "1",
                              "--max-restarts", "2", "--blacklist-cooldown", "0.5s:0.5s", "--elastic-timeout", "2s",
                              "sh", "-c", "exit 3"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::string last = r.err.substr(0, r.err.find_last_not_of('\n') + 1);
  last = last.substr(last.find_last_of('\n') + 1);
  EXPECT_EQ(last.rfind("hpcrun: gave up: 0 healthy slot(s), --min-np 1 needed after waiting --elastic-timeout 2 s", 0),
            0u)
      << r.err;
}

// What a program prints cannot pass for its wrapper's report: a status line for another rank, or
// one on stdout, is the program's output. Here rank 0 fails (exit 3), a failure hpcrun retries,
// after printing a usage error for rank 1 on its stderr and for itself on its stdout; believed,
// either would end the job at once as a usage error (exit 2) that retrying cannot help.
TEST(HpcrunCli, AProgramsOwnStatusLinesDoNotSpeakForARank) {
  TempDir dir("hpcrun_forged");
  const std::string tag = "hpcrun-rank-status:";
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "2", "--max-restarts", "1", "--blacklist-cooldown",
                              "0.1s:0.2s", "sh", "-c",
                              "if [ \"$OMPI_COMM_WORLD_RANK\" = 0 ]; then echo '" + tag +
                                  " rank=1 exit=2 terminated=0 stop_requested=0' >&2; echo '" + tag +
                                  " rank=0 exit=2 terminated=0 stop_requested=0'; sleep 0.5; exit 3; fi; sleep 2"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.find("reported a usage error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gave up: 2 failure(s), --max-restarts is 1; the last: rank 0 on localhost ended with exit code 3"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[a2:r0] " + tag + " rank=0 exit=2"), std::string::npos) << "shown as the program's output:\n" << r.out;
}

// A program whose last output has no line end (a progress bar's "\r"): mpirun puts the wrapper's
// status on that same line, and hpcrun took the rank for one that never reported finishing,
// relaunched a job that had succeeded and gave up with exit 1.
TEST(HpcrunCli, ALastLineWithoutALineEndKeepsTheRanksStatus) {
  TempDir dir("hpcrun_no_line_end");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "2", "--max-restarts", "1", "sh", "-c",
                              "printf 'step 10/10\\r' >&2; printf 'done'"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("summary: 1 attempt(s), 0 failure(s)"), std::string::npos) << r.err;
}

// The same with another rank's output and status after the piece without a line end: mpirun
// writes them on its line. Rank 1's progress comes first, rank 0's after it, before rank 1 ends
// (rank 0's status then comes before or after rank 1's; on the old code either failed). Each waits
// for the event it must follow, not for a time (a 0.4 s sleep was not enough on a loaded machine):
// for its pipe to mpirun to be read empty (FIONREAD), then for the other rank's mark.
TEST(HpcrunCli, AnotherRanksOutputAfterALineWithoutALineEndIsItsOwn) {
  TempDir dir("hpcrun_no_line_end_2");
  const std::string ranks = R"(
import fcntl, os, struct, sys, termios, time
def poll(done):  # a minute at most: a failure, not a hang
    for _ in range(6000):
        if done(): return
        time.sleep(0.01)
    sys.exit('timed out')
def read_by_mpirun(): poll(lambda: struct.unpack('i', fcntl.ioctl(2, termios.FIONREAD, b'0000'))[0] == 0)
def mark(name): open(os.path.join(sys.argv[1], name), 'w').close()
def marked(name): poll(lambda: os.path.exists(os.path.join(sys.argv[1], name)))
if os.environ['OMPI_COMM_WORLD_RANK'] == '1':
    os.write(2, b'one 50%\r'); read_by_mpirun(); mark('one'); marked('zero')
else:
    marked('one'); os.write(2, b'zero 10/10\r'); read_by_mpirun(); mark('zero')
)";
  const RunResult r =
      hpcrun({"--log-dir", dir.str(), "-np", "2", "--max-restarts", "1", "/usr/bin/python3", "-c", ranks, dir.str()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("summary: 1 attempt(s), 0 failure(s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[a1:r0] zero 10/10"), std::string::npos) << r.err;
}

// A process map hpcrun cannot read (--display-diffable-map's has no node names) is one warning: the
// ranks are taken to be in -H's slot order, and the job runs. The map asked for is shown.
TEST(HpcrunCli, AnUnreadableProcessMapIsOneWarning) {
  TempDir dir("hpcrun_map");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "2", "--mpi-args", "--display-diffable-map", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hpcrun: warning: mpirun printed no process map; the ranks are taken to be on the hosts in "
                       "-H's slot order"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("<map>"), std::string::npos) << r.out;
}

// At the end of a job no relaunch continues, hpcrun frees the run's snapshots in host memory
// on the job's hosts, unless they hold steps no checkpoint does. (A stop, exit 75, leaves none
// either: the trainer removes them once its checkpoint, which holds the same state, is written.)
// hpctrain given --resume none begins the run afresh in the first attempt; a relaunch after it
// trained continues that run (--resume auto), from its snapshot of step 8. Each attempt had
// started over and died at step 8 again, until hpcrun gave up.
TEST(HpcrunCli, ARelaunchContinuesARunBegunWithResumeNone) {
  TempDir dir("hpcrun_resume_none");
  const std::string ck = dir.file("ck"), m = dir.file("m.jsonl");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "8", 1);
  const RunResult r = hpcrun({"-np", "1", "--max-restarts", "1", "--blacklist-cooldown", "0.1s:0.2s",
                              hpctrain_binary(), "--checkpoint-dir", ck, "--resume=none", "--snapshot-dir",
                              dir.file("snaps"), "--snapshot-every-steps", "1", "--max-steps", "12",
                              "--train-samples", "1280", "--test-samples", "100", "--threads", "1", "--device", "cpu",
                              "--metrics-file", m, "--data-dir", fashion_mnist_dir()},
                             120);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the run began with --resume none in attempt 1; later attempts continue it (--resume auto)"),
            std::string::npos) << r.err;
  const JsonObject d = done_of(m);
  EXPECT_EQ(d.at("resumed_from").str, "snapshot");
  EXPECT_EQ(d.at("resumed_from_step").number, 8);
}

// The same, with the checkpoint directory and resume = none in hpctrain's config file (--config),
// where hpcrun saw neither: it watched no heartbeat, and its own --resume auto overrode the file's
// fresh start in the first attempt, which continued the directory's earlier run (step 4) instead.
TEST(HpcrunCli, AConfigFilesCheckpointDirAndResumeAreSeen) {
  TempDir dir("hpcrun_config");
  const std::string ck = dir.file("ck"), m = dir.file("m.jsonl"), config = dir.file("train.conf");
  const std::vector<std::string> common{"--train-samples", "1280", "--test-samples", "100", "--threads", "1",
                                        "--device", "cpu", "--data-dir", fashion_mnist_dir()};
  std::vector<std::string> earlier{hpctrain_binary(), "--checkpoint-dir", ck, "--max-steps", "4"};
  earlier.insert(earlier.end(), common.begin(), common.end());
  ASSERT_EQ(run_program(earlier, 60).exit_code, 0);
  write_text(config, "checkpoint-dir = " + ck + "\nresume = none\nsnapshot-dir = " + dir.file("snaps") +
                         "\nsnapshot-every-steps = 1\nstep-timeout = 2m\n");
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "8", 1);
  // 100 ms a step: the heartbeat of attempt 2's first step (9) stands 300 ms, for hpcrun's 0.1 s
  // polls to see it, where steps 10-12 and the end took some 50 ms and the check below was luck.
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:100", 1);
  std::vector<std::string> args{"-np", "1", "--max-restarts", "1", "--blacklist-cooldown", "0.1s:0.2s",
                                hpctrain_binary(), "--config", config, "--max-steps", "12", "--metrics-file", m};
  args.insert(args.end(), common.begin(), common.end());
  const RunResult r = hpcrun(args, 120);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the run began with --resume none in attempt 1; later attempts continue it (--resume auto)"),
            std::string::npos) << r.err;
  // hpcrun's logs in the checkpoint directory, the first attempt a fresh start (the earlier run's
  // checkpoints set aside), and the heartbeat's steps read.
  const std::string first = read_text(ck + "/hpcrun/attempt-1.log");
  EXPECT_EQ(first.find("resuming from"), std::string::npos) << first;
  // The file's step-timeout sets the lock wait hpcrun gives (2m and a minute).
  EXPECT_NE(first.find(" --checkpoint-lock-wait 3m "), std::string::npos) << first.substr(0, 2000);
  EXPECT_NE(r.err.find("attempt 2: 1 rank(s) on localhost:1, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" s, steps 9-12: every rank finished"), std::string::npos) << r.err;
  const JsonObject d = done_of(m);
  EXPECT_EQ(d.at("resumed_from").str, "snapshot");
  EXPECT_EQ(d.at("resumed_from_step").number, 8);
}

// A checkpoint whose write outlasts --stall-timeout but moves is no stall: hpctrain's heartbeat
// names its synced bytes as they come, which hpcrun takes for life (not for a step). The final
// checkpoint, 14 chunks each synced after 0.5 s, under --stall-timeout 5s: one attempt, a success.
// Before, the heartbeat stood still for the write, and hpcrun killed the job as stalled.
TEST(HpcrunCli, ACheckpointWriteThatMovesIsNoStall) {
  TempDir dir("hpcrun_slow_write");
  const std::string ck = dir.file("ck");
  setenv("HPCTRAIN_TEST_SLOW_WRITE", "0.5:14", 1);
  const RunResult r = hpcrun({"-np", "1", "--stall-timeout", "5s", "--max-restarts", "0", hpctrain_binary(),
                              "--checkpoint-dir", ck, "--max-steps", "4", "--step-timeout", "3s",
                              "--snapshot-every-steps", "0", "--train-samples", "1280", "--test-samples", "100",
                              "--threads", "1", "--device", "cpu", "--data-dir", fashion_mnist_dir()},
                             120);
  unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("stall"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(ck + "/ckpt-000000004.hpck")) << r.err;
  const nlohmann::json sum = summary(ck + "/hpcrun/summary.json");
  ASSERT_EQ(sum["attempts"].size(), 1u) << sum;
  EXPECT_EQ(sum["attempts"][0]["result"], "success");
  EXPECT_EQ(sum["attempts"][0]["last_step"], 4) << sum;

  // A stop hpcrun asks for (SIGTERM to hpcrun) whose checkpoint takes 6 s under --stop-timeout 3s:
  // the timeout counts from the write's last synced chunk, and the job stops with its checkpoint.
  // Before, hpcrun terminated it 3 s into the write.
  const std::string stop_ck = dir.file("stop");
  setenv("HPCTRAIN_TEST_SLOW_WRITE", "0.5:12", 1);
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:100", 1);
  Started job({hpcrun_binary(), "-np", "1", "--stop-timeout", "3s", "--max-restarts", "0", hpctrain_binary(),
               "--checkpoint-dir", stop_ck, "--step-timeout", "3s", "--snapshot-every-steps", "0", "--train-samples",
               "1280", "--test-samples", "100", "--threads", "1", "--device", "cpu", "--data-dir", fashion_mnist_dir()});
  unsetenv("HPCTRAIN_TEST_SLOW_WRITE");
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  const auto stepped = [&] { return read_text(stop_ck + "/heartbeat").find("\nstate=training\n") != std::string::npos; };
  while (!stepped() && job.running() && job.seconds() < 120) usleep(50 * 1000);
  ASSERT_TRUE(stepped()) << read_text(job.err_path());
  ASSERT_EQ(::kill(job.pid(), SIGTERM), 0);
  const RunResult stopped = job.finish(120);
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_NE(stopped.err.find("checkpoint written, --resume auto continues from it"), std::string::npos) << stopped.err;
  EXPECT_GE(stopped.seconds, 6.0) << "the write was not slow";
}

// Inside a Slurm job, a node of the allocation that does not answer its probe at the start is a node
// failure (exit 1, which slurm/job.sh requeues onto other nodes), not bad input: before, it was exit
// 2, "cannot start", which the job script never requeues. A fixed -H list stays bad input.
TEST(HpcrunCli, ASlurmNodeThatDoesNotAnswerAtTheStartIsAFailureNotBadInput) {
  TempDir dir("hpcrun_slurm_probe");
  const std::string agent = dir.file("agent");
  std::ofstream(agent) << "#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\n"
                          "[ \"$1\" = node2 ] && exit 255\nshift\nexec sh -c \"$*\"\n";
  fs::permissions(agent, fs::perms::owner_all);
  ::setenv("SLURM_JOB_ID", "7", 1);
  ::setenv("SLURM_JOB_NODELIST", "node[1-2]", 1);
  ::setenv("SLURM_TASKS_PER_NODE", "1(x2)", 1);
  const RunResult r = hpcrun({"--log-dir", dir.file("logs"), "--launch-agent", agent, "-np", "2", "true"});
  for (const char* name : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE"}) ::unsetenv(name);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(error_lines(r.err), 0) << r.err;
  EXPECT_NE(r.err.find("gave up: cannot start: 1 healthy slot(s) (node1:1), --min-np 2 needed in Slurm's allocation"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("attempt 1"), std::string::npos) << r.err;
  const RunResult fixed = hpcrun({"--log-dir", dir.file("logs2"), "--launch-agent", agent, "-H", "node1:1,node2:1",
                                  "-np", "2", "true"});
  EXPECT_EQ(fixed.exit_code, 2) << fixed.err;
  EXPECT_NE(fixed.err.find("hpcrun: error: cannot start: 1 healthy slot(s) (node1:1), --min-np 2 needed"),
            std::string::npos) << fixed.err;
}

// hpcrun removes its own membership-change marker only: another hpcrun's (of the same checkpoint
// directory, its drain under way) was removed at each attempt's start and at the end, and that
// stop then wrote a checkpoint instead of keeping the state in memory.
TEST(HpcrunCli, AnotherHpcrunsMembershipMarkerIsLeftAlone) {
  TempDir dir("hpcrun_marker");
  const std::string marker = dir.file("membership-change");
  std::ofstream(marker) << "token=0123456789abcdef\npid=1\n";
  const RunResult r = hpcrun({"--checkpoint-dir", dir.str(), "-np", "1", "--max-restarts", "0", "sh", "-c",
                              "test -e " + marker});
  EXPECT_EQ(r.exit_code, 0) << "the marker was gone when the attempt ran: " << r.err;
  EXPECT_EQ(read_text(marker), "token=0123456789abcdef\npid=1\n");
}

// A user's stop that comes while a stop to grow is under way outranks it, and takes back the
// membership-change marker: the job stops for good (75, a requeue perhaps on other nodes), so the
// ranks that have not yet looked must write a checkpoint, not snapshots alone in the memory of
// hosts the job may not see again. Here the program waits for the stop request, then up to 5 s for
// the marker to go; the discovery output grows from localhost to 127.0.0.1 (both local).
TEST(HpcrunCli, AUsersStopDuringAGrowTakesBackTheMembershipMarker) {
  TempDir dir("hpcrun_grow_then_stop");
  const std::string hosts = dir.file("hosts"), asked = dir.file("asked");
  std::ofstream(hosts) << "localhost:1\n";
  const std::string discover = script(dir, "discover.sh", "cat " + hosts);
  const std::string marker = dir.file("membership-change");
  const std::string program = "trap 'touch " + asked + "' USR1; echo step=1 > " + dir.file("heartbeat") +
                              "; while [ ! -e " + asked + " ]; do sleep 0.05; done; i=0; while [ -e " + marker +
                              " ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; "
                              "if [ -e " + marker + " ]; then echo marker kept; else echo marker gone; fi; exit 75";
  Started job({hpcrun_binary(), "--checkpoint-dir", dir.str(), "--host-discovery-script", discover,
               "--discovery-interval", "0.2s", "--max-np", "2", "--max-restarts", "0", "sh", "-c", program});
  const auto said = [&](const std::string& what) { return read_text(job.err_path()).find(what) != std::string::npos; };
  while (!said("attempt 1:") && job.running() && job.seconds() < 60) usleep(50 * 1000);
  std::ofstream(hosts, std::ios::app) << "127.0.0.1:1\n";
  while (!fs::exists(asked) && job.running() && job.seconds() < 60) usleep(20 * 1000);
  ASSERT_TRUE(said("asking the job to checkpoint and stop: growing onto 127.0.0.1")) << read_text(job.err_path());
  ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
  const RunResult r = job.finish(60);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_NE(r.out.find("marker gone"), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(fs::exists(marker));
}

// A rank that crashes in a grow's stop is a failure of the job, counted against --max-restarts
// and blamed, not a stop to change hosts relaunched for free: a program that crashes in its stop
// path would otherwise be relaunched as often as hosts come and go. The program crashes
// (SIGSEGV) when asked to stop; the discovery output grows from localhost to 127.0.0.1.
TEST(HpcrunCli, ARankThatCrashesInAGrowsStopIsAFailure) {
  TempDir dir("hpcrun_grow_crash");
  const std::string hosts = dir.file("hosts");
  std::ofstream(hosts) << "localhost:1\n";
  const std::string discover = script(dir, "discover.sh", "cat " + hosts);
  const std::string program = until_asked_to_stop(dir, "kill -SEGV $$");
  Started job({hpcrun_binary(), "--checkpoint-dir", dir.str(), "--host-discovery-script", discover,
               "--discovery-interval", "0.2s", "--max-np", "2", "--max-restarts", "0", "sh", "-c", program});
  const auto said = [&](const std::string& what) { return read_text(job.err_path()).find(what) != std::string::npos; };
  while (!said("attempt 1:") && job.running() && job.seconds() < 60) usleep(50 * 1000);
  std::ofstream(hosts, std::ios::app) << "127.0.0.1:1\n";
  const RunResult r = job.finish(120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("asking the job to checkpoint and stop: growing onto 127.0.0.1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gave up: 1 failure(s), --max-restarts is 0; the last: rank 0 on localhost ended with signal 11"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("attempt 2:"), std::string::npos) << r.err;
}

// A host whose slots in the discovery output fall below its ranks drains the job to them, as one
// that leaves it does: the job had run on, its ranks on slots given to others. The program runs
// until it is asked to stop (at most 60 s), and its second attempt ends at once.
TEST(HpcrunCli, AHostWithFewerSlotsIsDrainedToThem) {
  TempDir dir("hpcrun_fewer_slots");
  const std::string hosts = dir.file("hosts");
  std::ofstream(hosts) << "localhost:2\n";
  const std::string discover = script(dir, "discover.sh", "cat " + hosts);
  const std::string program = until_asked_to_stop(dir, "exit 75");
  Started job({hpcrun_binary(), "--checkpoint-dir", dir.str(), "--host-discovery-script", discover,
               "--discovery-interval", "0.2s", "--max-restarts", "0", "sh", "-c", program});
  const auto said = [&](const std::string& what) { return read_text(job.err_path()).find(what) != std::string::npos; };
  while (!said("attempt 1:") && job.running() && job.seconds() < 60) usleep(50 * 1000);
  std::ofstream(hosts) << "localhost:1\n";
  const RunResult r = job.finish(120);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("host localhost has 1 slot(s) in the discovery output, fewer than its 2 rank(s)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("attempt 2: 1 rank(s) on localhost:1 "), std::string::npos) << r.err;
}

// A drain's stop writes snapshots alone (the hosts that go on hold the state); hpcrun then waits
// for --min-np slots, and a signal ends the wait: exit 75, for a requeue that may run on other
// nodes. Before it exits, the state of the stop's step, which only host memory held, is written
// into the checkpoint directory, and the same command run there without those snapshots (another
// host's memory) resumes at that very step.
TEST(HpcrunCli, ASignalWhileWaitingAfterADrainKeepsTheStopsStateOnSharedStorage) {
  TempDir dir("hpcrun_drain_persist");
  const std::string hosts = dir.file("hosts"), ck = dir.file("ck");
  std::ofstream(hosts) << "localhost:2\n";
  const std::string discover = script(dir, "discover.sh", "cat " + hosts);
  const auto train = [&](const std::string& snaps, const std::vector<std::string>& launch) {
    std::vector<std::string> args{hpcrun_binary()};
    args.insert(args.end(), launch.begin(), launch.end());
    args.insert(args.end(), {"--max-restarts", "0", hpctrain_binary(), "--checkpoint-dir", ck, "--snapshot-dir", snaps,
                             "--train-samples",
                             "6400", "--epochs", "2", "--test-samples", "100", "--threads", "1", "--device", "cpu",
                             "--data-dir", fashion_mnist_dir()});
    return args;
  };
  Started job(train(dir.file("snaps"), {"--host-discovery-script", discover, "--discovery-interval", "0.2s",
                                        "--min-np", "2", "--elastic-timeout", "5m"}));
  const auto said = [&](const std::string& what) { return read_text(job.err_path()).find(what) != std::string::npos; };
  const auto step = [&] {
    const std::string beat = read_text(ck + "/heartbeat");
    return beat.rfind("step=", 0) == 0 ? std::atoll(beat.c_str() + 5) : -1;
  };
  while (step() < 5 && job.running() && job.seconds() < 120) usleep(50 * 1000);
  ASSERT_GE(step(), 5) << read_text(job.err_path());
  std::ofstream(hosts) << "localhost:1\n";
  while (!said("waiting up to 5 min for hosts") && job.running() && job.seconds() < 180) usleep(50 * 1000);
  ASSERT_TRUE(said("waiting up to 5 min for hosts")) << read_text(job.err_path());
  const int64_t stopped_at = step();
  ASSERT_EQ(::kill(job.pid(), SIGTERM), 0);
  const RunResult r = job.finish(120);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  const std::string name = "ckpt-" + std::string(9 - std::to_string(stopped_at).size(), '0') +
                           std::to_string(stopped_at) + ".hpck";
  EXPECT_NE(r.err.find(": kept the snapshot of step " + std::to_string(stopped_at) + " ("), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(ck + "/" + name)) << r.err;
  EXPECT_EQ(r.err.find("freeing the run's snapshots"), std::string::npos) << "a requeue here may want them: " << r.err;
  // Elsewhere: the same command, on a host whose memory holds nothing of the run.
  const RunResult again = run_program(train(dir.file("other-snaps"), {"-np", "1"}), 300);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  const nlohmann::json last = summary(ck + "/hpcrun/summary.json").at("attempts").back();
  EXPECT_EQ(last.at("resumed_from"), "checkpoint") << last.dump();
  EXPECT_EQ(last.at("resumed_from_step"), stopped_at) << last.dump();
}

TEST(HpcrunCli, AJobThatEndsForGoodFreesItsSnapshots) {
  TempDir dir("hpcrun_snaps");
  const std::string snaps = dir.file("snaps");
  // `program`: hpctrain, or a script of that name in front of it (hpcrun knows hpctrain by name).
  auto job = [&](const std::string& hook, const std::string& ck, const std::string& program = hpctrain_binary(),
                 const std::string& every = "3", const std::vector<std::string>& more = {}) {
    setenv(hook.c_str(), "8", 1);
    std::vector<std::string> args{"-np", "1", "--max-restarts", "0", program, "--checkpoint-dir", ck,
                                  "--snapshot-dir", snaps, "--snapshot-every-steps", every, "--train-samples", "1280",
                                  "--epochs", "1", "--test-samples", "100", "--threads", "1", "--device", "cpu",
                                  "--data-dir", fashion_mnist_dir()};
    args.insert(args.end(), more.begin(), more.end());
    const RunResult r = hpcrun(args, 120);
    unsetenv(hook.c_str());
    return r;
  };
  auto run_dirs = [&] {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(snaps)) out.push_back(e.path().filename().string());
    return out;
  };
  // Stopped by a signal after step 8: exit 75, the trainer's checkpoint holds the state.
  const RunResult stopped = job("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", dir.file("ck1"));
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_TRUE(run_dirs().empty());
  EXPECT_EQ(stopped.err.find("freeing the run's snapshots"), std::string::npos) << stopped.err;
  EXPECT_EQ(stopped.err.find("persist"), std::string::npos) << stopped.err;
  const nlohmann::json stop_summary = summary(dir.file("ck1") + "/hpcrun/summary.json");
  EXPECT_FALSE(stop_summary.contains("persisted_step") || stop_summary.contains("snapshots")) << stop_summary.dump();
  // Killed after step 8 with no checkpoint yet, and --max-restarts 0: hpcrun gives up. The
  // snapshot of step 6, the only copy of steps 1 to 6, goes into the checkpoint directory (the
  // hosts' memory lasts an hour, and none when an idle cluster's nodes are terminated) ...
  const std::string ck2 = dir.file("ck2");
  const RunResult failed = job("HPCTRAIN_TEST_KILL_AFTER_STEP", ck2);
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_NE(failed.err.find("the run's newest state may be a snapshot in host memory, past the newest checkpoint in " +
                            ck2 + " (none; the heartbeat's step "),
            std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("): writing the newest there (localhost:1)"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find(": kept the snapshot of step 6 ("), std::string::npos) << failed.err;
  EXPECT_TRUE(fs::exists(ck2 + "/ckpt-000000006.hpck")) << failed.err;
  // ... and then the snapshots go: they hold nothing more.
  EXPECT_NE(failed.err.find("freeing the run's snapshots"), std::string::npos) << failed.err;
  EXPECT_TRUE(run_dirs().empty()) << failed.err;
  const nlohmann::json failed_summary = summary(ck2 + "/hpcrun/summary.json");
  EXPECT_EQ(failed_summary.value("persisted_step", -1), 6) << failed_summary.dump();
  EXPECT_EQ(failed_summary.value("snapshots", ""), "freed") << failed_summary.dump();
  // The same command resumes from that checkpoint, not from step 0.
  const RunResult again = job("HPCTRAIN_TEST_UNUSED", ck2);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("attempt 2 succeeded"), std::string::npos) << again.err;
  EXPECT_EQ(again.err.find(", steps 1-"), std::string::npos) << "not resumed from step 6: " << again.err;
  EXPECT_TRUE(run_dirs().empty()) << "the finished run's snapshots are still there";
  // Steps of half a second and snapshots every 5: the heartbeat (once a second) is past the
  // snapshot (step 5) when step 8 ends the run. Steps 6 to 8 are lost with the run, and the
  // snapshots, which hold no more than the checkpoint now, go.
  const std::string ck4 = dir.file("ck4");
  setenv("HPCTRAIN_TEST_SLOW_RANK", "0:500", 1);
  const RunResult slow = job("HPCTRAIN_TEST_KILL_AFTER_STEP", ck4, hpctrain_binary(), "5");
  unsetenv("HPCTRAIN_TEST_SLOW_RANK");
  EXPECT_EQ(slow.exit_code, 1) << slow.err;
  const std::string beat = read_text(ck4 + "/heartbeat");
  ASSERT_EQ(beat.rfind("step=", 0), 0u) << beat;
  EXPECT_GT(std::atoll(beat.c_str() + 5), 5) << "the case needs a heartbeat past the snapshot: " << beat;
  EXPECT_NE(slow.err.find(": kept the snapshot of step 5 ("), std::string::npos) << slow.err;
  EXPECT_NE(slow.err.find("freeing the run's snapshots"), std::string::npos) << slow.err;
  EXPECT_TRUE(run_dirs().empty()) << slow.err;
  // A checkpoint at step 5, a snapshot at 6, killed after 8: the heartbeat beat at the checkpoint
  // and, steps being fast, not since (it then says step 5, "training"). The snapshot is newer all
  // the same, and kept.
  const std::string ck5 = dir.file("ck5");
  const RunResult fast = job("HPCTRAIN_TEST_KILL_AFTER_STEP", ck5, hpctrain_binary(), "3",
                             {"--checkpoint-every-steps", "5"});
  EXPECT_EQ(fast.exit_code, 1) << fast.err;
  EXPECT_NE(fast.err.find(": kept the snapshot of step 6 ("), std::string::npos)
      << fast.err << read_text(ck5 + "/heartbeat");
  EXPECT_TRUE(fs::exists(ck5 + "/ckpt-000000006.hpck"));
  EXPECT_TRUE(run_dirs().empty()) << fast.err;
  // Where the snapshot cannot be written (here an hpctrain whose persist-snapshot fails), the
  // snapshots are kept, the only copy of those steps, for the same command to resume them.
  const std::string wrapper = dir.file("bin/hpctrain"), ck3 = dir.file("ck3");
  fs::create_directories(dir.file("bin"));
  std::ofstream(wrapper) << "#!/bin/sh\n[ \"$1\" = persist-snapshot ] && { echo 'hpctrain: error: planted' >&2; exit 2; }\n"
                         << "exec " << hpctrain_binary() << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  const RunResult unsaved = job("HPCTRAIN_TEST_KILL_AFTER_STEP", ck3, wrapper);
  EXPECT_EQ(unsaved.exit_code, 1) << unsaved.err;
  EXPECT_NE(unsaved.err.find("hpctrain: error: planted"), std::string::npos) << unsaved.err;
  EXPECT_NE(unsaved.err.find("warning: the newest snapshot was not written into " + ck3), std::string::npos)
      << unsaved.err;
  EXPECT_NE(unsaved.err.find("keeping the run's snapshots in host memory: they hold steps past the newest "
                             "checkpoint in " + ck3 + " (none)"),
            std::string::npos) << unsaved.err;
  EXPECT_EQ(unsaved.err.find("freeing the run's snapshots"), std::string::npos) << unsaved.err;
  EXPECT_EQ(run_dirs().size(), 1u);
  const nlohmann::json unsaved_summary = summary(ck3 + "/hpcrun/summary.json");
  EXPECT_FALSE(unsaved_summary.contains("persisted_step")) << unsaved_summary.dump();
  EXPECT_EQ(unsaved_summary.value("snapshots", ""), "kept") << unsaved_summary.dump();
  const RunResult resumed = job("HPCTRAIN_TEST_UNUSED", ck3, wrapper);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.err.find(", steps 1-"), std::string::npos) << "not resumed from the snapshots: " << resumed.err;
  EXPECT_TRUE(run_dirs().empty()) << "the finished run's snapshots are still there";
  // The same where the heartbeat, killed in training, still says the checkpoint's step 5 (steps
  // being fast) and the snapshot of step 6 is newer: kept too.
  const std::string ck6 = dir.file("ck6");
  const RunResult lagging = job("HPCTRAIN_TEST_KILL_AFTER_STEP", ck6, wrapper, "3", {"--checkpoint-every-steps", "5"});
  EXPECT_EQ(lagging.exit_code, 1) << lagging.err;
  EXPECT_NE(lagging.err.find("keeping the run's snapshots in host memory: they "), std::string::npos) << lagging.err;
  EXPECT_EQ(run_dirs().size(), 1u) << lagging.err << read_text(ck6 + "/heartbeat");
  const RunResult lagging_resumed = job("HPCTRAIN_TEST_UNUSED", ck6, wrapper);
  EXPECT_EQ(lagging_resumed.exit_code, 0) << lagging_resumed.err;
  EXPECT_TRUE(run_dirs().empty()) << "the finished run's snapshots are still there";
}

// A run that failed right after the checkpoint of its step, that checkpoint damaged (a resume
// passes it by for an older one): by the names the snapshots hold nothing newer, but the newest
// of them is the only copy of the steps since that older checkpoint, and goes into the directory
// (in place of the damaged file where it is of the same step) before the snapshots are freed.
// The trainer is hpctrain, killed after step 8 with checkpoints and snapshots every 4 steps,
// behind a script that then truncates ckpt-8 and leaves the heartbeat a run that failed there
// leaves (state=stopped, exit_code=1).
TEST(HpcrunCli, ADamagedNewestCheckpointLeavesTheSnapshotsStepsOnSharedStorage) {
  TempDir dir("hpcrun_damaged");
  const std::string ck = dir.file("ck"), snaps = dir.file("snaps"), wrapper = dir.file("bin/hpctrain");
  const std::string newest = ck + "/ckpt-000000008.hpck";
  fs::create_directories(dir.file("bin"));
  std::ofstream(wrapper) << "#!/bin/sh\ncase \"$1\" in persist-snapshot|clean-snapshots) exec " << hpctrain_binary()
                         << " \"$@\";; esac\n"
                         << hpctrain_binary() << " \"$@\"\n"
                         << "truncate -s -64 " << newest << " || exit 3\n"
                         << "printf 'step=8\\nepoch=0\\nunix_time=%s\\npid=%s\\nstate=stopped\\nexit_code=1\\n' "
                         << "$(date +%s) $$ > " << ck << "/heartbeat\nexit 1\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  std::vector<std::string> args{"-np", "1", "--max-restarts", "0", wrapper, "--checkpoint-dir", ck, "--snapshot-dir",
                                snaps, "--snapshot-every-steps", "4", "--checkpoint-every-steps", "4",
                                "--train-samples", "1280", "--epochs", "1", "--test-samples", "100", "--threads", "1",
                                "--device", "cpu", "--data-dir", fashion_mnist_dir()};
  setenv("HPCTRAIN_TEST_KILL_AFTER_STEP", "8", 1);
  const RunResult failed = hpcrun(args, 120);
  unsetenv("HPCTRAIN_TEST_KILL_AFTER_STEP");
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_NE(failed.err.find("past the newest checkpoint in " + ck + " (step 4; the heartbeat's step 8)"),
            std::string::npos)
      << failed.err;
  EXPECT_NE(failed.err.find(": kept the snapshot of step 8 ("), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find(", in place of a damaged file of that step"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("freeing the run's snapshots"), std::string::npos) << failed.err;
  // Elsewhere (no snapshot): the run resumes at step 8, not at step 4.
  args[4] = hpctrain_binary();
  args[8] = dir.file("other-snaps");
  const RunResult again = hpcrun(args, 120);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  const nlohmann::json last = summary(ck + "/hpcrun/summary.json").at("attempts").back();
  EXPECT_EQ(last.at("resumed_from"), "checkpoint") << last.dump();
  EXPECT_EQ(last.at("resumed_from_step"), 8) << last.dump();
}

// A checkpoint directory that cannot be read as the job ends (shared storage failing with it)
// costs neither the exit code a batch script acts on nor the summary: the snapshots are kept, with
// a warning. The program, named hpctrain, leaves a heartbeat and a run id, then makes the
// directory unreadable and ends: failing (1 after --max-restarts 0), or stopping itself after a
// checkpoint (75, which a batch script requeues). As root, hpcrun runs without the capabilities
// that let root past permission bits.
TEST(HpcrunCli, ACheckpointDirectoryUnreadableAtTheEndKeepsTheExitCodeAndTheSummary) {
  for (const int program_exit : {3, 75}) {
    TempDir dir("hpcrun_unreadable_end");
    const std::string ck = dir.file("ck"), logs = dir.file("logs"), program = dir.file("bin/hpctrain");
    fs::create_directories(dir.file("bin"));
    std::ofstream(program) << "#!/bin/sh\nmkdir -p " << ck << " && printf 'step=5\\nstate=training\\n' > " << ck
                           << "/heartbeat && echo 0123456789abcdef > " << ck << "/run-id && chmod 000 " << ck
                           << " && exit " << program_exit << "\nexit 9\n";
    fs::permissions(program, fs::perms::owner_all);
    std::vector<std::string> args{hpcrun_binary(), "-np", "1", "--max-restarts", "0", "--log-dir", logs, program,
                                  "--checkpoint-dir", ck};
    if (geteuid() == 0)
      args.insert(args.begin(), {"/usr/bin/setpriv", "--inh-caps=-dac_override,-dac_read_search",
                                 "--bounding-set=-dac_override,-dac_read_search"});
    const RunResult r = run_program(args, 60);
    fs::permissions(ck, fs::perms::owner_all);
    const int expected = program_exit == 75 ? 75 : 1;
    EXPECT_EQ(r.exit_code, expected) << r.err;
    EXPECT_EQ(error_lines(r.err), 0) << r.err;
    EXPECT_NE(r.err.find("warning: keeping the run's snapshots in host memory: cannot tell what they hold ("),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("hpcrun: summary: 1 attempt(s)"), std::string::npos) << r.err;
    const nlohmann::json s = summary(logs + "/summary.json");
    EXPECT_EQ(s.at("exit_code"), expected) << s.dump();
    EXPECT_EQ(s.at("snapshots"), "kept") << s.dump();
  }
}

}  // namespace
}  // namespace hpc::itest
