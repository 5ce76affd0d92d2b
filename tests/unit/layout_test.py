#!/usr/bin/env python3
"""The layout's rules (issue 45; DESIGN.md: "a folder is a room"), checked on the tree's own
#include lines: no cycle between units (a unit is a .hpp with its .cpp and .cu: setup.cpp and
trainer.cpp once included each other's headers), and no folder that includes from a folder built
on it. The layers, from the bottom:

  core < kernels < ckpt, data, dist, nn, optim < export < train < apps
  launch beside train: it includes core and ckpt only (hpcrun launches hpctrain, it is not built on it)

A folder may include from its own folder and from layers below it; folders of one layer not from
each other. First on small made-up trees whose answers are known (a cycle, an upward include, a
sideways one, launch on train), then on the real tree, which must have none.
"""
import collections
import os
import re
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LAYERS = {"core": 0, "kernels": 1, "ckpt": 2, "data": 2, "dist": 2, "nn": 2, "optim": 2, "export": 3,
          "train": 4, "apps": 5, "launch": 4}
LAUNCH_MAY_INCLUDE = {"core", "ckpt", "launch"}
SOURCES = (".cpp", ".hpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def units(root):
    """{unit: set of units it includes}, a unit being a path under src/ (or kernels/, launch/)
    without its extension, e.g. train/setup or launch/attempt."""
    deps = collections.defaultdict(set)
    for top in ("src", "kernels", "launch"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                unit = unit_of(root, path)
                deps[unit]
                with open(path, encoding="utf-8", errors="replace") as f:
                    for target in INCLUDE.findall(f.read()):
                        resolved = resolve(root, folder, target)
                        if resolved and unit_of(root, resolved) != unit:
                            deps[unit].add(unit_of(root, resolved))
    return deps


def unit_of(root, path):
    rel = os.path.relpath(path, root)
    if rel.startswith("src" + os.sep):
        rel = rel[4:]
    return os.path.splitext(rel)[0].replace(os.sep, "/")


def resolve(root, folder, target):
    """The file an #include "target" names: beside the includer, under src/, or under the root."""
    for base in (folder, os.path.join(root, "src"), root):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(candidate):
            return candidate
    return None  # a system or generated header


def cycles(deps):
    """Each cycle between units once, as a list that starts and ends with the same unit."""
    found, state = [], {}

    def visit(u, stack):
        state[u] = "open"
        stack.append(u)
        for v in sorted(deps.get(u, ())):
            if state.get(v) == "open":
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = "done"

    for u in sorted(deps):
        if u not in state:
            visit(u, [])
    return found


def layer_violations(deps):
    """'a/x -> b/y (why)' for each include from a folder to one it may not include."""
    out = []
    for unit, targets in sorted(deps.items()):
        src = unit.split("/")[0]
        for target in sorted(targets):
            dst = target.split("/")[0]
            if src == dst or src not in LAYERS or dst not in LAYERS:
                continue
            if src == "launch" and dst not in LAUNCH_MAY_INCLUDE:
                out.append(f"{unit} -> {target} (launch/ includes core/ and ckpt/ only)")
            elif src != "launch" and LAYERS[dst] >= LAYERS[src]:
                kind = "a folder of the same layer" if LAYERS[dst] == LAYERS[src] else "a folder built on it"
                out.append(f"{unit} -> {target} ({src}/ includes from {kind}, {dst}/)")
    return out


def make_tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


class MadeUpTrees(unittest.TestCase):
    def test_a_cycle_through_a_cpp_is_found_and_a_chain_is_not(self):
        root = make_tree({
            "src/train/setup.hpp": '#include "train/options.hpp"\n',
            "src/train/setup.cpp": '#include "train/setup.hpp"\n#include "train/trainer.hpp"\n',
            "src/train/trainer.hpp": "",
            "src/train/trainer.cpp": '#include "train/trainer.hpp"\n#include "train/setup.hpp"\n',
            "src/train/options.hpp": '#include "core/log.hpp"\n#include <vector>\n',
            "src/core/log.hpp": "",
        })
        deps = units(root)
        self.assertEqual(deps["train/setup"], {"train/options", "train/trainer"})
        self.assertEqual(cycles(deps), [["train/setup", "train/trainer", "train/setup"]])
        os.remove(os.path.join(root, "src/train/trainer.cpp"))
        self.assertEqual(cycles(units(root)), [])

    def test_includes_up_sideways_and_from_launch_into_train_are_named(self):
        root = make_tree({
            "src/core/log.hpp": '#include "train/options.hpp"\n',
            "src/nn/model.hpp": '#include "data/dataset.hpp"\n#include "core/log.hpp"\n#include "kernels/bn.hpp"\n',
            "src/data/dataset.hpp": "",
            "src/train/options.hpp": '#include "nn/model.hpp"\n',
            "kernels/bn.hpp": '#include "core/log.hpp"\n',
            "launch/attempt.cpp": '#include "attempt.hpp"\n#include "train/options.hpp"\n#include "ckpt/store.hpp"\n',
            "launch/attempt.hpp": "",
            "src/ckpt/store.hpp": "",
        })
        self.assertEqual(layer_violations(units(root)), [
            "core/log -> train/options (core/ includes from a folder built on it, train/)",
            "launch/attempt -> train/options (launch/ includes core/ and ckpt/ only)",
            "nn/model -> data/dataset (nn/ includes from a folder of the same layer, data/)",
        ])


class TheTree(unittest.TestCase):
    def test_no_unit_includes_itself_back(self):
        found = cycles(units(ROOT))
        self.assertEqual(found, [], "include cycles: " + "; ".join(" -> ".join(c) for c in found))

    def test_no_folder_includes_from_one_built_on_it(self):
        found = layer_violations(units(ROOT))
        self.assertEqual(found, [], "\n".join(found))

    def test_every_folder_has_its_layer(self):
        folders = {u.split("/")[0] for u in units(ROOT)}
        self.assertEqual(folders - set(LAYERS), set(), "a folder with no layer in LAYERS above")


if __name__ == "__main__":
    sys.exit(unittest.main())
