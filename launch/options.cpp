#include "options.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "blacklist.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/option_kit.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// How long an hpctrain attempt waits for its checkpoint directory's lock (--checkpoint-lock-wait).
constexpr const char* kRelaunchLockWait = "1m";

// hpcrun's switches: every other option takes one value.
const std::set<std::string> kSwitches = {"help", "h", "version", "quiet", "drain-stragglers"};
// Single-dash spellings people bring from mpirun and horovodrun.
std::string normalise(const std::string& arg) {
  if (arg == "-np" || arg == "-n") return "--np";
  if (arg.rfind("-np=", 0) == 0) return "--np=" + arg.substr(4);
  return arg;
}

std::vector<std::string> split_words(const std::string& s) {
  std::stringstream ss(s);
  std::vector<std::string> out;
  for (std::string w; ss >> w;) out.push_back(w);
  return out;
}

// The mpirun options that hpcrun sets for each attempt: given again in --mpi-args they would
// contradict its placement (mpirun refuses a second -np, or takes it and ignores the healthy hosts).
const std::set<std::string> kOwnMpirunOptions = {"-np", "--np", "-n", "-c", "-H", "--host", "-host", "--hostfile",
                                                 "-hostfile", "--machinefile", "-machinefile", "--default-hostfile"};

// A name that does not resolve is a typo, or a host the name service has lost: when the hosts that
// do resolve cannot give --min-np slots, nothing could ever start, and it is bad input; otherwise
// the health probe reports it (one line naming it), blacklists it, and the job runs on the others.
// A launch agent given may reach names this machine cannot resolve (an ssh config's Host aliases);
// Slurm's node names are Slurm's to reach (srun).
void check_host_names(const LaunchOptions& o) {
  if (o.launch_agent_given || (o.host_source != HostSource::List && o.host_source != HostSource::Hostfile)) return;
  int resolved_slots = 0;
  std::string unknown, why;
  for (const Host& h : o.static_hosts) {
    if (is_local_host(h.name) || resolves(h.name, unknown.empty() ? &why : nullptr)) resolved_slots += h.slots;
    else if (unknown.empty()) unknown = h.name;
  }
  HPC_REQUIRE(unknown.empty() || resolved_slots >= o.min_np, "unknown host '", unknown, "': ", why,
              " (check -H or --hostfile)");
}

// The launch agent runs on this machine: missing, it is a local typo, not the failure of every
// remote host it was meant to reach (which would be blacklisted for it).
void check_launch_agent(const LaunchOptions& o) {
  const bool remote = o.host_source == HostSource::Discovery ||
                      ((o.host_source == HostSource::List || o.host_source == HostSource::Hostfile) &&
                       std::any_of(o.static_hosts.begin(), o.static_hosts.end(),
                                   [](const Host& h) { return !is_local_host(h.name); }));
  if (!o.launch_agent_given && !remote) return;
  const std::string agent = split_words(o.launch_agent).front();
  std::string why;
  HPC_REQUIRE(!find_program(agent, &why).empty(), "--launch-agent ", agent, ": ", why,
              " (it starts the ranks on the other hosts and probes them)");
}

// Checked now, while nothing is written; the directory itself is created at the first launch.
void check_log_dir(const std::string& dir) {
  require_not_root_dir(dir, "--log-dir");
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  HPC_REQUIRE(fs::is_directory(p, ec), "log directory ", dir, " (--log-dir): ", p.string(), " is not a directory");
  HPC_REQUIRE(::access(p.c_str(), W_OK | X_OK) == 0, "log directory ", dir, " (--log-dir): cannot write in ",
              p.string(), ": ", std::strerror(errno));
}

void require_count(int v, const char* option, int lowest, int highest = 1000000) {
  HPC_REQUIRE(v >= lowest && v <= highest, "--", option, " must be a whole number from ", lowest, " to ", highest, ", got ", v);
}

