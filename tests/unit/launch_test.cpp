// hpcrun's pure parts: host lists in every form, the blacklist's cooldowns, the ranks' status
// lines, mpirun's tagged output and messages, an attempt's phases and deadlines, what an
// attempt's end means, and what hpcrun does after it (relaunch_policy.hpp's table).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "analysis.hpp"
#include "attempt_phase.hpp"
#include "blacklist.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "host_pool.hpp"
#include "hosts.hpp"
#include "job_context.hpp"
#include "mca.hpp"
#include "options.hpp"
#include "rank_report.hpp"
#include "relaunch_policy.hpp"
#include "straggler_policy.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace {

template <class F>
std::string usage_message(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return e.what();
  }
  ADD_FAILURE() << "no usage error";
  return "";
}

TEST(Hosts, ListWithAndWithoutSlots) {
  EXPECT_EQ(parse_host_list("a:2,b,c:4", 1), (HostList{{"a", 2}, {"b", 1}, {"c", 4}}));
  EXPECT_EQ(parse_host_list("a,b", 3), (HostList{{"a", 3}, {"b", 3}}));
  EXPECT_EQ(parse_host_list("a:1,b:1,a:2", 1), (HostList{{"a", 3}, {"b", 1}}));  // repeats add up, as in Open MPI
  EXPECT_EQ(show_hosts({{"a", 2}, {"b", 1}}), "a:2,b:1");
  EXPECT_EQ(total_slots({{"a", 2}, {"b", 5}}), 7);
}

TEST(Hosts, BadListsAreUsageErrors) {
  EXPECT_NE(usage_message([] { parse_host_list("a,,b", 1); }).find("empty host name"), std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a:0", 1); }).find("slots"), std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a:x", 1); }).find("slots"), std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a b", 1); }).find("not a host name"), std::string::npos);
  const std::string long_name = usage_message([] { parse_host_list(std::string(200000, 'x') + "!", 1); });
  EXPECT_NE(long_name.find("xxx... (200001 bytes)' is not a host name"), std::string::npos) << long_name.size();
  EXPECT_LT(long_name.size(), 400u);
  EXPECT_NE(usage_message([] { parse_host_list(",", 1); }).find("empty"), std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a,", 1); }).find("empty host name after the last comma"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a:+3", 1); }).find("slots must be a whole number"), std::string::npos);
  // An IPv6 address read as NAME:SLOTS gave "':' is not a host name".
  EXPECT_NE(usage_message([] { parse_host_list("::1", 1); }).find("'::1' has more than one ':' (an IPv6 address?)"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a,fe80::1:2", 1); }).find("'fe80::1:2' has more than one ':'"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_host_list("a: 3", 1); }).find("slots must be a whole number"), std::string::npos);
  // Repeats add up, but not past what one entry may give.
  EXPECT_EQ(parse_host_list("a:4095,a:1", 1), (HostList{{"a", 4096}}));
  EXPECT_NE(usage_message([] { parse_host_list("a:4096,a:4096", 1); }).find("host a is named again, and its slots "
                                                                          "add up to 8192, more than 4096"),
            std::string::npos);
}

// Slots are counted in an int: a list whose slots add up past kMaxTotalSlots is refused where it
// is read, so no count (total_slots, -np for mpirun) wraps to a negative or small number.
TEST(Hosts, AllSlotsTogetherHaveALimit) {
  EXPECT_EQ(total_slots(slurm_hosts("n[1-256]", "4096(x256)")), kMaxTotalSlots);
  const std::string too_many = usage_message([] { slurm_hosts("n[1-257]", "4096(x257)"); });
  EXPECT_NE(too_many.find("SLURM_JOB_NODELIST: the hosts' slots add up to more than 1048576"), std::string::npos)
      << too_many;
  std::string list;
  for (int i = 0; i <= 256; ++i) list += "h" + std::to_string(i) + ":4096,";
  list.pop_back();
  EXPECT_NE(usage_message([&] { parse_host_list(list, 1); }).find("-H: the hosts' slots add up to more than"),
            std::string::npos);
  // Slurm's compressed forms are refused before they are expanded past the limit: eleven ranges
  // of 100000 names, or 257 entries of 4096 nodes, would otherwise be made whole first.
  std::string nodes;
  for (char c = 'a'; c <= 'k'; ++c) nodes += std::string(1, c) + "[000000-099999],";
  nodes.pop_back();
  const std::string many_nodes = usage_message([&] { expand_slurm_nodelist(nodes); });
  EXPECT_NE(many_nodes.find("names more than 1048576 nodes"), std::string::npos) << many_nodes;
  EXPECT_LT(many_nodes.size(), 500u) << "the list is shown cut, not whole";
  std::string tasks;
  for (int i = 0; i < 257; ++i) tasks += "1(x4096),";
  tasks.pop_back();
  const std::string many_tasks = usage_message([&] { expand_slurm_tasks_per_node(tasks); });
  EXPECT_NE(many_tasks.find("counts more than 1048576 nodes"), std::string::npos) << many_tasks.substr(0, 300);
  EXPECT_EQ(expand_slurm_tasks_per_node("1(x4096)").size(), 4096u);
}

// A Slurm list of 100000 nodes (what expand_slurm_nodelist allows in one range) is read whole,
// each name once, in its order.
TEST(Hosts, LongListsKeepEveryHostOnce) {
  std::string tasks;
  for (int i = 0; i < 24; ++i) tasks += "1(x4096),";
  tasks += "1(x1696)";
  const HostList hosts = slurm_hosts("n[000001-100000]", tasks);
  ASSERT_EQ(hosts.size(), 100000u);
  EXPECT_EQ(hosts.front().name, "n000001");
  EXPECT_EQ(hosts.back().name, "n100000");
  EXPECT_EQ(total_slots(hosts), 100000);
  EXPECT_EQ(parse_host_list("b:1,a:2,b:3", 1), (HostList{{"b", 4}, {"a", 2}}));  // the first place is kept
}

TEST(Hosts, Hostfile) {
  const std::string path = ::testing::TempDir() + "/hpcrun_hostfile";
  {
    std::ofstream f(path);
    f << "# the cluster\nnode1 slots=4\n\nnode2   # one slot\nnode3 slots=2 max_slots=2\n";
  }
  EXPECT_EQ(parse_hostfile(path, 1), (HostList{{"node1", 4}, {"node2", 1}, {"node3", 2}}));
  {
    std::ofstream f(path);
    f << "node1 cpus=4\n";
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("line 1"), std::string::npos);
  {
    std::ofstream f(path);
    f << "node1 slots=1\nnode2 slots=2 slots=3\n";  // was: the last one, without a word
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("line 2: slots is given twice"), std::string::npos);
  {
    std::ofstream f(path);
    f << "node1 max_slots=1 slots=4\n";  // was: 4 ranks there
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("line 1: slots=4 is more than max_slots=1"),
            std::string::npos);
  {
    std::ofstream f(path);
    f << "# nothing\n";
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("names no host"), std::string::npos);
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string("node1 slots=1\0\n", 15);  // a NUL is named, not printed
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("got '1\\x00'"), std::string::npos);
  {
    std::ofstream f(path, std::ios::binary);
    f << "node1 slots=1\n" << std::string(100 * 1024, '\0');  // as /dev/zero, whose first line never ends
  }
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("line 2 is longer than 64 KiB: not a hostfile"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(usage_message([&] { parse_hostfile(path, 1); }).find("cannot open"), std::string::npos);
  // A directory reads as an empty stream: not "names no host".
  EXPECT_NE(usage_message([&] { parse_hostfile(::testing::TempDir(), 1); }).find("is a directory"), std::string::npos);
  // A path that cannot be looked at is a usage error naming why, not std::filesystem's exception
  // (hpcrun's exit 1, a bug): a link loop, and a name longer than the system takes.
  const std::string loop = ::testing::TempDir() + "/hpcrun_hostfile_loop";
  std::remove(loop.c_str());
  ASSERT_EQ(symlink("hpcrun_hostfile_loop", loop.c_str()), 0);
  EXPECT_NE(usage_message([&] { parse_hostfile(loop, 1); }).find("cannot open it (Too many levels of symbolic links)"),
            std::string::npos);
  std::remove(loop.c_str());
  EXPECT_NE(usage_message([&] { parse_hostfile("/tmp/" + std::string(300, 'a') + "/hosts", 1); })
                .find("cannot open it (File name too long)"),
            std::string::npos);
}

TEST(Hosts, DiscoveryOutput) {
  EXPECT_EQ(parse_discovery_output("h1:2\n\nh2\n# gone: h3\n", 1, "d"), (HostList{{"h1", 2}, {"h2", 1}}));
  EXPECT_TRUE(parse_discovery_output("", 1, "d").empty());
  EXPECT_NE(usage_message([] { parse_discovery_output("h1:two\n", 1, "script"); }).find("script line 1"), std::string::npos);
}

// A host printed twice is refused (horovodrun would count it once, Open MPI twice), not run with
// the slots added up: one line naming both lines, whether the slots agree or not.
TEST(Hosts, DiscoveryOutputRefusesARepeatedHost) {
  EXPECT_EQ(usage_message([] { parse_discovery_output("h1:2\nh2\nh1:2\n", 1, "script"); }),
            "script line 3: host h1 is named again (first on line 1); print each host once, with all its slots (h1:N)");
  EXPECT_NE(usage_message([] { parse_discovery_output("h1\nh1:4\n", 1, "script"); }).find("line 2: host h1"),
            std::string::npos);
}

// `ompi_info --all --parsable` as Open MPI 4.1 prints it (an excerpt).
const char* kOmpiInfo =
    "package:Debian OpenMPI\n"
    "mca:btl:base:param:btl:value:^uct,openib,ofi\n"
    "mca:btl:tcp:version:\"mca:2.1.0\"\n"
    "mca:btl:tcp:param:btl_tcp_if_include:value:\n"
    "mca:btl:tcp:param:btl_tcp_if_include:help:Comma-delimited list of devices: eth0\n"
    "mca:btl:self:version:\"component:4.1.4\"\n"
    "mca:btl:vader:version:\"component:4.1.4\"\n"
    "mca:plm:rsh:param:plm_rsh_agent:value:\"ssh : rsh\"\n"
    "mca:plm:rsh:param:plm_rsh_agent:synonym:name:orte_rsh_agent\n"
    "mca:mpi:base:param:mpi_param_check:value:true\n";

TEST(Mca, SettingsAreReadFromMpirunsWords) {
  EXPECT_EQ(mca_settings({"--mca", "a", "1", "--bind-to", "core", "-mca", "b", "2", "--gmca", "c", "3", "-gmca", "d",
                          "4", "--mca", "e"}),
            (std::vector<std::pair<std::string, std::string>>{{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}}));
}

TEST(Mca, KnownParametersAndComponentsPass) {
  const McaCatalogue known = parse_ompi_info(kOmpiInfo);
  EXPECT_EQ(known.components.at("btl"), (std::set<std::string>{"self", "tcp", "vader"}));
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"btl_tcp_if_include", "lo"}, {"orte_rsh_agent", "ssh"}, {"plm_rsh_agent", "ssh"},
           {"mpi_param_check", "0"}, {"btl", "self,tcp"}, {"btl", "^vader"}, {"btl", ""}})
    EXPECT_EQ(mca_problem(known, name, value), "") << name << " " << value;
}

// mpirun ignores a parameter it does not know, and a component it has not fails every rank.
TEST(Mca, MisspeltNamesAreNamedWithTheNearest) {
  const McaCatalogue known = parse_ompi_info(kOmpiInfo);
  EXPECT_EQ(mca_problem(known, "btl_tcp_if_inclde", "lo"),
            "this Open MPI has no MCA parameter btl_tcp_if_inclde (did you mean btl_tcp_if_include?); mpirun would "
            "ignore it (ompi_info --all lists the parameters)");
  EXPECT_EQ(mca_problem(known, "no_such_thing", "1"),
            "this Open MPI has no MCA parameter no_such_thing; mpirun would ignore it (ompi_info --all lists the "
            "parameters)");
  EXPECT_EQ(mca_problem(known, "btl", "tpc,self"),
            "--mca btl tpc,self: this Open MPI has no btl component tpc (did you mean tcp?); it has self, tcp, vader");
  EXPECT_NE(mca_problem(known, "btl", "^self,vadre").find("no btl component vadre (did you mean vader?)"),
            std::string::npos);
  EXPECT_TRUE(parse_ompi_info("").parameters.empty());  // hpcrun then warns and checks nothing
}

