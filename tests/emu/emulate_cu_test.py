#!/usr/bin/env python3
"""emulate_cu.py, the rewriting behind the emulated kernels (tests/emu/cuda_emu.hpp), on sources
of its own: each launch made a call with its arguments as written, each __shared__ variable
filled once per block, the line numbers kept, and a launch or declaration it cannot take apart
an error naming its line."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import emulate_cu  # noqa: E402


def rewrite(text):
    return emulate_cu.emulate("k.cu", emulate_cu.garble_shared("k.cu", text))


class Launches(unittest.TestCase):
    def test_a_launch_becomes_a_call_with_its_configuration_and_arguments(self):
        self.assertEqual(rewrite("k<<<g, b>>>(x, f(y, z));"), "::hpc::emu::launch(k, g, b)(x, f(y, z));")

    def test_template_arguments_namespaces_and_a_full_configuration(self):
        text = "ns::apply<T, std::max(V, 2)><<<dim3(gx, gy), block, 0, stream>>>(a, b);"
        self.assertEqual(rewrite(text), "::hpc::emu::launch(ns::apply<T, std::max(V, 2)>, dim3(gx, gy), block, 0, stream)(a, b);")

    def test_lines_are_kept_where_a_launch_spans_several(self):
        text = "a;\nk<<<1,\n  32>>>(x,\n  y);\nb;\n"
        out = rewrite(text)
        self.assertEqual(out.count("\n"), text.count("\n"))
        self.assertEqual(out.splitlines()[-1], "b;")

    def test_a_launch_it_cannot_take_apart_names_its_line(self):
        for text, why in [("a;\n<<<1, 2>>>(x);", "no kernel name before <<<"),
                          ("a;\nk<<<1, 2(x);", "<<< without >>>"),
                          ("a;\nk<<<1, 2>>>;", "no arguments after >>>"),
                          ("a;\nk<<<1, 2>>>(x;", "a launch's arguments never close")]:
            with self.assertRaises(SystemExit) as e:
                rewrite(text)
            self.assertEqual(str(e.exception), f"emulate_cu.py: k.cu:2: {why}", text)


class SharedVariables(unittest.TestCase):
    def filled(self, text):
        return re.findall(r"fresh_shared\(hpc_emu_shared_mark_\d+, &(\w+), sizeof (\w+)\)", rewrite(text))

    def test_each_variable_of_a_declaration_is_filled_on_its_line(self):
        text = "void f() {\n  __shared__ double s0[kB][V], s1[kB][V];\n  s0[0][0] = 1;\n}\n"
        self.assertEqual(self.filled(text), [("s0", "s0"), ("s1", "s1")])
        out = rewrite(text)
        self.assertEqual(out.count("\n"), text.count("\n"))
        self.assertIn("fresh_shared", out.splitlines()[1])

    def test_a_template_type_and_a_bound_with_a_comparison(self):
        self.assertEqual(self.filled("__shared__ Pack<T, V> p[4], q;"), [("p", "p"), ("q", "q")])
        self.assertEqual(self.filled("__shared__ float a[N < 8 ? 8 : N], b[2];"), [("a", "a"), ("b", "b")])
        self.assertEqual(self.filled("__shared__ bool last;"), [("last", "last")])

    def test_each_declaration_has_a_mark_of_its_own(self):
        marks = re.findall(r"static unsigned long long (hpc_emu_shared_mark_\d+)", rewrite("__shared__ int a; __shared__ int b, c;"))
        self.assertEqual(len(set(marks)), 3)

    def test_comments_and_the_macro_are_left_alone(self):
        text = "// __shared__ memory holds a block's sums\n#define __shared__ static\n"
        self.assertEqual(rewrite(text), text)

    def test_a_declaration_it_cannot_take_apart_names_its_line(self):
        for text, why in [("a;\n__shared__ int x", "a __shared__ declaration without its ';'"),
                          ("a;\n__shared__ ;", "a __shared__ declaration without a name")]:
            with self.assertRaises(SystemExit) as e:
                rewrite(text)
            self.assertEqual(str(e.exception), f"emulate_cu.py: k.cu:2: {why}", text)


class TheProgram(unittest.TestCase):
    def test_it_writes_the_file_the_build_compiles_with_the_source_lines(self):
        with tempfile.TemporaryDirectory() as tmp:
            source, target = os.path.join(tmp, "k.cu"), os.path.join(tmp, "out", "k.cpp")
            with open(source, "w", encoding="utf-8") as f:
                f.write("k<<<1, 32>>>(x);\n")
            subprocess.run([sys.executable, os.path.join(HERE, "emulate_cu.py"), source, target], check=True)
            with open(target, encoding="utf-8") as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], '#include "emu/cuda_emu.hpp"  // first: the device built-ins')
            self.assertEqual(lines[1], f'#line 1 "{source}"')
            self.assertEqual(lines[2], "::hpc::emu::launch(k, 1, 32)(x);")
            self.assertEqual(sorted(os.listdir(os.path.dirname(target))), ["k.cpp"])  # no .part left

    def test_a_wrong_command_line_is_one_line_and_a_failure(self):
        r = subprocess.run([sys.executable, os.path.join(HERE, "emulate_cu.py")], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stderr.strip(), "usage: emulate_cu.py IN.cu OUT.cpp")


if __name__ == "__main__":
    unittest.main()
