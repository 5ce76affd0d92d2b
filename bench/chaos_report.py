#!/usr/bin/env python3
"""The report of a chaos soak (bench/chaos.sh under hpcrun, bench/chaos_slurm.sh under Slurm): one
training hit by faults against an undisturbed run of the same options. It prints faults by kind,
faults survived, steps redone (in all and per fault), time from each fault to the next step
(median, p95, max), time lost as a share of the soak, what was left behind and both final
state_checksums; exit 0 when the checksums and steps agree, nothing is left and at least
--min-kinds kinds of fault were injected, else 1.

Inputs (files the soak wrote):
  --ref FILE, --run FILE   the metrics (--metrics-every-steps 1) of the undisturbed run and of the
                           soak: JSON lines, step, config (resumed_from_step) and done events; the
                           soak's holds every run of it (hpctrain appends)
  --faults FILE            one fault a line: start<TAB>end<TAB>kind<TAB>where<TAB>detail (unix times)
  --left FILE              what was left behind, one what<TAB>detail line each (empty: nothing)
  --times REF_START REF_END START END   unix times of both runs
  --seed, --duration (s), --mean-interval (s), --min-kinds, --job (the header's words on the job)
  --note TEXT              appended to the faults line ("; TEXT"), e.g. how often Slurm requeued
Only the hpcrun soak has these (each optional):
  --hpcrun-summaries FILE...  hpcrun's summary.json of each invocation (in the order of the numbers
                           in their names: summary-10.json after summary-9.json): attempts and
                           failures on the faults line, and --hosts missing from the last attempt
                           left behind
  --hosts A,B,C            the hosts every attempt should have
  --fds FILE               hpcrun's open file descriptors: unix_time<TAB>invocation<TAB>count a line
                           (growth within an invocation is left behind); --fds-end FILE: their
                           targets near the end, one a line
An input it cannot read (missing, a directory or FIFO, not UTF-8, a line not of its kind, an event
without the fields the report reads, --times not finite or ending before they start) is one line
on stderr and exit 2, before any of the report is printed.
"""
import argparse, collections, json, math, os, re, statistics, sys

import report_cli  # bench/report_cli.py, beside this file

PROG = "chaos_report"


class UsageError(Exception):
    """An input the report cannot read (a missing or foreign file, a bad option): one line, exit 2,
    apart from a soak that failed (exit 1)."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (try --help)")


def lines_of(path, what):
    """The lines of a file the soak wrote: a regular file (a FIFO would be waited on for ever),
    readable, UTF-8."""
    if not os.path.isfile(path):
        raise UsageError(f"{what} {path}: " + ("no such file" if not os.path.exists(path) else
                                               "a directory, not a file" if os.path.isdir(path) else
                                               "not a regular file"))
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError as e:
        raise UsageError(f"{what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None


def is_number(v):
    """A finite JSON number (an integer too large for a float, 400 digits, is not one)."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        return False


# What each event the report reads must hold (hpctrain's --metrics-file).
NEEDED = {"step": ("unix_time", "step"), "config": ("unix_time", "resumed_from_step"), "done": ("steps",)}


def events(path, what):
    out = []
    for n, line in enumerate(lines_of(path, what), 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line cut by a killed rank 0
        except RecursionError:
            raise UsageError(f"{what} {path}:{n}: not a metrics line (JSON nested too deeply)") from None
        if not isinstance(e, dict):
            raise UsageError(f"{what} {path}:{n}: not a metrics line (a JSON object of hpctrain's --metrics-file)")
        kind = e.get("event")
        for key in NEEDED.get(kind, ()) if isinstance(kind, str) else ():  # (a list is no key)
            if not is_number(e.get(key)):
                raise UsageError(f"{what} {path}:{n}: its {e['event']} event's {key} is "
                                 + ("missing" if key not in e else f"not a number ({json.dumps(e[key])[:40]})"))
        if e.get("event") == "done" and not isinstance(e.get("state_checksum"), str):
            raise UsageError(f"{what} {path}:{n}: its done event has no state_checksum (a run without a checkpoint?)")
        out.append(e)
    return out


def faults_of(path):
    faults = []
    for n, line in enumerate(lines_of(path, "--faults"), 1):
        if not line.strip():
            continue
        f = line.split("\t")
        try:
            ok = len(f) >= 3 and all(math.isfinite(float(t)) for t in f[:2])
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"--faults {path}:{n}: not start<TAB>end<TAB>kind<TAB>where<TAB>detail (unix times)")
        faults.append(f)
    return faults