TEST(Hosts, SlurmForms) {
  EXPECT_EQ(expand_slurm_nodelist("gpu[01-03,07],login1"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu07", "login1"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-10]-ib"), (std::vector<std::string>{"n8-ib", "n9-ib", "n10-ib"}));
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(slurm_hosts("a[1-2],b", "4(x2),1"), (HostList{{"a1", 4}, {"a2", 4}, {"b", 1}}));
  usage_message([] { expand_slurm_nodelist("a[1-"); });
  usage_message([] { expand_slurm_nodelist("a[3-1]"); });
  // Brackets that name nothing, or a list cut after a comma: not dropped in silence.
  for (const char* bad : {"n[],login1", "n[1,]", "a,", "n[1-2],"})
    EXPECT_NE(usage_message([&] { expand_slurm_nodelist(bad); }).find("is not a Slurm host list"), std::string::npos)
        << bad;
  usage_message([] { expand_slurm_tasks_per_node("2(x"); });
  EXPECT_NE(usage_message([] { slurm_hosts("a[1-3]", "1"); }).find("inconsistent"), std::string::npos);
  // A repeat counts nodes, not slots: more than a host's 4096 slots is a large allocation.
  EXPECT_EQ(slurm_hosts("n[1-5000]", "1(x5000)").size(), 5000u);
  for (const char* bad : {"1(x0)", "1(x+3)", "1(x)", "1(x1048577)"})
    EXPECT_NE(usage_message([&] { expand_slurm_tasks_per_node(bad); }).find("a repeat count (xN) must be"),
              std::string::npos)
        << bad;
  EXPECT_NE(usage_message([] { expand_slurm_tasks_per_node("1(x2),"); }).find("ends with a comma"), std::string::npos);
}

// The allocation as mpirun should see it after a lost node: only the healthy hosts, in forms
// that read back as the same hosts.
TEST(Hosts, SlurmAllocationForMpirun) {
  const HostList healthy{{"a1", 4}, {"b", 1}};
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : slurm_allocation_env(healthy)) env[k] = v;
  EXPECT_EQ(env["SLURM_JOB_NODELIST"], "a1,b");
  EXPECT_EQ(env["SLURM_NODELIST"], "a1,b");
  EXPECT_EQ(env["SLURM_JOB_NUM_NODES"], "2");
  EXPECT_EQ(env["SLURM_NNODES"], "2");
  EXPECT_EQ(env["SLURM_JOB_CPUS_PER_NODE"], "4,1");
  EXPECT_EQ(slurm_hosts(env["SLURM_JOB_NODELIST"], env["SLURM_TASKS_PER_NODE"]), healthy);
}

// scontrol show job -o's record: PreemptTime is set once Slurm chose the job for preemption.
TEST(Hosts, SlurmPreemptTime) {
  EXPECT_EQ(slurm_preempt_time("JobId=7 JobName=t JobState=RUNNING PreemptEligibleTime=2026-11-23T14:30:08 "
                               "PreemptTime=2026-11-23T14:30:12 SuspendTime=None"),
            "2026-11-23T14:30:12");
  EXPECT_EQ(slurm_preempt_time("JobId=7 JobState=RUNNING PreemptEligibleTime=2026-11-23T14:30:08 PreemptTime=None"), "");
  EXPECT_EQ(slurm_preempt_time("JobId=7 JobState=RUNNING"), "");
  EXPECT_EQ(slurm_preempt_time(""), "");
}

TEST(Hosts, Local) {
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_FALSE(is_local_host("10.1.2.3"));
  // An address of this machine's own (not a loopback one) is this machine too, as mpirun takes it.
  ifaddrs* all = nullptr;
  ASSERT_EQ(::getifaddrs(&all), 0);
  int own = 0;
  for (const ifaddrs* a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) == 0) continue;
    EXPECT_TRUE(is_local_host(text)) << text;
    ++own;
  }
  ::freeifaddrs(all);
  if (own == 0) std::printf("(no address but loopback here: the own-address case is not checked)\n");
  std::string why;
  EXPECT_TRUE(resolves("localhost", &why));
  EXPECT_FALSE(resolves("no-such-host.invalid", &why));
  EXPECT_FALSE(why.empty());
}

TEST(Blacklist, CooldownDoublesUpToTheMaximum) {
  Blacklist b(10, 35);
  EXPECT_FALSE(b.blocked("h", 0));
  EXPECT_EQ(b.fail("h", 100), 10);
  EXPECT_TRUE(b.blocked("h", 109));
  EXPECT_FALSE(b.blocked("h", 110));
  EXPECT_DOUBLE_EQ(b.remaining("h", 105), 5);
  EXPECT_EQ(b.fail("h", 200), 20);
  EXPECT_EQ(b.fail("h", 300), 35);
  EXPECT_EQ(b.fail("h", 400), 35);
  EXPECT_EQ(b.failures("h"), 4);
  EXPECT_FALSE(b.blocked("other", 400));
  EXPECT_DOUBLE_EQ(b.next_release(400), 435);
  EXPECT_DOUBLE_EQ(b.next_release(500), 500);
}

// A host that failed a few times long ago and has served the job since gets MIN again at its next
// failure, not the doubled cooldown its old failures earned (hpcrun kept every count for the whole job).
TEST(Blacklist, ACountStartsOverOnceTheHostServedTheMaximum) {
  Blacklist b(10, 40);
  EXPECT_EQ(b.fail("h", 0), 10);
  EXPECT_EQ(b.fail("h", 100), 20);
  b.served("h", 200, 230);  // 30 s in the job: less than MAX
  EXPECT_EQ(b.fail("h", 240), 40);
  b.served("h", 300, 320);  // 20 s, then 20 s more in a later attempt: MAX since its last failure
  EXPECT_EQ(b.failures("h"), 3);
  b.served("h", 400, 420);
  EXPECT_EQ(b.failures("h"), 0);
  EXPECT_EQ(b.fail("h", 500), 10);
  EXPECT_EQ(b.fail("h", 520), 20);
  // Only the time after its last failure counts (a straggler drained at 520 ran on until the stop).
  b.served("h", 480, 550);
  EXPECT_EQ(b.fail("h", 600), 40);
  // A host that never failed has nothing to forgive, and serving does not blacklist it.
  b.served("x", 0, 1000);
  EXPECT_EQ(b.failures("x"), 0);
  EXPECT_FALSE(b.blocked("x", 500));
}

// Ranks fill the hosts in the order given. Where the hosts have more slots than the job takes
// (--max-np), a relaunch keeps the hosts of the attempt before, which hold its snapshots in
// memory (after a stop to grow or drain, the only copy of its last steps): a host that joined
// ahead of them in the discovery output, or a script that lists its hosts in another order each
// time, moved the job wholly onto other hosts, and it resumed an older checkpoint.
TEST(Placement, ARelaunchKeepsTheHostsOfTheAttemptBefore) {
  const HostList one_each = {{"a", 1}, {"b", 1}, {"c", 1}};
  EXPECT_EQ(place(one_each, 2), (HostList{{"a", 1}, {"b", 1}}));
  EXPECT_EQ(place({{"a", 4}, {"b", 2}}, 5), (HostList{{"a", 4}, {"b", 1}}));
  // Job on a:2 (--max-np 4); c:4 joins ahead of it: the growth takes a's 2 slots and 2 of c's.
  EXPECT_EQ(place({{"c", 4}, {"a", 2}}, 4, {{"a", 2}}), (HostList{{"c", 2}, {"a", 2}}));
  // The script's order changed ([d, c, a] after [a, b, c, d]); b was lost: a stays in the job.
  EXPECT_EQ(place({{"d", 2}, {"c", 2}, {"a", 2}}, 4, {{"a", 2}, {"b", 2}}), (HostList{{"d", 2}, {"a", 2}}));
  // Enough slots for every host: all of them, in order; a kept host that left is no matter.
  EXPECT_EQ(place(one_each, 3, {{"c", 1}, {"gone", 1}}), one_each);
  EXPECT_EQ(place(one_each, 1, {{"c", 1}}), (HostList{{"c", 1}}));
}

