#include "options.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/lexical_cast.hpp>
#include <boost/program_options.hpp>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "blacklist.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// How long an hpctrain attempt waits for its checkpoint directory's lock (--checkpoint-lock-wait)
// beyond the program's --step-timeout (relaunch_lock_wait), and where it has none.
constexpr double kRelaunchLockMargin = 60;

// The program's --step-timeout (hpctrain's 10m where not given) and a minute; a minute where it
// has none (0) or hpctrain will refuse the value anyway.
std::string relaunch_lock_wait(const std::string& step_timeout) {
  double step = 600;
  if (!step_timeout.empty()) {
    try {
      step = parse_duration(step_timeout, "--step-timeout");
    } catch (const Error&) {
      step = 0;
    }
  }
  return options::duration_text(std::min(step > 0 ? step + kRelaunchLockMargin : kRelaunchLockMargin, kLongestWait));
}

std::vector<std::string> split_words(const std::string& s) {
  std::stringstream ss(s);
  std::vector<std::string> out;
  for (std::string w; ss >> w;) out.push_back(w);
  return out;
}

// The mpirun options that hpcrun sets for each attempt: given again in --mpi-args they would
// contradict its placement (mpirun refuses a second -np, or takes it and ignores the healthy hosts).
// "--n" is -np's alias too (mpirun --help lists it); -N, --npernode and --pernode place ranks per
// node, where hpcrun gives each host its slots, and mpirun's --do-not-launch run passed them
// (exit 0, its refusal only printed): every attempt then failed as a lost host.
const std::set<std::string> kOwnMpirunOptions = {"-np",         "--np",           "-n",         "--n",
                                                 "-c",          "-H",             "--host",     "-host",
                                                 "--hostfile",  "-hostfile",      "--machinefile", "-machinefile",
                                                 "--default-hostfile", "-N", "--npernode", "-npernode",
                                                 "--pernode",   "-pernode"};

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
  const std::string program = find_program(agent, &why);
  HPC_REQUIRE(!program.empty(), "--launch-agent ", agent, ": ", why,
              " (it starts the ranks on the other hosts and probes them)");
  require_safe_file(program, "--launch-agent");  // run as this user at every probe and launch
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
  // Not to be made in a folder another user may write to (not sticky): they could make it first,
  // or rename it away and read the job's logs where it was. Refused before it is made.
  require_safe_directory(dir, "--log-dir");
}

// hpcrun reads the heartbeat where the trainer writes it: a different directory would show no
// progress, and every attempt would be killed as stalled.
void check_checkpoint_dir(const LaunchOptions& o) {
  require_not_root_dir(o.checkpoint_dir, "--checkpoint-dir");
  std::error_code ec;
  HPC_REQUIRE(!fs::exists(o.checkpoint_dir, ec) || fs::is_directory(o.checkpoint_dir, ec), "--checkpoint-dir ",
              o.checkpoint_dir, ": not a directory");
  require_safe_directory(o.checkpoint_dir, "--checkpoint-dir");  // hpcrun writes membership-change there
  const std::string programs = program_value(o, "checkpoint-dir");
  if (!o.program_is_hpctrain) return;
  // None at all: hpctrain refused the options hpcrun adds for its directory ("--checkpoint-lock-wait
  // needs --checkpoint-dir", an option the user never gave), after hpcrun had made its log folder.
  HPC_REQUIRE(!programs.empty(), "hpcrun's --checkpoint-dir ", o.checkpoint_dir,
              " is not given to hpctrain, which writes its checkpoints and heartbeat where its own --checkpoint-dir "
              "says: give it once, to the program (hpctrain --checkpoint-dir ", o.checkpoint_dir, ")");
  HPC_REQUIRE(fs::weakly_canonical(fs::absolute(programs), ec) == fs::weakly_canonical(fs::absolute(o.checkpoint_dir), ec),
              "hpcrun's --checkpoint-dir ", o.checkpoint_dir, " is not the program's (", programs,
              "), where its heartbeat is: give it once, to the program");
}

