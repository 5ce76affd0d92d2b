// The text inputs users and their schedulers hand hpctrain and hpcrun: the first byte picks the
// reader, the rest is its text.
//   0 hpcrun -H's host list            5 a duration (--step-timeout and the like)
//   1 a hostfile (--hostfile)          6 an hpctrain --config file (parse_options)
//   2 a discovery script's output      7 a packed dataset's manifest (DIR/train.json)
//   3 SLURM_JOB_NODELIST, a newline,   8 a packed dataset's classes.txt
//     SLURM_TASKS_PER_NODE             9 a heartbeat file (hpcrun reads rank 0's)
//   4 scontrol's job record            10 a rank's status and alive lines, mpirun's tagged output
//                                      11 the config file as hpcrun reads hpctrain's
#include <cstdint>
#include <string>

#include "ckpt/store.hpp"
#include "contract.hpp"
#include "core/duration.hpp"
#include "data/shards.hpp"
#include "hosts.hpp"
#include "options.hpp"
#include "rank_report.hpp"
#include "train/options/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hpc;
  if (size < 1) return 0;
  const int reader = data[0] % 12;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const fuzz::Scratch& scratch = fuzz::Scratch::get();
  const auto file = [&](const std::string& name) {
    return scratch.write(name, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  };
  fuzz::usage_error_or_success([&] {
    switch (reader) {
      case 0: (void)launch::parse_host_list(text, 1); break;
      case 1: (void)launch::parse_hostfile(file("hostfile"), 1); break;
      case 2: (void)launch::parse_discovery_output(text, 1, "the discovery script"); break;
      case 3: {
        const size_t nl = text.find('\n');
        (void)launch::slurm_hosts(text.substr(0, nl), nl == std::string::npos ? "1" : text.substr(nl + 1));
        break;
      }
      case 4: (void)launch::slurm_preempt_time(text); break;
      case 5: (void)parse_duration(text, "--step-timeout"); break;
      case 6: {
        const std::string path = file("hpctrain.conf");
        const char* argv[] = {"hpctrain", "--config", path.c_str()};
        (void)train::parse_options(3, argv, /*speak=*/false);
        break;
      }
      case 7:
        file("train.json");
        (void)data::read_split_manifest(scratch.dir(), "train");
        break;
      case 8:
        file("classes.txt");
        (void)data::read_class_names(scratch.dir());
        break;
      case 9:
        file("heartbeat");
        (void)ckpt::heartbeat_step(ckpt::read_heartbeat(scratch.dir()));
        break;
      case 10: {
        const launch::TaggedLine line = launch::parse_tagged(text, true);  // as hpcrun reads mpirun's
        launch::RankReport report;
        int rank = -1;
        (void)launch::parse_report(line.text, &report);
        (void)launch::parse_alive(line.text, &rank);
        break;
      }
      default: (void)launch::program_config_values(file("hpctrain.conf")); break;
    }
  });
  return 0;
}