def left_of(path):
    """what<TAB>detail lines; a line without its detail is still something left behind."""
    return [(l.split("\t", 1) + [""])[:2] for l in lines_of(path, "--left") if l.strip()]


def in_number_order(path):
    """A sort key that puts numbers in a name in their order: chaos.sh's summary-10.json after
    summary-9.json (as text it came first, and the last invocation's hosts were another's)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"([0-9]+)", path))]


def summary_of(path):
    """hpcrun's summary.json: its attempts (each with its hosts) and failures. No attempt at all is
    one hpcrun writes too: stopped (a preemption, exit 75) while it waited for hosts, as after a
    cut host; refused, it ended the soak's report with exit 2."""
    try:
        s = json.loads("\n".join(lines_of(path, "--hpcrun-summaries")))
    except (ValueError, RecursionError):
        s = None
    ok = (isinstance(s, dict) and isinstance(s.get("failures"), int) and isinstance(s.get("attempts"), list)
          and all(isinstance(t, dict) and isinstance(t.get("hosts"), str) for t in s["attempts"]))
    if not ok:
        raise UsageError(f"--hpcrun-summaries {path} is not hpcrun's summary.json (attempts with their hosts, failures)")
    return s


def fds_of(path):
    fds = collections.defaultdict(list)
    for n, line in enumerate(lines_of(path, "--fds"), 1):
        if not line.strip():
            continue
        words = line.split()
        if len(words) != 3 or not (words[2].isascii() and words[2].isdigit()):  # ("²" is a digit to isdigit)
            raise UsageError(f"--fds {path}:{n}: not unix_time<TAB>invocation<TAB>count")
        fds[words[1]].append(int(words[2]))
    return fds