// What hpcrun's command line gives: LaunchOptions, and the texts read further once every option is
// known (the host lists need --slots-per-host).
struct CommandLine : LaunchOptions {
  std::string hosts, hostfile, mpi_args_text;
  // The cooldown as the option writes it ("1m:10m").
  std::string cooldown = options::duration_text(cooldown_min) + ":" + options::duration_text(cooldown_max);
  bool help = false, version = false;
};

// LaunchOptions' member as CommandLine's, for the kit's factories.
template <class T>
T CommandLine::*own(T LaunchOptions::*m) {
  return m;
}

// Ranks hpcrun starts at most (-np, --min-np, --max-np).
constexpr int kMaxRanks = 1000000;

// --stall-timeout and --start-timeout: 0, or long enough for a start-up (kMinStallTimeout).
options::Check<double> start_up_or_zero(std::string counts, std::string zero) {
  return [=](const double& seconds, const std::string& shown) {
    HPC_REQUIRE(seconds == 0 || seconds >= kMinStallTimeout, shown, " ", show_duration(seconds),
                " is shorter than a start-up needs", counts, ": give at least ", show_duration(kMinStallTimeout),
                ", or 0 ", zero);
  };
}

// -x: a variable to set on every rank, which mpirun would only warn about, and start the ranks without.
void check_env_word(const std::string& e, const std::string& shown) {
  const std::string name = e.substr(0, e.find('='));
  // A name the shell and mpirun's -x take: letters, digits and _, not beginning with a digit.
  const bool word = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                    std::all_of(name.begin(), name.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                    });
  HPC_REQUIRE(word, shown, " '", e, "' is not NAME or NAME=VALUE (a NAME of letters, digits and _, not beginning "
              "with a digit)");
  HPC_REQUIRE(e.find('=') != std::string::npos || std::getenv(name.c_str()), shown, " ", name,
              ": not set in hpcrun's environment (export it, or give ", shown, " ", name, "=VALUE)");
}

// hpcrun's options, through the kit every command line uses (core/option_kit.hpp): each one's
// names, range and help are here, and only here; its default is its member's initialiser
// (LaunchOptions', or CommandLine's for a text read further).
using Entry = options::Entry<CommandLine>;
struct Group {
  const char* caption;  // --help's heading
  std::vector<Entry> entries;
};
using options::Presence;
using O = CommandLine;
using L = LaunchOptions;

using Default = options::Default;

// hpcrun's numbers, given to Boost as text and converted here as Boost would (lexical_cast: the values
// taken are the same). Boost converting them itself refused a value the type cannot hold
// (--max-restarts 99999999999, --straggler-factor 1e999) or no number of its kind (1e3 or ten for a
// count) with "the argument ('...') for option '...' is invalid", which names no range: such a text
// is refused here in the words of the option's range, `range`, and a number by `check` of the same
// range (the kit's). The kit's entry otherwise.
template <class At>
Entry number_read_here(options::Name name, At at, std::string help, options::Check<options::member_t<O, At>> check,
                       std::string range, Default shown = Default::Shown) {
  using T = options::member_t<O, At>;
  Entry e = options::number_at<O>(name, at, help, {}, shown);
  e.add = [=](po::options_description& d, O& o) {
    auto* v = po::value<std::string>();
    if (shown == Default::Shown) v->default_value(options::text(at(o)));
    d.add_options()(name.boost().c_str(), v, help.c_str());
  };
  e.read = [=](const po::variables_map& vm, O& o) {
    if (!vm.count(name.long_name)) return;
    const std::string& given = vm[name.long_name].as<std::string>();
    T v{};
    try {
      v = boost::lexical_cast<T>(given);
    } catch (const boost::bad_lexical_cast&) {
      usage_error(name.shown(), " must be ", range, ", got '", given, "'", options::out_of_range(given));
    }
    check(v, name.shown());
    at(o) = v;
  };
  return e;
}

// A count: a whole number from `lowest` to `highest`.
Entry whole_number(options::Name name, int L::*m, std::string help, int lowest, int highest,
                   Default shown = Default::Shown) {
  return number_read_here(std::move(name), options::member(own(m)), std::move(help), options::from_to(lowest, highest),
                          "a whole number from " + std::to_string(lowest) + " to " + std::to_string(highest), shown);
}

