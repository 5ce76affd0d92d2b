#!/usr/bin/env python3
"""Where one training step's GPU time and DRAM bytes go, read from Nsight Compute's CSV, against
the GPU's measured copy bandwidth (the roofline of a kernel that only moves memory). Stdlib only.

    python3 bench/ncu_kernels.py NCU.csv MODEL COPY_BYTES_PER_S

NCU.csv is what bench/gpu_vs_peer.sh's kernels step writes:
    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv
        --print-units base --log-file NCU.csv gpu_step ... --warmup 1 --iters 1
one row per kernel launch per metric ("ID", "Kernel Name", ..., "Metric Name", "Metric Unit",
"Metric Value"), among ncu's own ==PROF== lines. The two steps launch the same kernels, so the
later half of the launches is the second step. They are grouped by kernel name (template
arguments, parameters and anonymous namespaces cut off); "ours" are the groups in namespace hpc
(kernels/*.cu; Nsight Compute 2025.3 names them "hpc::sgd_kernel"), the rest is cuDNN's,
cuBLAS's and NCCL's. A launch's DRAM bytes are
what it read plus what it wrote; its bandwidth is those bytes over its duration, printed as a
fraction of COPY_BYTES_PER_S (`gpu_step --copy-bandwidth`: a device-to-device copy's read plus
written bytes per second).

Prints the largest groups as '# ' lines, then the step's key=value lines (MODEL names them):
kernels_MODEL_{launches, step_ms, top, top_share, dram_bytes, copy_bandwidth_bytes_per_s,
bytes_time_ms, fraction_of_bandwidth, ours_ms, ours_dram_bytes, ours_fraction_of_bandwidth},
and for resnet50 also resnet50_step_dram_bytes and resnet50_kernels_fraction_of_bandwidth (the
issue's names). Bad input: one line on stderr, exit 2.
"""
import collections
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
# ncu's units, to seconds and to bytes (--print-units base gives nsecond and byte).
SECONDS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
           "second": 1.0, "s": 1.0}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
OURS = "hpc::"  # kernels/*.cu; Nsight Compute may leave out the nested "kernels::"


class InputError(Exception):
    """Input this script cannot use: reported as one line, exit 2."""


Launch = collections.namedtuple("Launch", "name seconds bytes")


def group_of(kernel_name):
    """ncu names ours "void hpc::kernels::(anonymous namespace)::add_kernel<__nv_bfloat16>(const T1 *,
    ...)": the anonymous namespace dropped before the template and the arguments are cut
    ("hpc::kernels::add_kernel")."""
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", kernel_name)
    return re.sub(r"[<(].*", "", name).replace("void ", "").strip()


def number(value, unit, metric):
    scale = (SECONDS if metric == TIME else BYTES).get(unit)
    if scale is None:
        raise InputError(f"unknown unit '{unit}' of {metric} (run ncu with --print-units base)")
    try:
        return float(value.replace(",", "")) * scale  # ncu groups thousands with commas
    except ValueError:
        return None  # "n/a": ncu could not collect it for this launch


def read_launches(lines):
    """The launches in ncu's order: their group, seconds, and DRAM bytes (None where either
    DRAM metric is missing)."""
    metrics = []  # per launch: (ID, kernel name, {metric: value})
    for row in csv.DictReader(line for line in lines if line.startswith('"')):
        metric = row.get("Metric Name")
        if metric not in (TIME, READ, WRITE):
            continue
        # A launch's rows are consecutive, one per metric: a new ID, or a metric seen again, starts the next.
        if not metrics or metrics[-1][0] != row.get("ID") or metric in metrics[-1][2]:
            metrics.append((row.get("ID"), row.get("Kernel Name") or "?", {}))
        metrics[-1][2][metric] = number(row["Metric Value"], row.get("Metric Unit", ""), metric)
    launches = []
    for launch_id, name, values in metrics:
        if values.get(TIME) is None:
            raise InputError(f"launch {launch_id} ({group_of(name)}) has no {TIME}")
        read, write = values.get(READ), values.get(WRITE)
        launches.append(Launch(group_of(name), values[TIME], None if read is None or write is None else read + write))
    if not launches:
        raise InputError(f"ncu recorded no kernel durations ({TIME})")
    if all(launch.bytes is None for launch in launches):
        raise InputError(f"ncu recorded no DRAM bytes (run it with --metrics {TIME},{READ},{WRITE})")
    return launches


