// A file for node_exporter's textfile collector (--prometheus-file): Prometheus's text format,
// gauges and counters with their HELP and TYPE lines, replaced whole on every write (a temporary file beside
// it, then a rename) so that a scrape never reads half a file. Knows nothing of training: the
// step metrics (step_metrics.hpp) say which gauges it holds.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hpc::train {

// One sample of a gauge, or of a counter (a name ending in _total, counting up from 0 while the
// process lives). Samples of one name must be given together, the first with the help.
struct Gauge {
  std::string name;  // without the prefix (hpctrain_ is added)
  std::string help;
  double value = 0;
  std::vector<std::pair<std::string, std::string>> labels = {};  // its own, after the file's
  bool counter = false;
};

class PrometheusTextfile {
 public:
  // labels: on every sample (the job, the world size). Their values keep letters, digits and
  // ._:-/ ; any other byte becomes _ (label values must be UTF-8, and these need no escapes).
  PrometheusTextfile(std::string path, std::vector<std::pair<std::string, std::string>> labels);
  // The file's text for these gauges.
  std::string render(const std::vector<Gauge>& gauges) const;
  // Replaces the file. A failure is one warning (the first), never an error: the file is for
  // watching a run, not part of it. Whether it was written. last: the run's last state (done,
  // failed), written over the old file in place where it cannot be replaced (a full disk).
  bool write(const std::vector<Gauge>& gauges, bool last = false);
  const std::string& path() const { return path_; }
  const std::string& written_path() const { return written_; }  // what each rewrite is renamed over

 private:
  std::string path_, labels_;  // labels_: `name="value",...` as rendered
  std::string written_;        // path_, or where the link path_ is leads: what each rewrite replaces
  bool warned_ = false;
};

// A usage error when `path` holds a file that hpctrain did not write (one not empty and not
// beginning "# HELP hpctrain_"): the rewrites would replace it; and when its directory is missing
// or cannot be written to, which is a wrong path (a full or failing disk later is only warned of).
void require_ours_or_none(const std::string& path);

// What a label value becomes (PrometheusTextfile's rule): "job 1" -> "job_1".
std::string label_value(const std::string& s);

}  // namespace hpc::train
