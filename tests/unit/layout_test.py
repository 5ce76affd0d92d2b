#!/usr/bin/env python3
"""The layout's rules (issue 45; DESIGN.md: "a folder is a room"), checked on the tree's own
#include lines: no cycle between units (a unit is a .hpp with its .cpp and .cu: setup.cpp and
trainer.cpp once included each other's headers), and no folder that includes from a folder built
on it. The layers, from the bottom (FOLDER_ORDER):

  core < kernels < ckpt, data, dist, nn, optim < export < train < apps
  launch beside train: it includes core and ckpt only (hpcrun launches hpctrain, it is not built on it)

and inside train/, whose files all stand in its folders (TRAIN_ORDER; docs/architecture.md):

  stop < options < engine < state, observe < serve < run

A folder may include from its own folder and from layers below it; folders of one layer not from
each other. Every src/ file has a test that includes or names it, or is listed with the test
that covers it through another (COVERED_THROUGH, each test checked to exist). And no function in src/ or launch/ longer than 60 lines, from its opening brace to
its closing one (issue 45's acceptance), found by matching braces with comments, strings and
preprocessor lines blanked out. First on small made-up trees and sources whose answers are known
(a cycle, an upward include, a sideways one, launch on train, the same inside train/ and a file
outside its folders; functions of 60 and 61 lines, in a namespace, a class and with lambdas and
braces in strings inside), then on the real tree, which must have none.
"""
import collections
import os
import re
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# The layers of src/'s folders (and kernels/, launch/), from the bottom: a tuple is one layer.
FOLDER_ORDER = [("core",), ("kernels",), ("ckpt", "data", "dist", "nn", "optim"), ("export",), ("train", "launch"),
                ("apps",)]
LAUNCH_MAY_INCLUDE = {"core", "ckpt", "launch"}
# The layers of train/'s folders, from the bottom: how a run is stopped (stop signals, the step
# watchdog); what it is told (its options); the engines, which hold the training state; keeping
# that state (checkpoints, snapshots) and observing the run (metrics, progress, the trace), side by
# side; serving a checkpoint's model (export, predict); the run itself and the other subcommands.
TRAIN_ORDER = [("stop",), ("options",), ("engine",), ("state", "observe"), ("serve",), ("run",)]


def layer_numbers(order):
    """{folder: its layer's index} of an order of layers."""
    return {folder: i for i, layer in enumerate(order) for folder in layer}


LAYERS = layer_numbers(FOLDER_ORDER)
# The folders whose own folders have layers, and theirs.
INNER_LAYERS = {"train": layer_numbers(TRAIN_ORDER)}
SOURCES = (".cpp", ".hpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MAX_FUNCTION_LINES = 60
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b")
PREPROCESSOR = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)


def units(root):
    """{unit: set of units it includes}, a unit being a path under src/ (or kernels/, launch/)
    without its extension, e.g. train/run/setup or launch/attempt."""
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
    """'a/x -> b/y (why)' for each include from a folder to one it may not include: between top
    folders by LAYERS (launch/ by LAUNCH_MAY_INCLUDE), and inside a folder of INNER_LAYERS between
    its own folders."""
    out = []
    for unit, targets in sorted(deps.items()):
        src = unit.split("/")[0]
        for target in sorted(targets):
            dst = target.split("/")[0]
            if src == dst and src in INNER_LAYERS:
                out += inner_violation(unit, target, INNER_LAYERS[src])
            elif src == dst or src not in LAYERS or dst not in LAYERS:
                continue
            elif src == "launch" and dst not in LAUNCH_MAY_INCLUDE:
                out.append(f"{unit} -> {target} (launch/ includes core/ and ckpt/ only)")
            elif src != "launch":
                out += violation(unit, target, src, dst, LAYERS)
    return out


def inner_violation(unit, target, layers):
    """The same between two folders inside one (train/engine -> train/state). A unit directly in the
    outer folder, or in a folder with no layer, is unplaced()'s to name."""
    src, dst = unit.split("/"), target.split("/")
    if len(src) < 3 or len(dst) < 3 or src[1] == dst[1] or src[1] not in layers or dst[1] not in layers:
        return []
    src_folder, dst_folder = f"{src[0]}/{src[1]}", f"{dst[0]}/{dst[1]}"
    return violation(unit, target, src_folder, dst_folder, {src_folder: layers[src[1]], dst_folder: layers[dst[1]]})


def violation(unit, target, src, dst, layers):
    """[the line for unit -> target] when folder src may not include from folder dst, else []."""
    if layers[dst] < layers[src]:
        return []
    kind = "a folder of the same layer" if layers[dst] == layers[src] else "a folder built on it"
    return [f"{unit} -> {target} ({src}/ includes from {kind}, {dst}/)"]


