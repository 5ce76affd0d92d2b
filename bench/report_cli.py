"""The way out of a bench report tool (chaos_report.py, scaling_model.py), shared by both: each
imports it from its own directory (bench/ is no package) and its cli(argv) calls run()."""
import os
import sys


def run(prog, main, argv, usage_error, what, quiet_broken_pipe=False):
    """main(argv)'s exit code, with standard output flushed. A usage_error (the tool's own
    exception for a user's mistake) is one line on stderr, "PROG: error: ...", and exit code 2; so
    is a standard output that is closed or refuses `what` (as "the report"). With quiet_broken_pipe,
    a reader that stops early (| head) ends it quietly, as it would a program SIGPIPE ends (141)."""
    if sys.stdout is None:  # started with it closed (`>&-`): print() would pass over it
        print(f"{prog}: error: cannot write {what} to standard output: it is closed", file=sys.stderr)
        return 2
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except usage_error as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # standard output refused it (`> file` on a full disk): as hpcdata says it
        if quiet_broken_pipe and isinstance(e, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 128 + 13
        print(f"{prog}: error: cannot write {what} to standard output: {e.strerror}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left in its buffer goes nowhere
        return 2
