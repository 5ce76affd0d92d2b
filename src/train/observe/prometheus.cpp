#include "train/observe/prometheus.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"

namespace hpc::train {
namespace {

constexpr const char* kPrefix = "hpctrain_";

// As Prometheus's text format writes numbers: the shortest text that reads back as the same
// double, NaN and +Inf/-Inf spelled its way.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string labels_text(const std::vector<std::pair<std::string, std::string>>& labels) {
  std::string text;
  for (const auto& [name, value] : labels)
    text += (text.empty() ? "" : ",") + name + "=\"" + label_value(value) + "\"";
  return text;
}

// A new temporary file beside `path`, open in *fd: hidden, and not named *.prom, so that
// node_exporter (which reads only *.prom) never reads it half-written; of a name no one can guess
// (mkstemp: created, never opened through a link another user planted in a shared collector
// directory). Empty, with errno set, when it cannot be made.
std::string temporary_beside(const std::string& path, int* fd) {
  const std::filesystem::path p(path);
  std::string name = ".";  // appended, not "." + name: GCC 12 warns falsely (-Wrestrict) on that
  name += p.filename().string();
  name += ".tmp.XXXXXX";
  std::string tmp = (p.parent_path() / name).string();
  *fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (*fd < 0) return "";
  ::fchmod(*fd, 0644);  // node_exporter reads it as another user
  return tmp;
}

bool write_all(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string label_value(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("._:-/", c)) c = '_';
  return out;
}

// A link (into node_exporter's textfile directory, say) is written through: each rewrite is
// renamed over its target. Renamed over the link, it replaced the link with a file of its own, and
// the target the collector read was never updated.
PrometheusTextfile::PrometheusTextfile(std::string path, std::vector<std::pair<std::string, std::string>> labels)
    : path_(std::move(path)), labels_(labels_text(labels)), written_(through_links(path_)) {}

void require_ours_or_none(const std::string& path) {
  // A collector directory is often one every job may write to (sticky, as /tmp): a link planted
  // there under the job's file name was followed, and each rewrite renamed over (or created) the
  // file it chose, one of this user's (through_links reads the link itself, where the kernel's
  // fs.protected_symlinks never looks). Refused as --metrics-file's is.
  if (const std::optional<std::string> planted = planted_by_another_user(path))
    usage_error("refusing --prometheus-file ", path, ": ", *planted,
                ": another user may have put it there for this run to follow or write into; use a path of your own");
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(path, ec).parent_path().string();
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  HPC_REQUIRE(std::filesystem::is_directory(st), "cannot write --prometheus-file ", path, ": ",
              std::filesystem::exists(st) ? dir + " is not a directory" : "its directory " + dir + " does not exist",
              " (create it, or give node_exporter's --collector.textfile.directory)");
  HPC_REQUIRE(::access(dir.c_str(), W_OK | X_OK) == 0, "cannot write --prometheus-file ", path, ": its directory ", dir,
              ": ", std::strerror(errno));
  const std::string ours = std::string("# HELP ") + kPrefix;
  std::ifstream in(path, std::ios::binary);
  std::string head(ours.size(), '\0');
  if (in && in.read(head.data(), static_cast<std::streamsize>(head.size())).gcount() > 0)
    HPC_REQUIRE(in && head == ours, "--prometheus-file ", path, " holds a file hpctrain did not write (it does not "
                "begin '", ours, "'): each rewrite would replace it; name another file, or remove it");
}

std::string PrometheusTextfile::render(const std::vector<Gauge>& gauges) const {
  std::string text;
  for (size_t i = 0; i < gauges.size(); ++i) {
    const Gauge& g = gauges[i];
    const std::string name = kPrefix + g.name;
    if (i == 0 || gauges[i - 1].name != g.name)
      text += "# HELP " + name + " " + g.help + "\n# TYPE " + name + (g.counter ? " counter\n" : " gauge\n");
    const std::string own = labels_text(g.labels);
    const std::string all = labels_ + (!labels_.empty() && !own.empty() ? "," : "") + own;
    text += name + (all.empty() ? "" : "{" + all + "}") + " " + number(g.value) + "\n";
  }
  return text;
}

bool PrometheusTextfile::write(const std::vector<Gauge>& gauges, bool last) {
  int fd = -1;
  const std::string tmp = temporary_beside(written_, &fd), text = render(gauges);
  bool ok = fd >= 0 && write_all(fd, text);
  int error = ok ? 0 : errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) ok = false, error = errno;
  if (ok && ::rename(tmp.c_str(), written_.c_str()) != 0) ok = false, error = errno;
  if (!ok && fd >= 0) ::unlink(tmp.c_str());
  if (!ok && last && ckpt::overwrite_in_place(written_.c_str(), text.data(), text.size())) return true;
  if (!ok && !warned_) {
    warned_ = true;
    log::warn("cannot write --prometheus-file ", path_, ": ", std::strerror(error),
              " (said once; training goes on, and so do the tries)");
  }
  return ok;
}

}  // namespace hpc::train