// Every wait an option gives (a duration): at most kLongestWait (core/duration.hpp), and `also`
// (its lower bound, where it has one; parse_duration refuses a negative one). Past it hpcrun's
// timers would not get the seconds given: 1e300h is infinite, and --probe-timeout, ssh's
// ConnectTimeout in whole seconds, overflowed an int.
options::Check<double> wait_at_most(options::Check<double> also = {}) {
  return [=](const double& seconds, const std::string& shown) {
    if (seconds > kLongestWait) {  // as given where it can be (2000h), not 2.77777777777778e+296h for 1e300 seconds
      const std::string got = !std::isfinite(seconds) ? "an endless one"
                              : seconds < 1e15        ? options::duration_text(seconds)
                                                      : options::text(seconds) + "s";
      usage_error(shown, " must be at most ", options::duration_text(kLongestWait), ", got ", got);
    }
    if (also) also(seconds, shown);
  };
}

Group where_group() {
  return {"Where: hosts and slots (one rank per slot)",
          {options::path({"hosts", 'H'}, &O::hosts, "hosts as host[:slots],... (as mpirun -H)", Presence::NotBlank),
           options::path("hostfile", &O::hostfile,
                         "Open MPI hostfile: 'host slots=N' per line (yours, no one else's to write)", Presence::NotBlank),
           options::path("host-discovery-script", own(&L::discovery_script),
                         "program printing the usable hosts, one 'host:slots' per line; run every "
                         "--discovery-interval, the job grows onto new hosts (and new slots) and is drained off vanished ones "
                         "(yours, no one else's to write)",
                         Presence::NotBlank),
           options::duration("discovery-interval", own(&L::discovery_interval),
                             "how often the discovery script runs, and the job looks for hosts to grow onto (with "
                             "any host list: a failed host back after its --blacklist-cooldown)",
                             wait_at_most(options::more_than(0.0))),
           whole_number("slots-per-host", &L::slots_per_host, "slots of a host given without ':slots'", 1, kMaxSlots)}};
}

Group size_group() {
  const Default none = Default::None;  // 0: not given
  return {"How many ranks (inside a Slurm job without host options: the allocation)",
          {whole_number({"np", 'n', "-np"}, &L::np, "ranks to start (-np; default: every slot, up to --max-np)", 1,
                        kMaxRanks, none),
           whole_number("min-np", &L::min_np,
                        "fewest ranks the job may run on (default: -np, else 1); below it hpcrun waits up to "
                        "--elastic-timeout for hosts",
                        1, kMaxRanks, none),
           whole_number("max-np", &L::max_np, "most ranks the job may grow to (default: -np, else unbounded)", 1,
                        kMaxRanks, none)}};
}

Group launch_group() {
  return {"How: the mpirun command",
          {options::noting_given(
               options::text_with_default("launch-agent", own(&L::launch_agent),
                                          "command that runs a command on a host (Open MPI's plm_rsh_agent), also "
                                          "used for health probes; ssh gets -o BatchMode=yes -o "
                                          "ConnectTimeout=<--probe-timeout>",
                                          Presence::NotBlank),
               &L::launch_agent_given),
           options::text_with_default("mpirun", own(&L::mpirun), "the mpirun to use", Presence::NotBlank),
           options::then(options::path("mpi-args", &O::mpi_args_text,
                                       "extra mpirun arguments, e.g. \"--mca btl_tcp_if_include eth0\""),
                         [](O& o) { o.mpi_args = split_mpi_args(o.mpi_args_text); }),
           options::repeated({"env", 'x'}, own(&L::env), "NAME or NAME=VALUE to set on every rank (repeatable)",
                             check_env_word),
           options::path("log-dir", own(&L::log_dir),
                         "one log per attempt and summary.json (default: CHECKPOINT_DIR/hpcrun, else ./hpcrun-logs)",
                         Presence::NotBlank),
           options::path("checkpoint-dir", own(&L::checkpoint_dir),
                         "the job's checkpoint directory, where its heartbeat is (default: the program's "
                         "--checkpoint-dir)",
                         Presence::NotBlank),
           options::flag("quiet", own(&L::quiet),
                         "only hpcrun's own lines on the terminal (the program's go to the logs)")}};
}

