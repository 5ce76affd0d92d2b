// How hpcrun learns how each rank ended. mpirun reports only the first rank that failed, and a
// host that was lost entirely reports nothing at all, so hpcrun starts every rank through a
// thin wrapper (`hpcrun --rank-exec PROGRAM ARGS...`): it runs the program, forwards the
// signals mpirun sends, and prints one status line on stderr when the program ends. mpirun's
// --tag-output brings that line back as "[job,rank]<stderr>:hpcrun-rank-status: ...". A rank
// whose line never arrives was lost with its host, or cut off from it.
#pragma once

#include <string>
#include <vector>

#include "subprocess.hpp"

namespace hpc::launch {

struct RankReport {
  int rank = -1;
  ExitStatus status;
  bool terminated = false;      // the wrapper got SIGTERM/SIGINT/SIGHUP first (mpirun tearing the job down)
  bool stop_requested = false;  // the wrapper got SIGUSR1 first (a checkpoint-and-stop request)
};

// A stalled job is asked, before it is killed, which ranks still respond: SIGUSR2 to mpirun, which
// forwards it to every wrapper, and each wrapper that can run answers with one "alive" line (the
// program never sees SIGUSR2: hpcrun tells mpirun to signal the wrappers alone, not their process
// groups). Ranks on a host that is stopped or cut off do not answer.
bool parse_alive(const std::string& text, int* rank);
// A wrapper that mpirun's teardown reaches (its first SIGTERM, SIGINT or SIGHUP) says so at once,
// in a "signalled" line: its host is alive, whether or not the wrapper lives to report how its
// program ended (mpirun's SIGKILL may come first while the program, hpctrain, takes the SIGTERM
// as a stop for the next step and waits in a collective for a peer that aborted).
bool parse_signalled(const std::string& text, int* rank);

std::string format_report(const RankReport& r);
// True when `text` is a status line (then `r` holds it).
bool parse_report(const std::string& text, RankReport* r);

// One line of mpirun's --tag-output: "[1,3]<stderr>:text" is rank 3's stderr; an untagged line
// is mpirun's own (rank -1).
struct TaggedLine {
  int rank = -1;
  bool is_stderr = false;
  std::string text;
};
TaggedLine parse_tagged(const std::string& line, bool from_stderr);
// mpirun tags each piece of a rank's output it reads, not each line, and writes it after the last
// piece of any rank: after a piece without a line end ("done 100%\r", a prompt) the next piece, of
// this rank or another, follows on the same line with its tag ("[1,1]<stderr>:done 100%\r[1,0]<stderr>:
// hpcrun-rank-status: rank=0 ...") or, read in one piece with it, without. The line cut before each
// tag of its job and, on stderr, before a wrapper's line ("hpcrun-rank-"), each piece with its tag
// (an untagged line: itself alone). A wrapper's line is believed only under its own rank's tag.
std::vector<std::string> split_rank_line(const std::string& line);

// The wrapper's main: runs argv[0] with its arguments, reports, exits as it did.
int rank_exec_main(int argc, char** argv);
// Blocks the signals the wrapper passes on to its program, from its first moment (hpcrun_main's
// .preinit_array): one that comes before the program is started waits, and is then passed on,
// instead of killing the rank unannounced.
void block_forwarded_signals();

}  // namespace hpc::launch