def unplaced(deps):
    """The units of a folder of INNER_LAYERS that stand directly in it or in a folder with no layer."""
    out = []
    for unit in sorted(deps):
        parts = unit.split("/")
        if parts[0] not in INNER_LAYERS:
            continue
        if len(parts) < 3:
            out.append(f"{unit}: directly in {parts[0]}/, not in one of its folders")
        elif parts[1] not in INNER_LAYERS[parts[0]]:
            out.append(f"{unit}: {parts[0]}/{parts[1]}/ has no layer")
    return out


def blank(text):
    """The source with comments, string and character literals and preprocessor lines replaced
    by spaces (newlines kept): what is left holds only the code's own braces."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('R"', i) and re.match(r'R"([^(\s]*)\(', text[i:]):
            delim = re.match(r'R"([^(\s]*)\(', text[i:]).group(1)
            j = text.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i] and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return PREPROCESSOR.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "".join(out))


def function_spans(text):
    """(first line, last line) of each function body: a brace opened after a ')' (a signature,
    with const, noexcept, an initializer list...) where no function is open yet; namespaces,
    classes and brace initialisers are scopes, and braces inside a function (blocks, lambdas)
    belong to it."""
    code = blank(text)
    stack, found, head_start, line = [], [], 0, 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            head = code[head_start:i]
            if any(kind == "function" for kind, _ in stack):
                kind = "block"
            elif SCOPE.search(head) and "(" not in head:
                kind = "scope"
            elif ")" in head and not head.rstrip().endswith(("=", ",", "(", "return")):
                kind = "function"
            else:
                kind = "block"
            stack.append((kind, line))
            head_start = i + 1
        elif c in "};":
            if c == "}" and stack:
                kind, first = stack.pop()
                if kind == "function":
                    found.append((first, line))
            head_start = i + 1
    return found


def long_functions(root, limit=MAX_FUNCTION_LINES):
    """'path:first-last (N lines)' for each function over `limit` lines in src/ and launch/."""
    out = []
    for top in ("src", "launch"):
        for folder, _, files in sorted(os.walk(os.path.join(root, top))):
            for name in sorted(files):
                if name.endswith(SOURCES):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        for first, last in function_spans(f.read()):
                            if last - first + 1 > limit:
                                out.append(f"{os.path.relpath(path, root)}:{first}-{last} ({last - first + 1} lines)")
    return out


# The src/ files no test includes or names, and the test that covers each through another
# (issue 45: "every src/ file has a test that includes it or is named in a test's comment as
# covered through another"): unit -> (test file under tests/, a test in it that runs the unit).
# Files built in one configuration only (with or without CUDA, oneDNN or OpenBLAS) are covered
# by the same test in whichever build has them.
COVERED_THROUGH = {
    "apps/hpctrain_main": ("integration/cli_test.cpp", "PrintsVersionAndExitsZero"),
    "ckpt/dir_lock": ("integration/checkpoint_test.cpp", "ASecondRunOnABusyDirectoryIsRefusedAndTouchesNothing"),
    "core/choice": ("unit/options_test.cpp", "UnknownChoicesAreRefusedWithTheChoices"),
    "core/cuda_check": ("gpu/kernels_test.cpp", "BatchNormTrainingEqualsItsDefinition"),
    "core/device_cuda": ("unit/core_test.cpp", "PinnedIsHostMemoryEverywhereAndPageLockedWithAGpu"),
    "core/device_none": ("unit/core_test.cpp", "PinnedIsHostMemoryEverywhereAndPageLockedWithAGpu"),
    "core/json": ("unit/core_test.cpp", "JsonLineTypesAndEscapes"),
    "core/signal_safe_text": ("unit/ckpt_test.cpp", "AStopAtOnceLeavesAnotherRunsHeartbeatAlone"),
    "data/cifar": ("unit/data_test.cpp", "PlanarRgbBecomesInterleaved"),
    "data/facts": ("serving/predict_test.py", "test_agrees_with_evaluate_on_the_same_samples"),
    "data/idx": ("unit/data_test.cpp", "GzipFilesReadTheSameAsRaw"),
    "data/image_file": ("serving/predict_test.py", "test_sizes_colours_and_formats_frame_as_evaluation"),
    "dist/agree": ("integration/mpi_test.cpp", "AProblemOnOneRankIsNamedByRankAndHost"),
    "dist/communicator": ("integration/mpi_test.cpp", "TwoAndFourRanksMatchOneRankWithoutBatchNorm"),
    "dist/mpi": ("integration/mpi_test.cpp", "TwoAndFourRanksMatchOneRankWithoutBatchNorm"),
    "dist/process": ("integration/mpi_test.cpp", "DefaultThreadsShareTheHostsCores"),
    "export/onnx_export": ("serving/onnx_test.py", "test_resnet50"),
    "nn/cblas_gemm": ("unit/layers_test.cpp", "AnyThreadCountGivesTheSameBits"),
    "nn/composite": ("unit/gradcheck_test.cpp", "ProjectionShortcut"),
    "nn/cuda/context": ("gpu/network_test.cpp", "TrainingAndEvalPassesMatchTheCpuModel"),
    "nn/gemm_common": ("unit/layers_test.cpp", "MatchesNaiveConvolution"),
    "nn/gemm_dnnl": ("unit/layers_test.cpp", "MatchesNaiveConvolution"),
    "nn/gemm_openblas": ("unit/layers_test.cpp", "MatchesNaiveConvolution"),
    "nn/library_conv": ("unit/layers_test.cpp", "ConvChunkedPath"),
    "nn/library_conv_dnnl": ("unit/layers_test.cpp", "ConvChunkedPath"),
    "nn/library_conv_none": ("unit/layers_test.cpp", "ConvChunkedPath"),
    "nn/model_zoo": ("unit/layers_test.cpp", "ParameterCounts"),
    "nn/norm": ("unit/gradcheck_test.cpp", "NhwcActivations"),
    "nn/parallel": ("integration/mpi_test.cpp", "DefaultThreadsShareTheHostsCores"),
    "nn/pool_row": ("unit/layers_test.cpp", "BatchNormFusedPool"),
    "nn/simple_layers": ("unit/layers_test.cpp", "GlobalAvgPoolReluFlattenLinear"),
    "train/engine/engine_cpu": ("integration/train_test.cpp", "SameSeedSameChecksumOtherSeedOtherChecksum"),
    "train/engine/gpu_engine": ("gpu/train_gpu_test.cpp", "DefaultJobReaches92PercentOnOneGpu"),
    "train/engine/gpu_engine_none": ("integration/cli_test.cpp", "DeviceCudaWithoutAGpuIsAUsageError"),
    "train/engine/inference": ("serving/predict_test.py", "test_agrees_with_evaluate_on_the_same_samples"),
    "train/engine/inference_cpu": ("serving/predict_test.py", "test_agrees_with_evaluate_on_the_same_samples"),
    "train/engine/inference_gpu": ("gpu/train_gpu_test.cpp", "PredictOnTheGpuGivesTheCpuLogits"),
    "train/engine/inference_gpu_none": ("gpu/train_gpu_test.cpp", "PredictOnTheGpuGivesTheCpuLogits"),
    "train/observe/progress": ("integration/output_test.cpp", "ATerminalShowsTheLiveLine"),
    "train/observe/prometheus": ("integration/train_test.cpp", "PrometheusFileParsesAndAgreesWithTheMetricsFile"),
    "train/observe/step_metrics": ("integration/train_test.cpp",
                                   "StepEventsEveryNStepsCarryTheSchedulesLearningRate"),
    "train/options/option_checks": ("integration/cli_test.cpp", "IsOneLineUsageError"),
    "train/options/subcommand": ("serving/predict_test.py", "test_help_documents_the_options"),
    "train/options/train_options": ("unit/options_test.cpp", "HoldsEveryListedOptionWithItsRule"),
    "train/run/boundary": ("integration/checkpoint_test.cpp", "StopOnSignalCheckpointsAndResumesExactly"),
    "train/run/commands": ("integration/checkpoint_test.cpp", "EvaluateAndInspectACheckpoint"),
    "train/run/trainer": ("integration/train_test.cpp", "ShortRunReachesSaneAccuracy"),
    "train/serve/export_command": ("serving/onnx_test.py", "test_cnn"),
    "train/serve/predict": ("serving/predict_test.py", "test_agrees_with_evaluate_on_the_same_samples"),
    "train/serve/serving": ("serving/predict_test.py", "test_checkpoints_that_cannot_serve"),
    "train/serve/serving_model": ("serving/predict_test.py", "test_the_checkpoint_names_its_classes"),
    "train/state/snapshots": ("integration/snapshot_test.cpp",
                              "AKilledRankResumesFromTheSnapshotAndEndsInTheSameState"),
    "train/stop/final_records": ("integration/checkpoint_test.cpp",
                                 "SigintDuringACheckpointWriteStopsAtOnceAndKeepsThePreviousOne"),
    "train/stop/signals": ("integration/checkpoint_test.cpp", "AStopSignalAtAnyMomentAfterStartEndsWithItsExitCode"),
}


def test_texts(root):
    """{path under tests/: text} of every test file but this one (whose table names them all)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for name in files:
            path = os.path.join(folder, name)
            if name == os.path.basename(__file__):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                out[os.path.relpath(path, os.path.join(root, "tests"))] = f.read()
    return out


