#!/usr/bin/env python3
"""What a data-parallel run would do on more GPUs: step time, exposed communication, images/s and
scaling efficiency from 1 to 512 GPUs, from one run's bucket timeline and a cluster description.

  scaling_model.py --timeline T.jsonl (--metrics M.jsonl | --step-seconds S) --cluster NAME
                   [--clusters FILE] [--gpus 8,16,...] [--bucket-mb MB] [--no-overlap]
                   [--scale-to SECONDS] [--batch B] [--skip-steps K] [--no-jitter] [--json]
  scaling_model.py --arch vgg16|resnet101|resnet50 --step-seconds S --batch B --cluster NAME ...
  scaling_model.py --fit-sweep SWEEP.jsonl      (alpha and beta per rank count, as a "local" preset)
  scaling_model.py --explain TRACE.json [--skip-steps K] [the model's inputs, as above, of one node]
                   (a run of several ranks taken apart from its Chrome trace: per rank, when its
                   backward pass ends, its wait for the slowest rank, each bucket's hand-over to the
                   communication thread, its all-reduce and the wait inside it for the other ranks,
                   the main thread's wait; with the model's inputs, the model's figure for each part)

The timeline is hpctrain's --timeline-file: JSON Lines (per step and bucket: begin, end in arena
elements of 4 bytes; queued, started, done, backward_done, finished in seconds since the step began)
or the Chrome trace (rank 0's "queue bucket N" and "backward" events). Each bucket's ready time is the
median over the steps after --skip-steps of when it was queued. The step's compute time is the
one-rank step time (--metrics: the median step_seconds - comm_wait_seconds of its step events;
or --step-seconds); --scale-to multiplies every time by SECONDS / that (another device's step).
--arch builds the timeline from an ImageNet architecture instead: each conv or fc layer (with its
batch norm) one group, the forward pass a third of the step and each layer's backward a share of
the other two thirds in proportion to its FLOPs at 224x224, its gradient ready when it ends.

Model. A ring all-reduce of S bytes on n ranks costs its latency + 2(n-1)/n*S*beta, its latency as
NCCL's tuning model charges a ring (src/graph/tuning.cc): the cluster's ring_base_latency_us once a
call, each of a chunk's 2(n-1) hops at the alpha of the link it crosses (2(nodes-1) of them the
network's), and across nodes times ring_plateau for all but tiny messages (each rank's share 64
bytes or more); both default to 0 and 1, which leaves 2(n-1)*alpha (the local machine's MPI fits).
Flat: one ring over all GPUs, its bytes paced by the network (one ring edge leaving each node);
across nodes each of its hops inside a node costs at least NCCL's network overhead (net_overhead_us
x 3). NCCL (where the preset has a tree): the faster of that ring and NCCL's tree (Simple protocol:
tree base + 2 x ((ranks a node - 1) x its hop inside + floor(log2 nodes) x its network hop), the
ring's bus bandwidth x 0.92 x 0.5 x NCCL's medium-size correction), as NCCL picks per call.
Hierarchical: three calls, ring reduce-scatter inside the node, ring all-reduce of S/g between the
nodes (g parallel rings sharing the node's link: beta * g), ring all-gather inside the node.
Buckets go in order on one channel: a bucket starts at max(its ready time, the previous one's end) (--no-overlap: not before the backward pass ends); exposed = max(0,
last end - backward end); with --cycle-ms a bucket starts no earlier than the next tick of the
framework's loop, every MS from the step's start (Horovod's background thread slept 5 ms between
rounds in 2017); step = compute + exposed; efficiency = 1-GPU step / step. The hand-off: where the
input is a one-rank CPU run (--metrics of world size 1, not --scale-to), hpctrain's communication
thread is woken for each bucket and wakes the waiting main thread when it is done, which that run's
own wait for its buckets measures (with one rank nothing is all-reduced): its median comm wait h,
half before each bucket starts and half after the last ends. Stragglers: the
ranks' steps vary as the one rank's did (sigma: 1.4826 x the median absolute deviation of its step
times, from --metrics; none with --scale-to, --step-seconds alone, --arch or --no-jitter), and every
bucket waits for the slowest rank's, sigma x E[max of n standard normals] later (the mean rank's
step_seconds and exposed_seconds). What bench/scaling_check.sh measures is one rank's mean over its
steps, the longest 5% left out (trimmed_step_seconds, trimmed_exposed_seconds; --explain): that
rank's compute sigma z, the slowest of the others sigma max(0, m - z) behind it, over a grid of both
quantiles (each rank is sometimes the slowest, and waits for nobody then; of 2 ranks, every other
step: their median wait sits on that edge, so no median is compared). Where a node
runs more busy threads than it has cores (cores_per_node, the local machine only), compute is
stretched by ceil(ranks / cores) (the busiest core's share; one math thread a rank; the communication thread waits in MPI
with mpi_yield_when_idle, so it gives its core to them: bench/scaling_check.sh). Other bucket sizes: the
timeline's buckets are regrouped into runs of whole buckets as hpctrain cuts its arena (from the
end, each at least the size, the first closed once it holds 1 MB); a run is ready when its last part is.
hpctrain's own calls a step beside the buckets: the batch-norm statistics' average (the timeline's
statistics_* fields or "queue statistics" events; --arch: a mean and a variance a batch-norm channel,
queued as the forward pass ends), reduced first on the buckets' channel; and the step boundary's
agreement after the update (a blocking MPI all-reduce of 5 + 2n doubles: boundary_seconds, counted
in images/s and the efficiency, not in step_seconds). --other-framework leaves both out.

Input is checked, a mistake one line on stderr and exit code 2: every figure of a timeline, metrics
file, clusters file or sweep a JSON number (not a string or a bool), finite, in its range (times 0
to a day, a bucket queued by about its step's backward end, no two buckets over the same elements,
latencies 0 to 1 s, bandwidths 0.001 to 1e6 GB/s, counts positive integers, at most 1,000,000 GPUs),
and so every number option; --arch takes --step-seconds, not --metrics. A JSON Lines timeline's
line cut short (a killed run's last, which hpctrain appends after) is skipped with a warning; a
Chrome trace cut short is refused; JSON nested past what Python decodes is not JSON. A reader that
stops early (| head) ends it quietly (exit 141); standard output that refuses the results (a full
disk) is one line and exit 2.
"""
import argparse
import functools
import json
import math
import os
import re
import statistics
import sys

import report_cli  # bench/report_cli.py, beside this file

FLOAT_BYTES = 4
FIRST_BUCKET_BYTES = 1 << 20  # hpctrain's GradientBucketer::kFirstBucketBytes
DEFAULT_GPUS = [2 ** k for k in range(10)]
CANDIDATE_MB = [0.25, 0.5, 1, 2, 4, 8, 16, 25, 32, 64, 128, 256, 1024]
HERE = os.path.dirname(os.path.abspath(__file__))


class UsageError(Exception):
    """A mistake in the input: one line, exit code 2."""


def require(ok, message):
    if not ok:
        raise UsageError(message)


def warn(message):
    print(f"scaling_model: warning: {message}", file=sys.stderr)


