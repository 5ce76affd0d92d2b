#include "hosts.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/error.hpp"

namespace hpc::launch {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Host names and addresses as DNS, /etc/hosts and Open MPI accept them.
bool valid_name(const std::string& s) {
  return !s.empty() && s.size() <= 253 && s.front() != '-' &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '-' || c == '_'; });
}

// For messages: a binary file's bytes (a NUL, a UTF-16 mark) as \xNN, not as terminal garbage,
// and no more than the first 200 of them (a whole file on one line would be the error line).
std::string printable(const std::string& s) {
  constexpr size_t kShown = 200;
  if (s.size() > kShown) return printable(s.substr(0, kShown)) + "... (" + std::to_string(s.size()) + " bytes)";
  std::string out;
  for (unsigned char c : s) {
    if (std::isprint(c)) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

namespace {
// A whole number from 1 to `most`, digits only (stoi also takes "+3" and " 3"), else 0.
int whole_number(const std::string& text, int most) {
  int v = 0;
  size_t used = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
  return digits && used == text.size() && v >= 1 && v <= most ? v : 0;
}
}  // namespace

int parse_slots(const std::string& text, const std::string& where) {
  const int v = whole_number(text, kMaxSlots);
  HPC_REQUIRE(v > 0, where, ": slots must be a whole number from 1 to ", kMaxSlots, ", got '", printable(text), "'");
  return v;
}

// A host list being built. Repeated hosts add up their slots (as Open MPI does), keeping the
// first one's place; a name index keeps that linear in the hosts (a 100000-node Slurm list).
class HostAdder {
 public:
  void add(const std::string& name, int slots, const std::string& where) {
    HPC_REQUIRE(valid_name(name), where, ": '", printable(name), "' is not a host name");
    // Checked before adding, so no sum ever exceeds kMaxTotalSlots (far below INT_MAX).
    HPC_REQUIRE(total_ <= kMaxTotalSlots - slots, where, ": the hosts' slots add up to more than ", kMaxTotalSlots,
                ", the most one job may have");
    total_ += slots;
    const auto [it, fresh] = at_.emplace(name, hosts_.size());
    if (fresh) return hosts_.push_back({name, slots});
    Host& h = hosts_[it->second];
    HPC_REQUIRE(h.slots <= kMaxSlots - slots, where, ": host ", name, " is named again, and its slots add up to ",
                h.slots + slots, ", more than ", kMaxSlots);
    h.slots += slots;
  }
  const HostList& hosts() const { return hosts_; }
  HostList take() { return std::move(hosts_); }

 private:
  HostList hosts_;
  std::unordered_map<std::string, size_t> at_;  // name -> its place in hosts_
  int total_ = 0;
};

// "name[:slots]"
void add_colon_form(HostAdder& hosts, const std::string& item, int default_slots, const std::string& where) {
  const size_t colon = item.rfind(':');
  if (colon == std::string::npos) return hosts.add(item, default_slots, where);
  HPC_REQUIRE(item.find(':') == colon, where, ": '", printable(item), "' has more than one ':' (an IPv6 address?): ",
              "hosts are names or IPv4 addresses, each NAME or NAME:SLOTS (give an IPv6 host by its name)");
  hosts.add(item.substr(0, colon), parse_slots(item.substr(colon + 1), where + ": '" + printable(item) + "'"), where);
}

}  // namespace

HostList parse_host_list(const std::string& spec, int default_slots) {
  HostAdder hosts;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    item = trim(item);
    HPC_REQUIRE(!item.empty(), "-H '", spec, "': empty host name (hosts are separated by single commas)");
    add_colon_form(hosts, item, default_slots, "-H");
  }
  // getline drops an empty last item: "a," would pass as "a".
  HPC_REQUIRE(trim(spec).empty() || trim(spec).back() != ',', "-H '", spec,
              "': empty host name after the last comma (hosts are separated by single commas)");
  HPC_REQUIRE(!hosts.hosts().empty(), "-H names no host");
  return hosts.take();
}