def uncovered(root, covered_through):
    """The src/ units no test includes or names (as folder/name, or name.cpp, .hpp or .cu on its
    own) and the covering-test table does not list; then each table entry whose test file or
    test is not there, or whose unit is gone."""
    texts = test_texts(root)
    every = "\n".join(texts.values())
    src_units = {u for u in units(root) if u.split("/")[0] not in ("kernels", "launch")}
    out = []
    for unit in sorted(src_units):
        named = re.compile(r"(?<![\w/])" + re.escape(unit.split("/")[-1]) + r"\.(cpp|hpp|cu|cuh)\b")
        if unit not in every and not named.search(every) and unit not in covered_through:
            out.append(f"{unit}: no test includes or names it")
    for unit, (test, name) in sorted(covered_through.items()):
        if unit not in src_units:
            out.append(f"{unit}: listed as covered, but there is no such file in src/")
        elif name not in texts.get(test, ""):
            out.append(f"{unit}: its covering test {test} has no {name}")
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
            "src/train/run/setup.hpp": '#include "train/options/options.hpp"\n',
            "src/train/run/setup.cpp": '#include "train/run/setup.hpp"\n#include "train/run/trainer.hpp"\n',
            "src/train/run/trainer.hpp": "",
            "src/train/run/trainer.cpp": '#include "train/run/trainer.hpp"\n#include "train/run/setup.hpp"\n',
            "src/train/options/options.hpp": '#include "core/log.hpp"\n#include <vector>\n',
            "src/core/log.hpp": "",
        })
        deps = units(root)
        self.assertEqual(deps["train/run/setup"], {"train/options/options", "train/run/trainer"})
        self.assertEqual(cycles(deps), [["train/run/setup", "train/run/trainer", "train/run/setup"]])
        os.remove(os.path.join(root, "src/train/run/trainer.cpp"))
        self.assertEqual(cycles(units(root)), [])

    def test_includes_up_sideways_and_from_launch_into_train_are_named(self):
        root = make_tree({
            "src/core/log.hpp": '#include "train/options/options.hpp"\n',
            "src/nn/model.hpp": '#include "data/dataset.hpp"\n#include "core/log.hpp"\n#include "kernels/bn.hpp"\n',
            "src/data/dataset.hpp": "",
            "src/train/options/options.hpp": '#include "nn/model.hpp"\n',
            "kernels/bn.hpp": '#include "core/log.hpp"\n',
            "launch/attempt.cpp": ('#include "attempt.hpp"\n#include "train/options/options.hpp"\n'
                                   '#include "ckpt/store.hpp"\n'),
            "launch/attempt.hpp": "",
            "src/ckpt/store.hpp": "",
        })
        self.assertEqual(layer_violations(units(root)), [
            "core/log -> train/options/options (core/ includes from a folder built on it, train/)",
            "launch/attempt -> train/options/options (launch/ includes core/ and ckpt/ only)",
            "nn/model -> data/dataset (nn/ includes from a folder of the same layer, data/)",
        ])

    def test_inside_train_includes_up_and_sideways_and_files_outside_its_folders_are_named(self):
        root = make_tree({
            "src/train/engine/engine.hpp": ('#include "train/state/checkpointing.hpp"\n'
                                            '#include "train/options/options.hpp"\n'),
            "src/train/state/checkpointing.hpp": ('#include "train/engine/engine.hpp"\n'
                                                  '#include "train/observe/trace.hpp"\n'),
            "src/train/observe/trace.hpp": '#include "train/engine/engine.hpp"\n#include "core/log.hpp"\n',
            "src/train/run/trainer.cpp": ('#include "train/run/trainer.hpp"\n#include "train/stop/signals.hpp"\n'
                                          '#include "train/serve/serving.hpp"\n#include "train/loose.hpp"\n'),
            "src/train/run/trainer.hpp": "", "src/train/stop/signals.hpp": "", "src/train/serve/serving.hpp": "",
            "src/train/options/options.hpp": '#include "train/stop/signals.hpp"\n',
            "src/train/loose.hpp": '#include "train/run/trainer.hpp"\n',
            "src/train/misc/odd.hpp": '#include "train/run/trainer.hpp"\n',
            "src/core/log.hpp": "",
        })
        deps = units(root)
        self.assertEqual(layer_violations(deps), [
            "train/engine/engine -> train/state/checkpointing (train/engine/ includes from a folder built on it, "
            "train/state/)",
            "train/state/checkpointing -> train/observe/trace (train/state/ includes from a folder of the same layer, "
            "train/observe/)",
        ])
        self.assertEqual(unplaced(deps), ["train/loose: directly in train/, not in one of its folders",
                                          "train/misc/odd: train/misc/ has no layer"])


