// hpcrun as a user meets it on one machine: every bad input is exit code 2 and one
// "hpcrun: error: ..." line naming the problem, with no retry loop; a program's own usage error
// is not retried; failures are retried up to --max-restarts, then hpcrun gives up with code 1.
// (Several hosts, lost and cut ones: tests/launch/*.sh, in network namespaces.)
#include <gtest/gtest.h>

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

int error_lines(const std::string& err) {
  int n = 0;
  for (const std::string& l : lines_of(err)) n += l.rfind("hpcrun: error: ", 0) == 0;
  return n;
}

struct BadCase {
  std::vector<std::string> args;
  std::string says;
};

TEST(HpcrunCli, BadInputIsOneClearErrorAndExitCode2) {
  TempDir dir("hpcrun_cli");
  write_text(dir.file("empty_hostfile"), "# no hosts here\n");
  write_text(dir.file("bad_hostfile"), "node1 cores=4\n");
  const std::vector<BadCase> cases = {
      {{"-np", "1"}, "no program to run"},
      {{"-np", "1", "/no/such/program"}, "program /no/such/program: no such file"},
      {{"-np", "1", "no-such-program-anywhere"}, "not found in PATH"},
      {{"-H", "no-such-host.invalid:1", "true"}, "unknown host 'no-such-host.invalid'"},
      {{"-H", "", "true"}, "-H is empty"},
      {{"-H", "a,,b", "true"}, "empty host name"},
      {{"-H", "localhost:0", "true"}, "slots must be"},
      {{"--hostfile", dir.file("empty_hostfile"), "true"}, "names no host"},
      {{"--hostfile", dir.file("bad_hostfile"), "true"}, "line 1"},
      {{"--hostfile", dir.file("missing"), "true"}, "cannot open"},
      {{"-H", "localhost:2", "--min-np", "3", "true"}, "--min-np 3 needs more slots than the hosts have"},
      {{"-H", "localhost:2", "-np", "4", "true"}, "-np 4 needs more slots"},
      {{"-np", "2", "--min-np", "3", "true"}, "-np 2 is below --min-np 3"},
      {{"-np", "2", "--max-np", "1", "true"}, "--max-np 1 is below --min-np 2"},
      {{"-H", "a", "--hostfile", dir.file("bad_hostfile"), "true"}, "not several"},
      {{"true"}, "no hosts"},
      {{"-np", "1", "--bogus", "true"}, "unrecognised option '--bogus'"},
      {{"-np", "1", "--blacklist-cooldown", "60", "true"}, "MIN:MAX"},
      {{"-np", "1", "--stall-timeout", "soon", "true"}, "--stall-timeout must be a duration"},
      {{"-np", "x", "true"}, "np"},
      {{"-np", "1", "--max-restarts", "-1", "true"}, "--max-restarts"},
      {{"-np", "1", "--mpirun", "/no/mpirun", "true"}, "--mpirun /no/mpirun"},
      {{"-H", "a", "--host-discovery-script", "/no/script", "true"}, "not several"},
      {{"--host-discovery-script", "/no/script", "true"}, "--host-discovery-script /no/script"},
      {{"--host-discovery-script", "false", "true"}, "host discovery script false failed"},
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
}

TEST(HpcrunCli, HelpAndVersion) {
  const RunResult help = hpcrun({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* opt : {"--hosts", "--hostfile", "--host-discovery-script", "--np", "--min-np", "--max-np",
                          "--slots-per-host", "--launch-agent", "--stall-timeout", "--blacklist-cooldown",
                          "--elastic-timeout", "--max-restarts", "--log-dir"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  const RunResult version = hpcrun({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("hpcrun ", 0), 0u);
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
  EXPECT_NE(read_text(dir.file("summary.json")).find("\"result\": \"success\""), std::string::npos);
}

TEST(HpcrunCli, ProgramUsageErrorIsNotRetried) {
  TempDir dir("hpcrun_usage");
  const RunResult r = hpcrun({"--log-dir", dir.str(), "-np", "1", hpctrain_binary(), "--model", "nope"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("unknown model 'nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gave up: rank 0 reported a usage error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("attempt 2"), std::string::npos) << r.err;
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
}

}  // namespace
}  // namespace hpc::itest
