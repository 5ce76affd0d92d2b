// hpcrun's command line: `hpcrun [options] [--] PROGRAM [ARGS...]`. Option names follow
// horovodrun and mpirun where they have one (-np, -H, --hostfile, --min-np, --max-np,
// --host-discovery-script, --blacklist-cooldown, --elastic-timeout, -x). Each option is one entry of
// the option kit (core/option_kit.hpp) in options.cpp: its names, range and help there, its default
// the member's initialiser here.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hosts.hpp"
#include "straggler_policy.hpp"

namespace hpc::launch {

enum class HostSource { List, Hostfile, Discovery, Slurm, Local };

struct LaunchOptions {
  // Hosts
  HostSource host_source = HostSource::Local;
  HostList static_hosts;         // List, Hostfile, Slurm, Local
  std::string discovery_script;  // Discovery
  double discovery_interval = 5;
  int slots_per_host = 1;
  // Size: ranks to start, at least, at most (0: not given)
  int np = 0, min_np = 0, max_np = 0;
  // Launch
  std::string mpirun = "mpirun";
  std::string launch_agent = "ssh";
  bool launch_agent_given = false;
  std::vector<std::string> mpi_args;
  std::vector<std::string> env;  // NAME or NAME=VALUE, forwarded with mpirun -x
  std::string log_dir;
  std::string checkpoint_dir;  // where the trainer's heartbeat is
  // Monitoring and recovery (seconds)
  double stall_timeout = 600;
  double start_timeout = 600;  // from the launch to the first step; --stall-timeout unless given
  bool start_timeout_given = false;
  double probe_timeout = 10;
  double teardown_timeout = 10;
  double stop_timeout = 300;
  double elastic_timeout = 600;
  double cooldown_min = 60, cooldown_max = 600;
  int max_restarts = 3;
  StragglerPolicy stragglers;  // --straggler-factor, --straggler-time, --drain-stragglers
  // The first of those the command line gave ("" when none): hpcrun warns when the job gives them
  // no heartbeat to act on.
  std::string straggler_option;
  bool quiet = false;
  // The program and its arguments, as given (plus --resume auto for hpctrain)
  std::vector<std::string> program;
  bool program_is_hpctrain = false;
  // What hpctrain's config file (its --config) gives the options hpcrun acts on (kProgramConfigOptions),
  // read once before the first attempt; its command line's values win over these, as in hpctrain.
  std::map<std::string, std::string> program_config;
};

// hpctrain's options that hpcrun reads (where its heartbeat is, how it starts) or sets when the
// program does not give them.
inline const char* const kProgramConfigOptions[] = {"checkpoint-dir", "resume", "checkpoint-lock-wait",
                                                     "start-timeout", "step-timeout"};

// The shortest --stall-timeout and --start-timeout (seconds; 0 turns each off): the stall clock
// counts from the launch unless --start-timeout is given, and mpirun's start-up alone takes a
// second or more (several across hosts) before the program has even begun, whose heartbeat then
// changes at most once a second.
constexpr double kMinStallTimeout = 5;

// nullopt when --help or --version was printed. Bad input throws a usage error.
std::optional<LaunchOptions> parse_launch_options(int argc, const char* const* argv);

// Pure helpers, tested on their own.
// Where hpcrun's options end and the program begins (index into argv; argc when none).
int program_start(int argc, const char* const* argv);
// The value of --NAME in a program's arguments ("--NAME V" or "--NAME=V"), or "".
std::string program_option(const std::vector<std::string>& args, const std::string& name);
// What hpctrain's config file at PATH gives the options in kProgramConfigOptions, read as hpctrain
// reads it (name = value lines, '#' comments; other names passed over). Only a regular file of at
// most 1 MiB: a pipe (--config <(generate)) read here would be empty for hpctrain. A file that
// cannot be read or parsed gives nothing: hpctrain refuses it in the first attempt (exit 2).
std::map<std::string, std::string> program_config_values(const std::string& path);
// The program's value of --NAME: its arguments', else its config file's (hpctrain's --config,
// LaunchOptions::program_config), else "".
std::string program_value(const LaunchOptions& o, const std::string& name);
// Gives --NAME the value V: in place where the program's arguments set it (either form), else
// as --NAME V at their end (which overrides a config file's NAME: hpctrain's command line wins).
void set_program_option(std::vector<std::string>& args, const std::string& name, const std::string& value);
// --mpi-args as the words mpirun gets: split as a shell would (quotes, backslashes); an unclosed
// quote, or an option hpcrun sets itself for each attempt (-np, -H, --hostfile, ...), is a usage error.
std::vector<std::string> split_mpi_args(const std::string& text);

}  // namespace hpc::launch