class MadeUpFunctions(unittest.TestCase):
    @staticmethod
    def body(lines):
        return "".join(f"  x += {i};\n" for i in range(lines))

    def test_a_function_over_the_limit_is_named_and_one_at_it_is_not(self):
        # A function of 61 lines from brace to brace (59 inside), one of 60, in a namespace.
        text = ("namespace a {\n"
                "int long_one(int x) {\n" + self.body(59) + "}\n"
                "int short_one(int x) const noexcept {\n" + self.body(58) + "}\n"
                "}  // namespace a\n")
        self.assertEqual(function_spans(text), [(2, 62), (63, 122)])
        root = make_tree({"src/core/a.cpp": text})
        self.assertEqual(long_functions(root), ["src/core/a.cpp:2-62 (61 lines)"])

    def test_lambdas_blocks_and_braces_in_strings_belong_to_their_function(self):
        text = ("struct S {\n"
                "  int f() { return 1; }\n"                       # an inline method
                "  std::vector<int> v{1, 2};\n"                   # a brace initialiser
                "};\n"
                "#define BAD(x) do { x; } while (0)\n"              # a macro's braces
                "void g(int x) {\n"
                "  auto h = [&](int y) { if (y) { return '{'; } return '}'; };\n"
                "  const char* s = \"{{{\";  // } in a comment\n"
                "  /* { */ for (;;) { break; }\n"
                "}\n"
                "const char* raw = R\"({)\";\n")
        self.assertEqual(function_spans(text), [(2, 2), (6, 10)])


