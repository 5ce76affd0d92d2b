// hpcdata-pack: packs an image folder (SRC/<class>/<image>.jpg) into shards for hpctrain.
// Normally run as `hpcdata pack` (datasets/hpcdata); exit codes 0 done, 1 bad data or storage,
// 2 bad usage, 128 + N stopped by signal N.
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>

#include "core/cpus.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "core/standard_streams.hpp"
#include "data/pack.hpp"

namespace po = boost::program_options;

namespace {

// A stop signal (Ctrl-C, a job's end) makes the packing give up before its commit, so OUT is
// left as it was and the new shards are removed, instead of dying with them half-written.
std::atomic<bool> stop_requested{false};
volatile std::sig_atomic_t stop_signal = 0;

void on_stop_signal(int sig) {
  stop_signal = sig;
  stop_requested = true;
}

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  // Its reader gone (`| head`, a closed terminal): the progress lines fail, the packing goes on.
  // (Killed by SIGPIPE, it left its finished shards, a .part file and a new OUT behind.)
  std::signal(SIGPIPE, SIG_IGN);
}

// What the command line asks for: the packing's options, and how its lines look.
struct Command {
  hpc::data::PackOptions o;
  bool quiet = false;
  std::string progress = "auto", stamps = "auto";
  std::string seed;  // read as text: a number type would take -1 as 2^64 - 1
};

// The options --help shows, bound to c's members (their initial values are the defaults shown).
po::options_description shown_options(Command& c) {
  hpc::data::PackOptions& o = c.o;
  // "Usage: ": help2man makes the man page's SYNOPSIS of it.
  po::options_description desc(
      "Usage: hpcdata-pack SRC OUT [options]   (run by hpcdata pack SRC OUT [options])\n"
      "Packs SRC/<class>/<image>.jpg into OUT/<split>-gG-NNNNN-of-MMMMM.hpcs shards,\n"
      "OUT/<split>.json (the split's manifest, replaced last: a packing that fails or is stopped\n"
      "leaves OUT as it was) and OUT/classes.txt. Options");
  desc.add_options()("help,h", "this help")("version", "print the version (hpctrain's, which it is built with)")("split", po::value(&o.split)->default_value(o.split), "train or val")(
      "images-per-shard", po::value(&o.images_per_shard)->default_value(o.images_per_shard), "images in each shard")(
      "resize", po::value(&o.resize)->default_value(0),
      "scale each image's shorter side down to this many pixels (0: keep the images as they are)")(
      "quality", po::value(&o.quality)->default_value(o.quality), "JPEG quality of resized images, and of CMYK ones packed as RGB (1..100)")(
      // No default shown as a number: it is the CPUs of the machine that runs it, not of the one
      // that made the man page.
      "threads", po::value(&o.threads),
      "images decoded in parallel (one shard each; default: the CPUs this process may use, its affinity and "
      "cgroup quota)")(
      "skip-corrupt", po::bool_switch(&o.skip_corrupt),
      "skip images that do not decode, listing them in <split>.json (default: fail naming the first)")(
      "seed", po::value(&c.seed)->default_value(c.seed), "seed of the order images take in the shards")(
      "progress", po::value(&c.progress)->default_value(c.progress),
      "auto (a line redrawn in place when stderr is an interactive terminal, not a launcher's or a file; else "
      "lines), bar, lines (one every tenth of the images) or off")(
      "log-timestamps", po::value(&c.stamps)->default_value(c.stamps),
      "start progress and summary lines with the UTC time: auto (when stderr is not an interactive terminal), on "
      "or off")(
      "quiet", po::bool_switch(&c.quiet), "no progress (--progress off)");
  return desc;
}

// What Boost cannot check of the values given: a po::error naming the first that is wrong.
void check_values(const po::variables_map& vm, Command& c) {
  hpc::data::PackOptions& o = c.o;
  if (!vm.count("src") || !vm.count("out"))
    throw po::error("an image folder SRC and an output directory OUT are needed");
  if (o.src.empty() || o.out.empty())
    throw po::error(std::string(o.src.empty() ? "SRC" : "OUT") + " is an empty path (an unset variable?)");
  // A shard's index counts its records in 32 bits.
  if (o.images_per_shard <= 0 || o.images_per_shard > 4294967295)
    throw po::error("--images-per-shard must be positive, and at most 4294967295");
  if (o.resize < 0) throw po::error("--resize must be 0 or positive");
  if (o.quality < 1 || o.quality > 100) throw po::error("--quality must be 1..100");
  if (o.threads < 1 || o.threads > 1024) throw po::error("--threads must be 1..1024");
  const std::string& seed = c.seed;
  const auto [end, parsed] = std::from_chars(seed.data(), seed.data() + seed.size(), o.seed);
  if (seed.empty() || parsed != std::errc() || end != seed.data() + seed.size())
    throw po::error("--seed must be a whole number from 0 to 18446744073709551615, got '" + seed + "'");
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "lines" && c.progress != "off")
    throw po::error("unknown --progress '" + c.progress + "' (choose auto, bar, lines or off)");
  if (c.stamps != "auto" && c.stamps != "on" && c.stamps != "off")
    throw po::error("unknown --log-timestamps '" + c.stamps + "' (choose auto, on or off)");
}