// hpcrun reads the heartbeat where the trainer writes it: a different directory would show no
// progress, and every attempt would be killed as stalled.
void check_checkpoint_dir(const LaunchOptions& o) {
  require_not_root_dir(o.checkpoint_dir, "--checkpoint-dir");
  std::error_code ec;
  HPC_REQUIRE(!fs::exists(o.checkpoint_dir, ec) || fs::is_directory(o.checkpoint_dir, ec), "--checkpoint-dir ",
              o.checkpoint_dir, ": not a directory");
  const std::string programs = program_option(o.program, "checkpoint-dir");
  if (!o.program_is_hpctrain || programs.empty()) return;
  HPC_REQUIRE(fs::weakly_canonical(fs::absolute(programs), ec) == fs::weakly_canonical(fs::absolute(o.checkpoint_dir), ec),
              "hpcrun's --checkpoint-dir ", o.checkpoint_dir, " is not the program's (", programs,
              "), where its heartbeat is: give it once, to the program");
}

}  // namespace

int program_start(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = normalise(argv[i]);
    if (arg == "--") return i + 1;
    if (arg.size() < 2 || arg[0] != '-') return i;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(arg[1] == '-' ? 2 : 1, eq == std::string::npos ? std::string::npos : eq - (arg[1] == '-' ? 2 : 1));
    if (eq == std::string::npos && !kSwitches.count(name)) ++i;  // its value
  }
  return argc;
}

std::vector<std::string> split_mpi_args(const std::string& text) {
  // split_unix reads quotes and backslashes as a shell does, but closes a quote left open.
  char open = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\') ++i;
    else if (open && text[i] == open) open = 0;
    else if (!open && (text[i] == '"' || text[i] == '\'')) open = text[i];
  }
  HPC_REQUIRE(!open, "--mpi-args '", text, "': a ", open, " quote is not closed");
  std::vector<std::string> words;
  try {
    words = po::split_unix(text);
  } catch (const std::exception& e) {
    usage_error("--mpi-args '", text, "': ", e.what());
  }
  for (const std::string& w : words)
    HPC_REQUIRE(!kOwnMpirunOptions.count(w.substr(0, w.find('='))), "--mpi-args: ", w,
                " is hpcrun's to set for each attempt; give hpcrun -np, -H or --hostfile instead");
  return words;
}

std::string program_option(const std::vector<std::string>& args, const std::string& name) {
  const std::string flag = "--" + name;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return "";
}

