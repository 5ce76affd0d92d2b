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
// ThreadSanitizer (-DHPCTRAIN_SANITIZE=thread; TSAN_OPTIONS overrides):
//   second_deadlock_stack=1: a lock-order report names where each of the two locks was taken.
//   handle_segv=0:  as for ASan (crash.hpp's report; without it, TSan's own handler meets the
//                   crash report's re-raised SIGSEGV and aborts with "nested bug").
//   report_thread_leaks=0: hpctrain ends at once with _exit (a stop at once, the watchdog, a
//                   signal after the outcome is final), where its loader's, lock refresher's and
//                   writer's threads still live by design; ThreadSanitizer intercepts _exit, calls
//                   those threads leaked and turns the exit code into 66, which hpcrun then reads
//                   as another failure than the run's.
//   The suppressions below: races inside uninstrumented libraries whose own synchronization
//   ThreadSanitizer cannot see, each matched by the library's file name only, never our code.
extern "C" {
const char* __tsan_default_options() { return "second_deadlock_stack=1:handle_segv=0:report_thread_leaks=0"; }
// libgomp: OpenMP's fork, barriers and join (src/nn/parallel.hpp, oneDNN's threads) synchronize
// inside libgomp, which is not instrumented: every access of a parallel region to what the
// thread that opened it wrote before looks like a race. Matched by the frames of libgomp in a
// racing access's stack (an OpenMP worker's): this build does not check what runs inside
// OpenMP regions. A worker's access whose stack ThreadSanitizer cannot restore ("failed to
// restore the stack") is not matched: the thread-count tests of src/nn still report so (README).
// mca_btl_tcp.so: Open MPI's TCP transport takes two of its locks in both orders, in its
// add_procs and in its del_procs/proc_remove (all on the main thread: no deadlock), a
// lock-order report in every MPI run of two ranks or more, every frame inside Open MPI.
const char* __tsan_default_suppressions() {
  return "race:libgomp.so\n"
         "deadlock:mca_btl_tcp.so\n";
}
const char* __asan_default_options() { return "detect_leaks=0:handle_segv=0"; }
const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }
}