// Reads the command line into c. Returns the exit code where the program ends here (--help,
// --version, a usage error: one line, exit 2), nullopt where the packing goes on.
std::optional<int> read_command_line(int argc, char** argv, Command& c) {
  const po::options_description desc = shown_options(c);
  po::options_description hidden;
  hidden.add_options()("src", po::value(&c.o.src))("out", po::value(&c.o.out));
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("src", 1).add("out", 1);
  try {
    po::variables_map vm;
    // Options named whole, as hpctrain's and hpcrun's: Boost's guessing took --res for --resize.
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).style(hpc::options::kCommandLineStyle).run(),
              vm);
    po::notify(vm);
    if (vm.count("help") || vm.count("version")) {
      if (vm.count("help")) hpc::log::write_help(hpc::detail::concat(desc, "\n"));
      else hpc::log::write_help(hpc::detail::concat("hpcdata-pack ", HPCTRAIN_VERSION, "\n"));  // hpcdata --version's too
      hpc::log::require_standard_output_written();  // a full disk under `> file`: exit 2, not a cut file
      return 0;
    }
    check_values(vm, c);
    hpc::data::check_pack_paths(c.o);
  } catch (const po::error& e) {
    std::fprintf(stderr, "hpcdata pack: error: %s (try --help)\n",
                 hpc::options::error_text(e, argc, argv, all, pos).c_str());
    return 2;
  } catch (const hpc::Error& e) {
    std::fprintf(stderr, "hpcdata pack: error: %s\n", e.what());
    return 2;
  }
  return std::nullopt;
}

// The progress lines, as --progress, --log-timestamps and --quiet ask (the stamps are set here
// for the summary too): c.o.progress, and whether the line is redrawn in place (a bar).
bool set_up_progress(Command& c) {
  const bool interactive = hpc::log::interactive(STDERR_FILENO);
  const bool tty = c.progress == "bar" || (c.progress == "auto" && interactive);
  c.quiet = c.quiet || c.progress == "off";
  hpc::log::set_stamps(c.stamps == "on" || (c.stamps == "auto" && !interactive) ? hpc::log::Stamps::On
                                                                               : hpc::log::Stamps::Off);
  if (c.quiet) return tty;
  auto shown_tenth = std::make_shared<int64_t>(-1);  // the last tenth of the images a line said
  c.o.progress = [tty, shown_tenth, split = c.o.split](int64_t done, int64_t total) {
    if (tty) {
      std::fprintf(stderr, "\rhpcdata pack: %s: %lld/%lld images", split.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fputc('\n', stderr);
    } else if (total > 0 && done * 10 / total > *shown_tenth) {
      *shown_tenth = done * 10 / total;
      std::fprintf(stderr, "%shpcdata pack: %s: %lld/%lld images\n", hpc::log::stamp(stderr).c_str(), split.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total));
    }
  };
  return tty;
}

// The summary line of a packing done, and its warnings.
void report(const hpc::data::PackOptions& o, const hpc::data::PackResult& r) {
  const std::string stamp = hpc::log::stamp(stderr);
  std::fprintf(stderr, "%shpcdata pack: %s: %lld images of %zu classes in %lld shards (%.1f MiB) in %s", stamp.c_str(), o.split.c_str(),
               static_cast<long long>(r.images), r.classes.size(), static_cast<long long>(r.shards),
               static_cast<double>(r.bytes) / (1 << 20), o.out.c_str());
  if (!r.skipped.empty()) std::fprintf(stderr, "; %zu images skipped, listed in %s.json", r.skipped.size(), o.split.c_str());
  if (r.cmyk_converted)
    std::fprintf(stderr, "; %lld CMYK images converted to RGB", static_cast<long long>(r.cmyk_converted));
  if (r.ignored_files) std::fprintf(stderr, "; %lld files that are not JPEG ignored", static_cast<long long>(r.ignored_files));
  std::fputc('\n', stderr);
  for (const std::string& w : r.warnings)
    std::fprintf(stderr, "%shpcdata pack: warning: %s\n", hpc::log::stamp(stderr).c_str(), w.c_str());
}

// Packs, stoppable by a signal; the exit code.
int pack(const Command& c, bool tty) {
  const hpc::data::PackOptions& o = c.o;
  try {
    report(o, hpc::data::pack_image_folder(o));
    return 0;
  } catch (const hpc::Error& e) {
    if (tty && !c.quiet) std::fputc('\n', stderr);
    if (stop_signal) {
      std::fprintf(stderr, "hpcdata pack: stopped by SIG%s before the new %s shards were committed: %s is as it was\n",
                   sigabbrev_np(stop_signal), o.split.c_str(), o.out.c_str());
      return 128 + stop_signal;
    }
    std::fprintf(stderr, "hpcdata pack: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // the file system's or the C++ library's own error
    std::fprintf(stderr, "hpcdata pack: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  hpc::hold_closed_standard_streams();  // before any file is opened, as hpctrain's main
  Command c;
  c.o.threads = hpc::cpus::usable();  // the CPUs this process may use, not the host's
  c.seed = std::to_string(c.o.seed);
  if (const std::optional<int> code = read_command_line(argc, argv, c)) return *code;
  catch_stop_signals();
  c.o.stop = &stop_requested;
  const bool tty = set_up_progress(c);
  return pack(c, tty);
}
