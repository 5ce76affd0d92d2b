#include "dist/agree.hpp"

#include <algorithm>
#include <exception>
#include <new>

#include "core/hash.hpp"
#include "dist/communicator.hpp"

namespace hpc::dist {

void collectively(ProcessContext& ctx, const std::function<void()>& fn) {
  uint64_t code = 0;
  std::string message;
  try {
    fn();
  } catch (const Error& e) {
    code = static_cast<uint64_t>(e.exit_code());
    message = e.what();
  } catch (const std::bad_alloc&) {
    code = 1;
    message = kOutOfMemory;
  } catch (const std::exception& e) {
    code = 1;
    message = what_it_means(e);  // a thread that cannot start says which limit
  }
  Communicator& comm = ctx.world();
  if (comm.size() == 1) {
    if (code) throw CollectiveError(code == 2 ? ErrorKind::Usage : ErrorKind::Internal, message);
    return;
  }
  const std::vector<uint64_t> codes = comm.allgather(code);
  // A failure of every rank (a bad flag) is the job's; one of some ranks names where it was.
  const bool everywhere = std::all_of(codes.begin(), codes.end(), [](uint64_t c) { return c != 0; });
  for (int r = 0; r < comm.size(); ++r) {
    if (!codes[static_cast<size_t>(r)]) continue;
    if (r == ctx.rank() && !everywhere) message = ctx.where() + ": " + message;
    message = broadcast_string(comm, message, r);
    throw CollectiveError(codes[static_cast<size_t>(r)] == 2 ? ErrorKind::Usage : ErrorKind::Internal, message);
  }
}

void require_agreement(ProcessContext& ctx, uint64_t value, ErrorKind kind,
                       const std::function<std::string(int rank)>& describe) {
  Communicator& comm = ctx.world();
  if (comm.size() == 1) return;
  const std::vector<uint64_t> all = comm.allgather(value);
  for (int r = 1; r < comm.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) throw CollectiveError(kind, describe(r));
}

void require_same_text(ProcessContext& ctx, const std::string& text, ErrorKind kind,
                       const std::function<std::string(int rank, const std::string& theirs)>& describe, uint64_t also) {
  require_agreement(ctx, fnv1a(text.data(), text.size()) ^ also, kind,
                    [&](int r) { return describe(r, broadcast_string(ctx.world(), text, r)); });
}

}  // namespace hpc::dist