// The discovery script through HostPool, as hpcrun runs it: its first answer must be good (else a
// usage error); later garbage, a host twice, 0 slots or a failure keep the previous answer; and
// the interval counts from the end of a run, so a script slower than --discovery-interval is not
// run again at once, back to back (hpcrun's loop did nothing else: no output read, no signal).
TEST(HostPool, DiscoveryKeepsItsLastGoodAnswerAndItsInterval) {
  char dir_template[] = "/tmp/hostpool-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir = dir_template;
  const std::string script = (dir / "discover").string(), answer = (dir / "answer").string(),
                    runs = (dir / "runs").string();
  {
    std::ofstream out(script);
    out << "#!/bin/sh\necho run >> " << runs << "\nsleep \"$(cat " << dir.string() << "/delay 2>/dev/null || echo 0)\"\n"
        << "cat " << answer << "\nexit \"$(cat " << dir.string() << "/code 2>/dev/null || echo 0)\"\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const auto set = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  const auto count_runs = [&] {
    std::ifstream in(runs);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  LaunchOptions o;
  o.host_source = HostSource::Discovery;
  o.discovery_script = script;
  o.discovery_interval = 0.4;
  o.probe_timeout = 5;
  o.min_np = 1;
  Clock clock;
  Voice voice;
  SignalInbox signals;
  HostPool pool(o, clock, voice, signals);

  set("answer", "a:2\na:1\n");
  EXPECT_NE(usage_message([&] { pool.discover(true); }).find("host a is named again (first on line 1)"), std::string::npos);
  set("answer", "a:2\nb\n");
  ASSERT_TRUE(pool.discover(true));
  const HostList good = {{"a", 2}, {"b", 1}};
  EXPECT_EQ(pool.known_hosts(), good);
  for (const char* bad : {"a:2\nb:0\n", "a:2\nb:1\na:4\n", "garbage here\n", "a:-1\n"}) {
    set("answer", bad);
    EXPECT_FALSE(pool.discover(false)) << bad;
    EXPECT_EQ(pool.known_hosts(), good) << bad;
  }
  set("answer", "b:3\n");
  set("code", "1");
  EXPECT_FALSE(pool.discover(false));
  EXPECT_EQ(pool.known_hosts(), good);
  set("code", "0");
  ASSERT_TRUE(pool.discover(false));  // hosts in another order, one gone: taken as they are
  EXPECT_EQ(pool.known_hosts(), (HostList{{"b", 3}}));

  // A script that takes longer than the interval: the next run waits the interval after its end.
  set("delay", "0.6");
  ASSERT_TRUE(pool.discover(false));
  const int after = count_runs();
  pool.known_hosts();
  EXPECT_EQ(count_runs(), after) << "run again at once after a run slower than --discovery-interval";
  ::usleep(500000);
  pool.known_hosts();
  EXPECT_EQ(count_runs(), after + 1);
  std::filesystem::remove_all(dir);
}

TEST(Blacklist, CooldownOption) {
  double lo = 0, hi = 0;
  parse_cooldown("1m:10m", &lo, &hi);
  EXPECT_EQ(lo, 60);
  EXPECT_EQ(hi, 600);
  usage_message([&] { parse_cooldown("60", &lo, &hi); });
  usage_message([&] { parse_cooldown("60:30", &lo, &hi); });
  usage_message([&] { parse_cooldown("0:30", &lo, &hi); });
  usage_message([&] { parse_cooldown("a:b", &lo, &hi); });
}

TEST(RankReport, RoundTrip) {
  RankReport r;
  r.rank = 3;
  r.status.exited = true;
  r.status.code = 124;
  RankReport back;
  ASSERT_TRUE(parse_report(format_report(r), &back));
  EXPECT_EQ(back.rank, 3);
  EXPECT_TRUE(back.status.exited);
  EXPECT_EQ(back.status.code, 124);
  EXPECT_FALSE(back.terminated);
  r.status = {false, 0, 9};
  r.terminated = true;
  ASSERT_TRUE(parse_report(format_report(r), &back));
  EXPECT_FALSE(back.status.exited);
  EXPECT_EQ(back.status.signal, 9);
  EXPECT_TRUE(back.terminated);
  EXPECT_FALSE(parse_report("hpctrain: epoch 1", &back));
  EXPECT_FALSE(parse_report("hpcrun-rank-status: rank=x exit=1", &back));
  EXPECT_FALSE(parse_report("hpcrun-rank-status: rank=1", &back));
  int rank = -1;
  EXPECT_TRUE(parse_alive("hpcrun-rank-alive: rank=7", &rank));
  EXPECT_EQ(rank, 7);
  EXPECT_FALSE(parse_alive("hpcrun-rank-alive: nobody", &rank));
  EXPECT_TRUE(parse_signalled("hpcrun-rank-signalled: rank=3", &rank));
  EXPECT_EQ(rank, 3);
  EXPECT_FALSE(parse_signalled("hpcrun-rank-alive: rank=3", &rank));
}

TEST(RankReport, TaggedLines) {
  TaggedLine t = parse_tagged("[1,12]<stderr>:hello: world", false);
  EXPECT_EQ(t.rank, 12);
  EXPECT_TRUE(t.is_stderr);
  EXPECT_EQ(t.text, "hello: world");
  t = parse_tagged("[1,0]<stdout>:", true);
  EXPECT_EQ(t.rank, 0);
  EXPECT_FALSE(t.is_stderr);
  EXPECT_EQ(t.text, "");
  t = parse_tagged("[vm:1234] mpirun: something", true);
  EXPECT_EQ(t.rank, -1);
  EXPECT_EQ(t.text, "[vm:1234] mpirun: something");
}

// A piece of a rank's output without a line end, then the wrapper's status: one line from mpirun,
// two for hpcrun (a successful job was relaunched for a rank "that never reported finishing").
TEST(RankReport, APieceWithoutALineEndIsCutFromTheNext) {
  EXPECT_EQ(split_rank_line("[1,1]<stderr>:done 100%\r[1,1]<stderr>:hpcrun-rank-status: rank=1 exit=0"),
            (std::vector<std::string>{"[1,1]<stderr>:done 100%\r", "[1,1]<stderr>:hpcrun-rank-status: rank=1 exit=0"}));
  EXPECT_EQ(split_rank_line("[1,0]<stdout>:a[1,0]<stdout>:b[1,0]<stdout>:"),
            (std::vector<std::string>{"[1,0]<stdout>:a", "[1,0]<stdout>:b", "[1,0]<stdout>:"}));
  // Read by mpirun in one piece with the text before it: one tag.
  EXPECT_EQ(split_rank_line("[1,1]<stderr>:step 10/10\rhpcrun-rank-status: rank=1 exit=0"),
            (std::vector<std::string>{"[1,1]<stderr>:step 10/10\r", "[1,1]<stderr>:hpcrun-rank-status: rank=1 exit=0"}));
  EXPECT_EQ(split_rank_line("[1,1]<stdout>:step 10/10\rhpcrun-rank-status: rank=1 exit=0"),
            (std::vector<std::string>{"[1,1]<stdout>:step 10/10\rhpcrun-rank-status: rank=1 exit=0"}));
  // Another rank's piece after one without a line end: the rest of the line is that rank's (CI saw
  // rank 0's status taken for rank 1's output, and a finished job relaunched).
  EXPECT_EQ(split_rank_line("[1,1]<stderr>:step 10/10\r[1,0]<stderr>:step 10/10\r[1,0]<stderr>:hpcrun-rank-status: "
                            "rank=0 exit=0"),
            (std::vector<std::string>{"[1,1]<stderr>:step 10/10\r", "[1,0]<stderr>:step 10/10\r",
                                      "[1,0]<stderr>:hpcrun-rank-status: rank=0 exit=0"}));
  EXPECT_EQ(split_rank_line("[1,1]<stdout>:50%\r[1,0]<stderr>:x\rhpcrun-rank-status: rank=0 exit=0"),
            (std::vector<std::string>{"[1,1]<stdout>:50%\r", "[1,0]<stderr>:x\r",
                                      "[1,0]<stderr>:hpcrun-rank-status: rank=0 exit=0"}));
  EXPECT_EQ(split_rank_line("[1,0]<stderr>:x [1,12]<stderr>:y"),
            (std::vector<std::string>{"[1,0]<stderr>:x ", "[1,12]<stderr>:y"}));
  // Only a whole tag of this job cuts.
  EXPECT_EQ(split_rank_line("[1,0]<stderr>:[1,] [1,2]<err>: [2,1]<stderr>: [1,x]<stderr>:"),
            (std::vector<std::string>{"[1,0]<stderr>:[1,] [1,2]<err>: [2,1]<stderr>: [1,x]<stderr>:"}));
  EXPECT_EQ(split_rank_line("mpirun: [1,0]<stderr>:x"), (std::vector<std::string>{"mpirun: [1,0]<stderr>:x"}));
  EXPECT_EQ(split_rank_line("[1,0]<stderr>:"), (std::vector<std::string>{"[1,0]<stderr>:"}));
}

// Open MPI 4's words when a host's daemon did not start, which name no host; and the line that
// says why in a probe's output (the agent's words come before mpirun's message).
TEST(Analysis, ADaemonThatDidNotStartIsSeenAndItsReasonRead) {
  EXPECT_TRUE(says_daemons_not_started("ORTE was unable to reliably start one or more daemons."));
  EXPECT_FALSE(says_daemons_not_started("ORTE does not know how to route a message to the specified daemon"));
  EXPECT_EQ(host_blamed_by_mpirun("  target node:  node1"), "");  // the healthy host that message names
  EXPECT_EQ(first_said("bash: orted: command not found\n------\nORTE was unable to reliably start one or more "
                       "daemons.\n"),
            "bash: orted: command not found");
  EXPECT_EQ(first_said("\n-----------\n  ORTE was unable to reliably start one or more daemons.\nThis usually\n"),
            "ORTE was unable to reliably start one or more daemons.");
  EXPECT_EQ(first_said(""), "(it said nothing)");
  EXPECT_EQ(first_said(std::string(400, 'x')).size(), 300u);
}

TEST(Analysis, MpirunMessagesNameHosts) {
  EXPECT_EQ(host_blamed_by_mpirun("  Remote daemon: [[19890,0],2] on node 10.77.0.12"), "10.77.0.12");
  EXPECT_EQ(host_blamed_by_mpirun("  Peer host:  node7"), "node7");
  EXPECT_EQ(host_blamed_by_mpirun("mpirun noticed that process rank 1 with PID 0 on node gpu3 exited on signal 9 (Killed)."),
            "gpu3");
  // ssh, mpirun's launch agent, failing to start a daemon (OpenSSH 9's words)
  EXPECT_EQ(host_blamed_by_mpirun("ssh: connect to host 10.7.0.3 port 22: Connection refused"), "10.7.0.3");
  EXPECT_EQ(host_blamed_by_mpirun("ssh: connect to host node4 port 2222: Connection timed out"), "node4");
  EXPECT_EQ(host_blamed_by_mpirun("ssh: Could not resolve hostname nohost: Name or service not known"), "nohost");
  EXPECT_EQ(host_blamed_by_mpirun("Host key for node5 has changed and you have requested strict checking."), "node5");
  EXPECT_EQ(host_blamed_by_mpirun("No ED25519 host key is known for node6 and you have requested strict checking."), "node6");
  EXPECT_EQ(host_blamed_by_mpirun("Connection to node7 port 22 timed out"), "node7");
  EXPECT_EQ(host_blamed_by_mpirun("Connection to 10.7.0.8 closed by remote host."), "10.7.0.8");
  EXPECT_EQ(host_blamed_by_mpirun("Host key verification failed."), "");
  EXPECT_EQ(host_blamed_by_mpirun("hpctrain: cannot connect to host x"), "");
  EXPECT_EQ(host_blamed_by_mpirun("  Local host: vm"), "");
  EXPECT_EQ(host_blamed_by_mpirun("hpctrain: epoch 1"), "");
}

RankReport report(int rank, int code, bool terminated = false, bool stop = false) {
  RankReport r;
  r.rank = rank;
  r.status.exited = code >= 0;
  r.status.code = code >= 0 ? code : 0;
  r.status.signal = code >= 0 ? 0 : -code;
  r.terminated = terminated;
  r.stop_requested = stop;
  return r;
}

ExitStatus exit_code(int c) { return {true, c, 0}; }

Analysis analyse(const HostList& placement, std::vector<RankReport> reports, std::vector<std::string> named,
                 ExitStatus status, bool stop_requested, bool stalled, std::set<int> alive = {}) {
  AttemptEvidence e;
  e.reports = std::move(reports);
  e.blamed_by_mpirun = std::move(named);
  e.alive = std::move(alive);
  e.mpirun_status = status;
  e.stop_requested = stop_requested;
  e.stalled = stalled;
  return analyse_attempt(placement, e);
}

const HostList kThree = {{"a", 2}, {"b", 2}, {"c", 2}};

TEST(Analysis, RanksMapToHostsBySlot) {
  EXPECT_EQ(rank_hosts({{"a", 2}, {"b", 1}}), (std::vector<std::string>{"a", "a", "b"}));
}

// Open MPI 4.1's words (mpirun --display-map), with the ranks of -H 10.0.0.7:2,localhost:1 as it
// places them: rank 0 on its own host, which it names by its host name.
std::vector<std::string> map_lines(const std::string& here) {
  return {" Data for JOB [1192,1] offset 0 Total slots allocated 3",
          "",
          " ========================   JOB MAP   ========================",
          "",
          " Data for node: " + here + "\tNum slots: 1\tMax slots: 0\tNum procs: 1",
          " \tProcess OMPI jobid: [1192,1] App: 0 Process rank: 0 Bound: UNBOUND",
          "",
          " Data for node: 10.0.0.7\tNum slots: 2\tMax slots: 0\tNum procs: 2",
          " \tProcess OMPI jobid: [1192,1] App: 0 Process rank: 1 Bound: N/A",
          " \tProcess OMPI jobid: [1192,1] App: 0 Process rank: 2 Bound: N/A",
          "",
          " ============================================================="};
}

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

ProcessMap read_map(const std::vector<std::string>& lines) {
  ProcessMap map;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_TRUE(map.take(lines[i])) << lines[i];
    EXPECT_EQ(map.complete(), i + 1 == lines.size()) << lines[i];
  }
  return map;
}

TEST(Analysis, TheProcessMapSaysWhereEachRankIs) {
  ProcessMap map;
  EXPECT_FALSE(map.take("[1,0]<stdout>:Data for node: x"));
  EXPECT_FALSE(map.take("Warning: Permanently added 'b' to the list of known hosts."));
  map = read_map(map_lines("vm"));
  EXPECT_EQ(map.node_of_rank(), (std::map<int, std::string>{{0, "vm"}, {1, "10.0.0.7"}, {2, "10.0.0.7"}}));
  EXPECT_FALSE(map.take("mpirun noticed that process rank 0 with PID 7 on node vm exited on signal 9 (Killed)."));
  // The daemons' copies after it (an rsh launch agent), whole or interleaved, change nothing.
  for (const std::string& line : {std::string(" Data for JOB [1192,1] offset 0 Total slots allocated 3"),
                                  std::string(" Data for node: 10.0.0.7\tNum slots: 2"),
                                  std::string(" \tProcess OMPI jobid: [1192,1] App: 0 Process rank: 0 Bound: N/A"),
                                  std::string(" =====")})
    EXPECT_TRUE(map.take(line));
  EXPECT_EQ(map.node_of_rank().at(0), "vm");

  // --display-devel-map's (Open MPI 4.1): no closing rule; the first line that is not indented
  // ends it and is not its own.
  ProcessMap devel;
  for (const std::string& line :
       {std::string(" Data for JOB [6320,1] offset 0 Total slots allocated 2"), std::string(""),
        std::string(" Mapper requested: NULL  Last mapper: round_robin  Mapping policy: BYCORE:NOOVERSUBSCRIBE"),
        std::string(" \tNum nodes: 2"), std::string(" Data for node: nodea\tState: 3\tFlags: 18"),
        std::string(" \tNum procs: 1\tNext node_rank: 1"), std::string(" \tData for proc: [[6320,1],1]"),
        std::string(" \t\tPid: 0\tLocal rank: 0\tNode rank: 0\tApp rank: 1"),
        std::string(" Data for node: nodeb\tState: 3\tFlags: 18"), std::string(" \tData for proc: [[6320,1],0]")})
    EXPECT_TRUE(devel.take(line)) << line;
  EXPECT_FALSE(devel.complete());
  EXPECT_EQ(devel.node_of_rank(), (std::map<int, std::string>{{0, "nodeb"}, {1, "nodea"}}));
  EXPECT_FALSE(devel.take("--------------------------------------------------------------------------"));
  EXPECT_TRUE(devel.complete());

  // This machine, given as localhost, is where mpirun puts rank 0: not slot order.
  const HostList placement = {{"10.0.0.7", 2}, {"localhost", 1}};
  const RankPlacement p = place_ranks(placement, read_map(map_lines(this_host())).node_of_rank());
  EXPECT_EQ(p.problem, "");
  EXPECT_EQ(p.hosts, (std::vector<std::string>{"localhost", "10.0.0.7", "10.0.0.7"}));
  EXPECT_EQ(p.host_of_node, (std::map<std::string, std::string>{{this_host(), "localhost"}, {"10.0.0.7", "10.0.0.7"}}));

  // --map-by node: the hosts take turns; a node by its short name; a node no name matches, when it
  // is the one host left (this machine by an address of it).
  const std::map<int, std::string> by_node = {{0, "a"}, {1, "b.cluster"}, {2, "a"}, {3, "b.cluster"}, {4, "c-addr"}};
  const RankPlacement q = place_ranks({{"a", 2}, {"b", 2}, {"10.1.2.3", 1}}, by_node);
  EXPECT_EQ(q.problem, "");
  EXPECT_EQ(q.hosts, (std::vector<std::string>{"a", "b", "a", "b", "10.1.2.3"}));

  // Two addresses of one network are not each other's short names ("10").
  EXPECT_EQ(place_ranks({{"10.0.0.7", 1}, {"10.0.0.8", 1}}, {{0, "10.5.5.5"}, {1, "10.6.6.6"}}).problem,
            "mpirun's process map names node 10.5.5.5, which is none of -H's hosts");

  // What cannot be matched leaves the slot order, and says why.
  const RankPlacement none = place_ranks({{"a", 1}, {"b", 1}}, {});
  EXPECT_EQ(none.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(none.problem, "mpirun printed no process map");
  const RankPlacement foreign = place_ranks({{"a", 1}, {"b", 1}}, {{0, "x"}, {1, "y"}});
  EXPECT_EQ(foreign.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(foreign.problem, "mpirun's process map names node x, which is none of -H's hosts");
  EXPECT_EQ(place_ranks({{"a", 1}, {"b", 1}}, {{1, "a"}}).problem, "mpirun's process map does not place rank 0");
}

TEST(Analysis, BlameFollowsTheProcessMap) {
  // -H 10.0.0.7:2,localhost:1: rank 0, on this machine, crashed; mpirun names the node by this
  // machine's name.
  const HostList placement = {{"10.0.0.7", 2}, {"localhost", 1}};
  const RankPlacement p = place_ranks(placement, read_map(map_lines(this_host())).node_of_rank());
  AttemptEvidence e;
  e.reports = {report(0, -9), report(1, -15, true), report(2, -15, true)};
  e.mpirun_status = exit_code(137);
  e.rank_hosts = p.hosts;
  e.host_of_node = p.host_of_node;
  Analysis a = analyse_attempt(placement, e);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"localhost"}));
  EXPECT_NE(a.reason.find("rank 0 on localhost"), std::string::npos) << a.reason;
  // mpirun names the host as lost (its daemon, "Remote daemon: ... on node H").
  e.blamed_by_mpirun = {this_host()};
  a = analyse_attempt(placement, e);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"localhost"}));
  EXPECT_EQ(a.reason, "lost localhost (named by mpirun)");
  // It names the host of the rank that died there ("noticed that process rank 0 ... on node H
  // exited"): the rank's own report says how it ended.
  e.process_ends_by_mpirun = {this_host()};
  a = analyse_attempt(placement, e);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"localhost"}));
  EXPECT_EQ(a.reason, "rank 0 on localhost ended with signal 9 (Killed)");
  // Without a word from that rank, the host may have been lost with it.
  e.reports.erase(e.reports.begin());
  a = analyse_attempt(placement, e);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"localhost"}));
  EXPECT_EQ(a.reason, "lost localhost (named by mpirun)");
  EXPECT_TRUE(names_a_process_end("mpirun noticed that process rank 0 with PID 0 on node vm exited on signal 11"));
  EXPECT_TRUE(names_a_process_end("  Peer host:  vm"));
  EXPECT_FALSE(names_a_process_end("  Remote daemon: [[40563,0],1] on node nodeb"));
}

