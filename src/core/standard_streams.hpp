// The standard streams a process was started without, held so that no file of its own takes their
// numbers.
#pragma once

namespace hpc {

// Standard input, output or error that the process was started without (`>&-`, `2>&-`) is held
// by /dev/null opened the other way round (input write-only, output and error read-only): a write
// to standard output still fails with EBADF, as on a closed descriptor ("cannot write the results
// to standard output: Bad file descriptor", exit 2), a read of standard input too, and no file
// the process opens later takes the number. Left free, the next file opened got it, and what was
// printed went into that file: evaluate's result line into its --metrics-file (exit 0, and the
// next evaluate refused the file as no JSON Lines), a training's progress lines and warnings into
// the checkpoint directory's lock. Called first in main, before any file is opened.
void hold_closed_standard_streams();

}  // namespace hpc
