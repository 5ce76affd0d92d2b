#!/usr/bin/env python3
"""Checks a Chrome trace that hpctrain --timeline-file wrote (mpi_test's ChromeTraceOfEveryRank).

The file must load as strict JSON and match chrome_trace.schema.json (the Trace Event Format's
array form, as hpctrain uses it; Perfetto's trace processor, which would load it too, is not
available offline here). Then, for every rank and every step of --steps: the step, its data wait,
forward, backward and optimizer on the main thread (tid 0), inside the step; every bucket queued
and all-reduced on tid 1, with the same extent on every rank and step; with --statistics, the
batch-norm statistics' average queued and all-reduced there too, one size throughout, ahead of
bucket 0; the --expect names (e.g.
checkpoint) on every rank; each rank's steps in order in time (a resumed run's after the stopped
run's, which it appends to); and the units: rank 0's step durations against the metrics file's
step_seconds (a trace in milliseconds, or in seconds, is off by 1000).

Exit 0 when it holds; otherwise 1, with one line per problem (the first 20)."""
import argparse
import collections
import json
import sys

import jsonschema

PHASES = ("data wait", "forward", "backward", "optimizer")
SLACK_US = 2000  # the phases are timed on one thread's clock; only rounding separates them


def steps_of(text):
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def check_statistics(by, rank, step, problems):
    """The batch-norm statistics' average: queued and all-reduced on tid 1, its size in its args,
    done before the first bucket's all-reduce starts (the thread takes it first)."""
    got = {k: by.get((rank, 1, f"{k} statistics", step)) for k in ("queue", "allreduce")}
    if not all(got.values()):
        problems.append(f"rank {rank}, step {step}: no {' or '.join(k for k, v in got.items() if not v)} statistics")
        return None
    a = got["allreduce"][-1]
    if a["args"]["values"] <= 0 or a["args"]["bytes"] != 4 * a["args"]["values"]:
        problems.append(f"allreduce statistics of step {step} on rank {rank}: size {a['args']}")
    first = by.get((rank, 1, "allreduce bucket 0", step))
    # (The GPU path's times are the host's: each call "starts" as it is enqueued and "ends" when
    # the step joins the NCCL stream, a queue of no length; its order is the stream's, not shown.)
    host_times = got["queue"][-1]["dur"] > 0
    if first and host_times and a["ts"] + a["dur"] > first[-1]["ts"] + 1e-3:
        problems.append(f"rank {rank}, step {step}: the statistics' all-reduce ends after bucket 0's starts")
    return a["args"]["values"]


def check(trace, schema, ranks, steps, expect, metrics, statistics=False):
    problems = []
    try:
        jsonschema.validate(trace, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        return [f"not the Trace Event Format: {e.message} at {list(e.absolute_path)}"]
    complete = [e for e in trace if e["ph"] == "X"]
    named = {e["pid"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    by = collections.defaultdict(list)  # (rank, tid, name, step) -> events
    for e in complete:
        by[(e["pid"], e["tid"], e["name"], e.get("args", {}).get("step"))].append(e)
    buckets = {}  # bucket -> (begin, end)
    for e in complete:
        if e["name"].startswith(("queue bucket ", "allreduce bucket ")):
            a = e["args"]
            if e["name"].split()[-1] != str(a["bucket"]):
                problems.append(f"{e['name']} has args.bucket {a['bucket']}")
            if a["bytes"] != 4 * (a["end"] - a["begin"]) or a["end"] <= a["begin"]:
                problems.append(f"{e['name']} of step {a['step']} on rank {e['pid']}: extent {a}")
            if buckets.setdefault(a["bucket"], (a["begin"], a["end"])) != (a["begin"], a["end"]):
                problems.append(f"bucket {a['bucket']} has two extents: {buckets[a['bucket']]}, {a}")
    if sorted(buckets) != list(range(len(buckets))) or len(buckets) < 2:
        problems.append(f"buckets {sorted(buckets)}: want 0..N-1 with N >= 2")
    sizes = set()  # the statistics' values: one count on every rank and step
    for rank in range(ranks):
        if rank not in named:
            problems.append(f"rank {rank} has no process_name")
        for step in steps:
            whole = by.get((rank, 0, f"step {step}", step))
            if not whole:
                problems.append(f"rank {rank} has no step {step}")
                continue
            begin, end = whole[-1]["ts"], whole[-1]["ts"] + whole[-1]["dur"]
            for name in PHASES:
                found = by.get((rank, 0, name, step))
                if not found:
                    problems.append(f"rank {rank}, step {step}: no {name}")
                elif not begin - SLACK_US <= found[-1]["ts"] <= found[-1]["ts"] + found[-1]["dur"] <= end + SLACK_US:
                    problems.append(f"rank {rank}, step {step}: {name} is outside the step")
            for b in buckets:
                for kind in ("queue", "allreduce"):
                    if not by.get((rank, 1, f"{kind} bucket {b}", step)):
                        problems.append(f"rank {rank}, step {step}: no {kind} bucket {b}")
            if statistics and (values := check_statistics(by, rank, step, problems)) is not None:
                sizes.add(values)
        # In time as in number: a resumed run's steps after the stopped run's, whose file it
        # appends to (both counted from 0, they lay over each other).
        timed = [by[(rank, 0, f"step {s}", s)][-1] for s in steps if by.get((rank, 0, f"step {s}", s))]
        for a, b in zip(timed, timed[1:]):
            if b["ts"] < a["ts"] + a["dur"] - SLACK_US:
                problems.append(f"rank {rank}: {b['name']} begins at {b['ts']} us, before {a['name']} ends "
                                f"({a['ts']} + {a['dur']} us)")
        for name in expect:
            if not any(k[0] == rank and k[2] == name for k in by):
                problems.append(f"rank {rank} has no {name}")
    if len(sizes) > 1:
        problems.append(f"the statistics' all-reduce has sizes {sorted(sizes)}: want one")
    for line in metrics:
        if line.get("event") == "step" and line["step"] in steps:
            got = by.get((0, 0, f"step {line['step']}", line["step"]))
            want = line["step_seconds"] * 1e6
            if got and not 0.8 * want - SLACK_US <= got[-1]["dur"] <= 1.25 * want + SLACK_US:
                problems.append(f"step {line['step']} lasts {got[-1]['dur']} in the trace, {want} us in the metrics "
                                "file: not microseconds?")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--schema", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--steps", type=steps_of, required=True, help="FIRST-LAST, counted from 1")
    p.add_argument("--expect", action="append", default=[], help="an event name every rank has (repeatable)")
    p.add_argument("--metrics", help="the run's --metrics-file, with step events (--metrics-every-steps 1)")
    p.add_argument("--statistics", action="store_true",
                   help="every step also averages the batch-norm statistics (several ranks, a model with batch norm)")
    a = p.parse_args()
    try:
        with open(a.trace) as f:
            trace = json.load(f)
    except ValueError as e:
        print(f"{a.trace} is not JSON: {e}")
        return 1
    with open(a.schema) as f:
        schema = json.load(f)
    metrics = []
    if a.metrics:
        with open(a.metrics) as f:
            metrics = [json.loads(line) for line in f if line.strip()]
    problems = check(trace, schema, a.ranks, a.steps, a.expect, metrics, a.statistics)
    for problem in problems[:20]:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