class MadeUpCoverage(unittest.TestCase):
    def test_a_file_no_test_names_is_found_and_a_listed_test_must_exist(self):
        root = make_tree({
            "src/core/a.hpp": "", "src/core/a.cpp": "",   # included by a test
            "src/nn/b.cpp": "",                          # named in a test's comment as b.cpp
            "src/nn/sub_b.cpp": "",                      # only b.cpp is named: not this one
            "src/train/c.cpp": "", "src/train/d.cpp": "",
            "tests/unit/x_test.cpp": '#include "core/a.hpp"\n// b.cpp through a\nTEST(X, RunsC) {}\n',
        })
        self.assertEqual(uncovered(root, {}), ["nn/sub_b: no test includes or names it",
                                             "train/c: no test includes or names it",
                                             "train/d: no test includes or names it"])
        self.assertEqual(uncovered(root, {"nn/sub_b": ("unit/x_test.cpp", "RunsC"),
                                          "train/c": ("unit/x_test.cpp", "RunsC"),
                                          "train/d": ("unit/x_test.cpp", "RunsD"),
                                          "train/e": ("unit/x_test.cpp", "RunsC")}),
                         ["train/d: its covering test unit/x_test.cpp has no RunsD",
                          "train/e: listed as covered, but there is no such file in src/"])


class TheTree(unittest.TestCase):
    def test_no_unit_includes_itself_back(self):
        found = cycles(units(ROOT))
        self.assertEqual(found, [], "include cycles: " + "; ".join(" -> ".join(c) for c in found))

    def test_no_folder_includes_from_one_built_on_it(self):
        found = layer_violations(units(ROOT))
        self.assertEqual(found, [], "\n".join(found))

    def test_no_function_is_longer_than_the_limit(self):
        found = long_functions(ROOT)
        self.assertEqual(found, [], f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found))

    def test_every_file_has_a_test(self):
        found = uncovered(ROOT, COVERED_THROUGH)
        self.assertEqual(found, [], "\n".join(found))

    def test_every_folder_has_its_layer(self):
        deps = units(ROOT)
        folders = {u.split("/")[0] for u in deps}
        self.assertEqual(folders - set(LAYERS), set(), "a folder with no layer in FOLDER_ORDER above")
        found = unplaced(deps)
        self.assertEqual(found, [], "files outside the layers of TRAIN_ORDER above:\n" + "\n".join(found))

    def test_the_orders_name_each_folder_once(self):
        for order in (FOLDER_ORDER, TRAIN_ORDER):
            every = [folder for layer in order for folder in layer]
            self.assertEqual(len(every), len(set(every)), order)


if __name__ == "__main__":
    sys.exit(unittest.main())