namespace {
// A hostfile line is a name and two counts: one longer than this is not a hostfile's (a binary
// file, /dev/zero), and is refused before it is read whole (/dev/zero's first line never ends).
constexpr size_t kMaxHostfileLine = 64 * 1024;

// The next line into `line` (false at the end); a usage error past kMaxHostfileLine bytes.
bool read_hostfile_line(std::istream& in, std::string* line, const std::string& where) {
  line->clear();
  for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
    if (c == '\n') return true;
    HPC_REQUIRE(line->size() < kMaxHostfileLine, where, " is longer than ", kMaxHostfileLine / 1024,
                " KiB: not a hostfile");
    line->push_back(static_cast<char>(c));
  }
  return !line->empty();
}
}  // namespace

HostList parse_hostfile(const std::string& path, int default_slots) {
  // A directory opens as an empty stream: it would read as a file that "names no host". A path
  // that cannot be looked at (a link loop, a name too long) threw std::filesystem's error, which
  // hpcrun reported as its own bug (exit 1): the open below names it instead.
  std::error_code unreadable;
  HPC_REQUIRE(!std::filesystem::is_directory(path, unreadable), "--hostfile ", path, ": is a directory, not a hostfile");
  std::ifstream in(path);
  HPC_REQUIRE(in, "--hostfile ", path, ": cannot open it (", std::strerror(errno), ")");
  HostAdder hosts;
  int line_no = 0;
  for (std::string line; read_hostfile_line(in, &line, "--hostfile " + path + " line " + std::to_string(line_no + 1));) {
    ++line_no;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = "--hostfile " + path + " line " + std::to_string(line_no);
    std::stringstream words(line);
    std::string name, word;
    words >> name;
    int slots = default_slots, max_slots = kMaxSlots;
    std::set<std::string> keys;  // "slots=2 slots=3": which one was meant?
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      HPC_REQUIRE(eq != std::string::npos && (key == "slots" || key == "max_slots" || key == "max-slots"), where,
                  ": expected 'slots=N' or 'max_slots=N' after the host name, got '", printable(word), "'");
      HPC_REQUIRE(keys.insert(key == "max-slots" ? "max_slots" : key).second, where, ": ", key,
                  " is given twice; give it once");
      if (key == "slots") slots = parse_slots(word.substr(eq + 1), where);
      else max_slots = parse_slots(word.substr(eq + 1), where);  // hpcrun never oversubscribes
    }
    HPC_REQUIRE(slots <= max_slots, where, ": slots=", slots, " is more than max_slots=", max_slots,
                " (Open MPI refuses such a line too)");
    hosts.add(name, slots, where);
  }
  HPC_REQUIRE(!hosts.hosts().empty(), "--hostfile ", path, " names no host");
  return hosts.take();
}