Entry start_timeout() {
  const std::string help = "how long an attempt may take from its launch to its first finished step (mpirun's "
                           "start-up, the program's set-up: a slow file system, a large dataset) before it is "
                           "killed and relaunched as a stall; default: --stall-timeout; at least " +
                           show_duration(kMinStallTimeout) + " (0: no limit)";
  Entry e = options::duration("start-timeout", own(&L::start_timeout), help,
                              wait_at_most(start_up_or_zero("", "for no limit")), Default::None);
  return options::then(options::noting_given(std::move(e), &L::start_timeout_given), [](O& o) {
    if (!o.start_timeout_given) o.start_timeout = o.stall_timeout;  // read before it
  });
}

Group recovery_group() {
  return {"Failures",
          {options::duration("stall-timeout", own(&L::stall_timeout),
                             "a job whose heartbeat shows no finished step (nor a checkpoint's write that moves) "
                             "for this long (from its launch, unless --start-timeout is given) is killed and "
                             "relaunched; at least " +
                                 show_duration(kMinStallTimeout) + " (0: off)",
                             wait_at_most(start_up_or_zero(" (it counts from the launch)", "to turn it off"))),
           start_timeout(),
           // No bound of its own: any count an int holds.
           number_read_here("max-restarts", options::member(own(&L::max_restarts)),
                            "failures to recover from before giving up (joins and drains do not count)",
                            options::at_least(0),
                            "a whole number from 0 to " + std::to_string(std::numeric_limits<int>::max())),
           options::then(options::text_with_default("blacklist-cooldown", &O::cooldown,
                                                    "MIN:MAX a failed host stays out: MIN, doubling with each failure "
                                                    "of that host, up to MAX; once it has run the job for MAX "
                                                    "since its last failure, its next one is MIN again"),
                         [](O& o) {
                           parse_cooldown(o.cooldown, &o.cooldown_min, &o.cooldown_max);
                           wait_at_most()(o.cooldown_max, "--blacklist-cooldown's MAX");
                         }),
           options::duration("elastic-timeout", own(&L::elastic_timeout),
                             "how long to wait for enough healthy slots (--min-np) before giving up", wait_at_most()),
           options::duration("probe-timeout", own(&L::probe_timeout),
                             "a host that does not answer a probe in this time is unhealthy",
                             wait_at_most(options::more_than(0.0))),
           options::duration("teardown-timeout", own(&L::teardown_timeout),
                             "how long mpirun may take to end a failed job before hpcrun kills it",
                             wait_at_most(options::more_than(0.0, "it is how long the ranks of a stalled job get to "
                                                                  "answer, and mpirun to end a failed job"))),
           options::duration("stop-timeout", own(&L::stop_timeout),
                             "how long a checkpoint-and-stop (a signal, growth, a drain) may take before the job is "
                             "killed (while its checkpoint is written, from the write's last synced chunk)",
                             wait_at_most(options::more_than(0.0, "0 would kill every job asked to checkpoint before "
                                                                  "it can")))}};
}

Group straggler_group() {
  static const char* const kFactorIs = "a host's busy time per step over the median host's";
  return {"Slow hosts (from the heartbeat of hpctrain with --checkpoint-dir)",
          {number_read_here(
               "straggler-factor", [](auto& o) -> auto& { return o.stragglers.factor; },
               "a host whose rank's own work per step takes this many times the median rank's is slow",
               options::more_than(1.0, kFactorIs), std::string("more than 1 (") + kFactorIs + ")"),
           options::duration_at<O>(
               "straggler-time", [](auto& o) -> auto& { return o.stragglers.seconds; },
               "a host slow for this long (its heartbeats' time, a gap counting up to 10 s) is named a straggler "
               "in hpcrun's log (once)",
               wait_at_most(options::more_than(0.0))),
           options::flag_at<O>(
               "drain-stragglers", [](auto& o) -> auto& { return o.stragglers.drain; },
               "drain a straggler at the next step boundary, as a host that leaves, and keep it out for its "
               "--blacklist-cooldown; the job goes on on the rest, if they have --min-np slots")}};
}

