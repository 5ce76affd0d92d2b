// Rank-aware logging. A line of a rank other than 0 names it and its host ("hpctrain: warning:
// rank 1 on node7: ..."), so a multi-rank log can be read; the commands choose which ranks print
// informational lines (training and evaluate: rank 0 alone, by the level they give the others).
// The process context (src/dist) sets the rank and host once at start-up.
//
// Lines may start with the time (ISO 8601, UTC, milliseconds): a log file read the next morning
// needs it, a terminal does not. Stamps::Auto stamps stdout's lines when stdout is not an
// interactive terminal, and stderr's warnings when stderr is not; it leaves errors as they are
// ("hpctrain: error: ..." first on the line is what launchers and scripts match, and the last line
// of a failed run is never far from a stamped one); Stamps::On stamps every line.
#pragma once

#include <string>

#include "core/error.hpp"

namespace hpc::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Quiet = 4 };
enum class Stamps { Auto, On, Off };

// `where`: "rank 1 on node7", as ProcessContext::where says it.
void set_process(int rank, int world_size, const std::string& where);
void set_level(Level level);
void set_stamps(Stamps stamps);
Level level();
int rank();

// Whether `fd` is a terminal a person watches: a TTY whose TERM is not "dumb", in a process no
// launcher started (mpirun, srun and PMIx give their ranks pseudo-terminals of their own, which
// end up in log files: a line redrawn with \r and escapes garbles them).
bool interactive(int fd);
inline bool interactive_stdout() { return interactive(1); }

// "2026-11-23T18:04:02.123Z " when lines going to `out` (a warning's, or another's) are stamped,
// else "".
std::string stamp(FILE* out, bool warning = false);

void write(Level level, const std::string& line);

// Standard output (C's stdout, which std::cout writes through) flushed: 0 where everything written
// to it so far reached its file, else the errno of the first failed write that was seen (-1 where
// it is no longer known). A command's results end in it (before its next line on stderr), so that
// a failure is seen with its errno; require_standard_output_written ends the command.
int flush_standard_output();
// `text` written to standard output and flushed, as flush_standard_output. A command's results go
// through here, not std::cout or printf: a write that does not fit the buffer (a --help, inspect
// --json of a directory) fails inside that write, whose errno is gone by the time
// flush_standard_output asks ("a write failed" where "No space left on device" was known).
int write_standard_output(const std::string& text);
// What a failed write of standard output (flush_standard_output's or write_standard_output's
// non-zero result) means, to follow "standard output ": "is closed (its reader exited)", or
// "cannot be written (No space left on device)". For the one warning of a run that goes on.
std::string standard_output_trouble(int failed);
// write_standard_output for --help's or --version's text: a reader that leaves early is then fine
// (`hpctrain --help | head` read what it wanted), where for results it is an error.
void write_help(const std::string& text);
// The results a command printed are in their file: standard output flushed, and closed once (a
// duplicate of it, so that it stays open: a network file system reports a deferred write error at
// a close). Else a usage error (exit 2): "cannot write the results to standard output: No space
// left on device", where a script would have found a cut file and exit 0 (`> file` on a full
// disk, a reader that ended early: SIGPIPE is ignored; after write_help, a full disk alone).
void require_standard_output_written();
// Standard output holds a training's progress lines from now on, not results: a line that cannot
// be written (a full disk, EIO) is said once on stderr, and the run goes on without them.
void set_progress_output();

template <class... Args>
void info(const Args&... args) { write(Level::Info, detail::concat(args...)); }
template <class... Args>
void warn(const Args&... args) { write(Level::Warn, detail::concat(args...)); }
template <class... Args>
void error(const Args&... args) { write(Level::Error, detail::concat(args...)); }
template <class... Args>
void debug(const Args&... args) { write(Level::Debug, detail::concat(args...)); }

}  // namespace hpc::log
