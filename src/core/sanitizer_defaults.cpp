// The run-time checkers' defaults in a checked build (-DHPCTRAIN_SANITIZE, CMakeLists.txt), linked
// into every program and test of such a build and into no other. Built in, not asked of the
// environment: the ranks that hpcrun starts over ssh (the launch tests' hosts, a Slurm step) do
// not get the caller's ASAN_OPTIONS, and a rank ended by LeakSanitizer's report at exit counts
// as a failed rank. ASAN_OPTIONS and UBSAN_OPTIONS, where set, still override these.
//   detect_leaks=0: Open MPI keeps its allocations to the end of the process, which LeakSanitizer
//                   reports for every MPI program.
//   handle_segv=0:  hpctrain's crash report (core/crash.hpp) handles SIGSEGV, and its tests expect
//                   the process to die by that signal.
//   halt_on_error=1, print_stacktrace=1: undefined behaviour ends the process where it happens,
//                   with the stack, instead of one line that a test passing anyway would hide.
extern "C" {
const char* __asan_default_options() { return "detect_leaks=0:handle_segv=0"; }
const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }
}