// Every option, in --help's groups and order; read in this order too (the first bad value is the one
// reported).
const std::vector<Group>& option_groups() {
  static const std::vector<Group> groups{
      where_group(), size_group(), launch_group(), recovery_group(), straggler_group(),
      {"General",
       {options::flag({"help", 'h'}, &O::help, "this help"), options::flag("version", &O::version, "print the version")}}};
  return groups;
}

// The Boost description of every option, bound to o.
po::options_description describe(CommandLine& o) {
  po::options_description all;
  for (const Group& g : option_groups()) {
    po::options_description group(g.caption);
    options::add(g.entries, group, o);
    all.add(group);
  }
  return all;
}

// mpirun's single-dash spellings ("-np 4") as Boost reads them ("--np 4").
std::string long_form(const std::string& arg) {
  for (const Group& g : option_groups())
    for (const Entry& e : g.entries)
      if (std::string l = options::long_form(e, arg); l != arg) return l;
  return arg;
}

// Whether the option `arg` names takes its value from the next argument: not a switch, not given
// its value in `arg` itself (--np=4, -Hhost). An unknown option is taken to (Boost refuses it).
bool value_follows(const po::options_description& all, const std::string& arg) {
  const bool is_long = arg[1] == '-';
  const size_t eq = arg.find('=');
  if (is_long && eq != std::string::npos) return false;
  const po::option_description* d = all.find_nothrow(is_long ? arg.substr(2) : arg.substr(0, 2), false);
  if (!d) return true;
  return d->semantic()->max_tokens() > 0 && (is_long || arg.size() == 2);
}

}  // namespace

int program_start(int argc, const char* const* argv) {
  CommandLine scratch;
  const po::options_description all = describe(scratch);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = long_form(argv[i]);
    if (arg == "--") return i + 1;
    if (arg.size() < 2 || arg[0] != '-') return i;
    if (value_follows(all, arg)) ++i;
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
  // Output in another form hides the rank tags hpcrun reads each rank's status lines by: every job,
  // finished or not, was judged failed ("never reported finishing") and relaunched.
  static const std::set<std::string> kOutputForms = {"--timestamp-output", "-timestamp-output", "--xml", "-xml"};
  for (const std::string& w : words) {
    HPC_REQUIRE(!kOwnMpirunOptions.count(w.substr(0, w.find('='))), "--mpi-args: ", w,
                " is hpcrun's to set for each attempt; give hpcrun -np, -H or --hostfile instead");
    HPC_REQUIRE(!kOutputForms.count(w), "--mpi-args: ", w,
                " changes the form of the ranks' output, whose tagged lines hpcrun reads to know how each rank ended; "
                "leave it out (hpcrun's log lines carry their time)");
  }
  // An option whose words are missing at the end would take hpcrun's own words that follow them
  // on mpirun's command line (its rank wrapper's path and options): --mca as a parameter's name
  // and value, which mpirun accepts, and the ranks would start without the wrapper, each attempt
  // a host failure. mpirun's --do-not-launch check cannot see it.
  struct WordsAfter {
    size_t count;
    const char* usage;
  };
  static const std::map<std::string, WordsAfter> kWordsAfter = {
      {"--mca", {2, "NAME VALUE"}}, {"-mca", {2, "NAME VALUE"}}, {"--gmca", {2, "NAME VALUE"}},
      {"-gmca", {2, "NAME VALUE"}}, {"-x", {1, "NAME[=VALUE]"}}};
  for (size_t i = 0; i < words.size(); ++i) {
    const auto wants = kWordsAfter.find(words[i]);
    if (wants == kWordsAfter.end()) continue;
    const size_t count = wants->second.count;
    HPC_REQUIRE(i + count < words.size(), "--mpi-args '", text, "': ", words[i], " needs ", count == 1 ? "a word" : "two words",
                " after it (", words[i], " ", wants->second.usage, ")");
    i += count;
  }
  return words;
}

