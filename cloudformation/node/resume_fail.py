#!/usr/bin/env python3
"""Slurm's ResumeFailProgram: nodes that did not come up within ResumeTimeout. Terminates
whatever instance they got and sets them down with the reason, so that their jobs are requeued
and no instance is left running for a node Slurm has given up on.

    resume_fail.py NODELIST   (slurm.conf: ResumeFailProgram=...)
"""

import sys

from hpc_cloud import main_wrapper, set_down
from suspend import suspend


def resume_failed(cfg, nodes):
    rc = suspend(cfg, nodes)  # an instance it cannot terminate is an orphan: set down all the same
    for node in nodes:
        set_down(node, "did not come up within ResumeTimeout")
    return rc


if __name__ == "__main__":
    sys.exit(main_wrapper("resume_fail.py", resume_failed))