// Unlike -H and hostfiles, a repeated host is refused: horovodrun counts such a host once (its
// last line's slots), Open MPI would add the slots up, and a script that prints a host twice
// (two sources concatenated) most likely meant neither.
HostList parse_discovery_output(const std::string& text, int default_slots, const std::string& source) {
  HostAdder hosts;
  std::map<std::string, int> first_line;
  std::stringstream ss(text);
  int line_no = 0;
  for (std::string line; std::getline(ss, line);) {
    ++line_no;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = source + " line " + std::to_string(line_no);
    add_colon_form(hosts, line, default_slots, where);
    const std::string name = line.substr(0, line.rfind(':'));  // valid: add_colon_form checked it
    const auto [it, fresh] = first_line.emplace(name, line_no);
    HPC_REQUIRE(fresh, where, ": host ", name, " is named again (first on line ", it->second,
                "); print each host once, with all its slots (", name, ":N)");
  }
  return hosts.take();
}

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> out;
  size_t i = 0;
  const auto bad = [&] { usage_error("SLURM_JOB_NODELIST '", printable(list), "' is not a Slurm host list"); };
  while (i < list.size()) {
    // One item: a prefix, then optionally "[ranges]" and a suffix, up to a comma outside brackets.
    size_t end = i;
    int depth = 0;
    while (end < list.size() && (list[end] != ',' || depth > 0)) {
      if (list[end] == '[') ++depth;
      if (list[end] == ']' && --depth < 0) bad();
      ++end;
    }
    if (depth != 0 || end == i) bad();
    const std::string item = list.substr(i, end - i);
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      out.push_back(item);
    } else {
      const size_t close = item.find(']', open);
      const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
      if (suffix.find('[') != std::string::npos) bad();  // one bracket group per item, as sbatch prints
      const std::string inside = item.substr(open + 1, close - open - 1);
      if (inside.empty() || inside.back() == ',') bad();  // "n[]" and "n[1,]" would name no host, or one less
      std::stringstream ranges(inside);
      for (std::string r; std::getline(ranges, r, ',');) {
        const size_t dash = r.find('-');
        const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
        if (lo.empty() || hi.empty() || !std::all_of(lo.begin(), lo.end(), ::isdigit) ||
            !std::all_of(hi.begin(), hi.end(), ::isdigit) || lo.size() > 9 || hi.size() > 9)
          bad();
        const long a = std::stol(lo), b = std::stol(hi);
        if (b < a || b - a > 100000) bad();
        // Every node has a slot at least: a list of more nodes than kMaxTotalSlots is refused
        // before its names are made (many ranges of 100000 would otherwise fill the memory).
        HPC_REQUIRE(b - a < static_cast<long>(kMaxTotalSlots - out.size()), "SLURM_JOB_NODELIST '",
                    printable(list), "' names more than ", kMaxTotalSlots, " nodes, the most slots one job may have");
        for (long n = a; n <= b; ++n) {
          std::string digits = std::to_string(n);
          if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');  // keep zero padding
          out.push_back(prefix + digits + suffix);
        }
      }
    }
    i = end + 1;
  }
  if (out.empty() || list.back() == ',') bad();
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks) {
  const std::string where = "SLURM_TASKS_PER_NODE '" + printable(tasks) + "'";
  std::vector<int> out;
  std::stringstream ss(tasks);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t x = item.find("(x");
    const int n = parse_slots(item.substr(0, x), where);
    int repeat = 1;
    if (x != std::string::npos) {
      HPC_REQUIRE(item.back() == ')', where, " is not in Slurm's form, e.g. 2(x3),1");
      // A count of nodes, not of slots: 1(x5000) is 5000 nodes of one task each.
      const std::string count = item.substr(x + 2, item.size() - x - 3);
      repeat = whole_number(count, kMaxTotalSlots);
      HPC_REQUIRE(repeat > 0, where, ": a repeat count (xN) must be a whole number from 1 to ", kMaxTotalSlots,
                  ", got '", printable(count), "'");
    }
    // As for the node list: each entry is a node with a slot at least, checked before it is made.
    HPC_REQUIRE(static_cast<size_t>(repeat) <= kMaxTotalSlots - out.size(), where, " counts more than ",
                kMaxTotalSlots, " nodes, the most slots one job may have");
    out.insert(out.end(), static_cast<size_t>(repeat), n);
  }
  HPC_REQUIRE(!out.empty(), "SLURM_TASKS_PER_NODE is empty");
  HPC_REQUIRE(tasks.back() != ',', where, " ends with a comma");
  return out;
}