TEST(Analysis, SuccessAndStops) {
  std::vector<RankReport> all0;
  for (int r = 0; r < 6; ++r) all0.push_back(report(r, 0));
  EXPECT_EQ(analyse(kThree, all0, {}, exit_code(0), false, false).verdict, Verdict::Success);
  // mpirun's 0 without every rank's word is no success (seen when signalled during start-up).
  all0.pop_back();
  const Analysis early = analyse(kThree, all0, {}, exit_code(0), false, false);
  EXPECT_EQ(early.verdict, Verdict::Failure);
  EXPECT_NE(early.reason.find("rank(s) 5 never reported finishing"), std::string::npos) << early.reason;
  EXPECT_EQ(analyse(kThree, {}, {}, exit_code(0), true, false).verdict, Verdict::Stopped);
  std::vector<RankReport> all75;
  for (int r = 0; r < 6; ++r) all75.push_back(report(r, 75, false, true));
  EXPECT_EQ(analyse(kThree, all75, {}, exit_code(75), true, false).verdict, Verdict::Stopped);
  // Stopped by a signal hpcrun did not send (Slurm, a spot watcher): hand "requeue me" upwards.
  EXPECT_EQ(analyse(kThree, all75, {}, exit_code(75), false, false).verdict, Verdict::StoppedOutside);
}

// A second signal kills the job (SIGTERM to mpirun): without every rank's checkpoint that is no
// stop but a failure, which the policy ends with 130; a kill that came after the checkpoints is
// still a stop (75).
TEST(Analysis, ASecondSignalsKillIsNoStop) {
  AttemptEvidence e;
  e.stop_requested = true;
  e.killed_on_request = true;
  e.mpirun_status = exit_code(1);
  e.reports = {report(0, -15, true, true), report(1, 75, false, true)};
  const Analysis a = analyse_attempt(kThree, e);
  EXPECT_EQ(a.verdict, Verdict::Failure);
  EXPECT_NE(a.reason.find("killed on request by a second signal"), std::string::npos) << a.reason;
  EXPECT_TRUE(a.failed_hosts.empty());
  e.reports.clear();
  for (int r = 0; r < 6; ++r) e.reports.push_back(report(r, 75, false, true));
  e.mpirun_status = exit_code(75);
  EXPECT_EQ(analyse_attempt(kThree, e).verdict, Verdict::Stopped);
}

// A rank that crashes while the job stops (to grow, to drain, or for the user) is a failure of
// the job: blamed and counted, as any crash, not "stopped as asked". The stop's own ends are not:
// a checkpoint's 75, the teardown's SIGTERM, a program without a handler dying of SIGUSR1, an exit
// code after the request; nor is a crash on the host the stop drains off.
TEST(Analysis, ACrashInAStopIsAFailure) {
  AttemptEvidence e;
  e.stop_requested = true;
  e.mpirun_status = exit_code(75);
  e.reports = {report(0, 75, false, true), report(1, 75, false, true), report(2, -11, false, true),
               report(3, 75, false, true), report(4, 75, false, true), report(5, 75, false, true)};
  const Analysis a = analyse_attempt(kThree, e);
  EXPECT_EQ(a.verdict, Verdict::Failure) << a.reason;
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"b"}));
  EXPECT_NE(a.reason.find("rank 2 on b ended with signal 11"), std::string::npos) << a.reason;
  EXPECT_TRUE(failed_by_itself(e.reports[2]));
  e.leaving = {"b"};  // b is being drained
  EXPECT_EQ(analyse_attempt(kThree, e).verdict, Verdict::Stopped);
  e.leaving = {"c"};
  EXPECT_EQ(analyse_attempt(kThree, e).verdict, Verdict::Failure);
  e.leaving.clear();
  for (const int end : {-15, -9, -10, 1, 124}) {  // SIGTERM, SIGKILL, SIGUSR1; exit codes
    e.reports[2] = report(2, end, false, true);
    const Analysis s = analyse_attempt(kThree, e);
    EXPECT_EQ(s.verdict, Verdict::Stopped) << end << ": " << s.reason;
    EXPECT_FALSE(failed_by_itself(e.reports[2])) << end;
  }
  e.reports[2] = report(2, -6, true, true);  // the teardown reached it first: a victim
  EXPECT_EQ(analyse_attempt(kThree, e).verdict, Verdict::Stopped);
  for (const int sig : {-6, -7, -8, -4})  // SIGABRT, SIGBUS, SIGFPE, SIGILL
    EXPECT_TRUE(crashed(report(2, sig, false, true))) << sig;
}

TEST(Analysis, UsageErrorsAreNotRetried) {
  const Analysis a = analyse(kThree, {report(0, 2), report(1, 2, true)}, {}, exit_code(2), false, false);
  EXPECT_EQ(a.verdict, Verdict::UsageError);
  EXPECT_NE(a.reason.find("usage error"), std::string::npos);
  EXPECT_EQ(a.program_error, "");
}

// A stray word in --mpi-args: mpirun runs it as the program ("Executable: 0", or "Application
// name: X" where its execve failed) and fails on every host alike. The watcher records it when
// it is not hpcrun's own wrapper; the attempt is then a usage error, not a lost host retried.
TEST(Analysis, AProgramMpirunTookFromItsArgumentsIsAUsageError) {
  EXPECT_EQ(executable_named_by_mpirun("Executable: 0"), "0");
  EXPECT_EQ(executable_named_by_mpirun("  Application name:  /nonexistent/dir/x"), "/nonexistent/dir/x");
  EXPECT_EQ(executable_named_by_mpirun("  Local host:        vm"), "");
  EXPECT_EQ(executable_named_by_mpirun("hpctrain: Executable: x"), "");
  AttemptEvidence e;
  e.mpirun_status = exit_code(134);
  e.blamed_by_mpirun = {"b"};
  EXPECT_EQ(analyse_attempt(kThree, e).verdict, Verdict::Failure);  // without it: a host's failure
  e.foreign_executable = "0";
  const Analysis a = analyse_attempt(kThree, e);
  EXPECT_EQ(a.verdict, Verdict::UsageError);
  EXPECT_NE(a.reason.find("mpirun took '0' for the program to run"), std::string::npos) << a.reason;
  EXPECT_TRUE(a.failed_hosts.empty());
}

// The program's own words for hpcrun's last line: an MPI program prints its error on rank 0 alone,
// while another rank may be the first to exit with 2.
TEST(Analysis, UsageErrorCarriesTheProgramsLine) {
  AttemptEvidence e;
  e.reports = {report(1, 2), report(0, 2), report(2, -15, true)};
  e.mpirun_status = exit_code(2);
  keep_error_line(e.error_lines[2], "hpctrain: error: torn down");  // not a usage error's rank
  keep_error_line(e.error_lines[0], "hpctrain: error: unknown model 'nope'");
  keep_error_line(e.error_lines[0], "see --help");  // a later line without "error" does not displace it
  const Analysis a = analyse_attempt(kThree, e);
  EXPECT_EQ(a.verdict, Verdict::UsageError);
  EXPECT_EQ(a.program_error, "hpctrain: error: unknown model 'nope'");
  std::string kept;
  keep_error_line(kept, "loading");
  keep_error_line(kept, "  Error: bad value  ");
  keep_error_line(kept, "");
  EXPECT_EQ(kept, "Error: bad value");
}

TEST(Analysis, MpirunComplaint) {
  const std::string binding =
      "-----\nThe specified binding policy is not recognized:\n\n  Policy: bogus\n\nPlease check for a typo or ensure "
      "that the option is a supported\none.\n-----\n-----\nIt looks like opal_init failed for some reason;\n-----\n";
  EXPECT_EQ(mpirun_complaint(binding), "The specified binding policy is not recognized: Policy: bogus");
  EXPECT_EQ(mpirun_complaint("mpirun: Error: unknown option \"--bogus\"\nType 'mpirun --help' for usage.\n"),
            "mpirun: Error: unknown option \"--bogus\" Type 'mpirun --help' for usage.");
  EXPECT_EQ(mpirun_complaint(""), "(it said nothing)");
  EXPECT_LE(mpirun_complaint(std::string(1000, 'x')).size(), 400u);
}

TEST(Analysis, LostHostIsTheSilentOne) {
  // Host b's ranks never reported; the others were torn down by mpirun.
  const Analysis a = analyse(kThree, {report(0, 15, true), report(1, -15, true), report(4, -15, true), report(5, 1, true)},
                                     {}, exit_code(205), false, false);
  EXPECT_EQ(a.verdict, Verdict::Failure);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"b"}));
  EXPECT_NE(a.reason.find("b"), std::string::npos);
}

TEST(Analysis, CutOffHostWhileThePeersTimedOut) {
  // Ranks on a and c ended by the step watchdog (124): victims; b could not report at all.
  const Analysis a = analyse(kThree, {report(0, 124), report(1, 124), report(4, 124), report(5, 124)}, {},
                                     {false, 0, 9}, false, false);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"b"}));
}

TEST(Analysis, FirstRankToFailByItselfIsBlamed) {
  // Rank 3 crashed; rank 0 then failed on the vanished peer: only b is blamed.
  const Analysis a = analyse(kThree,
                                     {report(3, -11), report(0, 1), report(1, -15, true), report(2, -15, true),
                                      report(4, -15, true), report(5, -15, true)},
                                     {}, exit_code(1), false, false);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"b"}));
  EXPECT_NE(a.reason.find("rank 3 on b"), std::string::npos);
}

