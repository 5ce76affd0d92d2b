#include "dist/communicator.hpp"

#include <algorithm>

#include "core/hash.hpp"

namespace hpc::dist {

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  uint64_t len = s.size();
  comm.broadcast(&len, sizeof len, root);
  std::string out = comm.rank() == root ? s : std::string(len, '\0');
  if (len > 0) comm.broadcast(out.data(), static_cast<int64_t>(len), root);
  return out;
}

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine) {
  const int world = comm.size();
  const std::vector<uint64_t> hashes = comm.allgather(fnv1a(mine.data(), mine.size()));
  std::vector<std::string> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto first = std::find(hashes.begin(), hashes.end(), hashes[static_cast<size_t>(r)]) - hashes.begin();
    all[static_cast<size_t>(r)] = first == r ? broadcast_string(comm, mine, r) : all[static_cast<size_t>(first)];
  }
  return all;
}

std::string distinct_joined(const std::vector<std::string>& by_rank, const std::string& separator) {
  std::string joined;
  for (auto it = by_rank.begin(); it != by_rank.end(); ++it)
    if (std::find(by_rank.begin(), it, *it) == it) joined += (joined.empty() ? "" : separator) + *it;
  return joined;
}

std::vector<std::string> Communicator::gather_bytes(const std::string& mine, int root) {
  std::vector<std::string> all;
  for (int r = 0; r < size(); ++r) {
    std::string part = broadcast_string(*this, mine, r);
    if (rank() == root) all.push_back(std::move(part));
  }
  return all;
}

}  // namespace hpc::dist
