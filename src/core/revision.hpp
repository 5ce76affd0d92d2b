// The source revision this build was made from (cmake/HpctrainRevision.cmake): the commit, 12 hex
// digits, "-dirty" when tracked files differed from it, "unknown" without git, or what a packager
// gave as -DHPCTRAIN_REVISION. hpctrain_version says the release; this says which build of it: the
// config event and every checkpoint record it (a change of meaning between two builds of one
// release is found by it).
#pragma once

namespace hpc {
const char* build_revision();
}  // namespace hpc