// A rank fails by itself (MPI_Abort, exit code 1); its peers, waiting for it in a collective, take
// mpirun's SIGTERM as a stop for the next step and are killed before they report. Their wrappers
// said the teardown reached them: their host is alive, not silent, and the failing rank's is
// blamed (nodeb was, and the job shrank onto the failing host).
TEST(Analysis, AHostTheTeardownReachedIsNotSilent) {
  const HostList placement = {{"nodeb", 2}, {"nodec", 1}};
  AttemptEvidence e;
  e.reports = {report(2, 1)};
  e.signalled = {0, 1};
  e.mpirun_status = exit_code(1);
  const Analysis a = analyse_attempt(placement, e);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"nodec"}));
  EXPECT_EQ(a.reason, "rank 2 on nodec ended with exit code 1");
  // One signalled rank of a host is enough; a host none of whose ranks said anything is still lost.
  e.signalled = {1};
  EXPECT_EQ(analyse_attempt(placement, e).failed_hosts, (std::set<std::string>{"nodec"}));
  e.reports.clear();
  EXPECT_EQ(analyse_attempt(placement, e).failed_hosts, (std::set<std::string>{"nodec"}));
  EXPECT_EQ(analyse_attempt(placement, e).reason, "lost nodec (no word from its ranks)");
}

TEST(Analysis, HostsNamedByMpirun) {
  const Analysis a = analyse(kThree, {}, {"c"}, exit_code(205), false, false);
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"c"}));
  const Analysis none = analyse(kThree, {}, {"elsewhere"}, exit_code(1), false, true);
  EXPECT_TRUE(none.failed_hosts.empty());  // nothing to blame: the caller probes every host
  EXPECT_NE(none.reason.find("stalled"), std::string::npos);
}

TEST(Analysis, StalledJobBlamesTheHostsThatDidNotAnswer) {
  // Host c's processes are stopped: its ranks neither answered the liveness query nor reported.
  const Analysis a = analyse(kThree, {report(0, -9, true)}, {}, {false, 0, 9}, false, true, {0, 1, 2, 3});
  EXPECT_EQ(a.failed_hosts, (std::set<std::string>{"c"}));
  EXPECT_NE(a.reason.find("c (its ranks did not answer)"), std::string::npos) << a.reason;
}

TEST(Analysis, StalledJobWhoseRanksAllAnsweredBlamesNobody) {
  // Every rank answered the query; the teardown then let only host a's reports through.
  const Analysis a = analyse(kThree, {report(0, -15, true), report(1, -15, true)}, {}, {false, 0, 15}, false, true,
                             {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(a.verdict, Verdict::Failure);
  EXPECT_TRUE(a.failed_hosts.empty()) << a.reason;
  EXPECT_EQ(a.reason, "the job stalled (no finished step within --stall-timeout)");
}

TEST(Analysis, AStallBeforeTheFirstStepNamesTheStartTimeout) {
  AttemptEvidence e;
  e.reports = {report(0, -15, true), report(1, -15, true)};
  e.alive = {0, 1, 2, 3, 4, 5};
  e.mpirun_status = {false, 0, 15};
  e.stalled = e.stalled_starting = true;
  const Analysis a = analyse_attempt(kThree, e);
  EXPECT_TRUE(a.failed_hosts.empty()) << a.reason;
  EXPECT_EQ(a.reason, "the job stalled (no first step within --start-timeout)");
}

TEST(Options, WhereTheProgramStarts) {
  const char* a[] = {"hpcrun", "-np", "4", "-H", "a:2,b:2", "--quiet", "prog", "--np", "3"};
  EXPECT_EQ(program_start(9, a), 6);
  const char* b[] = {"hpcrun", "--max-np=4", "--", "-prog"};
  EXPECT_EQ(program_start(4, b), 3);
  const char* c[] = {"hpcrun", "-x", "A=1", "--env", "B"};
  EXPECT_EQ(program_start(5, c), 5);
  const char* d[] = {"hpcrun", "-Hlocalhost", "prog", "-x", "A"};
  EXPECT_EQ(program_start(5, d), 2) << "-H's value is in the argument itself";
  const char* e[] = {"hpcrun", "-np=2", "--help", "-h", "-n", "2", "prog"};
  EXPECT_EQ(program_start(7, e), 6);
  EXPECT_EQ(program_option({"hpctrain", "--epochs", "3", "--checkpoint-dir=/ck"}, "checkpoint-dir"), "/ck");
  EXPECT_EQ(program_option({"hpctrain", "--checkpoint-dir", "/x"}, "checkpoint-dir"), "/x");
  EXPECT_EQ(program_option({"hpctrain", "--checkpoint-dirs", "/x"}, "checkpoint-dir"), "");
  using Args = std::vector<std::string>;
  for (Args args : {Args{"hpctrain", "--resume", "none", "--epochs", "3"}, Args{"hpctrain", "--resume=/ck/a.hpck"}}) {
    set_program_option(args, "resume", "auto");
    EXPECT_EQ(program_option(args, "resume"), "auto");
    EXPECT_EQ(args.size(), args[1] == "--resume" ? 5u : 2u) << "the value replaced, not another added";
  }
  Args none{"hpctrain", "--resumes", "x", "--epochs", "3"};
  set_program_option(none, "resume", "auto");
  EXPECT_EQ(none, (Args{"hpctrain", "--resumes", "x", "--epochs", "3", "--resume", "auto"}));
}

// hpcrun counts the beats of its running attempt: one that names another hpcrun's token or
// another attempt (a rank 0 of an earlier attempt alive on a lost host) is not progress; one
// that names none (a program other than hpctrain) is.
TEST(HeartbeatWatch, CountsOnlyItsOwnAttemptsBeats) {
  const std::string dir = ::testing::TempDir() + "/hpcrun_beats";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& text) { std::ofstream(dir + "/heartbeat") << text; };
  const std::string ours = "hpcrun_token=" + hpcrun_token() + "\n";
  write("step=7\n");  // an earlier run's, there before the attempt
  HeartbeatWatch watch(dir);
  watch.begin(0, 3);
  EXPECT_FALSE(watch.poll(0.5));
  write("step=1\n");
  EXPECT_TRUE(watch.poll(1));
  write("step=2\n" + ours + "hpcrun_attempt=3\n");
  EXPECT_TRUE(watch.poll(2));
  for (const std::string& other : {"step=9\n" + ours + "hpcrun_attempt=2\n", "step=9\n" + ours,
                                   std::string("step=9\nhpcrun_token=0000000000000000\nhpcrun_attempt=3\n")}) {
    write(other);
    EXPECT_FALSE(watch.poll(3)) << other;
  }
  EXPECT_EQ(watch.step(), 2);
  EXPECT_EQ(watch.last_progress(), 2);
  std::filesystem::remove_all(dir);
}

// A beat that only says how far a checkpoint's write came (hpctrain's Heartbeat::writing) is a
// change, which the stall clock takes for life, and says it is a write: no step.
TEST(HeartbeatWatch, TellsAWritesBeatFromAStep) {
  const std::string dir = ::testing::TempDir() + "/hpcrun_write_beats";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& text) { std::ofstream(dir + "/heartbeat") << text; };
  HeartbeatWatch watch(dir);
  watch.begin(0, 1);
  write("step=4\nstate=training\n");
  EXPECT_TRUE(watch.poll(1));
  EXPECT_FALSE(watch.writing());
  write("step=4\nstate=training\ncheckpoint_step=4\ncheckpoint_bytes_synced=16777216\ncheckpoint_bytes=90000000\n");
  EXPECT_TRUE(watch.poll(2));
  EXPECT_TRUE(watch.writing());
  EXPECT_EQ(watch.step(), 4);
  EXPECT_EQ(watch.last_progress(), 2);
  write("step=4\nstate=training\ncheckpoint_step=4\ncheckpoint_bytes_synced=33554432\ncheckpoint_bytes=90000000\n");
  EXPECT_TRUE(watch.poll(3));
  EXPECT_EQ(watch.last_progress(), 3);
  write("step=4\nstate=done\n");
  EXPECT_TRUE(watch.poll(4));
  EXPECT_FALSE(watch.writing());
  std::filesystem::remove_all(dir);
}

// An attempt's rank 0 waits for the checkpoint directory's lock while another live process holds
// it: the rank 0 of an earlier attempt (cut off, alive until its watchdog ends it) or another run.
// The attempt's own lock, one released or left by a process gone (its record unchanged for the
// stale time, 30 s) is no such wait.
TEST(LockWatch, TellsAWaitForAnothersLockFromTheAttemptsOwn) {
  const std::string dir = ::testing::TempDir() + "/hpcrun_lock_watch";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& text) { std::ofstream(dir + "/lock") << text; };
  const std::string ours = "hpcrun_token=" + hpcrun_token() + "\n";
  std::string holder;
  LockWatch none(dir);
  EXPECT_FALSE(none.held_by_another(0, hpcrun_token(), "3", &holder)) << "no lock file";
  write("host=h1\npid=7\nunix_time=1\nstate=held\n" + ours + "hpcrun_attempt=2\n");
  LockWatch watch(dir);
  EXPECT_TRUE(watch.held_by_another(0, hpcrun_token(), "3", &holder));
  EXPECT_EQ(holder.rfind("host h1 pid 7", 0), 0u) << holder;
  EXPECT_NE(holder.find(": attempt 2's rank 0"), std::string::npos) << holder;
  EXPECT_TRUE(watch.held_by_another(29, hpcrun_token(), "3", &holder));
  EXPECT_FALSE(watch.held_by_another(30.5, hpcrun_token(), "3", &holder)) << "unchanged for the stale time";
  write("host=h1\npid=7\nunix_time=2\nstate=held\n" + ours + "hpcrun_attempt=2\n");
  EXPECT_TRUE(watch.held_by_another(31, hpcrun_token(), "3", &holder)) << "rewritten: alive";
  write("host=h2\npid=8\nunix_time=3\nstate=held\nhpcrun_token=0000000000000000\nhpcrun_attempt=3\n");
  EXPECT_TRUE(watch.held_by_another(32, hpcrun_token(), "3", &holder));
  EXPECT_NE(holder.find(": another run"), std::string::npos) << holder;
  write("host=h2\npid=8\nunix_time=4\nstate=held\n");
  EXPECT_TRUE(watch.held_by_another(33, hpcrun_token(), "3", &holder)) << "a run outside hpcrun";
  write("host=h3\npid=9\nunix_time=5\nstate=held\n" + ours + "hpcrun_attempt=3\n");
  EXPECT_FALSE(watch.held_by_another(34, hpcrun_token(), "3", &holder)) << "the attempt's own";
  write("host=h1\npid=7\nunix_time=6\nstate=released\n" + ours + "hpcrun_attempt=2\n");
  EXPECT_FALSE(watch.held_by_another(35, hpcrun_token(), "3", &holder)) << "released";
  EXPECT_FALSE(LockWatch("").held_by_another(0, hpcrun_token(), "3", &holder)) << "no checkpoint directory";
  std::filesystem::remove_all(dir);
}

// hpctrain's config file, for the options hpcrun acts on: read as hpctrain reads it; never a
// pipe or FIFO (--config <(generate)), which hpcrun would empty before hpctrain reads it.
TEST(Options, TheProgramsConfigFileGivesWhatHpcrunActsOn) {
  const std::string path = ::testing::TempDir() + "/hpcrun_program.conf";
  std::ofstream(path) << "# a comment\nlr = 0.1\ncheckpoint-dir = /data/ck  # where\nresume = none\n"
                         "start-timeout = 5m\nepochs = 3\n";
  EXPECT_EQ(program_config_values(path), (std::map<std::string, std::string>{
                                             {"checkpoint-dir", "/data/ck"}, {"resume", "none"}, {"start-timeout", "5m"}}));
  EXPECT_TRUE(program_config_values(path + ".missing").empty());
  EXPECT_TRUE(program_config_values(::testing::TempDir()).empty()) << "a directory";
  EXPECT_TRUE(program_config_values("").empty());
  const std::string fifo = ::testing::TempDir() + "/hpcrun_program.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(program_config_values(fifo).empty()) << "read (and blocked on) a FIFO";
  std::remove(fifo.c_str());
  std::ofstream(path) << "[train]\ncheckpoint-dir = /x\n";  // hpctrain refuses sections: nothing taken here
  EXPECT_TRUE(program_config_values(path).empty() || program_config_values(path).count("checkpoint-dir") == 0);
  std::remove(path.c_str());
}

TEST(Options, MpiArgsAreSplitAsAShellWould) {
  EXPECT_EQ(split_mpi_args("--mca btl 'self,tcp'  --bind-to \"none\""),
            (std::vector<std::string>{"--mca", "btl", "self,tcp", "--bind-to", "none"}));
  EXPECT_EQ(split_mpi_args("-x A=a\\ b"), (std::vector<std::string>{"-x", "A=a b"}));
  EXPECT_TRUE(split_mpi_args("").empty());
  EXPECT_NE(usage_message([] { split_mpi_args("--mca btl 'self"); }).find("quote is not closed"), std::string::npos);
  EXPECT_NE(usage_message([] { split_mpi_args("--bind-to none\\"); }).find("--mpi-args"), std::string::npos);
  for (const char* own : {"-np 4", "-H a,b", "--host=a", "--hostfile f", "-n 2"})
    EXPECT_NE(usage_message([&] { split_mpi_args(own); }).find("is hpcrun's to set"), std::string::npos) << own;
}