def pct(v, q): return sorted(v)[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main(argv):
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--faults", required=True)
    p.add_argument("--left", required=True)
    p.add_argument("--times", nargs=4, type=float, required=True, metavar=("REF_START", "REF_END", "START", "END"))
    p.add_argument("--seed", required=True)
    p.add_argument("--duration", required=True)
    p.add_argument("--mean-interval", required=True)
    p.add_argument("--min-kinds", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--note", default="")
    p.add_argument("--hpcrun-summaries", nargs="*")
    p.add_argument("--hosts", default="")
    p.add_argument("--fds")
    p.add_argument("--fds-end")
    a = p.parse_args(argv)
    ref_start, ref_end, start, end = a.times
    if not all(math.isfinite(t) for t in a.times) or not (ref_end > ref_start and end > start):
        raise UsageError(f"--times must be finite unix times with each end after its start, got "
                         f"{' '.join(f'{t:g}' for t in a.times)}")
    if a.min_kinds < 0:
        raise UsageError(f"--min-kinds must be 0 or more, got {a.min_kinds}")

    # Every input read before the verdict: one it cannot read is exit 2, not a soak that failed.
    ref, run = events(a.ref, "--ref"), events(a.run, "--run")
    faults, left = faults_of(a.faults), left_of(a.left)
    summaries = [summary_of(f) for f in sorted(a.hpcrun_summaries or [], key=in_number_order)]
    fds = fds_of(a.fds) if a.fds else collections.defaultdict(list)
    fds_end = " ".join(lines_of(a.fds_end, "--fds-end")).split() if a.fds_end and os.path.exists(a.fds_end) else None
    for path, ev in (a.ref, ref), (a.run, run):
        if not any(e.get("event") == "done" for e in ev):
            print(f"\nchaos soak (seed {a.seed}): no done event in {path}: that training did not finish")
            return 1
    done_ref = [e for e in ref if e.get("event") == "done"][-1]
    done = [e for e in run if e.get("event") == "done"][-1]
    steps = sorted((e["unix_time"], e["step"]) for e in run if e.get("event") == "step")
    starts = sorted((e["unix_time"], e["resumed_from_step"]) for e in run if e.get("event") == "config")
    by_kind = collections.Counter(f[2] for f in faults)
    recover, redone, survived = [], [], 0
    for i, f in enumerate(faults):
        t0, t1 = float(f[0]), float(f[1])
        t_next = float(faults[i + 1][0]) if i + 1 < len(faults) else float("inf")
        # A fault the job was relaunched for (once or more): the steps from each resumed state to the
        # last one done before that start are redone, and it recovered at the first step after the
        # last start. Else (a short stop or cut it rode out): at the first step after the fault ended.
        relaunch = [(t, r) for t, r in starts if t0 < t < t_next]
        since = relaunch[-1][0] if relaunch else t1
        after = [t for t, s in steps if t > since]
        if not after: continue
        survived += 1
        recover.append(after[0] - t0)
        redone.append(sum(max(0, max([s for t, s in steps if t < tr] or [0]) - r) for tr, r in relaunch))

    ref_s, run_s = ref_end - ref_start, end - start
    launcher = f"; {a.note}" if a.note else ""
    if a.hpcrun_summaries is not None:
        attempts = sum(len(s["attempts"]) for s in summaries)
        failed = sum(s["failures"] for s in summaries)
        # The hosts of the last attempt of all (an invocation stopped before its first has none).
        last = next((s["attempts"][-1] for s in reversed(summaries) if s["attempts"]), None)
        last_hosts = [h.split(":")[0] for h in last["hosts"].split(",")] if last else []
        left += [["host left out", h] for h in a.hosts.split(",") if h and h not in last_hosts]
        launcher = f"; hpcrun: {attempts} attempt(s) in {len(summaries)} invocation(s), {failed} failed" + launcher
    if a.fds:
        fd_growth = max((v[-1] - v[0] for v in fds.values()), default=0)
        if fd_growth > 0: left.append(["hpcrun file descriptors", f"{fd_growth} more near the end than at the first fault"])

    print(f"\nchaos soak (seed {a.seed}, faults for {a.duration} s at a mean interval of {a.mean_interval} s), {a.job}, "
          f"{done['steps']} steps:")
    print(f"  faults injected: {len(faults)} ({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))}); "
          f"survived: {survived}{launcher}")
    if recover:
        print(f"  steps redone: {len(steps) - done['steps']} in all (step events beyond the {done['steps']}); per fault: "
              f"median {statistics.median(redone):g}, max {max(redone)}, sum {sum(redone)}")
        print(f"  fault to the next step: median {statistics.median(recover):.1f} s, p95 {pct(recover, 0.95):.1f} s, "
              f"max {max(recover):.1f} s")
    print(f"  time: undisturbed {ref_s:.0f} s, soak {run_s:.0f} s: {run_s - ref_s:.0f} s lost, "
          f"{100 * (run_s - ref_s) / run_s:.0f}% of the soak")
    if a.fds:
        fd_line = ", ".join(f"invocation {k}: {v[0]} at the first fault, {v[-1]} near the end" for k, v in fds.items())
        print(f"  hpcrun's open file descriptors: {fd_line or 'not sampled'}")
        if fds_end is not None:
            print("    near the end: " + ", ".join(sorted(collections.Counter(fds_end).elements())))
    print(f"  left behind: {len(left)}" + "".join(f"\n    {w}: {x}" for w, x in left))
    same = done["state_checksum"] == done_ref["state_checksum"] and done["steps"] == done_ref["steps"]
    print(f"  state_checksum: {done['state_checksum']} at step {done['steps']}, undisturbed {done_ref['state_checksum']} at "
          f"step {done_ref['steps']}: {'the same' if same else 'DIFFERENT'}")
    if len(by_kind) < a.min_kinds: print(f"  only {len(by_kind)} kind(s) of fault injected, --min-kinds {a.min_kinds}")
    return 0 if same and not left and len(by_kind) >= a.min_kinds else 1


def cli(argv):
    """main() with an input it cannot read as one line on stderr and exit code 2."""
    return report_cli.run(PROG, main, argv, UsageError, "the report")

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