HostList slurm_hosts(const std::string& nodelist, const std::string& tasks_per_node) {
  const std::vector<std::string> names = expand_slurm_nodelist(nodelist);
  const std::vector<int> tasks = expand_slurm_tasks_per_node(tasks_per_node);
  HPC_REQUIRE(names.size() == tasks.size(), "Slurm's allocation is inconsistent: SLURM_JOB_NODELIST names ", names.size(),
              " node(s), SLURM_TASKS_PER_NODE ", tasks.size());
  HostAdder hosts;
  for (size_t i = 0; i < names.size(); ++i) hosts.add(names[i], tasks[i], "SLURM_JOB_NODELIST");
  return hosts.take();
}

std::vector<std::pair<std::string, std::string>> slurm_allocation_env(const HostList& hosts) {
  std::string names, tasks;
  for (const Host& h : hosts) {
    if (!names.empty()) names += ',', tasks += ',';
    names += h.name;
    tasks += std::to_string(h.slots);
  }
  const std::string count = std::to_string(hosts.size());
  return {{"SLURM_JOB_NODELIST", names}, {"SLURM_NODELIST", names},         {"SLURM_TASKS_PER_NODE", tasks},
          {"SLURM_JOB_CPUS_PER_NODE", tasks}, {"SLURM_JOB_NUM_NODES", count}, {"SLURM_NNODES", count}};
}

std::string slurm_preempt_time(const std::string& scontrol_record) {
  std::istringstream fields(scontrol_record);
  for (std::string f; fields >> f;) {
    if (f.rfind("PreemptTime=", 0) != 0) continue;
    const std::string when = f.substr(std::strlen("PreemptTime="));
    return when == "None" || when == "Unknown" || when == "(null)" ? "" : when;
  }
  return "";
}

const Host* find_host(const HostList& hosts, const std::string& name) {
  const auto it = std::find_if(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == name; });
  return it == hosts.end() ? nullptr : &*it;
}

bool has_host(const HostList& hosts, const std::string& name) { return find_host(hosts, name) != nullptr; }

int total_slots(const HostList& hosts) {
  long long n = 0;
  for (const Host& h : hosts) n += h.slots;
  // Every parser keeps a list within kMaxTotalSlots; more is a bug, not a wrapped count.
  HPC_CHECK(n <= kMaxTotalSlots, "hosts ", show_hosts(hosts).substr(0, 200), " have ", n, " slots, more than ",
            kMaxTotalSlots);
  return static_cast<int>(n);
}

std::string show_hosts(const HostList& hosts) {
  std::string s;
  for (const Host& h : hosts) s += (s.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return s;
}

namespace {
// Whether `name` is a numeric address of one of this machine's interfaces (-H 10.0.0.5 on
// 10.0.0.5 itself): mpirun starts such a host's ranks here, without its launch agent, and hpcrun
// probed it through ssh, blacklisted it when that failed, and could not start.
bool is_own_address(const std::string& name) {
  unsigned char want[sizeof(in6_addr)];
  const int family = ::inet_pton(AF_INET, name.c_str(), want) == 1    ? AF_INET
                     : ::inet_pton(AF_INET6, name.c_str(), want) == 1 ? AF_INET6
                                                                      : 0;
  if (!family) return false;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return false;
  bool found = false;
  for (const ifaddrs* a = all; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != family) continue;
    const void* have = family == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
                                         : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    found = std::memcmp(have, want, family == AF_INET ? sizeof(in_addr) : sizeof(in6_addr)) == 0;
  }
  ::freeifaddrs(all);
  return found;
}
}  // namespace

bool is_local_host(const std::string& name) {
  if (name == "localhost" || name.rfind("127.", 0) == 0 || name == "::1") return true;
  char self[256] = {};
  if (::gethostname(self, sizeof self - 1) != 0) return false;
  const std::string me = self;
  return name == me || (me.find('.') != std::string::npos && name == me.substr(0, me.find('.'))) ||
         is_own_address(name);
}

bool resolves(const std::string& name, std::string* why) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (rc != 0 && why) *why = ::gai_strerror(rc);
  return rc == 0;
}

}  // namespace hpc::launch