namespace {
// Where --NAME's value stands in a program's arguments: the word after "--NAME", or the word
// "--NAME=V" itself (`joined`); nullopt when they do not give it.
struct ValueAt {
  size_t index;
  bool joined;
};
std::optional<ValueAt> find_program_option(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return ValueAt{i + 1, false};
    if (args[i].rfind(flag + "=", 0) == 0) return ValueAt{i, true};
  }
  return std::nullopt;
}
}  // namespace

std::string program_option(const std::vector<std::string>& args, const std::string& name) {
  const std::string flag = "--" + name;
  const std::optional<ValueAt> at = find_program_option(args, flag);
  if (!at) return "";
  return at->joined ? args[at->index].substr(flag.size() + 1) : args[at->index];
}

std::map<std::string, std::string> program_config_values(const std::string& path) {
  std::error_code ec;
  // hpctrain's limit on a config file's size too; a larger file is hpctrain's to refuse
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > options::kMaxConfigFileBytes || ec) return {};
  std::ifstream in(path);
  po::options_description wanted;
  for (const char* name : kProgramConfigOptions) wanted.add_options()(name, po::value<std::string>());
  std::map<std::string, std::string> out;
  try {
    for (const po::option& opt : po::parse_config_file(in, wanted, /*allow_unregistered=*/true).options)
      if (!opt.unregistered && !opt.value.empty() && !opt.value.front().empty()) out[opt.string_key] = opt.value.front();
  } catch (const po::error&) {
    return {};  // hpctrain's to report, in the first attempt
  }
  return out;
}

std::string program_value(const LaunchOptions& o, const std::string& name) {
  const std::string given = program_option(o.program, name);
  if (!given.empty()) return given;
  const auto found = o.program_config.find(name);
  return found == o.program_config.end() ? "" : found->second;
}

void set_program_option(std::vector<std::string>& args, const std::string& name, const std::string& value) {
  const std::string flag = "--" + name;
  if (const std::optional<ValueAt> at = find_program_option(args, flag))
    args[at->index] = at->joined ? flag + "=" + value : value;
  else
    args.insert(args.end(), {flag, value});
}

