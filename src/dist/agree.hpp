// Errors in a multi-rank job without hangs. Before training, a problem may show on one rank
// only (a file missing on one host, a per-rank config file): collectively() makes every rank
// throw the same CollectiveError, so all exit with the same code and only rank 0 prints it.
// An error one rank meets alone during training cannot be agreed on (the others are waiting
// in a collective): main() names the rank and host and aborts the whole job.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/error.hpp"
#include "dist/process.hpp"

namespace hpc::dist {

// An error every rank of the job has thrown.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// Runs fn on this rank. If it throws on any rank, every rank throws a CollectiveError with
// the lowest failing rank's message (naming that rank and host when there are several).
void collectively(ProcessContext& ctx, const std::function<void()>& fn);

// Every rank passes its value; where they differ, every rank throws a CollectiveError of
// `kind` whose message is describe(r), r the first rank whose value differs from rank 0's.
// describe runs on every rank, so it may itself use collectives.
void require_agreement(ProcessContext& ctx, uint64_t value, ErrorKind kind,
                       const std::function<std::string(int rank)>& describe);

// The same for a text every rank passes (`also`: a digest of more that the text does not show,
// folded in): describe is given the first differing rank's text, to name it beside rank 0's.
void require_same_text(ProcessContext& ctx, const std::string& text, ErrorKind kind,
                       const std::function<std::string(int rank, const std::string& theirs)>& describe,
                       uint64_t also = 0);

}  // namespace hpc::dist