namespace {

// The option values hpcrun reads itself (durations, host lists, mpirun's words) before they go
// into LaunchOptions.
struct RawOptions {
  std::string hosts, hostfile, start, mpi_args;
  // LaunchOptions' cooldown, written as the option reads it ("1m:10m").
  std::string cooldown = options::duration_text(LaunchOptions{}.cooldown_min) + ":" +
                         options::duration_text(LaunchOptions{}.cooldown_max);
};

// hpcrun's durations, through the kit every command line uses (core/option_kit.hpp): each one's
// default is LaunchOptions' initialiser, shown in --help as it is written ("10m").
using Entry = options::Entry<LaunchOptions>;
const std::vector<Entry>& durations() {
  static const std::vector<Entry> table{
      options::duration("discovery-interval", &LaunchOptions::discovery_interval,
                        "how often the discovery script runs"),
      options::duration("stall-timeout", &LaunchOptions::stall_timeout,
                        "a job whose heartbeat shows no finished step for this long (from its launch, unless "
                        "--start-timeout is given) is killed and relaunched; at least " +
                            show_duration(kMinStallTimeout) + " (0: off)"),
      options::duration("probe-timeout", &LaunchOptions::probe_timeout,
                        "a host that does not answer a probe in this time is unhealthy"),
      options::duration("teardown-timeout", &LaunchOptions::teardown_timeout,
                        "how long mpirun may take to end a failed job before hpcrun kills it"),
      options::duration("stop-timeout", &LaunchOptions::stop_timeout,
                        "how long a checkpoint-and-stop (a signal, growth, a drain) may take before the job is killed"),
      options::duration("elastic-timeout", &LaunchOptions::elastic_timeout,
                        "how long to wait for enough healthy slots (--min-np) before giving up"),
      options::duration_at<LaunchOptions>(
          "straggler-time", [](auto& o) -> auto& { return o.stragglers.seconds; },
          "a host slow for this long is named a straggler in hpcrun's log (once)"),
  };
  return table;
}

// Adds the duration NAME (above) to a group of --help.
void add_duration(const char* name, po::options_description& group, LaunchOptions& o) {
  for (const Entry& e : durations())
    if (e.name == name) return e.add(group, o);
  HPC_CHECK(false, "no hpcrun duration --", name);
}

po::options_description where_options(LaunchOptions& o, RawOptions& raw) {
  po::options_description where("Where: hosts and slots (one rank per slot)");
  where.add_options()
      ("hosts,H", po::value(&raw.hosts), "hosts as host[:slots],... (as mpirun -H)")
      ("hostfile", po::value(&raw.hostfile), "Open MPI hostfile: 'host slots=N' per line")
      ("host-discovery-script", po::value(&o.discovery_script),
       "program printing the usable hosts, one 'host:slots' per line; run every --discovery-interval, "
       "the job grows onto new hosts and is drained off vanished ones");
  add_duration("discovery-interval", where, o);
  where.add_options()("slots-per-host", po::value(&o.slots_per_host)->default_value(o.slots_per_host),
                      "slots of a host given without ':slots'");
  return where;
}

po::options_description size_options(LaunchOptions& o) {
  po::options_description size("How many ranks (inside a Slurm job without host options: the allocation)");
  size.add_options()
      ("np", po::value(&o.np), "ranks to start (-np; default: every slot, up to --max-np)")
      ("min-np", po::value(&o.min_np), "fewest ranks the job may run on (default: -np, else 1); "
                                       "below it hpcrun waits up to --elastic-timeout for hosts")
      ("max-np", po::value(&o.max_np), "most ranks the job may grow to (default: -np, else unbounded)");
  return size;
}

po::options_description launch_options(LaunchOptions& o, RawOptions& raw) {
  po::options_description launch("How: the mpirun command");
  launch.add_options()
      ("launch-agent", po::value(&o.launch_agent)->default_value(o.launch_agent),
       "command that runs a command on a host (Open MPI's plm_rsh_agent), also used for health probes; "
       "ssh gets -o BatchMode=yes -o ConnectTimeout=<--probe-timeout>")
      ("mpirun", po::value(&o.mpirun)->default_value(o.mpirun), "the mpirun to use")
      ("mpi-args", po::value(&raw.mpi_args), "extra mpirun arguments, e.g. \"--mca btl_tcp_if_include eth0\"")
      ("env,x", po::value(&o.env)->composing(), "NAME or NAME=VALUE to set on every rank (repeatable)")
      ("log-dir", po::value(&o.log_dir), "one log per attempt and summary.json (default: CHECKPOINT_DIR/hpcrun, "
                                         "else ./hpcrun-logs)")
      ("checkpoint-dir", po::value(&o.checkpoint_dir),
       "the job's checkpoint directory, where its heartbeat is (default: the program's --checkpoint-dir)")
      ("quiet", po::bool_switch(&o.quiet), "only hpcrun's own lines on the terminal (the program's go to the logs)");
  return launch;
}

po::options_description recovery_options(LaunchOptions& o, RawOptions& raw) {
  po::options_description recovery("Failures");
  add_duration("stall-timeout", recovery, o);
  recovery.add_options()
      ("start-timeout", po::value(&raw.start),
       ("how long an attempt may take from its launch to its first finished step (mpirun's start-up, the "
        "program's set-up: a slow file system, a large dataset) before it is killed and relaunched as a stall; "
        "default: --stall-timeout; at least " + show_duration(kMinStallTimeout) + " (0: no limit)").c_str())
      ("max-restarts", po::value(&o.max_restarts)->default_value(o.max_restarts),
       "failures to recover from before giving up (joins and drains do not count)")
      ("blacklist-cooldown", po::value(&raw.cooldown)->default_value(raw.cooldown),
       "MIN:MAX a failed host stays out: MIN, doubling with each failure of that host, up to MAX");
  for (const char* name : {"elastic-timeout", "probe-timeout", "teardown-timeout", "stop-timeout"})
    add_duration(name, recovery, o);
  return recovery;
}

po::options_description straggler_options(LaunchOptions& o) {
  po::options_description stragglers("Slow hosts (from the heartbeat of hpctrain with --checkpoint-dir)");
  stragglers.add_options()
      ("straggler-factor", po::value(&o.stragglers.factor)->default_value(o.stragglers.factor),
       "a host whose rank's own work per step takes this many times the median rank's is slow");
  add_duration("straggler-time", stragglers, o);
  stragglers.add_options()
      ("drain-stragglers", po::bool_switch(&o.stragglers.drain),
       "drain a straggler at the next step boundary, as a host that leaves, and keep it out for its "
       "--blacklist-cooldown; the job goes on on the rest, if they have --min-np slots");
  return stragglers;
}

// False when --help or --version was printed.
bool parse_own(const std::vector<std::string>& own, const po::options_description& all, po::variables_map* vm) {
  try {
    po::store(po::command_line_parser(own).options(all).style(po::command_line_style::default_style &
                                                              ~po::command_line_style::allow_guessing).run(),
              *vm);
    po::notify(*vm);
  } catch (const po::error& e) {
    usage_error(e.what(), " (hpcrun's options come before the program; try --help)");
  }
  if (vm->count("help")) {
    std::cout << "Usage: hpcrun [options] [--] PROGRAM [ARGS...]\n"
                 "Starts PROGRAM through mpirun on the given hosts and keeps it running to completion: after a\n"
                 "failure it relaunches on the healthy hosts (hpctrain resumes from its last checkpoint), it grows\n"
                 "the job onto hosts that appear and drains it off hosts that leave.\n"
                 "Exit codes: 0 success; 1 gave up (the reason on one line); 2 bad input (hpcrun's or the program's);\n"
                 "75 stopped on request after a checkpoint (SIGTERM, SIGINT or SIGUSR1 to hpcrun), resume by running\n"
                 "it again.\n"
              << all;
    return false;
  }
  if (vm->count("version")) {
    std::cout << "hpcrun " << HPCTRAIN_VERSION << "\n";
    return false;
  }
  return true;
}

void read_timeouts(const po::variables_map& vm, const RawOptions& raw, LaunchOptions& o) {
  options::read(durations(), vm, o);
  o.start_timeout_given = !raw.start.empty();
  o.start_timeout = o.start_timeout_given ? parse_duration(raw.start, "start-timeout") : o.stall_timeout;
  parse_cooldown(raw.cooldown, &o.cooldown_min, &o.cooldown_max);
  HPC_REQUIRE(o.stragglers.seconds > 0, "--straggler-time must be more than 0");
  HPC_REQUIRE(o.stragglers.factor > 1 && std::isfinite(o.stragglers.factor), "--straggler-factor must be more than 1 "
              "(a host's busy time per step over the median host's), got ", o.stragglers.factor);
  HPC_REQUIRE(o.discovery_interval > 0, "--discovery-interval must be more than 0");
  HPC_REQUIRE(o.probe_timeout > 0, "--probe-timeout must be more than 0");
  HPC_REQUIRE(o.teardown_timeout > 0, "--teardown-timeout must be more than 0 (it is how long the ranks of a "
                                      "stalled job get to answer, and mpirun to end a failed job)");
  HPC_REQUIRE(o.stop_timeout > 0, "--stop-timeout must be more than 0 (0 would kill every job asked to "
                                  "checkpoint before it can)");
  HPC_REQUIRE(o.stall_timeout == 0 || o.stall_timeout >= kMinStallTimeout, "--stall-timeout ", show_duration(o.stall_timeout),
              " is shorter than a start-up needs (it counts from the launch): give at least ",
              show_duration(kMinStallTimeout), ", or 0 to turn it off");
  HPC_REQUIRE(o.start_timeout == 0 || o.start_timeout >= kMinStallTimeout, "--start-timeout ",
              show_duration(o.start_timeout), " is shorter than a start-up needs: give at least ",
              show_duration(kMinStallTimeout), ", or 0 for no limit");
}

void read_counts(const po::variables_map& vm, LaunchOptions& o) {
  HPC_REQUIRE(o.max_restarts >= 0, "--max-restarts must be 0 or more, got ", o.max_restarts);
  require_count(o.slots_per_host, "slots-per-host", 1, 4096);  // as host:slots
  if (vm.count("np")) require_count(o.np, "np", 1);
  if (vm.count("min-np")) require_count(o.min_np, "min-np", 1);
  if (vm.count("max-np")) require_count(o.max_np, "max-np", 1);
  if (!o.min_np) o.min_np = o.np ? o.np : 1;
  if (!o.max_np && o.np) o.max_np = std::max(o.np, o.min_np);
  HPC_REQUIRE(!o.max_np || o.max_np >= o.min_np, "--max-np ", o.max_np, " is below --min-np ", o.min_np);
  HPC_REQUIRE(!o.np || o.np >= o.min_np, "-np ", o.np, " is below --min-np ", o.min_np);
  HPC_REQUIRE(!o.np || !o.max_np || o.np <= o.max_np, "-np ", o.np, " is above --max-np ", o.max_np);
}

void read_launch(const po::variables_map& vm, const RawOptions& raw, LaunchOptions& o) {
  o.mpi_args = split_mpi_args(raw.mpi_args);
  o.launch_agent_given = !vm["launch-agent"].defaulted();
  HPC_REQUIRE(!split_words(o.launch_agent).empty(), "--launch-agent is empty");
  // An empty value is an unset variable in a script, never a wish for the default.
  for (const char* name : {"log-dir", "checkpoint-dir", "mpirun", "host-discovery-script"})
    HPC_REQUIRE(!vm.count(name) || !vm[name].as<std::string>().empty(), "--", name,
                " is empty (an unset variable?): give a path or leave the option out");
  for (const std::string& e : o.env) {
    const std::string name = e.substr(0, e.find('='));
    HPC_REQUIRE(!name.empty() && name.find_first_of(" \t\n") == std::string::npos, "-x '", e,
                "' is not NAME or NAME=VALUE");
    // mpirun only warns, and starts the ranks without it.
    HPC_REQUIRE(e.find('=') != std::string::npos || std::getenv(name.c_str()), "-x ", name,
                ": not set in hpcrun's environment (export it, or give -x ", name, "=VALUE)");
  }
}

// One source of hosts: -H, --hostfile, the discovery script, Slurm's allocation, or this machine.
void choose_hosts(const po::variables_map& vm, const RawOptions& raw, LaunchOptions& o) {
  const int sources = !raw.hosts.empty() + !raw.hostfile.empty() + !o.discovery_script.empty();
  HPC_REQUIRE(sources <= 1, "give one of -H, --hostfile and --host-discovery-script, not several");
  HPC_REQUIRE(!vm.count("hosts") || !raw.hosts.empty(), "-H is empty: name at least one host");
  HPC_REQUIRE(!vm.count("hostfile") || !raw.hostfile.empty(), "--hostfile is empty");
  if (!raw.hosts.empty()) {
    o.host_source = HostSource::List;
    o.static_hosts = parse_host_list(raw.hosts, o.slots_per_host);
  } else if (!raw.hostfile.empty()) {
    o.host_source = HostSource::Hostfile;
    o.static_hosts = parse_hostfile(raw.hostfile, o.slots_per_host);
  } else if (!o.discovery_script.empty()) {
    o.host_source = HostSource::Discovery;
    std::string why;
    HPC_REQUIRE(!find_program(o.discovery_script, &why).empty(), "--host-discovery-script ", o.discovery_script,
                ": ", why);
  } else if (std::getenv("SLURM_JOB_ID") && std::getenv("SLURM_JOB_NODELIST") && std::getenv("SLURM_TASKS_PER_NODE")) {
    o.host_source = HostSource::Slurm;
    o.static_hosts = slurm_hosts(std::getenv("SLURM_JOB_NODELIST"), std::getenv("SLURM_TASKS_PER_NODE"));
  } else {
    HPC_REQUIRE(o.np > 0, "no hosts: give -H, --hostfile or --host-discovery-script, run inside a Slurm job, "
                          "or give -np to run on this machine alone");
    o.host_source = HostSource::Local;
    o.static_hosts = {{"localhost", o.np}};
  }
}

void check_slots(const LaunchOptions& o) {
  if (o.host_source == HostSource::Discovery) return;
  const int slots = total_slots(o.static_hosts);
  HPC_REQUIRE(slots >= o.min_np, "--min-np ", o.min_np, " needs more slots than the hosts have (", slots, ": ",
              show_hosts(o.static_hosts), ")");
  HPC_REQUIRE(!o.np || slots >= o.np, "-np ", o.np, " needs more slots than the hosts have (", slots, ": ",
              show_hosts(o.static_hosts), ")");
}

void read_program(LaunchOptions& o) {
  HPC_REQUIRE(!o.program.empty(), "no program to run: hpcrun [options] PROGRAM [ARGS...]");
  std::string why;
  HPC_REQUIRE(!find_program(o.program[0], &why).empty(), "program ", o.program[0], ": ", why);
  HPC_REQUIRE(!find_program(o.mpirun, &why).empty(), "--mpirun ", o.mpirun, ": ", why);
  o.program_is_hpctrain = std::filesystem::path(o.program[0]).filename() == "hpctrain";
  if (o.checkpoint_dir.empty()) o.checkpoint_dir = program_option(o.program, "checkpoint-dir");
  if (!o.checkpoint_dir.empty()) check_checkpoint_dir(o);
  if (o.program_is_hpctrain && program_option(o.program, "resume").empty()) {
    // Every attempt after the first must continue from the last checkpoint.
    o.program.push_back("--resume");
    o.program.push_back("auto");
  }
  if (o.program_is_hpctrain && !o.checkpoint_dir.empty() && program_option(o.program, "checkpoint-lock-wait").empty()) {
    // A relaunch after a lost host may find the last attempt's rank 0 still alive there, holding
    // the directory's lock until its own step watchdog ends it (about when the other ranks' did).
    o.program.push_back("--checkpoint-lock-wait");
    o.program.push_back(kRelaunchLockWait);
  }
  if (o.log_dir.empty())
    o.log_dir = o.checkpoint_dir.empty() ? "hpcrun-logs" : (std::filesystem::path(o.checkpoint_dir) / "hpcrun").string();
  check_log_dir(o.log_dir);
}

}  // namespace

std::optional<LaunchOptions> parse_launch_options(int argc, const char* const* argv) {
  LaunchOptions o;
  const int start = program_start(argc, argv);
  std::vector<std::string> own;
  for (int i = 1; i < start; ++i)
    if (std::string(argv[i]) != "--") own.push_back(normalise(argv[i]));
  for (int i = start; i < argc; ++i) o.program.push_back(argv[i]);

  RawOptions raw;
  po::options_description general("General");
  general.add_options()("help,h", "this help")("version", "print the version");
  po::options_description all;
  all.add(where_options(o, raw)).add(size_options(o)).add(launch_options(o, raw)).add(recovery_options(o, raw));
  all.add(straggler_options(o)).add(general);
  po::variables_map vm;
  if (!parse_own(own, all, &vm)) return std::nullopt;

  // In this order: the first bad value is the one reported.
  read_timeouts(vm, raw, o);
  read_counts(vm, o);
  read_launch(vm, raw, o);
  choose_hosts(vm, raw, o);
  check_slots(o);
  check_host_names(o);
  check_launch_agent(o);
  read_program(o);
  return o;
}

}  // namespace hpc::launch