class Group:
    def __init__(self, name):
        self.name, self.launches, self.seconds, self.bytes = name, 0, 0.0, 0.0

    def add(self, launch):
        self.launches += 1
        self.seconds += launch.seconds
        self.bytes += launch.bytes or 0.0

    def fraction(self, copy_bytes_per_s):
        """The achieved bandwidth as a fraction of the copy's."""
        return self.bytes / self.seconds / copy_bytes_per_s if self.seconds > 0 else 0.0


def summarize(launches, copy_bytes_per_s):
    """The second step's launches by group (largest time first), all of them together, and ours."""
    step = launches[len(launches) // 2:]  # the second of the two steps
    groups, total, ours = {}, Group("step"), Group("ours")
    for launch in step:
        groups.setdefault(launch.name, Group(launch.name)).add(launch)
        total.add(launch)
        if launch.name.startswith(OURS):
            ours.add(launch)
    if total.seconds <= 0:
        raise InputError("the step's kernels took no time (every duration is zero)")
    ranked = sorted(groups.values(), key=lambda g: -g.seconds)
    missing = sum(1 for launch in step if launch.bytes is None)
    return {"groups": ranked, "total": total, "ours": ours, "missing": missing, "copy": copy_bytes_per_s}


def report(s, model, top=15):
    copy, total, ours = s["copy"], s["total"], s["ours"]
    lines = [f"# {'ms':>9} {'share':>6} {'launches':>9} {'DRAM GB':>9} {'GB/s':>7} {'of copy':>7}  kernel "
             f"(copy bandwidth {copy / 1e9:.0f} GB/s)"]
    for g in s["groups"][:top] + [ours, total]:
        lines.append(f"# {g.seconds * 1e3:9.3f} {100 * g.seconds / total.seconds:5.1f}% {g.launches:9d} "
                     f"{g.bytes / 1e9:9.3f} {g.bytes / g.seconds / 1e9 if g.seconds else 0:7.0f} "
                     f"{g.fraction(copy):7.2f}  {g.name}")
    if s["missing"]:
        lines.append(f"# warning: {s['missing']} launch(es) without DRAM bytes, counted as none")
    head = s["groups"][0]
    keys = [("launches", total.launches), ("step_ms", f"{total.seconds * 1e3:.3f}"), ("top", head.name),
            ("top_share", f"{head.seconds / total.seconds:.3f}"), ("dram_bytes", f"{total.bytes:.0f}"),
            ("copy_bandwidth_bytes_per_s", f"{copy:.0f}"), ("bytes_time_ms", f"{total.bytes / copy * 1e3:.3f}"),
            ("fraction_of_bandwidth", f"{total.fraction(copy):.3f}"), ("ours_ms", f"{ours.seconds * 1e3:.3f}"),
            ("ours_dram_bytes", f"{ours.bytes:.0f}"), ("ours_fraction_of_bandwidth", f"{ours.fraction(copy):.3f}")]
    if s["missing"]:
        keys.append(("launches_without_dram_bytes", s["missing"]))
    lines += [f"kernels_{model}_{key}={value}" for key, value in keys]
    if model == "resnet50":
        lines += [f"resnet50_step_dram_bytes={total.bytes:.0f}",
                  f"resnet50_kernels_fraction_of_bandwidth={ours.fraction(copy):.3f}"]
    return lines


def main(argv):
    if len(argv) != 4:
        raise InputError("usage: ncu_kernels.py NCU.csv MODEL COPY_BYTES_PER_S")
    path, model, copy = argv[1:]
    try:
        copy_bytes_per_s = float(copy)
    except ValueError:
        copy_bytes_per_s = 0.0
    if not copy_bytes_per_s > 0:
        raise InputError(f"the copy bandwidth must be a positive number of bytes per second, got '{copy}'")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            launches = read_launches(f)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    print("\n".join(report(summarize(launches, copy_bytes_per_s), model)))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except InputError as e:
        print(f"ncu_kernels.py: error: {e}", file=sys.stderr)
        sys.exit(2)