// --drain-stragglers is a switch: the program starts after it, not one word later.
TEST(Options, DrainStragglersTakesNoValue) {
  const char* a[] = {"hpcrun", "--drain-stragglers", "--straggler-time", "30s", "prog"};
  EXPECT_EQ(program_start(5, a), 4);
}

// hpcrun's options as parse_launch_options reads them, with the program `true` after them.
LaunchOptions launch(std::vector<const char*> args) {
  args.insert(args.begin(), "hpcrun");
  args.push_back("true");
  std::optional<LaunchOptions> o = parse_launch_options(static_cast<int>(args.size()), args.data());
  EXPECT_TRUE(o.has_value());
  return o.value_or(LaunchOptions{});
}

// The durations: --discovery-interval, --stall-timeout, --start-timeout, --probe-timeout,
// --teardown-timeout, --stop-timeout, --elastic-timeout, --blacklist-cooldown's MIN and MAX,
// --straggler-time.
std::vector<double> seconds_of(const LaunchOptions& o) {
  return {o.discovery_interval, o.stall_timeout,   o.start_timeout, o.probe_timeout, o.teardown_timeout,
          o.stop_timeout,       o.elastic_timeout, o.cooldown_min,  o.cooldown_max,  o.stragglers.seconds};
}

// Every option's default, as LaunchOptions holds it after a command line that gives none of them.
TEST(Options, EveryOptionsDefault) {
  const LaunchOptions o = launch({"-np", "2"});
  EXPECT_EQ(o.host_source, HostSource::Local);
  EXPECT_EQ(o.static_hosts, (HostList{{"localhost", 2}}));
  EXPECT_EQ(o.discovery_script, "");
  EXPECT_EQ(o.slots_per_host, 1);
  EXPECT_EQ(o.np, 2);
  EXPECT_EQ(o.min_np, 2) << "-np's";
  EXPECT_EQ(o.max_np, 2) << "-np's";
  EXPECT_EQ(o.mpirun, "mpirun");
  EXPECT_EQ(o.launch_agent, "ssh");
  EXPECT_FALSE(o.launch_agent_given);
  EXPECT_TRUE(o.mpi_args.empty());
  EXPECT_TRUE(o.env.empty());
  EXPECT_EQ(o.log_dir, "hpcrun-logs");
  EXPECT_EQ(o.checkpoint_dir, "");
  EXPECT_EQ(seconds_of(o), (std::vector<double>{5, 600, 600, 10, 10, 300, 600, 60, 600, 120}));
  EXPECT_FALSE(o.start_timeout_given);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.stragglers.factor, 1.5);
  EXPECT_FALSE(o.stragglers.drain);
  EXPECT_FALSE(o.quiet);
  EXPECT_EQ(o.program, (std::vector<std::string>{"true"}));
  const LaunchOptions alone = launch({"-H", "localhost:3"});
  EXPECT_EQ(alone.np, 0) << "every slot";
  EXPECT_EQ(alone.min_np, 1);
  EXPECT_EQ(alone.max_np, 0) << "unbounded";
  EXPECT_EQ(launch({"-np", "1", "--stall-timeout", "0"}).start_timeout, 0) << "--stall-timeout's";
}

// Every option given reaches its member, in each of its spellings.
TEST(Options, EveryOptionReachesItsMember) {
  const LaunchOptions o = launch(
      {"-H", "localhost:3", "--slots-per-host", "2", "--discovery-interval", "7s", "-n", "2", "--min-np", "1",
       "--max-np", "3", "--launch-agent", "true", "--mpirun", "mpirun", "--mpi-args", "--bind-to 'none'", "-x", "A=1",
       "--env", "B=2", "--log-dir", "/tmp/hpcrun-options-test-logs", "--checkpoint-dir",
       "/tmp/hpcrun-options-test-ck", "--quiet",
       "--stall-timeout", "1m", "--start-timeout", "30s", "--max-restarts", "0", "--blacklist-cooldown", "30s:5m",
       "--elastic-timeout", "2m", "--probe-timeout", "5s", "--teardown-timeout", "20s", "--stop-timeout", "1m",
       "--straggler-factor", "2", "--straggler-time", "1m", "--drain-stragglers"});
  EXPECT_EQ(o.host_source, HostSource::List);
  EXPECT_EQ(o.static_hosts, (HostList{{"localhost", 3}}));
  EXPECT_EQ(o.slots_per_host, 2);
  EXPECT_EQ(o.np, 2);
  EXPECT_EQ(o.min_np, 1);
  EXPECT_EQ(o.max_np, 3);
  EXPECT_EQ(o.launch_agent, "true");
  EXPECT_TRUE(o.launch_agent_given);
  EXPECT_EQ(o.mpi_args, (std::vector<std::string>{"--bind-to", "none"}));
  EXPECT_EQ(o.env, (std::vector<std::string>{"A=1", "B=2"}));
  EXPECT_EQ(o.log_dir, "/tmp/hpcrun-options-test-logs");
  EXPECT_EQ(o.checkpoint_dir, "/tmp/hpcrun-options-test-ck");
  EXPECT_TRUE(o.quiet);
  EXPECT_EQ(seconds_of(o), (std::vector<double>{7, 60, 30, 5, 20, 60, 120, 30, 300, 60}));
  EXPECT_TRUE(o.start_timeout_given);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.stragglers.factor, 2);
  EXPECT_TRUE(o.stragglers.drain);
  for (const std::vector<const char*>& np : {std::vector<const char*>{"-np", "4"}, {"-np=4"}, {"-n", "4"}, {"--np=4"}})
    EXPECT_EQ(launch(np).np, 4) << np[0];
  EXPECT_EQ(launch({"-H", "a.invalid,b.invalid", "--launch-agent", "true", "--slots-per-host", "3"}).static_hosts,
            (HostList{{"a.invalid", 3}, {"b.invalid", 3}}));
}

// Each option's range, and its message, where hpcrun_cli_test does not try it.
TEST(Options, ValuesOutsideTheirRangeNameTheOption) {
  const auto error = [](std::vector<const char*> args) {
    args.insert(args.begin(), "hpcrun");
    args.push_back("true");
    return usage_message([&] { parse_launch_options(static_cast<int>(args.size()), args.data()); });
  };
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases{
      {{"-np", "0"}, "-np must be a whole number from 1 to 1000000, got 0"},
      {{"-np", "4097"}, "-np 4097 ranks on this machine alone (no host list) is more than a host's 4096 slots: give "
                        "-H, --hostfile or --host-discovery-script for more"},
      {{"-np", "1", "--min-np", "0"}, "--min-np must be a whole number from 1 to 1000000, got 0"},
      {{"-np", "1", "--max-np", "1000001"}, "--max-np must be a whole number from 1 to 1000000, got 1000001"},
      // Each names the options given: --min-np defaults to -np, and is not named for it.
      {{"-np", "3", "--max-np", "2"}, "-np 3 is above --max-np 2"},
      {{"-np", "2", "--min-np", "3"}, "-np 2 is below --min-np 3"},
      {{"-np", "1", "--min-np", "3", "--max-np", "2"}, "-np 1 is below --min-np 3"},
      {{"-H", "localhost:4", "--min-np", "3", "--max-np", "2"}, "--max-np 2 is below --min-np 3"},
      {{"-H", "localhost", "--slots-per-host", "0"}, "--slots-per-host must be a whole number from 1 to 4096, got 0"},
      {{"-np", "1", "--max-restarts", "-1"}, "--max-restarts must be 0 or more, got -1"},
      {{"-np", "1", "--probe-timeout", "0"}, "--probe-timeout must be more than 0, got 0"},
      {{"-np", "1", "--straggler-factor", "inf"}, "--straggler-factor must be more than 1 (a host's busy time per "
                                                  "step over the median host's), got inf"},
      {{"-np", "1", "--elastic-timeout", "soon"}, "--elastic-timeout must be a duration"},
      {{"-np", "1", "--discovery-interval", "soon"}, "--discovery-interval must be a duration"},
      {{"-np", "1", "--stop-timeout", "0"}, "--stop-timeout must be more than 0 (0 would kill every job asked to "
                                            "checkpoint before it can), got 0"},
      {{"-np", "1", "--stall-timeout", "4s"}, "--stall-timeout 4 s is shorter than a start-up needs (it counts from "
                                              "the launch): give at least 5 s, or 0 to turn it off"},
      {{"-np", "1", "--start-timeout", "4s"}, "--start-timeout 4 s is shorter than a start-up needs: give at least "
                                              "5 s, or 0 for no limit"},
      {{"-np", "1", "--launch-agent", " "}, "--launch-agent is empty"},
      {{"--hostfile", ""}, "--hostfile is empty"},
      {{"-H", " "}, "-H is empty"},
      {{"-np", "1", "-x", "A B"}, "-x 'A B' is not NAME or NAME=VALUE"},
      {{"-np", "1", "-x", "1A=x"}, "-x '1A=x' is not NAME or NAME=VALUE (a NAME of letters, digits and _"},
      {{"-np", "1", "-x", "A-B=1"}, "-x 'A-B=1' is not NAME or NAME=VALUE"},
      {{"-np", "1", "--blacklist-cooldown", "1m"}, "--blacklist-cooldown must be MIN:MAX"},
  };
  for (const auto& [args, says] : cases)
    EXPECT_EQ(error(args).rfind(says, 0), 0u) << args[0] << " " << args[1] << ": " << error(args);
}

// The straggler table (straggler_policy.hpp), a heartbeat at a time: named once, after the time,
// only while the same host stays above the factor; drained when asked and the rest can go on.
// `beats` gives one heartbeat a second from `from` to `to` seconds, as a training writes them.
struct StragglerBeats {
  StragglerPolicy policy;
  StragglerState state;
  StragglerDecision beat(const std::string& host, double ratio, double t, bool rest = true) {
    const StragglerDecision d = judge_straggler(state, {host, ratio}, t, policy, rest);
    state = d.next;
    return d;
  }
  // The actions other than None on the way (each with its time), in order.
  std::vector<std::pair<double, StragglerAction>> beats(const std::string& host, double ratio, double from, double to) {
    std::vector<std::pair<double, StragglerAction>> acted;
    for (double t = from; t <= to; t += 1)
      if (const StragglerDecision d = beat(host, ratio, t); d.action != StragglerAction::None) acted.emplace_back(t, d.action);
    return acted;
  }
};
using Acted = std::vector<std::pair<double, StragglerAction>>;

TEST(StragglerPolicy, NamesAHostSlowForTheTimeOnce) {
  StragglerBeats b{{1.5, 60, false}, {}};
  EXPECT_EQ(b.beats("b", 3, 0, 59), Acted{}) << "not yet --straggler-time";
  const StragglerDecision named = b.beat("b", 3.1, 60);
  EXPECT_EQ(named.action, StragglerAction::Name);
  EXPECT_DOUBLE_EQ(named.held_seconds, 60);
  EXPECT_EQ(b.beats("b", 3, 61, 200), Acted{}) << "named once";
  // Back to normal, then slow again: a new episode, named again after its own time.
  EXPECT_EQ(b.beat("b", 1.2, 201).action, StragglerAction::None);
  EXPECT_EQ(b.beats("b", 2, 210, 280), (Acted{{270, StragglerAction::Name}}));
}

TEST(StragglerPolicy, TheClockRestartsWhenTheSlowestHostChangesOrDipsToTheFactor) {
  StragglerBeats b{{1.5, 60, false}, {}};
  EXPECT_EQ(b.beats("b", 3, 0, 49), Acted{});
  EXPECT_EQ(b.beat("c", 3, 50).action, StragglerAction::None);
  EXPECT_EQ(b.beats("b", 3, 70, 110), Acted{}) << "b's clock restarted at 70";
  EXPECT_EQ(b.beat("b", 1.5, 111).action, StragglerAction::None) << "at the factor is not above it";
  EXPECT_EQ(b.beats("b", 3, 112, 160), Acted{}) << "b's clock restarted at 112, after its dip";
  EXPECT_EQ(b.beat("", 1, 161).action, StragglerAction::None) << "a heartbeat without a verdict";
  EXPECT_EQ(b.beats("b", 3, 162, 230), (Acted{{222, StragglerAction::Name}}));
}

// A gap between two heartbeats (an evaluation, a checkpoint) counts 10 s at most: the verdict
// that follows a long evaluation (the window of the steps before it) proves no slowness during
// it. Slow for 30 s, then 5 minutes without a heartbeat: the host is named only once it has been
// seen slow for the rest of its minute in steps after.
TEST(StragglerPolicy, AGapBetweenHeartbeatsIsNotSlowTime) {
  StragglerBeats b{{1.5, 60, true}, {}};
  EXPECT_EQ(b.beats("b", 3, 0, 30), Acted{});
  EXPECT_EQ(b.beat("b", 3, 330).action, StragglerAction::None) << "the evaluation's 300 s counted as slow";
  EXPECT_DOUBLE_EQ(b.state.held, 40);
  EXPECT_EQ(b.beats("b", 3, 331, 360), (Acted{{350, StragglerAction::NameAndDrain}}));
  // Heartbeats 5 s apart (steps of 5 s) count whole.
  StragglerBeats slow_steps{{1.5, 60, false}, {}};
  for (double t = 0; t < 60; t += 5) EXPECT_EQ(slow_steps.beat("b", 3, t).action, StragglerAction::None) << t;
  EXPECT_EQ(slow_steps.beat("b", 3, 60).action, StragglerAction::Name);
}

