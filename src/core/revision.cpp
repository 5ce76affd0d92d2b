#include "core/revision.hpp"

#include "hpctrain_revision.inc"  // generated at every build, in the build tree's generated/

namespace hpc {
const char* build_revision() { return HPCTRAIN_REVISION; }
}  // namespace hpc
