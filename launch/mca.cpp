#include "mca.hpp"

#include <sstream>

#include "core/spelling.hpp"

namespace hpc::launch {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);) out.push_back(part);
  return out;
}

std::string listed(const std::set<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

McaCatalogue parse_ompi_info(const std::string& parsable) {
  McaCatalogue c;
  std::istringstream in(parsable);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> f = split(line, ':');  // a value may hold ':' too, but only after field 5
    if (f.size() < 4 || f[0] != "mca") continue;
    if (f[3] == "version" && f[2] != "base") c.components[f[1]].insert(f[2]);
    if (f[3] != "param" || f.size() < 6) continue;
    c.parameters.insert(f[4]);
    if (f.size() >= 8 && f[5] == "synonym" && f[6] == "name") c.parameters.insert(f[7]);
  }
  return c;
}

std::vector<std::pair<std::string, std::string>> mca_settings(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i + 2 < args.size(); ++i) {  // one without both words: mpirun refuses it (--do-not-launch)
    const std::string& w = args[i];
    if (w == "--mca" || w == "-mca" || w == "--gmca" || w == "-gmca") {
      out.emplace_back(args[i + 1], args[i + 2]);
      i += 2;
    }
  }
  return out;
}

std::string mca_problem(const McaCatalogue& known, const std::string& name, const std::string& value) {
  if (!known.parameters.count(name)) {
    const std::vector<std::string> names(known.parameters.begin(), known.parameters.end());
    return "this Open MPI has no MCA parameter " + name + did_you_mean(names, name) +
           "; mpirun would ignore it (ompi_info --all lists the parameters)";
  }
  const auto framework = known.components.find(name);
  if (framework == known.components.end() || value.empty()) return "";
  const std::set<std::string>& have = framework->second;
  for (const std::string& component : split(value[0] == '^' ? value.substr(1) : value, ',')) {
    if (have.count(component)) continue;
    const std::vector<std::string> names(have.begin(), have.end());
    return "--mca " + name + " " + value + ": this Open MPI has no " + name + " component " + component +
           did_you_mean(names, component) + "; it has " + listed(have);
  }
  return "";
}

}  // namespace hpc::launch