TEST(StragglerPolicy, DrainsOnlyWhenAskedAndTheRestHasMinNpSlots) {
  const StragglerPolicy drain{1.5, 10, true};
  const StragglerState watched{"b", 0, 5, false};
  EXPECT_EQ(judge_straggler(watched, {"b", 4}, 5, drain, true).action, StragglerAction::NameAndDrain);
  EXPECT_EQ(judge_straggler(watched, {"b", 4}, 5, drain, false).action, StragglerAction::NameNotDrained);
  EXPECT_EQ(judge_straggler(watched, {"b", 4}, 5, {1.5, 10, false}, true).action, StragglerAction::Name);
  EXPECT_TRUE(judge_straggler(watched, {"b", 4}, 5, drain, true).next.named);
  EXPECT_EQ(judge_straggler({"b", 0, 20, true}, {"b", 4}, 1, drain, true).action, StragglerAction::None);
  EXPECT_EQ(judge_straggler(watched, {"b", 4}, 4, drain, true).action, StragglerAction::None) << "9 s, not 10";
}

TEST(Subprocess, FindProgramSaysWhy) {
  std::string why;
  EXPECT_EQ(find_program("/no/such/agent", &why), "");
  EXPECT_EQ(why, "no such file");
  const std::string text = ::testing::TempDir() + "/hpcrun_not_executable";
  std::ofstream(text) << "#!/bin/sh\n";  // mode 0644
  EXPECT_EQ(find_program(text, &why), "");
  EXPECT_EQ(why, "it is not an executable file");
  std::remove(text.c_str());
  EXPECT_EQ(find_program("/tmp", &why), "");
  EXPECT_EQ(why, "it is a directory");
  EXPECT_NE(find_program("sh", &why), "");
}

TEST(Subprocess, CommandsWithDeadlines) {
  const std::vector<CommandResult> r =
      run_commands({{"sh", "-c", "echo hi; exit 3"}, {"sleep", "5"}, {"/no/such/program"}}, 0.5);
  EXPECT_TRUE(r[0].started);
  EXPECT_EQ(r[0].status.code, 3);
  EXPECT_EQ(r[0].output, "hi\n");
  EXPECT_NE(r[0].why().find("exit code 3: hi"), std::string::npos);
  EXPECT_TRUE(r[1].timed_out);
  EXPECT_FALSE(r[2].started);
  EXPECT_NE(r[2].why().find("No such file"), std::string::npos);
  EXPECT_TRUE(run_command({"true"}, 5).ok());
  EXPECT_FALSE(run_command({"true"}, 5).output_cut);
}

// Output past what is kept is noted, not taken for the whole (the discovery script's hosts).
TEST(Subprocess, OutputPastWhatIsKeptIsNoted) {
  const CommandResult r = run_command({"sh", "-c", "head -c 1048577 /dev/zero"}, 60, false);
  EXPECT_TRUE(r.ok()) << r.why();
  EXPECT_EQ(r.output.size(), kMaxCommandOutput);
  EXPECT_TRUE(r.output_cut);
  EXPECT_FALSE(run_command({"sh", "-c", "head -c 1048576 /dev/zero"}, 60, false).output_cut);
}

// A command's answer is what it printed until it ended: a process it left behind holding its
// output (a discovery script that starts a daemon with &) neither makes hpcrun wait out the
// deadline nor adds its later lines (here a host) to the answer.
TEST(Subprocess, AnAnswerEndsWithItsCommand) {
  const CommandResult r = run_command({"sh", "-c", "(sleep 5; echo late:1) & echo node1:1"}, 60, false);
  EXPECT_TRUE(r.ok()) << r.why();
  EXPECT_EQ(r.output, "node1:1\n");
}