namespace {

// An option of hpcrun's whose value was left out takes the program as its value (`hpcrun -H a:2
// --np ./hpctrain --epochs 2`): the program's options are then read as hpcrun's, and the error
// named one of them ("unrecognised option '--epochs'"), not what went wrong. That said, or "".
std::string program_taken_as_a_value(const std::vector<std::string>& own, const po::options_description& all) {
  for (size_t i = 0; i + 1 < own.size(); ++i) {
    const std::string& arg = own[i];
    if (arg.size() < 2 || arg[0] != '-' || !value_follows(all, arg)) continue;
    const std::string& value = own[++i];
    std::string why;
    if (!value.empty() && value[0] != '-' && !find_program(value, &why).empty())
      return arg + " took the program " + value + " as its value: give " + arg + " one";
  }
  return "";
}

// False when --help or --version was printed.
bool parse_own(const std::vector<std::string>& own, CommandLine& o, po::variables_map* vm) {
  const po::options_description all = describe(o);
  try {
    po::store(po::command_line_parser(own).options(all).style(options::kCommandLineStyle).run(), *vm);
    po::notify(*vm);
  } catch (const po::unknown_option& e) {
    const std::string taken = program_taken_as_a_value(own, all);
    if (!taken.empty()) usage_error(options::what_of(e), " (", taken, ")");
    usage_error(options::unknown_option_text(e, all), " (hpcrun's options come before the program; try --help)");
  } catch (const po::error& e) {
    usage_error(options::what_of(e), " (hpcrun's options come before the program; try --help)");
  }
  if (o.help) {
    log::write_help(detail::concat(
        "Usage: hpcrun [options] [--] PROGRAM [ARGS...]\n"
                 "Starts PROGRAM through mpirun on the given hosts and keeps it running to completion: after a\n"
                 "failure it relaunches on the healthy hosts (hpctrain resumes from its last checkpoint), it grows\n"
                 "the job onto hosts that appear and drains it off hosts that leave.\n"
                 "Exit codes: 0 success; 1 gave up (the reason on one line); 2 bad input (hpcrun's or the program's);\n"
                 "75 stopped on request after a checkpoint (SIGTERM, SIGINT, SIGHUP, SIGUSR1 or SIGUSR2 to hpcrun), resume by\n"
        "running it again; 130 killed by a second such signal.\n",
        all));
    return false;
  }
  if (o.version) {
    log::write_help(detail::concat("hpcrun ", HPCTRAIN_VERSION, "\n"));
    return false;
  }
  return true;
}

// -np, --min-np and --max-np together (each is in its range, option_groups).
void settle_counts(LaunchOptions& o) {
  if (!o.min_np) o.min_np = o.np ? o.np : 1;
  if (!o.max_np && o.np) o.max_np = std::max(o.np, o.min_np);
  // -np against --max-np first: --min-np defaults to -np, and "-np 3 --max-np 2" was refused as
  // "--max-np 2 is below --min-np 3", an option the user never gave.
  HPC_REQUIRE(!o.np || !o.max_np || o.np <= o.max_np, "-np ", o.np, " is above --max-np ", o.max_np);
  HPC_REQUIRE(!o.np || o.np >= o.min_np, "-np ", o.np, " is below --min-np ", o.min_np);
  HPC_REQUIRE(!o.max_np || o.max_np >= o.min_np, "--max-np ", o.max_np, " is below --min-np ", o.min_np);
}

// One source of hosts: -H, --hostfile, the discovery script, Slurm's allocation, or this machine.
void choose_hosts(CommandLine& o) {
  const int sources = !o.hosts.empty() + !o.hostfile.empty() + !o.discovery_script.empty();
  HPC_REQUIRE(sources <= 1, "give one of -H, --hostfile and --host-discovery-script, not several");
  if (!o.hosts.empty()) {
    o.host_source = HostSource::List;
    o.static_hosts = parse_host_list(o.hosts, o.slots_per_host);
  } else if (!o.hostfile.empty()) {
    o.host_source = HostSource::Hostfile;
    require_safe_file(o.hostfile, "--hostfile");  // its hosts are where the job runs, as this user
    o.static_hosts = parse_hostfile(o.hostfile, o.slots_per_host);
  } else if (!o.discovery_script.empty()) {
    o.host_source = HostSource::Discovery;
    std::string why;
    const std::string script = find_program(o.discovery_script, &why);
    HPC_REQUIRE(!script.empty(), "--host-discovery-script ", o.discovery_script, ": ", why);
    require_safe_file(script, "--host-discovery-script");  // run as this user at every discovery
  } else if (std::getenv("SLURM_JOB_ID") && std::getenv("SLURM_JOB_NODELIST") && std::getenv("SLURM_TASKS_PER_NODE")) {
    o.host_source = HostSource::Slurm;
    o.static_hosts = slurm_hosts(std::getenv("SLURM_JOB_NODELIST"), std::getenv("SLURM_TASKS_PER_NODE"));
  } else {
    HPC_REQUIRE(o.np > 0, "no hosts: give -H, --hostfile or --host-discovery-script, run inside a Slurm job, "
                          "or give -np to run on this machine alone");
    // This machine alone is one host: as many ranks as -H localhost:N would allow.
    HPC_REQUIRE(o.np <= kMaxSlots, "-np ", o.np, " ranks on this machine alone (no host list) is more than a host's ",
                kMaxSlots, " slots: give -H, --hostfile or --host-discovery-script for more");
    o.host_source = HostSource::Local;
    o.static_hosts = {{"localhost", o.np}};
  }
}

void check_slots(const LaunchOptions& o) {
  if (o.host_source == HostSource::Discovery) return;
  const int slots = total_slots(o.static_hosts);
  // -np first: the --min-np it sets by default was named for an -np the hosts cannot hold.
  HPC_REQUIRE(!o.np || slots >= o.np, "-np ", o.np, " needs more slots than the hosts have (", slots, ": ",
              show_hosts(o.static_hosts), ")");
  HPC_REQUIRE(slots >= o.min_np, "--min-np ", o.min_np, " needs more slots than the hosts have (", slots, ": ",
              show_hosts(o.static_hosts), ")");
}

void read_program(LaunchOptions& o) {
  HPC_REQUIRE(!o.program.empty(), "no program to run: hpcrun [options] PROGRAM [ARGS...]");
  std::string why;
  HPC_REQUIRE(!find_program(o.program[0], &why).empty(), "program ", o.program[0], ": ", why);
  HPC_REQUIRE(!find_program(o.mpirun, &why).empty(), "--mpirun ", o.mpirun, ": ", why);
  o.program_is_hpctrain = std::filesystem::path(o.program[0]).filename() == "hpctrain";
  // hpcrun keeps a training going (relaunches resume it: --resume auto, which the other commands
  // do not take). `hpctrain evaluate ...` and the rest end in one go: mpirun runs them.
  const std::string command = o.program_is_hpctrain && o.program.size() > 1 ? o.program[1] : "train";
  HPC_REQUIRE(command == "train" || command.rfind('-', 0) == 0, "hpcrun runs trainings (hpctrain [train] ...), not '",
              o.program[0], " ", command, "': run it without hpcrun (mpirun -np N ", o.program[0], " ", command,
              " ..., or alone)");
  // A config file's checkpoint-dir or resume = none would otherwise go unseen: no heartbeat
  // watched, and the --resume auto below would override the file's fresh start.
  if (o.program_is_hpctrain) o.program_config = program_config_values(program_option(o.program, "config"));
  if (o.checkpoint_dir.empty()) o.checkpoint_dir = program_value(o, "checkpoint-dir");
  if (!o.checkpoint_dir.empty()) check_checkpoint_dir(o);
  // hpctrain's options hpcrun needs, where neither its command line nor its config file gave them.
  const auto by_default = [&o](const std::string& name, const std::string& value) {
    if (program_value(o, name).empty()) set_program_option(o.program, name, value);
  };
  // Every attempt after the first must continue from the last checkpoint.
  if (o.program_is_hpctrain) by_default("resume", "auto");
  if (o.program_is_hpctrain && !o.checkpoint_dir.empty()) {
    // A relaunch after a lost host may find the last attempt's rank 0 still alive there, cut off
    // from the other hosts but not from the shared storage, holding the directory's lock until
    // its own step watchdog ends it: up to its --step-timeout (10m by default) after its last
    // step, where mpirun, naming the lost daemon, ended the others at once. A wait of a minute
    // refused the relaunch as a usage error (exit 2: the job ended for good). A dead holder's lock
    // is taken at once (the kernel drops it), or after 30 s where its record stops changing.
    by_default("checkpoint-lock-wait", relaunch_lock_wait(program_value(o, "step-timeout")));
    // hpcrun watches the start-up itself (the heartbeat's first step, within --start-timeout):
    // hpctrain's own set-up limit is the same, not its 30m default, which would end a start-up
    // hpcrun was told to wait longer for (0: none either).
    by_default("start-timeout", options::duration_text(o.start_timeout));
  }
  if (o.log_dir.empty())
    o.log_dir = o.checkpoint_dir.empty() ? "hpcrun-logs" : (std::filesystem::path(o.checkpoint_dir) / "hpcrun").string();
  check_log_dir(o.log_dir);
}

}  // namespace

std::optional<LaunchOptions> parse_launch_options(int argc, const char* const* argv) {
  CommandLine o;
  const int start = program_start(argc, argv);
  std::vector<std::string> own;
  for (int i = 1; i < start; ++i)
    if (std::string(argv[i]) != "--") own.push_back(long_form(argv[i]));
  for (int i = start; i < argc; ++i) o.program.push_back(argv[i]);
  po::variables_map vm;
  if (!parse_own(own, o, &vm)) return std::nullopt;

  // In this order: the first bad value is the one reported.
  for (const Group& g : option_groups()) options::read(g.entries, vm, o);
  for (const Entry& e : straggler_group().entries)
    if (o.straggler_option.empty() && vm.count(e.name) && !vm[e.name].defaulted()) o.straggler_option = "--" + e.name;
  settle_counts(o);
  choose_hosts(o);
  check_slots(o);
  check_host_names(o);
  check_launch_agent(o);
  read_program(o);
  return LaunchOptions(std::move(o));
}

}  // namespace hpc::launch