def json_loads(text):
    """json.loads, where JSON nested past the decoder's depth (RecursionError, a traceback) is
    refused as any text that is not JSON is: a ValueError, which each reader reports in its way."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


# What the inputs may hold: beyond these a figure is a mistake (and its results hundreds of digits).
MAX_GPUS = 1_000_000
MAX_SECONDS = 86400.0  # a step, and any time within one
MAX_TRACE_US = 1e17  # a Chrome trace's timestamps (microseconds since 1970; since the run began before)
MAX_ELEMENTS = 1 << 40  # a timeline's arena offsets (elements of 4 bytes)
MAX_BYTES = 1 << 40  # a sweep's message
MAX_LATENCY_US = 1e6
MIN_GBPS, MAX_GBPS = 1e-3, 1e6
MAX_PLATEAU = 100.0
MAX_BATCH = 10_000_000
MISSING = object()


def number(value, what, low=0, high=math.inf, integer=False, above=False, shown=None):
    """value, where it is a finite number (JSON's: not a bool, not a string; integral where integer)
    from low (above: beyond low) to high; else a UsageError naming what (shown: the value as given)."""
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
    if ok and (isinstance(value, int) or math.isfinite(value)) and (value > low if above else value >= low) \
            and value <= high:
        return value
    limit = lambda x: str(int(x)) if float(x).is_integer() else f"{x:g}"  # noqa: E731
    if not ok:
        wrong = "an integer" if integer else "a number"
    elif not isinstance(value, int) and not math.isfinite(value):
        wrong = "finite"
    elif value > high:
        wrong = f"at most {limit(high)}"
    elif above and low == 0 or integer and low == 1:
        wrong = "positive"
    else:
        wrong = f"{'above' if above else 'at least'} {limit(low)}"
    if shown is None:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise UsageError(f"{what + ' ' if what else ''}must be {wrong}, got {shown}")


def mapping(value, what):
    """value, where it is a JSON object; else a UsageError naming what."""
    require(isinstance(value, dict), f"{what} must be a JSON object, got {json.dumps(value)[:40]}")
    return value


def field(obj, key, where, default=MISSING, prefix="", **limits):
    """obj[key] (obj a JSON object, where says whose: a file and its line or preset, prefix the path
    to obj) as number() takes it; default where obj has no key (none given: a UsageError)."""
    if key not in obj:
        require(default is not MISSING, f"{where} lacks {prefix}{key}")
        return default
    return number(obj[key], f"{where}: {prefix}{key}", **limits)


# ---------------------------------------------------------------- cost of one all-reduce

def ring_allreduce(size, n, link):
    """Seconds of a ring all-reduce of `size` bytes on n ranks over `link` (alpha s, beta s/byte)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link["alpha"] + 2 * (n - 1) / n * size * link["beta"]


def plateau(size, n, cluster):
    """NCCL's own correction of a ring all-reduce's latency across nodes for all but tiny messages
    (src/graph/tuning.cc, "plateau effect of ring": x1.9 before compute capability 8.0, x1.4 from it,
    once each rank's share is 64 bytes or more; NCCL divides by its channels too, not modelled)."""
    return cluster["ring_plateau"] if size / n >= 64 else 1.0


def flat_ring(size, n, nodes, cluster):
    """One ring over n ranks on `nodes` nodes: a chunk crosses the network on 2(nodes-1) of its
    2(n-1) hops and a node's link on the rest, and the network paces the bytes (NCCL's ring latency:
    its base once, each hop's latency by what it crosses, across nodes each hop inside a node at
    least NCCL's network overhead (3 x the preset's net_overhead_us with the Simple protocol), the
    plateau factor across nodes)."""
    intra, inter = intra_link(cluster, n if nodes == 1 else cluster["gpus_per_node"]), cluster["inter_link"]
    hops, network_hops = 2 * (n - 1), 2 * (nodes - 1)
    intra_hop = intra["alpha"] if nodes == 1 else max(intra["alpha"], 3 * cluster["net_overhead"])
    latency = cluster["ring_base"] + (hops - network_hops) * intra_hop + network_hops * inter["alpha"]
    if nodes > 1:
        latency *= plateau(size, n, cluster)
    beta = (inter if nodes > 1 else intra)["beta"]
    return latency + 2 * (n - 1) / n * size * beta


# NCCL's correction of its tree's bandwidth for medium sizes, Simple protocol, by log2(bytes / 64)
# from 0 to 22 (src/graph/tuning.cc, treeCorrectionFactor).
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)


