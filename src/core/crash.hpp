// A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE) says where it happened before the process dies: one
// line on stderr with the signal, the faulting address, the instruction and, for a jump to a
// null or unmapped address (which no backtrace can unwind from), the code that made it, each as
// library+offset and symbol. Then the handler that was installed before (Open MPI's, which
// prints its backtrace) or the default action (a core dump) takes the signal as if this one
// were not there. Installed after MPI_Init, so that it sees every crash first.
#pragma once

namespace hpc::crash {

void install_reporter();

// The test hook HPCTRAIN_TEST_CRASH=null-call: a call through a null function pointer, as a
// corrupted callback table would make (tests/integration/cli_test.cpp checks the line).
void crash_if_asked();

}  // namespace hpc::crash
