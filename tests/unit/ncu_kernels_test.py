#!/usr/bin/env python3
"""bench/ncu_kernels.py on a hand-written Nsight Compute CSV (ncu --csv --print-units base: one row
per kernel launch per metric, ncu's columns, thousands grouped with commas, ncu's ==PROF== lines
around it) whose answers are worked out by hand below; and its bad input (one line, exit 2).

Two steps of four launches (IDs 0-3, then 4-7); only the second counts. The first step's numbers
are ten times larger, so reading the wrong half shows. Copy bandwidth 4e12 B/s. Second step:
  ID  kernel                                   time     read    write   bytes  B/s     of copy
  4   hpc::kernels::convert_kernel (ours)      1.0 ms   2.0e9   1.0e9   3.0e9
  5   sm90_xmma_fprop_... (cuDNN)               4.0 ms   1.0e9   1.0e9   2.0e9  5e11    0.125
  6   hpc::kernels::convert_kernel (ours)      0.5 ms   1.0e9   0.5e9   1.5e9
  7   hpc::sgd_kernel (ours)                   2.0 ms   3.0e9   1.0e9   4.0e9  2e12    0.5
convert_kernel together: 1.5 ms, 4.5e9 B: 3e12 B/s, 0.75 of the copy.
Step: 7.5 ms, 10.5e9 B (at 4e12 B/s: 2.625 ms), 1.4e12 B/s: 0.35. Top: the cuDNN kernel, 4/7.5 = 0.533.
Ours: 3.5 ms, 8.5e9 B: 2.428571e12 B/s: 0.607 of the copy (reading only the bytes read gives
6e9 B: 0.429; only the first step's launches, or all of them, other numbers again).
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "ncu_kernels.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import ncu_kernels  # noqa: E402  (bench/ is no package)

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
CONVERT = ("void hpc::kernels::(anonymous namespace)::convert_kernel<float, __nv_bfloat16>"
           "(const T1 *, T2 *, long, float, int *)")
# As Nsight Compute 2025.3 named our kernels on the H200 (2026-11-27): "hpc::sgd_kernel", the
# nested namespaces left out, which a test of "hpc::kernels::" alone counted as not ours.
SGD = ("void hpc::(anonymous namespace)::sgd_kernel(float *, const float *, float *, long, const long *, "
       "const float *, int, float, float, bool, bool, const int *, const float *)")
CUDNN = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_cudnn"
# (kernel, ns, bytes read, bytes written) of the second step; the first step is ten times these.
STEP = [(CONVERT, 1_000_000, 2e9, 1e9), (CUDNN, 4_000_000, 1e9, 1e9), (CONVERT, 500_000, 1e9, 0.5e9),
        (SGD, 2_000_000, 3e9, 1e9)]
COPY = 4e12


def grouped(x):
    return f"{int(x):,}"  # ncu's thousands separators


def ncu_csv(steps=((10, STEP), (1, STEP)), metrics=("gpu__time_duration.sum", "dram__bytes_read.sum",
                                                      "dram__bytes_write.sum"), time_unit="nsecond"):
    lines = ["==PROF== Connected to process 4242 (/build-gpu/bench/gpu_step)",
             '==PROF== Profiling "convert_kernel": 0%....50%....100% - 3 passes', HEADER]
    launch = 0
    for factor, step in steps:
        for kernel, ns, read, write in step:
            values = {"gpu__time_duration.sum": (time_unit, ns * factor),
                      "dram__bytes_read.sum": ("byte", read * factor),
                      "dram__bytes_write.sum": ("byte", write * factor)}
            for metric in metrics:
                unit, value = values[metric]
                lines.append(f'"{launch}","4242","gpu_step","127.0.0.1","{kernel}","1","13","(256, 1, 1)",'
                             f'"(65535, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}",'
                             f'"{grouped(value)}"')
            launch += 1
    lines.append("==PROF== Disconnected from process 4242")
    return [line + "\n" for line in lines]


def keys_of(lines):
    return dict(line.split("=", 1) for line in lines if not line.startswith("#"))


class Arithmetic(unittest.TestCase):
    def setUp(self):
        self.summary = ncu_kernels.summarize(ncu_kernels.read_launches(ncu_csv()), COPY)
        self.keys = keys_of(ncu_kernels.report(self.summary, "resnet50"))

    def test_groups_by_name_without_namespace_template_or_arguments(self):
        groups = {g.name: g for g in self.summary["groups"]}
        self.assertEqual(set(groups), {"hpc::kernels::convert_kernel", "hpc::sgd_kernel", CUDNN})
        convert = groups["hpc::kernels::convert_kernel"]
        self.assertEqual(convert.launches, 2)
        self.assertAlmostEqual(convert.seconds, 1.5e-3)
        self.assertAlmostEqual(convert.bytes, 4.5e9)
        self.assertAlmostEqual(convert.fraction(COPY), 0.75)
        self.assertAlmostEqual(groups["hpc::sgd_kernel"].fraction(COPY), 0.5)
        self.assertAlmostEqual(groups[CUDNN].fraction(COPY), 0.125)
        self.assertEqual([g.name for g in self.summary["groups"]][0], CUDNN)  # largest time first

    def test_step_totals_of_the_second_step_only(self):
        k = self.keys
        self.assertEqual(k["kernels_resnet50_launches"], "4")
        self.assertEqual(k["kernels_resnet50_step_ms"], "7.500")
        self.assertEqual(k["kernels_resnet50_top"], CUDNN)
        self.assertEqual(k["kernels_resnet50_top_share"], "0.533")
        self.assertEqual(k["kernels_resnet50_dram_bytes"], "10500000000")
        self.assertEqual(k["kernels_resnet50_copy_bandwidth_bytes_per_s"], "4000000000000")
        self.assertEqual(k["kernels_resnet50_bytes_time_ms"], "2.625")
        self.assertEqual(k["kernels_resnet50_fraction_of_bandwidth"], "0.350")

    def test_ours_together(self):
        k = self.keys
        self.assertEqual(k["kernels_resnet50_ours_ms"], "3.500")
        self.assertEqual(k["kernels_resnet50_ours_dram_bytes"], "8500000000")
        self.assertEqual(k["kernels_resnet50_ours_fraction_of_bandwidth"], "0.607")

    def test_the_issues_names_for_resnet50_only(self):
        self.assertEqual(self.keys["resnet50_step_dram_bytes"], "10500000000")
        self.assertEqual(self.keys["resnet50_kernels_fraction_of_bandwidth"], "0.607")
        cnn = keys_of(ncu_kernels.report(self.summary, "cnn"))
        self.assertNotIn("resnet50_step_dram_bytes", cnn)
        self.assertEqual(cnn["kernels_cnn_dram_bytes"], "10500000000")

    def test_units_other_than_base_are_converted(self):
        us = [(k, ns / 1000, r, w) for k, ns, r, w in STEP]
        summary = ncu_kernels.summarize(ncu_kernels.read_launches(ncu_csv(((10, us), (1, us)), time_unit="usecond")),
                                        COPY)
        self.assertAlmostEqual(summary["ours"].fraction(COPY), 8.5e9 / 3.5e-3 / COPY)

    def test_launches_are_told_apart_without_ids(self):
        """A launch's rows follow each other: an ID repeated (or absent) still starts a new launch
        when a metric comes again."""
        lines = [line if line.startswith("==") or line == HEADER + "\n" else '"1"' + line[line.index(","):]
                 for line in ncu_csv()]
        keys = keys_of(ncu_kernels.report(ncu_kernels.summarize(ncu_kernels.read_launches(lines), COPY), "cnn"))
        self.assertEqual(keys["kernels_cnn_launches"], "4")
        self.assertEqual(keys["kernels_cnn_ours_fraction_of_bandwidth"], "0.607")

    def test_a_launch_without_dram_bytes_is_counted_and_named(self):
        lines = [line for line in ncu_csv() if not ('"6","4242"' in line and "dram__bytes_write" in line)]
        summary = ncu_kernels.summarize(ncu_kernels.read_launches(lines), COPY)
        keys = keys_of(ncu_kernels.report(summary, "cnn"))
        self.assertEqual(keys["kernels_cnn_launches_without_dram_bytes"], "1")
        self.assertEqual(keys["kernels_cnn_dram_bytes"], "9000000000")


class BadInput(unittest.TestCase):
    def run_script(self, lines, copy=str(COPY)):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu.csv")
            with open(path, "w") as f:
                f.writelines(lines)
            return subprocess.run([sys.executable, SCRIPT, path, "resnet50", copy], capture_output=True, text=True)

    def assert_usage_error(self, r, words):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(words, r.stderr)

    def test_the_script_prints_the_table_and_the_keys(self):
        r = self.run_script(ncu_csv())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resnet50_kernels_fraction_of_bandwidth=0.607", r.stdout.splitlines())
        self.assertTrue(any(line.startswith("#") and "hpc::kernels::convert_kernel" in line
                            for line in r.stdout.splitlines()))

    def test_no_launches(self):
        self.assert_usage_error(self.run_script(["==PROF== nothing profiled\n"]), "no kernel durations")

    def test_durations_without_dram_bytes(self):
        self.assert_usage_error(self.run_script(ncu_csv(metrics=("gpu__time_duration.sum",))), "no DRAM bytes")

    def test_unknown_unit(self):
        self.assert_usage_error(self.run_script(ncu_csv(time_unit="cycle")), "unknown unit 'cycle'")

    def test_bad_copy_bandwidth(self):
        self.assert_usage_error(self.run_script(ncu_csv(), copy="0"), "copy bandwidth")
        self.assert_usage_error(self.run_script(ncu_csv(), copy=""), "copy bandwidth")

    def test_missing_file(self):
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/ncu.csv", "cnn", "1e12"], capture_output=True,
                           text=True)
        self.assert_usage_error(r, "cannot read /nonexistent/ncu.csv")


if __name__ == "__main__":
    unittest.main()