def tree(size, n, nodes, cluster):
    """NCCL's tree all-reduce (Simple protocol), as its tuning model costs it (src/graph/tuning.cc):
    latency base + 2 x ((ranks a node - 1) x the tree's hop inside a node + floor(log2 nodes) x its
    network hop); bandwidth the ring's bus bandwidth x 0.92, x 0.5 (a tree's bus to algorithm
    bandwidth), x the medium-size correction. NCCL's per-channel caps are not modelled."""
    t = cluster["tree"]
    g = n // nodes
    latency = t["base"] + 2 * ((g - 1) * t["intra"] + int(math.log2(nodes)) * t["inter"])
    bus = 1 / (cluster["inter_link"] if nodes > 1 else intra_link(cluster, n))["beta"]
    log_size = int(math.log2(size // 64)) if size >= 64 else -1
    correction = TREE_CORRECTION[log_size] if 0 <= log_size < len(TREE_CORRECTION) else 1.0
    return latency + size / (bus * 0.92 * 0.5 * correction)


def allreduce_seconds(size, n, cluster, scheme):
    if n <= 1:
        return 0.0
    g = min(cluster["gpus_per_node"], n)
    nodes = n // g
    if scheme == "nccl":  # the faster of NCCL's ring and tree, as NCCL picks per call
        ring = flat_ring(size, n, nodes, cluster)
        return min(ring, tree(size, n, nodes, cluster)) if cluster["tree"] else ring
    if nodes == 1 or scheme == "flat":
        return flat_ring(size, n, nodes, cluster)
    # Hierarchical: three calls, each with its base latency: a ring reduce-scatter in the node, an
    # all-reduce of size/g between the nodes (the node's link shared by its g rings), an all-gather.
    intra, inter, base = intra_link(cluster, g), cluster["inter_link"], cluster["ring_base"]
    half_inside = base + (g - 1) * intra["alpha"] + (g - 1) / g * size * intra["beta"]
    latency_between = (base + 2 * (nodes - 1) * inter["alpha"]) * plateau(size / g, nodes, cluster)
    return 2 * half_inside + latency_between + 2 * (nodes - 1) / nodes * size * inter["beta"]


def intra_link(cluster, ranks):
    """The link inside a node; a measured fit for this many ranks wins (the local machine)."""
    return cluster["fits"].get(str(ranks), cluster["intra_link"])


def boundary_seconds(n, cluster):
    """hpctrain's step boundary: every rank, after its update, all-reduces 5 flags and its 2 slots of
    the 2n straggler figures (doubles) on the hosts' MPI, blocking (src/train/run/boundary.cpp,
    StepAgreement::reach), and the GPU waits for it. With the local machine's measured MPI fits,
    their cost; elsewhere recursive doubling, as MPI's all-reduce takes small messages (Thakur,
    Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH", 2005):
    log2 of a node's ranks rounds inside it, then log2 of the nodes across the network, each round a
    latency (the preset's host_mpi_latency_us) and the message over the link."""
    if n <= 1:
        return 0.0
    size = 8 * (5 + 2 * n)
    if cluster["fits"]:
        return allreduce_seconds(size, n, cluster, "flat")
    g = min(cluster["gpus_per_node"], n)
    nodes = n // g
    inside = math.ceil(math.log2(g)) * (cluster["host_alpha"]["intra"] + size * cluster["intra_link"]["beta"])
    between = math.ceil(math.log2(nodes)) * (cluster["host_alpha"]["inter"] + size * cluster["inter_link"]["beta"])
    return inside + between


# ---------------------------------------------------------------- the simulation

def busy_stretch(cluster, ranks_per_node):
    """Compute stretched where a node's ranks have fewer cores than math threads (one a rank): a
    synchronous step ends when the busiest core has run its ranks' work, ceil(ranks / cores) of
    them (3 ranks on 2 cores: 2, not 1.5; the scheduler does not split a rank's step evenly over
    the cores within a step of milliseconds)."""
    cores = cluster.get("cores_per_node")
    return float(max(1, math.ceil(ranks_per_node / cores))) if cores else 1.0


def simulate(run, n, cluster, scheme, overlap, buckets=None, trimmed=True):
    """Predicted step, exposed communication and their parts for n GPUs (trimmed=False: one rank's
    trimmed means left as the mean rank's figures, where only the exposed time is wanted)."""
    buckets = run["buckets"] if buckets is None else buckets
    stretch = busy_stretch(cluster, min(n, cluster["gpus_per_node"]))

    def at(t):  # a time of the 1-rank step, stretched
        return t * stretch

    # The slowest of n ranks whose steps vary as the one rank's did: its buckets are ready this much
    # later, and every rank waits for it.
    sigma = run["jitter"] * stretch
    late = sigma * expected_max_normal(n)
    wake = run["handoff"] / 2  # to the communication thread, and back to the main thread
    backward_done = at(run["backward_done"])

    def buckets_after(late):
        """The calls' parts and the main thread's exposed wait, the slowest rank this late: the batch-
        norm statistics' average first (queued as the forward pass ends; without overlap held, as
        hpctrain holds it, until the backward pass's end, and then ahead of every bucket), then the
        buckets, in order on one channel."""
        end, parts = 0.0, {"statistics": None, "buckets": []}
        calls = ([("statistics", run["statistics"])] if run["statistics"] else []) + [("bucket", b) for b in buckets]
        for kind, b in calls:
            ready = (at(b["ready"]) if overlap else backward_done) + late
            if run["cycle"]:  # the framework's loop takes it up at its next tick
                ready = math.ceil(ready / run["cycle"] - 1e-9) * run["cycle"]
            start = max(ready + wake, end)
            handoff = start - max(ready, end)  # the wake-up, or none behind the previous call
            end = start + allreduce_seconds(b["bytes"], n, cluster, scheme)
            part = {"bytes": b["bytes"], "ready_seconds": ready - late, "start_seconds": start,
                    "handoff_seconds": handoff, "allreduce_seconds": end - start}
            if kind == "statistics":
                parts["statistics"] = part
            else:
                parts["buckets"].append(part)
        return end + wake - backward_done, parts  # the main thread's wait, less where it is negative

    def exposed_of(wait):
        return max(0.0, wait) if n > 1 else 0.0

    wait, parts = buckets_after(late)
    exposed = exposed_of(wait)
    compute = at(run["step"])
    step = compute + exposed
    # The step loop's period: the step (hpctrain's step_seconds: its batch to its update) and the
    # boundary's agreement after it, which images/s and the efficiency count.
    boundary = boundary_seconds(n, cluster) if run["boundary"] else 0.0
    # What a check measures: one rank's mean over its steps, the longest TRIM of them left out (a
    # shared machine's hiccups). With the spread, that is not the mean rank's figure above: each
    # rank is sometimes the slowest and waits for nobody then, and the trim drops the widest spreads.
    # The one rank's own trimmed mean stands for the centre of its compute (a shared machine's steps
    # lean right of their median): the trimmed step is it, plus the trimmed sigma z + wait, less
    # the trimmed sigma z the rank's own noise already holds.
    one_rank = at(run["step_trimmed"])
    trimmed_step, trimmed_exposed, trimmed_late = one_rank + exposed, exposed, late
    if trimmed and sigma > 0 and n > 1:
        if run["cycle"]:  # the loop's ticks: not linear in the lateness
            exposed_after = lambda t: exposed_of(buckets_after(t)[0])  # noqa: E731
        else:  # every call's start shifts with the lateness, and so does the last end
            exposed_after = lambda t: exposed_of(wait - late + t)  # noqa: E731
        trimmed_late, trimmed_exposed, trimmed_step = one_rank_trimmed(exposed_after, sigma, n)
        trimmed_step += one_rank - sigma * trimmed_standard_normal()
        parts = buckets_after(trimmed_late)[1]  # explain sets them beside one rank's figures
    return {"gpus": n, "nodes": max(1, n // cluster["gpus_per_node"]), "scheme": scheme,
            "step_seconds": step, "exposed_seconds": exposed, "compute_seconds": compute,
            "boundary_seconds": boundary,
            "images_per_second": n * run["batch"] / (step + boundary) if run["batch"] else None,
            "efficiency": run["step"] / (step + boundary),
            "trimmed_step_seconds": trimmed_step, "trimmed_exposed_seconds": trimmed_exposed,
            # The parts (explain, beside one rank's trimmed means): when the backward pass ends, how late
            # the slowest rank is (for the mean rank, and one rank's trimmed mean), each bucket's times
            # (from the step's start, the slowest rank that late) and its hand-over to the
            # communication thread.
            "parts": {"backward_done_seconds": backward_done, "late_seconds": late,
                      "trimmed_late_seconds": trimmed_late, **parts}}


TRIM = 0.05  # the share of a rank's steps, the longest, that its trimmed means leave out


def trimmed_mean(values, trim=TRIM):
    """The mean of the values less the largest trim of them (floor of trim x their count)."""
    values = sorted(values)
    return statistics.fmean(values[:len(values) - int(trim * len(values))])


@functools.lru_cache(maxsize=None)
def trimmed_standard_normal(k=128):
    """The trimmed mean of a standard normal on the grid one_rank_trimmed uses (about -0.108)."""
    normal = statistics.NormalDist()
    return trimmed_mean(normal.inv_cdf((i + 0.5) / k) for i in range(k) for _ in range(k))


def one_rank_trimmed(exposed_after, sigma, n, k=128):
    """One rank's trimmed means over the steps of: how late the slowest rank is behind it, its exposed
    wait, and its step less the compute's centre, where each of the n ranks' compute is sigma x a
    standard normal, independent. The rank's own z and the max m of the other n - 1 (its CDF
    Phi^(n-1)) on a k x k grid of their quantiles; the slowest is max(0, m - z) x sigma late, the
    rank waits exposed_after(that), and its step is its own sigma z plus that wait."""
    normal = statistics.NormalDist()
    own = [normal.inv_cdf((i + 0.5) / k) for i in range(k)]
    others = [normal.inv_cdf(((j + 0.5) / k) ** (1 / (n - 1))) for j in range(k)]
    lates, waits, steps = [], [], []
    for z in own:
        for m in others:
            late = sigma * max(0.0, m - z)
            wait = exposed_after(late)
            lates.append(late)
            waits.append(wait)
            steps.append(sigma * z + wait)
    return trimmed_mean(lates), trimmed_mean(waits), trimmed_mean(steps)


@functools.lru_cache(maxsize=None)
def expected_max_normal(n):
    """E[max of n independent standard normals] (0.564 for 2, 1.029 for 4), by the trapezoid rule."""
    if n <= 1:
        return 0.0
    h, total = 0.001, 0.0
    for i in range(-10000, 10001):
        x = i * h
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * n * pdf * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1) * h
    return total


def rebucket(groups, bucket_bytes):
    """hpctrain's partition_buckets over the timeline's groups (arena end first)."""
    first = min(bucket_bytes, FIRST_BUCKET_BYTES)
    out, size, ready = [], 0, 0.0
    for i, g in enumerate(groups):
        size += g["bytes"]
        ready = max(ready, g["ready"])
        if size >= (first if not out else bucket_bytes) or i == len(groups) - 1:
            out.append({"bytes": size, "ready": ready})
            size, ready = 0, 0.0
    return out


def best_bucket(run, n, cluster, scheme, overlap):
    """The candidate bucket size with the least exposed communication (the larger one on a tie)."""
    best = None
    total_mb = sum(g["bytes"] for g in run["buckets"]) / 1e6
    for mb in [m for m in CANDIDATE_MB if m < 2 * total_mb] or [CANDIDATE_MB[0]]:
        r = simulate(run, n, cluster, scheme, overlap, rebucket(run["buckets"], int(mb * 1e6)), trimmed=False)
        if best is None or r["exposed_seconds"] <= best[1] * (1 + 1e-9):
            best = (mb, r["exposed_seconds"])
    return best


# ---------------------------------------------------------------- inputs

def read_json_file(path, what):
    """The text of the file `what` names: UTF-8, not empty."""
    require(os.path.exists(path), f"{what} '{path}' not found")
    require(os.path.isfile(path), f"{what} '{path}' is not a regular file"
            + (" (a directory)" if os.path.isdir(path) else ""))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"{what} '{path}': {e.strerror}")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} '{path}' is not UTF-8 text (byte {e.start}: {e.object[e.start]:#04x})")
    require(text.strip(), f"{what} '{path}' is empty")
    return text


def read_timeline(path, skip):
    text = read_json_file(path, "timeline")
    trace = chrome_events(text, path, "timeline")
    rows = chrome_rows(trace, path) if trace is not None else jsonl_rows(text, path)
    require(rows, f"timeline '{path}' has no bucket lines")
    steps = sorted({r["step"] for r in rows})
    kept = steps[skip:] if len(steps) > skip else steps[-1:]
    by_bucket = {}
    for r in rows:
        if r["step"] in kept:
            require(r["end"] > r["begin"] >= 0, f"timeline '{path}': bucket {r['bucket']} of step {r['step']} has "
                    f"no elements (begin {r['begin']}, end {r['end']})")
            by_bucket.setdefault(r["bucket"], []).append(r)
    buckets = []
    for b in sorted(by_bucket):
        rs = by_bucket[b]
        require(all((r["begin"], r["end"]) == (rs[0]["begin"], rs[0]["end"]) for r in rs),
                f"timeline '{path}': bucket {b} changes its elements between steps")
        buckets.append({"bytes": (rs[0]["end"] - rs[0]["begin"]) * FLOAT_BYTES,
                        "ready": statistics.median(r["queued"] for r in rs)})
    # Each element's gradient is in one bucket: overlapping buckets would all-reduce it twice.
    spans = sorted((rs[0]["begin"], rs[0]["end"], b) for b, rs in by_bucket.items())
    for (b0, e0, i), (b1, e1, j) in zip(spans, spans[1:]):
        require(b1 >= e0, f"timeline '{path}': buckets {i} (elements {b0} to {e0}) and {j} ({b1} to {e1}) overlap")
    backward = statistics.median(r["backward_done"] for r in rows if r["step"] in kept)
    require(backward > 0, f"timeline '{path}': the backward pass never ends (backward_done {backward})")
    # The batch-norm statistics' average, where the kept steps had one: its size, and when it was
    # queued (the forward pass's end, with overlap). A timeline of before 2026-11-29, or of a run
    # without batch norm or with --sync-batch-norm, has none.
    # Where only some steps have it (a JSON Lines file appended to by an older build, a trace that
    # lost events), those steps say what it is.
    averages = {r["step"]: r["statistics"] for r in rows if r["step"] in kept and "statistics" in r}
    average = None
    if averages:
        average = {"bytes": max(v for v, _ in averages.values()) * FLOAT_BYTES,
                   "ready": statistics.median(q for _, q in averages.values())}
    return buckets, backward, average


BUCKET_KEYS = ("step", "bucket", "begin", "end", "queued", "backward_done")


def bucket_row(r, where):
    """One bucket line's figures (a JSON Lines line, or made of the Chrome trace's events), each checked:
    counts integers, times in seconds from the step's start; a bucket (and the statistics' average)
    queued by about the backward pass's end: no later than twice that and a second (hpctrain reads
    the clock for backward_done before it queues the last one; on a GPU the host's clock runs ahead
    of the kernels: a loose bound, for figures that cannot be a step's)."""
    row = {k: field(r, k, where, integer=True, high=MAX_ELEMENTS) for k in ("step", "bucket", "begin", "end")}
    row["backward_done"] = field(r, "backward_done", where, high=MAX_SECONDS)
    by_then = row["backward_done"] * 2 + 1.0
    row["queued"] = field(r, "queued", where, high=by_then)
    if "statistics_values" in r:  # the step's batch-norm statistics' average (since 2026-11-29)
        row["statistics"] = (field(r, "statistics_values", where, integer=True, low=1, high=MAX_ELEMENTS),
                             field(r, "statistics_queued", where, high=by_then))
    return row


def jsonl_rows(text, path):
    """The bucket lines of a JSON Lines timeline. A line cut short (not JSON, but begun as one: a
    killed run's last, which hpctrain appends after) is skipped with a warning."""
    rows, cut = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        not_ours = f"timeline '{path}' line {n} is not a bucket line of hpctrain's --timeline-file"
        try:
            r = json_loads(line)
        except ValueError:
            require(line.lstrip().startswith("{"), not_ours)
            cut.append(n)
            continue
        require(isinstance(r, dict) and all(k in r for k in BUCKET_KEYS), not_ours)
        rows.append(bucket_row(r, f"timeline '{path}' line {n}"))
    if rows and cut:
        warn(f"timeline '{path}': line{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))} cut short "
             f"(a killed run's?), skipped")
    return rows


def chrome_events(text, path, what):
    """The Chrome trace's events (a JSON array, or an object with traceEvents); None for JSON Lines.
    A trace that is not JSON (cut short) is refused: JSON Lines begin with an object."""
    try:
        doc = json_loads(text)
    except ValueError as e:
        require(not text.lstrip().startswith("[") and '"traceEvents"' not in text.lstrip().split("\n", 1)[0],
                f"{what} '{path}' is a truncated or invalid Chrome trace ({e})")
        return None
    if isinstance(doc, list):
        return doc
    return doc["traceEvents"] if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) else None


def runs_of(events):
    """Each event with the number of the run that wrote it. A trace appended to by a resumed run
    (hpcrun's --resume auto relaunches) holds each run's events after the last one's, its steps
    keeping their numbers (a run resumed from a checkpoint before the last gather repeats some; and
    a trace of an older hpctrain starts every run's clock again near 0): each run's first events are rank 0's metadata
    ("process_name"), which start the next run."""
    run, out = 0, []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("pid", 0) == 0 and e.get("name") == "process_name":
            run += 1
        out.append((max(run, 1), e))
    return out


def chrome_rows(events, path):
    """Rank 0's buckets from the Chrome trace: 'queue bucket N' starts when the bucket was queued. Steps
    are each run's (runs_of): a run's events are never timed against another run's steps."""
    mine = [(run, e) for run, e in runs_of(events)
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("pid", 0) == 0]

    def at(e, key="ts"):  # an event's time or duration, in microseconds
        return field(e, key, f"timeline '{path}': event '{e.get('name')}'", high=MAX_TRACE_US)

    def of_step(e, what):  # the step an event's args name
        a = e.get("args")
        require(isinstance(a, dict) and all(k in a for k in what), f"timeline '{path}': a '{e['name']}' event "
                f"without its {' and '.join(what)}")
        return field(a, "step", f"timeline '{path}': event '{e['name']}'", prefix="args.", integer=True,
                     high=MAX_ELEMENTS)

    starts = {(run, int(str(e.get("name"))[5:])): at(e) for run, e in mine
              if re.fullmatch(r"step \d+", str(e.get("name", "")))}
    backward = {}
    for run, e in mine:  # the step a backward belongs to: its run's step that began last before it
        if e.get("name") == "backward":
            begin = at(e)
            owner = max(((t, s) for (r, s), t in starts.items() if r == run and t <= begin), default=None)
            if owner is not None:
                backward[(run, owner[1])] = (begin + at(e, "dur") - owner[0]) * 1e-6
    averages = {}  # (run, step) -> (values, queued): the batch-norm statistics' average
    for run, e in mine:
        if e.get("name") == "queue statistics":
            step = of_step(e, ("step", "values"))
            require((run, step) in starts, f"timeline '{path}': a 'queue statistics' event of step {step}, which has "
                    f"no 'step {step}' event")
            averages[(run, step)] = (e["args"]["values"], (at(e) - starts[(run, step)]) * 1e-6)
    rows = []
    for run, e in mine:
        if str(e.get("name", "")).startswith("queue bucket "):
            step = of_step(e, ("step", "bucket", "begin", "end"))
            require((run, step) in starts and (run, step) in backward, f"timeline '{path}': step {step} of a "
                    f"'queue bucket' event has no 'step {step}' and 'backward' events")
            r = {k: e["args"][k] for k in ("step", "bucket", "begin", "end")}
            r.update(queued=(at(e) - starts[(run, step)]) * 1e-6, backward_done=backward[(run, step)])
            if (run, step) in averages:
                r["statistics_values"], r["statistics_queued"] = averages[(run, step)]
            rows.append(bucket_row(r, f"timeline '{path}': event '{e['name']}' of step {step}"))
    return rows


def measured_parts(path, skip):
    """The parts of a run of several ranks, from its Chrome trace (every rank's events; each rank's
    clock starts at its own zero, so nothing is compared across ranks but durations, and the end of a
    step's last all-reduce, which every rank leaves at about the same moment). Per rank, means over
    the steps after `skip` that every rank has, the longest TRIM of them left out: when its backward pass ends (from its step's
    start); how long it waits for the slowest rank (its last end after its backward end, less the
    least of that over the ranks: the slowest rank's backward end is the one with the least left to
    wait); per bucket, when it was queued, its hand-over (the all-reduce's start less the later of
    its queueing and the previous call's end: waking the communication thread; the batch-norm
    statistics' average, where the steps have one, is the thread's first call), the all-reduce of
    the rank that waited least inside it (the ring's own time: the others also waited there for
    the last to arrive), and this rank's wait inside it beyond that; its last end after its
    backward end; and what its main thread waited (backward end to the optimizer's start)."""
    text = read_json_file(path, "trace")
    events = chrome_events(text, path, "trace")
    require(events is not None, f"trace '{path}' is not a Chrome trace (hpctrain --timeline-file NAME.json)")
    steps = {}  # (rank, step) -> {name: event}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or not isinstance(e.get("args"), dict) \
                or "step" not in e["args"]:
            continue  # an event of no step (a checkpoint's, an evaluation's)
        where = f"trace '{path}': event '{e.get('name')}'"
        step = field(e["args"], "step", where, prefix="args.", integer=True, high=MAX_ELEMENTS)
        rank = field(e, "pid", where, 0, integer=True, high=MAX_GPUS)
        steps.setdefault((rank, step), {})[str(e.get("name"))] = (field(e, "ts", where, high=MAX_TRACE_US) * 1e-6,
                                                                   field(e, "dur", where, high=MAX_TRACE_US) * 1e-6)
    ranks = sorted({r for r, _ in steps})
    require(len(ranks) >= 2, f"trace '{path}' has the events of {len(ranks)} rank(s): explain needs a run of several")
    buckets = 0
    while any(f"allreduce bucket {buckets}" in d for d in steps.values()):
        buckets += 1
    need = ["backward", "optimizer", *(f"{k} bucket {b}" for b in range(buckets) for k in ("queue", "allreduce"))]
    whole = sorted(s for s in {s for _, s in steps} if all(set(need) <= set(steps.get((r, s), {})) for r in ranks))
    kept = whole[skip:] if len(whole) > skip else whole[-1:]
    require(buckets and kept, f"trace '{path}' has no step with every rank's backward, optimizer and buckets")
    # The batch-norm statistics' average, where every kept step has it: the thread's first call.
    calls = ([("statistics", "statistics")] if all("allreduce statistics" in steps[(r, s)] and "queue statistics"
                                                   in steps[(r, s)] for r in ranks for s in kept) else [])
    calls += [(b, f"bucket {b}") for b in range(buckets)]
    rows = {r: [] for r in ranks}
    fastest = {c: [] for c, _ in calls}
    for s in kept:
        per = {}
        for r in ranks:
            d = steps[(r, s)]
            begin = d[f"step {s}"][0] if f"step {s}" in d else d["backward"][0]
            back_end = d["backward"][0] + d["backward"][1]
            bs, previous_end = {}, -math.inf
            for c, name in calls:  # in the order the communication thread takes them
                queued = d[f"queue {name}"][0]
                start, dur = d[f"allreduce {name}"]
                bs[c] = {"queued": queued - begin, "handoff": start - max(queued, previous_end), "allreduce": dur}
                previous_end = start + dur
            # A last all-reduce done before the backward pass ends: nothing left to wait for.
            per[r] = {"backward_end": back_end - begin, "last_end": max(0.0, previous_end - back_end),
                      "main_wait": d["optimizer"][0] - back_end, "buckets": bs}
        least_left = min(p["last_end"] for p in per.values())
        for c in fastest:
            fastest[c].append(min(p["buckets"][c]["allreduce"] for p in per.values()))
        for r, p in per.items():
            p["waits_for_slowest"] = p["last_end"] - least_left
            for c, x in p["buckets"].items():
                x["waiting_inside"] = x["allreduce"] - fastest[c][-1]
            rows[r].append(p)
    med = trimmed_mean  # each rank's steps, the longest TRIM of them left out
    parts = ("queued", "handoff", "waiting_inside")
    out = {"ranks": len(ranks), "steps": len(kept),
           "allreduce_fastest_seconds": [med(fastest[b]) for b in range(buckets)], "per_rank": []}
    if "statistics" in fastest:
        out["statistics_allreduce_fastest_seconds"] = med(fastest["statistics"])
    for r in ranks:
        ps = rows[r]

        def of_call(c):  # one all-reduce's parts on this rank
            return {k + "_seconds": med(p["buckets"][c][k] for p in ps) for k in parts}

        out["per_rank"].append({
            "rank": r, "backward_done_seconds": med(p["backward_end"] for p in ps),
            "waits_for_slowest_seconds": med(p["waits_for_slowest"] for p in ps),
            "last_end_after_backward_seconds": med(p["last_end"] for p in ps),
            "main_wait_seconds": med(p["main_wait"] for p in ps),
            "buckets": [of_call(b) for b in range(buckets)]})
        if "statistics" in fastest:
            out["per_rank"][-1]["statistics"] = of_call("statistics")
    return out


def explain(measured, predicted, out):
    """The measured parts per rank beside the model's (None: no model inputs given)."""
    ms = lambda v: "-" if v is None else f"{v * 1e3:.3f}"  # noqa: E731
    ranks = measured["per_rank"]
    pp = predicted["parts"] if predicted else None
    out.write(f"{'part (ms; trimmed means of ' + str(measured['steps']) + ' steps)':<58} {'model':>8}"
              + "".join(f" {'rank ' + str(r['rank']):>8}" for r in ranks) + "\n")

    def row(name, model, values):
        out.write(f"{name:<58} {ms(model):>8}" + "".join(f" {ms(v):>8}" for v in values) + "\n")

    row("backward pass ends, from the step's start", pp and pp["backward_done_seconds"],
        [r["backward_done_seconds"] for r in ranks])
    row("waits for the slowest rank", pp and pp["trimmed_late_seconds"],
        [r["waits_for_slowest_seconds"] for r in ranks])
    def call(name, size, mb, per_rank, fastest):
        """One all-reduce's four rows: mb, the model's bucket (None: not in the model)."""
        row(f"{name}{size}: queued, from the step's start", mb and mb["ready_seconds"],
            [p["queued_seconds"] for p in per_rank])
        row(f"{name}: handed to the communication thread", mb and mb["handoff_seconds"],
            [p["handoff_seconds"] for p in per_rank])
        row(f"{name}: all-reduce (measured: its fastest rank's)", mb and mb["allreduce_seconds"],
            [fastest] * len(per_rank))
        row(f"{name}: inside it, waiting for the other ranks", None, [p["waiting_inside_seconds"] for p in per_rank])

    model_buckets = pp["buckets"] if pp else []
    if "statistics_allreduce_fastest_seconds" in measured:
        call("batch-norm statistics", "", pp and pp["statistics"], [r["statistics"] for r in ranks],
             measured["statistics_allreduce_fastest_seconds"])
    for b, fastest in enumerate(measured["allreduce_fastest_seconds"]):
        mb = model_buckets[b] if b < len(model_buckets) else None
        call(f"bucket {b}", f" ({mb['bytes'] / 1e6:.3f} MB)" if mb else "", mb, [r["buckets"][b] for r in ranks], fastest)
    if pp and len(model_buckets) != len(measured["allreduce_fastest_seconds"]):
        out.write(f"(the model has {len(model_buckets)} bucket(s), the run {len(measured['allreduce_fastest_seconds'])})\n")
    last = pp and pp["buckets"][-1]["start_seconds"] + pp["buckets"][-1]["allreduce_seconds"] - pp["backward_done_seconds"]
    row("the last all-reduce ends, after the backward pass", last, [r["last_end_after_backward_seconds"] for r in ranks])
    row("the main thread waits: backward end to the optimizer", predicted and predicted["trimmed_exposed_seconds"],
        [r["main_wait_seconds"] for r in ranks])


def read_metrics(path, skip):
    """The one-rank step's compute time (median step - comm wait), the batch per rank, the spread of
    the compute times, and the hand-off: the median comm wait where the run had one rank (0 else)."""
    text = read_json_file(path, "metrics file")
    steps, waits, batch, world = [], [], None, None
    for n, line in enumerate(text.splitlines(), 1):
        try:
            e = json_loads(line)
        except ValueError:
            continue
        where = f"metrics file '{path}' line {n}"
        require(isinstance(e, dict), f"{where} is not a JSON object (an event of hpctrain's --metrics-file)")
        if e.get("event") == "step":
            step = field(e, "step_seconds", where, above=True, high=MAX_SECONDS)
            wait = field(e, "comm_wait_seconds", where, 0, high=step)  # a part of the step
            steps.append(step - wait)
            waits.append(wait)
        elif e.get("event") == "config":
            world = field(e, "world_size", where, 1, integer=True, low=1, high=MAX_GPUS)
            batch = field(e, "global_batch_size", where, integer=True, low=1, high=MAX_BATCH * MAX_GPUS) // world
    require(steps, f"metrics file '{path}' has no step events (run hpctrain with --metrics-every-steps 1)")
    steps, waits = (steps[skip:], waits[skip:]) if len(steps) > skip else (steps, waits)
    median = statistics.median(steps)
    spread = 1.4826 * statistics.median(abs(t - median) for t in steps)  # a normal's sigma, robust to outliers
    return median, batch, spread, statistics.median(waits) if world == 1 else 0.0, trimmed_mean(steps)


def load_cluster(path, name):
    text = read_json_file(path, "clusters file")
    try:
        presets = json_loads(text)
    except ValueError:
        raise UsageError(f"clusters file '{path}' is not JSON")
    require(isinstance(presets, dict), f"clusters file '{path}' is not a JSON object of presets by name")
    names = sorted(k for k in presets if not k.startswith("_"))
    require(name in names, f"unknown cluster '{name}' (presets in {path}: {', '.join(names)})")
    where = f"cluster '{name}' in {path}"
    c = dict(mapping(presets[name], where))
    latency = {"high": MAX_LATENCY_US}
    c["gpus_per_node"] = field(c, "gpus_per_node", where, integer=True, low=1, high=MAX_GPUS)
    if "cores_per_node" in c:
        c["cores_per_node"] = field(c, "cores_per_node", where, integer=True, low=1, high=MAX_GPUS)
    c["intra_link"], c["inter_link"] = to_link(c, "intra", where), to_link(c, "inter", where)
    fits = mapping(c.get("fits", {}), f"{where}: fits")
    for k in fits:
        require(k.startswith("_") or re.fullmatch(r"[1-9][0-9]*", k), f"{where}: fits key '{k}' is not a rank count")
    c["fits"] = {k: to_link(fits, k, where, "fits.") for k in fits if not k.startswith("_")}
    c["ring_base"] = field(c, "ring_base_latency_us", where, 0, **latency) * 1e-6
    c["ring_plateau"] = field(c, "ring_plateau", where, 1, low=1, high=MAX_PLATEAU)
    c["net_overhead"] = field(c, "net_overhead_us", where, 0, **latency) * 1e-6
    t = c.get("tree")  # NCCL's tree (since NCCL 2.4): its latencies, where the cluster's NCCL has one
    if t is not None:
        t = mapping(t, f"{where}: tree")
        t = {k: field(t, f"{k}_latency_us", where, prefix="tree.", **latency) * 1e-6 for k in ("base", "intra", "inter")}
    c["tree"] = t
    host = mapping(c.get("host_mpi_latency_us", {}), f"{where}: host_mpi_latency_us")  # the step boundary's MPI
    c["host_alpha"] = {k: field(host, k, where, c[k]["latency_us"], "host_mpi_latency_us.", **latency) * 1e-6
                       for k in ("intra", "inter")}
    return c


def to_link(obj, key, where, prefix=""):
    """obj[key], a link of the preset `where` names: its alpha (s) and beta (s/byte)."""
    require(key in obj, f"{where} lacks {prefix}{key}")
    d = mapping(obj[key], f"{where}: {prefix}{key}")
    bw = field(d, "bandwidth_GBps", where, prefix=f"{prefix}{key}.", low=MIN_GBPS, high=MAX_GBPS)
    lat = field(d, "latency_us", where, prefix=f"{prefix}{key}.", high=MAX_LATENCY_US)
    return {"alpha": lat * 1e-6, "beta": 1 / (bw * 1e9)}


# ---------------------------------------------------------------- architectures (ImageNet, 224x224)

def conv(cin, cout, k, hw_out, bias=False, bn=True):
    params = cin * cout * k * k + (cout if bias else 0) + (2 * cout if bn else 0)
    return {"params": params, "flops": 2 * cin * cout * k * k * hw_out * hw_out, "norm_channels": cout if bn else 0}


def vgg16():
    layers, cin, hw = [], 3, 224
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if v == "M":
            hw //= 2
        else:
            layers.append(conv(cin, v, 3, hw, bias=True, bn=False))
            cin = v
    for a, b in [(512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)]:
        layers.append({"params": a * b + b, "flops": 2 * a * b})
    return layers


def resnet(blocks):
    """torchvision's ResNet v1.5 (stride in the 3x3 conv) with bottlenecks: 25,557,032 / 44,549,160 parameters."""
    layers, cin = [conv(3, 64, 7, 112)], 64
    for stage, (count, width) in enumerate(zip(blocks, [64, 128, 256, 512])):
        hw = 56 >> stage
        for i in range(count):
            layers.append(conv(cin, width, 1, hw * 2 if (i == 0 and stage > 0) else hw))
            layers.append(conv(width, width, 3, hw))
            layers.append(conv(width, width * 4, 1, hw))
            if i == 0:
                layers.append(conv(cin, width * 4, 1, hw))
            cin = width * 4
    layers.append({"params": 2048 * 1000 + 1000, "flops": 2 * 2048 * 1000})
    return layers


ARCHS = {"vgg16": vgg16, "resnet50": lambda: resnet([3, 4, 6, 3]), "resnet101": lambda: resnet([3, 4, 23, 3])}


def arch_timeline(layers, step):
    """Groups arena end first (the last layer's gradient is ready first)."""
    total = sum(l["flops"] for l in layers)
    t, groups = step / 3, []
    for l in reversed(layers):
        t += 2 * step / 3 * l["flops"] / total
        groups.append({"bytes": l["params"] * FLOAT_BYTES, "ready": t})
    # hpctrain's batch-norm statistics' average: a running mean and variance a channel, queued as
    # the forward pass ends.
    channels = sum(l.get("norm_channels", 0) for l in layers)
    return groups, step, ({"bytes": 2 * channels * FLOAT_BYTES, "ready": step / 3} if channels else None)


# ---------------------------------------------------------------- fitting the sweep

def fit_sweep(path):
    """Least squares in relative error of t = 2(n-1)alpha + 2(n-1)/n S beta, per rank count."""
    text = read_json_file(path, "sweep")
    points = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            where = f"sweep '{path}' line {n}"
            try:
                r = json_loads(line)
            except ValueError:
                r = None
            require(isinstance(r, dict), f"{where} is not a line of bench/allreduce_sweep")
            ranks = field(r, "ranks", where, integer=True, low=2, high=MAX_GPUS)
            points.setdefault(ranks, []).append((field(r, "bytes", where, integer=True, low=1, high=MAX_BYTES),
                                                 field(r, "seconds", where, above=True, high=MAX_SECONDS)))
    fits = {}
    for n, pts in sorted(points.items()):
        require(len({s for s, _ in pts}) >= 2, f"sweep '{path}': {n} ranks need at least two different sizes")
        rows = [(2 * (n - 1) / t, 2 * (n - 1) / n * s / t) for s, t in pts]  # each row / t: relative error
        a11 = sum(x * x for x, _ in rows)
        a12 = sum(x * y for x, y in rows)
        a22 = sum(y * y for _, y in rows)
        b1, b2 = sum(x for x, _ in rows), sum(y for _, y in rows)
        det = a11 * a22 - a12 * a12
        alpha, beta = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        require(beta > 0, f"sweep '{path}': {n} ranks' times do not grow with the size: no bandwidth fits them")
        worst = max(abs(ring_allreduce(s, n, {"alpha": alpha, "beta": beta}) / t - 1) for s, t in pts)
        fits[str(n)] = {"bandwidth_GBps": round(1 / beta / 1e9, 4), "latency_us": round(max(alpha, 0) * 1e6, 3),
                        "worst_relative_error": round(worst, 3), "sizes": len(pts)}
        to_link(fits, str(n), f"sweep '{path}' (its fit)", "fits.")  # one a preset can hold
    return fits


# ---------------------------------------------------------------- output

def table(rows, best, overlap, out):
    out.write(f"{'GPUs':>5} {'nodes':>5} {'scheme':>12} {'step ms':>10} {'exposed ms':>11} {'boundary ms':>12} "
              f"{'img/s':>12} {'efficiency':>10} {'best bucket':>12}\n")
    for r, (mb, exposed) in zip(rows, best):
        ips = f"{r['images_per_second']:.0f}" if r["images_per_second"] else "-"
        out.write(f"{r['gpus']:>5} {r['nodes']:>5} {r['scheme']:>12} {r['step_seconds'] * 1e3:>10.3f} "
                  f"{r['exposed_seconds'] * 1e3:>11.3f} {r['boundary_seconds'] * 1e3:>12.3f} {ips:>12} "
                  f"{r['efficiency'] * 100:>9.1f}% "
                  f"{mb:>6g} MB ({exposed * 1e3:.3f} ms)\n")
    out.write(f"overlap: {'on' if overlap else 'off (--no-overlap)'}\n")


def positive(kind, high):
    """An option's value: a positive number (kind int: integer) of at most high, as number() takes it."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: '{text}'")
        try:
            return number(v, "", integer=kind is int, above=True, high=high, shown=f"'{text}'")
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e))
    return parse


def gpu_list(text):
    try:
        gpus = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of GPU counts, got '{text}'")
    try:
        return [number(n, "GPU counts", integer=True, low=1, high=MAX_GPUS, shown=f"'{text}'") for n in gpus]
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e))


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeline")
    p.add_argument("--arch", choices=sorted(ARCHS))
    p.add_argument("--metrics")
    p.add_argument("--step-seconds", type=positive(float, MAX_SECONDS))
    p.add_argument("--scale-to", type=positive(float, MAX_SECONDS))
    p.add_argument("--batch", type=positive(int, MAX_BATCH))
    p.add_argument("--cluster")
    p.add_argument("--clusters", default=os.path.join(HERE, "clusters.json"))
    p.add_argument("--gpus", type=gpu_list, default=DEFAULT_GPUS)
    p.add_argument("--bucket-mb", type=positive(float, 1e6))
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--no-jitter", action="store_true")
    p.add_argument("--other-framework", action="store_true")
    p.add_argument("--cycle-ms", type=positive(float, MAX_SECONDS * 1e3))
    p.add_argument("--skip-steps", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--fit-sweep")
    p.add_argument("--explain")
    a = p.parse_args(argv)
    require(a.skip_steps >= 0, f"--skip-steps must be >= 0, got {a.skip_steps}")
    if a.fit_sweep or (a.explain and not (a.timeline or a.arch)):
        return a
    require((a.timeline is None) != (a.arch is None), "give one of --timeline or --arch")
    require(a.cluster, "--cluster is required (a preset of --clusters)")
    require(not (a.arch and a.metrics), "--arch takes the step time from --step-seconds and the batch from --batch, "
            "not --metrics")
    require(a.metrics or a.step_seconds, "give the one-rank step time: --metrics FILE or --step-seconds S")
    return a


def build_run(a):
    if a.arch:
        groups, backward, average = arch_timeline(ARCHS[a.arch](), a.step_seconds)
        step, batch, jitter, handoff = a.step_seconds, a.batch, 0.0, 0.0
        trimmed = step
    else:
        groups, backward, average = read_timeline(a.timeline, a.skip_steps)
        step, batch, jitter, handoff, trimmed = (read_metrics(a.metrics, a.skip_steps) if a.metrics
                                                 else (None, None, 0.0, 0.0, None))
        trimmed = a.step_seconds or trimmed
        step = a.step_seconds or step
        batch = a.batch or batch
    require(step >= backward, f"the step ({step * 1e3:.3f} ms) ends before the backward pass "
            f"({backward * 1e3:.3f} ms): a metrics file or --step-seconds of another run?")
    scale = a.scale_to / step if a.scale_to else 1.0
    groups = [{"bytes": g["bytes"], "ready": g["ready"] * scale} for g in groups]
    # One device's step-to-step noise says nothing of another's: --scale-to drops it.
    run = {"groups": groups, "backward_done": backward * scale, "step": step * scale, "batch": batch,
           "step_trimmed": trimmed * scale,  # the one rank's trimmed mean (its median: step)
           "jitter": 0.0 if a.scale_to or a.no_jitter else jitter, "cycle": (a.cycle_ms or 0) * 1e-3,
           "handoff": 0.0 if a.scale_to else handoff,  # another device's step: no thread of ours
           # hpctrain's own calls a step beside the buckets (not another framework's: --other-framework)
           "statistics": None if a.other_framework or not average else
           {"bytes": average["bytes"], "ready": average["ready"] * scale},
           "boundary": not a.other_framework}
    run["buckets"] = rebucket(groups, int(a.bucket_mb * 1e6)) if a.bucket_mb else groups
    return run


def main(argv):
    a = parse_args(argv)
    if a.fit_sweep:
        print(as_json({"fits": fit_sweep(a.fit_sweep)}))
        return 0
    if a.explain:
        measured = measured_parts(a.explain, a.skip_steps)
        predicted = None
        if a.timeline or a.arch:  # the model's parts for as many GPUs as the run had ranks
            cluster, n = load_cluster(a.clusters, a.cluster), measured["ranks"]
            require(n <= cluster["gpus_per_node"], f"explain compares a run of one node: {n} ranks on "
                    f"{a.cluster}'s nodes of {cluster['gpus_per_node']}")
            predicted = simulate(build_run(a), n, cluster, "flat", not a.no_overlap)
        if a.json:
            print(as_json({"measured": measured, "predicted": predicted}))
        else:
            print(f"{a.explain}: {measured['ranks']} ranks" + (f", against the model on {a.cluster}, overlap "
                  f"{'off' if a.no_overlap else 'on'}" if predicted else ""))
            explain(measured, predicted, sys.stdout)
        return 0
    cluster = load_cluster(a.clusters, a.cluster)
    g = cluster["gpus_per_node"]
    for n in a.gpus:
        require(n <= g or n % g == 0, f"{n} GPUs do not fill nodes of {g} ({a.cluster})")
    run = build_run(a)
    overlap = not a.no_overlap
    rows, best = [], []
    for n in a.gpus:
        for scheme in ((["flat", "hierarchical"] + (["nccl"] if cluster["tree"] else [])) if n > g else ["ring"]):
            rows.append(simulate(run, n, cluster, "flat" if scheme == "ring" else scheme, overlap))
            rows[-1]["scheme"] = scheme
            best.append(best_bucket(run, n, cluster, "flat" if scheme == "ring" else scheme, overlap))
    for r, (mb, exposed) in zip(rows, best):
        r["best_bucket_mb"], r["best_bucket_exposed_seconds"] = mb, exposed
    if a.json:
        print(as_json({"cluster": a.cluster, "overlap": overlap,
                          "buckets": [{"bytes": b["bytes"], "ready_seconds": b["ready"]} for b in run["buckets"]],
                          "gradient_bytes": sum(b["bytes"] for b in run["buckets"]),
                          "statistics": run["statistics"] and {"bytes": run["statistics"]["bytes"],
                                                               "ready_seconds": run["statistics"]["ready"]},
                          "one_gpu_step_seconds": run["step"], "backward_done_seconds": run["backward_done"],
                          "batch_per_gpu": run["batch"], "step_sigma_seconds": run["jitter"], "handoff_seconds": run["handoff"],
                          "rows": rows}))
    else:
        as_json(rows)  # none of them NaN or infinite
        print(f"cluster {a.cluster} ({cluster.get('gpu', '')}, {g} per node); {len(run['buckets'])} buckets, "
              f"{sum(b['bytes'] for b in run['buckets']) / 1e6:.3f} MB of gradients; 1-GPU step "
              f"{run['step'] * 1e3:.3f} ms, backward ends at {run['backward_done'] * 1e3:.3f} ms"
              + (f", hand-off {run['handoff'] * 1e3:.3f} ms" if run["handoff"] else ""))
        table(rows, best, overlap, sys.stdout)
    return 0


def as_json(doc):
    """doc as JSON, the last guard of the checks on the inputs: a figure NaN or infinite is refused."""
    try:
        return json.dumps(doc, indent=1, allow_nan=False)
    except ValueError:
        raise UsageError("the model's figures for these inputs are not finite (NaN or infinity): "
                         "an input out of its range")


def cli(argv):
    """main() with a user's mistake as one line on stderr and exit code 2; a reader that stops early
    (| head) ends it quietly, as it would a program SIGPIPE ends (exit 141)."""
    return report_cli.run("scaling_model", main, argv, UsageError, "the results", quiet_broken_pipe=True)

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