TEST(Subprocess, LinesAcrossReads) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  LineSplitter s;
  std::vector<std::string> lines;
  ASSERT_EQ(::write(fds[1], "one\r\ntw", 7), 7);
  EXPECT_TRUE(s.read_from(fds[0], &lines));
  ASSERT_EQ(::write(fds[1], "o\nthree", 7), 7);
  EXPECT_TRUE(s.read_from(fds[0], &lines));
  ::close(fds[1]);
  EXPECT_FALSE(s.read_from(fds[0], &lines));
  std::string rest;
  EXPECT_TRUE(s.take_rest(&rest));
  ::close(fds[0]);
  EXPECT_EQ(lines, (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(rest, "three");
}

volatile sig_atomic_t g_handler_owner = 0;
int g_foreign_handler_pipe = -1;
void note_a_foreign_handler(int) {
  const char b = 1;
  if (::getpid() != g_handler_owner) [[maybe_unused]] ssize_t n = ::write(g_foreign_handler_pipe, &b, 1);
}

// A spawned child runs none of its parent's signal handlers, not even between the fork and the
// exec. hpcrun's handler writes into its own signal pipe, which a forked child shares: a Ctrl-C
// to the terminal's process group as mpirun is forked would count twice, and a second signal
// kills the job without its checkpoint. Here a flood of SIGUSR1 to the process group while it
// spawns, with a handler that notes where it ran.
TEST(Subprocess, AChildRunsNoneOfItsParentsSignalHandlers) {
  const auto spawn_under_a_flood = [] {
    ::setpgid(0, 0);
    int notes[2];
    if (::pipe2(notes, O_NONBLOCK) != 0) std::_Exit(2);
    g_handler_owner = ::getpid();
    g_foreign_handler_pipe = notes[1];
    struct sigaction sa{};
    sa.sa_handler = note_a_foreign_handler;
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
    const pid_t flood = ::fork();
    if (flood == 0) {
      ::signal(SIGUSR1, SIG_IGN);
      for (;;) ::kill(0, SIGUSR1);
    }
    int spawned = 0;
    for (const double end = monotonic_seconds() + 0.3; monotonic_seconds() < end; ++spawned) {
      Child c = Child::spawn({"true"}, SpawnOptions{});
      c.wait();
    }
    ::kill(flood, SIGKILL);
    ::waitpid(flood, nullptr, 0);
    int foreign = 0;
    char b;
    while (::read(notes[0], &b, 1) == 1) ++foreign;
    std::fprintf(stderr, "spawned=%d foreign=%d\n", spawned, foreign);
    std::_Exit(foreign == 0 && spawned > 0 ? 0 : 1);
  };
  EXPECT_EXIT(spawn_under_a_flood(), ::testing::ExitedWithCode(0), "foreign=0");
}

// A spawn that fails (no file descriptors left, here; fork's EAGAIN alike) leaves no pipe open:
// hpcrun retries its probes for hours, and each leaked pair would bring the next failure nearer.
TEST(Subprocess, ASpawnThatFailsLeavesNoPipeOpen) {
  const auto fail_with_free_descriptors = [](int free_fds) {
    const rlimit limit{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &limit);
    std::vector<int> filler;
    for (int fd; (fd = ::dup(STDIN_FILENO)) >= 0;) filler.push_back(fd);
    for (int k = 0; k < free_fds; ++k) ::close(filler[k]);
    bool refused = false;
    try {
      Child::spawn({"true"}, SpawnOptions{});
    } catch (const Error&) {
      refused = true;
    }
    int left = 0;
    for (int fd; (fd = ::dup(STDIN_FILENO)) >= 0;) ++left;
    std::fprintf(stderr, "refused=%d free=%d\n", refused, left);
    std::_Exit(refused && left == free_fds ? 0 : 1);
  };
  // Its pipes are made in turn: the second, then the third cannot be.
  EXPECT_EXIT(fail_with_free_descriptors(2), ::testing::ExitedWithCode(0), "refused=1 free=2");
  EXPECT_EXIT(fail_with_free_descriptors(4), ::testing::ExitedWithCode(0), "refused=1 free=4");
}

// An attempt launched at t = 100 with a heartbeat, --stall-timeout 60, --stop-timeout 300 and
// --teardown-timeout 10; --start-timeout as --stall-timeout (its default) unless given.
AttemptPhase launched(bool heartbeat = true, double stall = 60, double teardown = 10, double start = -1) {
  return AttemptPhase(PhaseTimeouts{heartbeat, stall, 300, teardown, start < 0 ? stall : start}, 100);
}

void expect_escalation(AttemptPhase& p, double t, Phase from, Action action, Phase to, double deadline) {
  const Escalation e = p.escalate(t);
  EXPECT_EQ(phase_name(e.from), std::string(phase_name(from))) << "at " << t;
  EXPECT_EQ(static_cast<int>(e.action), static_cast<int>(action)) << "at " << t;
  EXPECT_EQ(phase_name(p.phase()), std::string(phase_name(to))) << "at " << t;
  EXPECT_DOUBLE_EQ(p.deadline(), deadline) << "at " << t;
}

TEST(AttemptPhase, StallCountsFromTheLaunchThenFromTheLastStep) {
  AttemptPhase p = launched();
  EXPECT_EQ(p.phase(), Phase::Starting);
  EXPECT_DOUBLE_EQ(p.deadline(), 160);
  EXPECT_FALSE(p.running());
  expect_escalation(p, 159, Phase::Starting, Action::None, Phase::Starting, 160);
  p.progress(150);
  EXPECT_TRUE(p.running());
  EXPECT_DOUBLE_EQ(p.deadline(), 210);
  expect_escalation(p, 210, Phase::Running, Action::None, Phase::Running, 210);
  EXPECT_FALSE(p.stalled());
  // Stalled: the ranks are asked which respond, for at most 2 s, then terminated, then killed.
  expect_escalation(p, 211, Phase::Running, Action::QueryLiveness, Phase::Querying, 213);
  EXPECT_TRUE(p.stalled());
  EXPECT_FALSE(p.running());
  expect_escalation(p, 214, Phase::Querying, Action::Terminate, Phase::Terminating, 224);
  expect_escalation(p, 225, Phase::Terminating, Action::Kill, Phase::Killed, AttemptPhase::kNever);
  expect_escalation(p, 1e9, Phase::Killed, Action::None, Phase::Killed, AttemptPhase::kNever);
}

TEST(AttemptPhase, StallBeforeTheFirstStepAndAShortTeardown) {
  AttemptPhase p = launched(true, 60, 1);
  expect_escalation(p, 161, Phase::Starting, Action::QueryLiveness, Phase::Querying, 162);  // 1 s, not 2
  expect_escalation(p, 163, Phase::Querying, Action::Terminate, Phase::Terminating, 164);
}

// --start-timeout: the launch gets its own limit (a slow start-up is no stall), the steps after
// the first --stall-timeout; 0 puts no limit on the start-up.
TEST(AttemptPhase, TheStartTimeoutLimitsTheStartUpAndTheStallTimeoutTheSteps) {
  AttemptPhase p = launched(true, 6, 10, 120);
  EXPECT_DOUBLE_EQ(p.deadline(), 220);
  expect_escalation(p, 150, Phase::Starting, Action::None, Phase::Starting, 220);
  p.progress(180);
  EXPECT_DOUBLE_EQ(p.deadline(), 186);
  EXPECT_FALSE(p.stalled_starting());
  expect_escalation(p, 187, Phase::Running, Action::QueryLiveness, Phase::Querying, 189);
  EXPECT_TRUE(p.stalled());
  EXPECT_FALSE(p.stalled_starting());
  AttemptPhase slow = launched(true, 6, 10, 120);
  expect_escalation(slow, 221, Phase::Starting, Action::QueryLiveness, Phase::Querying, 223);
  EXPECT_TRUE(slow.stalled_starting());
  AttemptPhase unlimited = launched(true, 6, 10, 0);
  EXPECT_DOUBLE_EQ(unlimited.deadline(), AttemptPhase::kNever);
  unlimited.progress(5000);
  EXPECT_DOUBLE_EQ(unlimited.deadline(), 5006);
}

// While rank 0 waits for another process's lock (LockWatch), --start-timeout counts from the
// latest moment it was seen waiting; once the attempt runs, a wait seen late changes nothing.
TEST(AttemptPhase, AWaitForAnothersLockHoldsTheStartUpClock) {
  AttemptPhase p = launched(true, 6, 10, 120);
  p.start_held(150);
  p.start_held(200);
  p.start_held(190);
  expect_escalation(p, 221, Phase::Starting, Action::None, Phase::Starting, 320);
  expect_escalation(p, 321, Phase::Starting, Action::QueryLiveness, Phase::Querying, 323);
  EXPECT_TRUE(p.stalled_starting());
  AttemptPhase runs = launched(true, 6, 10, 120);
  runs.progress(130);
  runs.start_held(131);
  EXPECT_DOUBLE_EQ(runs.deadline(), 136);
}

TEST(AttemptPhase, WithoutAHeartbeatTheJobRunsAfterTenSecondsAndNeverStalls) {
  AttemptPhase p = launched(false);
  EXPECT_DOUBLE_EQ(p.deadline(), 110);
  expect_escalation(p, 111, Phase::Starting, Action::None, Phase::Running, AttemptPhase::kNever);
  EXPECT_TRUE(p.running());
  AttemptPhase off = launched(true, 0);  // --stall-timeout 0
  EXPECT_DOUBLE_EQ(off.deadline(), AttemptPhase::kNever);
  off.progress(120);
  EXPECT_DOUBLE_EQ(off.deadline(), AttemptPhase::kNever);
}

TEST(AttemptPhase, AStopThatTakesTooLongIsTerminatedThenKilled) {
  AttemptPhase p = launched();
  p.progress(110);
  p.stop_requested(120);
  EXPECT_FALSE(p.running());
  EXPECT_DOUBLE_EQ(p.deadline(), 420);
  p.progress(130);  // steps until the checkpoint: no stall clock while stopping
  EXPECT_DOUBLE_EQ(p.deadline(), 420);
  // Asked again (a signal after a request to grow): --stop-timeout starts again.
  p.stop_requested(200);
  EXPECT_DOUBLE_EQ(p.deadline(), 500);
  expect_escalation(p, 501, Phase::Stopping, Action::Terminate, Phase::Terminating, 504);
  expect_escalation(p, 505, Phase::Terminating, Action::Kill, Phase::Killed, AttemptPhase::kNever);
}

// A checkpoint's write that moves (the heartbeat's checkpoint_bytes_synced) is life: the stall clock
// starts again while running, and a stop's --stop-timeout counts from it; never a first step.
TEST(AttemptPhase, AWriteThatMovesIsLifeAndHoldsAStopsTimeout) {
  AttemptPhase p = launched();
  p.writing(105);  // set-up's stop checkpoint: still starting
  EXPECT_EQ(p.phase(), Phase::Starting);
  p.progress(110);
  p.writing(150);
  EXPECT_TRUE(p.running());
  EXPECT_DOUBLE_EQ(p.deadline(), 210);
  p.stop_requested(160);
  EXPECT_DOUBLE_EQ(p.deadline(), 460);
  p.progress(165);  // a step until the checkpoint: no clock of its own while stopping
  EXPECT_DOUBLE_EQ(p.deadline(), 460);
  p.writing(170);  // the stop's checkpoint moves: --stop-timeout from its last chunk
  EXPECT_DOUBLE_EQ(p.deadline(), 470);
  p.writing(400);
  EXPECT_DOUBLE_EQ(p.deadline(), 700);
  expect_escalation(p, 701, Phase::Stopping, Action::Terminate, Phase::Terminating, 704);
  p.writing(702);  // ending it already
  EXPECT_EQ(p.phase(), Phase::Terminating);
}

TEST(AttemptPhase, AFailureGivesMpirunTheTeardownTimeoutThenKills) {
  AttemptPhase p = launched();
  p.progress(110);
  p.failure_seen(130);
  EXPECT_EQ(p.phase(), Phase::TearingDown);
  EXPECT_DOUBLE_EQ(p.deadline(), 140);
  p.failure_seen(135);  // the first sign starts the clock
  p.progress(136);
  EXPECT_DOUBLE_EQ(p.deadline(), 140);
  expect_escalation(p, 141, Phase::TearingDown, Action::Kill, Phase::Killed, AttemptPhase::kNever);
}

// Two reasons to end the job: whichever runs out first escalates.
TEST(AttemptPhase, TheSoonerOfTwoDeadlinesWins) {
  AttemptPhase stopping = launched();
  stopping.stop_requested(120);  // until 420
  stopping.failure_seen(130);    // until 140: sooner
  EXPECT_EQ(stopping.phase(), Phase::TearingDown);
  EXPECT_DOUBLE_EQ(stopping.deadline(), 140);

  AttemptPhase failing = launched();
  failing.failure_seen(130);    // until 140
  failing.stop_requested(135);  // until 435: later
  EXPECT_EQ(failing.phase(), Phase::TearingDown);
  EXPECT_DOUBLE_EQ(failing.deadline(), 140);

  AttemptPhase querying = launched();
  querying.escalate(161);        // stalled: the query ends at 163
  querying.failure_seen(162);    // until 172: later
  querying.stop_requested(162);  // until 462: later
  EXPECT_EQ(querying.phase(), Phase::Querying);
  EXPECT_DOUBLE_EQ(querying.deadline(), 163);

  AttemptPhase slow = launched(true, 60, 600);  // --teardown-timeout longer than --stop-timeout
  slow.stop_requested(120);                     // until 420
  slow.failure_seen(130);                       // until 730: later
  EXPECT_EQ(slow.phase(), Phase::Stopping);
  EXPECT_DOUBLE_EQ(slow.deadline(), 420);
}

TEST(AttemptPhase, ASecondSignalTerminatesOnce) {
  AttemptPhase p = launched();
  p.stop_requested(120);
  EXPECT_EQ(p.kill_requested(130), Action::Terminate);
  EXPECT_EQ(p.phase(), Phase::Terminating);
  EXPECT_DOUBLE_EQ(p.deadline(), 133);
  EXPECT_EQ(p.kill_requested(131), Action::None);
  p.failure_seen(131);  // hpcrun is ending the job already
  EXPECT_EQ(p.phase(), Phase::Terminating);
  expect_escalation(p, 134, Phase::Terminating, Action::Kill, Phase::Killed, AttemptPhase::kNever);
  EXPECT_EQ(p.kill_requested(135), Action::None);
  AttemptPhase torn = launched();
  torn.failure_seen(130);
  torn.escalate(141);  // killed for the teardown
  EXPECT_EQ(torn.kill_requested(142), Action::None);
}

TEST(AttemptPhase, AfterMpirunEndsItsPipesGetTwoSeconds) {
  AttemptPhase p = launched();
  p.stop_requested(120);
  p.exited(150);
  EXPECT_TRUE(p.mpirun_gone());
  EXPECT_DOUBLE_EQ(p.deadline(), 152);
  p.failure_seen(151);
  p.stop_requested(151);
  EXPECT_EQ(p.kill_requested(151), Action::None);
  p.exited(151.5);
  EXPECT_DOUBLE_EQ(p.deadline(), 152);
  expect_escalation(p, 152.5, Phase::Draining, Action::CloseOutput, Phase::Draining, AttemptPhase::kNever);
  EXPECT_TRUE(p.mpirun_gone());
}

// ------------------------------------------------------------------ after an attempt: the policy

AttemptFacts ended(Verdict verdict, bool interrupted = false) {
  AttemptFacts f;
  f.verdict = verdict;
  f.interrupted = interrupted;
  f.outcome = "rank 1 on h2 exited with code 1";
  return f;
}

void expect_finish(const Decision& d, int code, const std::string& last_line) {
  EXPECT_EQ(d.next, Next::Finish);
  EXPECT_EQ(d.exit_code, code);
  EXPECT_EQ(d.last_line, last_line);
}

TEST(RelaunchPolicy, EndsThatNoRelaunchCanChange) {
  expect_finish(decide_after_attempt(ended(Verdict::Success), 0, 3), 0, "");
  AttemptFacts usage = ended(Verdict::UsageError);
  expect_finish(decide_after_attempt(usage, 0, 3), kExitUsage, "gave up: rank 1 on h2 exited with code 1");
  usage.program_error = "hpctrain: --lr: not a number: x";
  expect_finish(decide_after_attempt(usage, 0, 3), kExitUsage,
                "gave up: the program's usage error: hpctrain: --lr: not a number: x");
  expect_finish(decide_after_attempt(ended(Verdict::StoppedOutside), 0, 3), kExitCheckpointed,
                "the job stopped itself after a checkpoint; run hpcrun again to resume");
  for (Verdict v : {Verdict::Success, Verdict::UsageError, Verdict::StoppedOutside}) {
    const Decision d = decide_after_attempt(ended(v, true), 2, 3);
    EXPECT_EQ(d.next, Next::Finish);
    EXPECT_FALSE(d.failure);
    EXPECT_TRUE(d.blacklist.empty());
    EXPECT_FALSE(asks_slurm(v, false));
  }
}

TEST(RelaunchPolicy, AStopToGrowOrDrainRelaunchesWithoutCountingAFailure) {
  AttemptFacts grow = ended(Verdict::Stopped);
  grow.membership = true;
  const Decision d = decide_after_attempt(grow, 3, 3);  // even with no restart left
  EXPECT_EQ(d.next, Next::Relaunch);
  EXPECT_FALSE(d.failure);
  EXPECT_TRUE(d.blacklist.empty());
  EXPECT_EQ(d.relaunch_line, "");
  grow.interrupted = true;  // a signal outranks the change of hosts
  expect_finish(decide_after_attempt(grow, 0, 3), kExitCheckpointed, "stopped; run hpcrun again to resume");
  expect_finish(decide_after_attempt(ended(Verdict::Stopped, true), 0, 3), kExitCheckpointed,
                "stopped; run hpcrun again to resume");
  expect_finish(decide_after_attempt(ended(Verdict::Stopped), 0, 3), kExitGaveUp, "stopped; run hpcrun again to resume");
}

TEST(RelaunchPolicy, AFailureBlacklistsItsHostsAndRelaunchesUntilMaxRestarts) {
  AttemptFacts f = ended(Verdict::Failure);
  f.failed_hosts = {"h2", "h3"};
  EXPECT_TRUE(asks_slurm(Verdict::Failure, false));
  const Decision first = decide_after_attempt(f, 0, 3);
  EXPECT_EQ(first.next, Next::Relaunch);
  EXPECT_TRUE(first.failure);
  EXPECT_EQ(first.blacklist, f.failed_hosts);
  EXPECT_EQ(first.relaunch_line,
            "relaunching from the newest saved state, a host's snapshot or a checkpoint (restart 1 of 3)");
  const Decision third = decide_after_attempt(f, 2, 3);
  EXPECT_EQ(third.next, Next::Relaunch);
  EXPECT_NE(third.relaunch_line.find("(restart 3 of 3)"), std::string::npos);
  // The fourth failure with --max-restarts 3: the hosts are still blacklisted (the summary shows
  // them), and hpcrun gives up.
  const Decision fourth = decide_after_attempt(f, 3, 3);
  EXPECT_TRUE(fourth.failure);
  EXPECT_EQ(fourth.blacklist, f.failed_hosts);
  expect_finish(fourth, kExitGaveUp,
                "gave up: 4 failure(s), --max-restarts is 3; the last: rank 1 on h2 exited with code 1");
  expect_finish(decide_after_attempt(f, 0, 0), kExitGaveUp,
                "gave up: 1 failure(s), --max-restarts is 0; the last: rank 1 on h2 exited with code 1");
}

TEST(RelaunchPolicy, AFailureUnderASignalOrSlurmsPreemptionIsNotRelaunched) {
  AttemptFacts f = ended(Verdict::Failure, true);
  f.failed_hosts = {"h2"};
  EXPECT_FALSE(asks_slurm(Verdict::Failure, true));
  // One signal while the attempt failed by itself: a stop, from the newest saved state; 130 only
  // after a second signal killed the job.
  const Decision stopped = decide_after_attempt(f, 3, 3);
  expect_finish(stopped, kExitCheckpointed, "the attempt failed while hpcrun was asked to stop: nothing relaunched; "
                                            "run hpcrun again to resume from the newest saved state");
  EXPECT_FALSE(stopped.failure);
  EXPECT_TRUE(stopped.blacklist.empty());
  f.killed = true;
  const Decision killed = decide_after_attempt(f, 0, 3);
  expect_finish(killed, kExitKilled, "killed on request");
  EXPECT_FALSE(killed.failure);
  EXPECT_TRUE(killed.blacklist.empty());
  f.interrupted = f.killed = false;
  f.preempted_at = "2026-11-27T10:00:00";
  const Decision preempted = decide_after_attempt(f, 3, 3);  // not a failure: no restart is used up
  expect_finish(preempted, kExitCheckpointed,
                "Slurm chose this job for preemption at 2026-11-27T10:00:00 and ended its steps: not a host "
                "failure, nothing relaunched; the batch script requeues it (exit 75), and it resumes from the "
                "last checkpoint");
  EXPECT_FALSE(preempted.failure);
  EXPECT_TRUE(preempted.blacklist.empty());
}

TEST(RelaunchPolicy, NoHostsInTime) {
  EXPECT_EQ(exit_without_hosts(false), kExitGaveUp);
  EXPECT_EQ(exit_without_hosts(true), kExitCheckpointed);
}

}  // namespace
}  // namespace hpc::launch
