#include "dist/communicator.hpp"

namespace hpc::dist {

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  uint64_t len = s.size();
  comm.broadcast(&len, sizeof len, root);
  std::string out = comm.rank() == root ? s : std::string(len, '\0');
  if (len > 0) comm.broadcast(out.data(), static_cast<int64_t>(len), root);
  return out;
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
