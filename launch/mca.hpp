// Open MPI's MCA settings in --mpi-args, checked against the names its ompi_info lists before the
// first launch. mpirun takes a parameter it does not know without a word (--mca
// btl_tcp_if_inclde lo: the job runs on the default interfaces) and a component it has not
// (--mca btl tpc,self) fails every rank in MPI_Init, which looks like a lost host: both would be
// the same on every attempt. Pure, so every case is unit-tested (tests/unit/launch_test.cpp).
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hpc::launch {

struct McaCatalogue {
  std::set<std::string> parameters;                         // names and their synonyms
  std::map<std::string, std::set<std::string>> components;  // framework -> its components
};

// From `ompi_info --all --parsable`: "mca:btl:tcp:param:btl_tcp_if_include:value:..." names a
// parameter, "mca:plm:rsh:param:plm_rsh_agent:synonym:name:orte_rsh_agent" another name of one,
// "mca:btl:tcp:version:..." a component.
McaCatalogue parse_ompi_info(const std::string& parsable);

// The (name, value) of each --mca, -mca, --gmca or -gmca in mpirun's words `args`.
std::vector<std::pair<std::string, std::string>> mca_settings(const std::vector<std::string>& args);

// Why setting `name` to `value` would not do what it says, on one line ("" when it would): a
// parameter the catalogue lacks, or a framework's selection ("btl", "^openib", "self,tcp") naming
// a component it lacks; with the nearest known name where one is near.
std::string mca_problem(const McaCatalogue& known, const std::string& name, const std::string& value);

}  // namespace hpc::launch
