#!/usr/bin/env python3
"""The commands the user documentation shows are commands the tools take, and the files it names exist.

From the fenced code blocks of the documents in DOCS (sh, bash, console or unlabelled; python,
yaml, promql and the like are skipped) and from their inline `code` spans that hold a suite tool's
name, every command line is split into tokens (shlex, after joining backslash-continued
lines and dropping # comments). A token naming a suite tool (TOOLS: hpctrain, hpcrun, hpcdata, ...,
bare or as a path such as ./build/src/hpctrain, or a repository script such as bench/chaos.sh) owns
the long options that follow it, up to the next suite tool, a `--` or a shell operator; a
subcommand right after it (hpctrain evaluate, hpcdata pack) picks that subcommand's --help.
Options before the first suite tool belong to another program (mpirun's -np, sbatch's --time) and
are not checked. Each owned --name must appear in the tool's --help output (run from BUILD_DIR for
the built programs, from the source tree for scripts); the few shown options that are another
program's although a suite tool precedes them are in ALLOWED, each with its reason.

Every repository path a document names (a word beginning with one of the tree's top-level folders:
slurm/train.sbatch, bench/chaos.sh, src/train/run/; an all-capitals part such as NAME stands for
any name, and a glob such as slurm/*.sh must match something) and every relative Markdown link
must exist in the source tree, and every build/ path (build/src/hpctrain) in BUILD_DIR.
A word right after hpctrain or hpcdata that is no subcommand of theirs is reported too, and so is a
ParameterKey=NAME that is no parameter of the CloudFormation templates.

A failure names the document, its line, the tool and the option (or the path). Run by CTest
(label unit) through run_unittest.py with BUILD_DIR set; without BUILD_DIR the built programs'
options are skipped with a reason, the scripts' and the paths are still checked.
"""
import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("BUILD_DIR", "")
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

DOCS = ["README.md", "launch/README.md", "slurm/README.md", "cloudformation/README.md", "docs/aws.md",
        "docs/architecture.md", "docs/performance.md", "bench/README.md", "datasets/README.md",
        "kernels/README.md"]

# The built programs: name -> path under BUILD_DIR, and the subcommands with their own --help.
BUILT = {"hpctrain": "src/hpctrain", "hpcrun": "launch/hpcrun", "hpcdata-pack": "datasets/hpcdata-pack",
         "allreduce_sweep": "bench/allreduce_sweep", "checkpoint_stall": "bench/checkpoint_stall",
         "gemm_shapes": "bench/gemm_shapes", "gpu_step": "bench/gpu_step", "layer_profile": "bench/layer_profile",
         "loader_throughput": "bench/loader_throughput"}
SUBCOMMANDS = {"hpctrain": {"train", "evaluate", "inspect", "export", "predict", "clean-snapshots",
                            "persist-snapshot"},
               "hpcdata": {"prepare", "pack", "stage"}}
REQUIRED = {"hpctrain", "hpcrun", "hpcdata-pack"}
# The tools in the source tree, by name (as installed) or repository path, whose --help is safe to
# run anywhere (it prints and exits before doing anything) and lists their options. A script not
# here is never run: cloudformation/node's boot scripts install packages whatever they are given.
SCRIPTS = {"hpcdata": "datasets/hpcdata", "hpctrain-plot": "launch/hpctrain-plot"}
SCRIPT_PATHS = ["slurm/chain.sh", "slurm/local-cluster.sh", "setup.sh",
                "bench/chaos.sh", "bench/chaos_slurm.sh", "bench/cpu_vs_peer.sh", "bench/device_deps.sh",
                "bench/fine_tune.sh", "bench/gpu_vs_peer.sh", "bench/hpcrun_recovery.sh",
                "bench/mpi_vs_peer.sh", "bench/recipe_vs_peer.sh", "bench/same_bits.sh",
                "bench/scaling_check.sh", "bench/snapshot_cost.sh",
                "bench/chaos_report.py", "bench/predict_vs_opencv.py", "bench/scaling_model.py",
                "bench/torch_gpu_steps.py", "bench/torch_recipe_steps.py",
                "cloudformation/node/clustermgtd.py", "cloudformation/node/computemgtd.py",
                "cloudformation/node/data_credentials.py", "cloudformation/node/export_munge_key.py",
                "cloudformation/node/fetch_munge_key.py", "cloudformation/node/launch_check.py",
                "cloudformation/node/render_slurm_conf.py", "cloudformation/node/spot_watcher.py"]
# Scripts whose options after the script are another tool's, as they pass them on.
PASS_ON = {"slurm/train.sbatch": "hpctrain", "slurm/sweep.sbatch": "hpctrain"}

# (tool, option): why a document may show it after that tool although its --help does not list it.
ALLOWED = {
    ("hpcrun", "rank-exec"): "the per-rank wrapper mode hpcrun gives mpirun; launch/README describes it, "
                             "no user types it, so --help leaves it out",
}
# An inline span that is an option alone (`--requeue`) names an option of some suite tool, or one
# of these other programs' options, which the documents explain beside ours.
OTHER_OPTIONS = {
    "mpirun's": {"allow-run-as-root", "oversubscribe", "host", "do-not-launch", "gmca", "tag-output",
                 "display-map", "rank-by", "timestamp-output", "xml"},
    "sbatch's and srun's": {"mem", "requeue", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "exclusive",
                            "open-mode", "array", "no-kill"},
    "aws cloudformation's (docs/aws.md)": {"stack-policy-during-update-body", "on-failure"},
    "none: an abbreviation launch/README shows being refused": {"res"},
    "timm's (README: what hpctrain's batch norm does instead)": {"dist-bn"},
}
# Paths a document names in code that are another project's, not this repository's.
OTHER_PATHS = {"src/graph/tuning.cc": "NCCL's tuning model, which bench/README cites",
               "docs/benchmarks.rst": "Horovod's published table, which bench/README cites"}

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SHELL_FENCES = {"", "sh", "bash", "shell", "console", "text"}
OPTION = re.compile(r"^--([a-z0-9][a-z0-9-]*)(=.*)?$", re.S)
HELP_OPTION = re.compile(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)")
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", "$(", "`", "then", "do", "else", "{", "}", "!", "xargs",
             "time", "nice", "exec", "sudo", "env", "watch"}
TOP = ["src", "launch", "slurm", "bench", "cloudformation", "docs", "tests", "datasets", "kernels", "cmake"]
REPO_PATH = re.compile(r"(?<![\w./$~@:*{-])((?:%s)/[\w.*/{},-]*[\w*/])" % "|".join(TOP))
BUILD_PATH = re.compile(r"(?<![\w./$~@:*{-])build/([\w./-]*\w)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def tool_of(token):
    """The suite tool a command-line word names (its key in the tables), or None."""
    word = token.strip("\"'")
    for prefix in ("$PWD/", "${PWD}/", "./", "../"):
        while word.startswith(prefix):
            word = word[len(prefix):]
    base = os.path.basename(word)
    if base in BUILT or base in SCRIPTS:
        return base
    for path in SCRIPT_PATHS + list(PASS_ON):
        if word == path or word.endswith("/" + path) or (base == os.path.basename(path) and "/" not in word
                                                          and base.endswith((".sh", ".py", ".sbatch"))):
            return path
    return None


def commands(text):
    """The token lists of the shell commands in text (one or more lines joined already)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote in an example: plain words
        tokens = text.split()
    command = []
    for token in tokens:
        if re.search(r"\s", token) and any(tool_of(word) for word in token.split()):
            yield from commands(token)  # ssh head 'sbatch slurm/train.sbatch --epochs 3'
            continue
        if token in OPERATORS or set(token) <= set(";&|()"):
            if command:
                yield command
            command = []
        else:
            command.append(token)
    if command:
        yield command


def uses(command):
    """(tool, subcommand, option) for each long option a suite tool in command owns."""
    tool, sub = None, None
    for i, token in enumerate(command):
        named = tool_of(token)
        if named:
            tool = PASS_ON.get(named, named)
            sub = None
            if tool == named or tool in SUBCOMMANDS:
                following = command[i + 1] if i + 1 < len(command) else ""
                if following in SUBCOMMANDS.get(tool, ()):
                    sub = following
                elif tool in SUBCOMMANDS and re.fullmatch(r"[a-z][a-z-]*", following):
                    yield tool, following, None  # hpctrain evalute
            continue
        if token == "--":
            tool = None
            continue
        match = OPTION.match(token.lstrip("[").rstrip("],"))  # a synopsis's [--name VALUE]
        if tool and match:
            yield tool, sub, match.group(1)


def snippets(path):
    """(line number, command text) of each shell command in a document, and (line, word) of each code word."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence, lang, pending, start = None, "", "", 0
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, lang = match.group(1), match.group(2).lower()
            continue
        if fence is not None:
            if line.strip().startswith(fence[0] * 3) and line.strip().strip(fence[0]) == "":
                fence = None
                continue
            if lang not in SHELL_FENCES:
                continue
            body = re.sub(r"^\s*[$#] (?=\S)", "", line) if lang == "console" else line
            if not pending:
                start = number
            if body.rstrip().endswith("\\"):
                pending += body.rstrip()[:-1] + " "
                continue
            yield "block", start, pending + body
            pending = ""
            continue
        for span in INLINE.findall(line):
            yield "inline", number, span


def line_of(lines, start, option):
    """The line of a backslash-continued command, from the one it starts on, that shows option."""
    for number in range(start, min(start + 40, len(lines) + 1)):
        if re.search(re.escape(option) + r"(?![\w-])", lines[number - 1]):
            return number
    return start


def doc_uses(path):
    """(line, tool, subcommand, option) for every option a document shows a suite tool with; tool None
    for an inline span that begins with an option (it must be some tool's, or in OTHER_OPTIONS)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for kind, number, text in snippets(path):
        first = text.split()[0] if text.split() else ""
        if kind == "inline" and OPTION.match(first):
            for command in commands(text):
                for token in command:
                    match = OPTION.match(token)
                    if match:
                        yield number, None, None, match.group(1)
            continue
        if kind == "inline" and not any(tool_of(word) for word in text.split()):
            continue
        for command in commands(text):
            for tool, sub, option in uses(command):
                yield line_of(lines, number, "--" + option if option else sub), tool, sub, option


def doc_paths(path):
    """(line, path) of each repository path a document names in code, and of each relative link."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if match:
            fence = None if fence else match.group(1)
            continue
        for found in REPO_PATH.findall(line):
            yield number, found
        for found in BUILD_PATH.findall(line):
            yield number, "build/" + found
        if not fence:
            for link in LINK.findall(line):
                if not re.match(r"^[a-z]+:", link):
                    yield number, ("@" + link)


def path_exists(doc, name):
    """Whether a path a document names is in the source tree (a link: relative to the document; a
    build/ path: in BUILD_DIR, where that is set)."""
    if name.startswith("build/"):
        return not BUILD or os.path.exists(os.path.join(BUILD, name[len("build/"):]))
    if name.startswith("@"):
        return os.path.exists(os.path.join(os.path.dirname(os.path.join(SOURCE, doc)), name[1:]))
    name = name.rstrip("/")
    if name in OTHER_PATHS:
        return True
    name = "/".join("*" if re.fullmatch(r"[A-Z][A-Z_]*", part) else part for part in name.split("/"))
    if "{" in name:  # bench/{a,b}.sh
        head, rest = name.split("{", 1)
        choices, tail = rest.split("}", 1) if "}" in rest else (rest, "")
        return all(path_exists(doc, head + choice + tail) for choice in choices.split(","))
    for candidate in (name, name.rstrip(".,")):
        if glob.glob(os.path.join(SOURCE, candidate)):
            return True
    return False


class Helps:
    """Each tool's --help, run once: the set of long options it lists, or a reason it cannot be read."""

    def __init__(self, build):
        self.build = build
        self.cache = {}
        self.every = None

    def argv(self, tool, sub):
        if tool in BUILT:
            program = [os.path.join(self.build, BUILT[tool])]
            if not self.build:
                return None
            if not os.access(program[0], os.X_OK):
                if tool in REQUIRED:
                    raise AssertionError("%s is not built: build the tree before this test" % program[0])
                return None  # a bench program this build leaves out (gpu_step without a GPU toolkit)
        elif (tool, sub) == ("hpcdata", "pack") and not self.build:
            return None  # hpcdata pack --help is the built hpcdata-pack's
        else:
            script = os.path.join(SOURCE, SCRIPTS.get(tool, tool))
            program = ([PYTHON, script] if script.endswith(".py") or tool in SCRIPTS else ["bash", script])
        return program + ([sub] if sub else []) + ["--help"]

    def options(self, tool, sub):
        key = (tool, sub)
        if key not in self.cache:
            argv = self.argv(tool, sub)
            if argv is None:
                self.cache[key] = None
            else:
                run = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, timeout=60, cwd=SOURCE,
                                     env=dict(os.environ, HPCDATA_PACK=os.path.join(self.build, BUILT["hpcdata-pack"])
                                              if self.build else ""))
                text = run.stdout.decode("utf-8", "replace")
                if run.returncode != 0:
                    raise AssertionError("%s exited %d:\n%s" % (" ".join(argv), run.returncode, text[-2000:]))
                self.cache[key] = set(HELP_OPTION.findall(text))
        return self.cache[key]


    def every_option(self):
        """The long options of every tool and subcommand, with OTHER_OPTIONS."""
        if self.every is not None:
            return self.every
        every = set().union(*OTHER_OPTIONS.values())
        for tool in list(BUILT) + list(SCRIPTS) + SCRIPT_PATHS:
            for sub in [None] + sorted(SUBCOMMANDS.get(tool, ())):
                every |= self.options(tool, sub) or set()
        self.every = every
        return every


@functools.lru_cache(maxsize=None)
def template_parameters():
    """The Parameters of the CloudFormation templates (cloudformation/*.yaml), by their keys' indent."""
    names = set()
    for template in glob.glob(os.path.join(SOURCE, "cloudformation", "*.yaml")):
        section = None
        with open(template, encoding="utf-8") as f:
            for line in f:
                top = re.match(r"^(\w+):", line)
                if top:
                    section = top.group(1)
                key = re.match(r"^  (\w+):", line)
                if section == "Parameters" and key:
                    names.add(key.group(1))
    return names


def check(docs, helps):
    """The problems found: one line each, naming the document, line, tool and option or path."""
    problems = []
    for doc in docs:
        path = os.path.join(SOURCE, doc)
        for number, tool, sub, option in doc_uses(path):
            if tool is None:
                if helps.build and option not in helps.every_option():  # else many are unknown
                    problems.append("%s:%d: --%s is no suite tool's option (nor in OTHER_OPTIONS)" % (doc, number, option))
                continue
            if option is None:
                problems.append("%s:%d: %s: %s is not one of its subcommands (%s)"
                                % (doc, number, tool, sub, ", ".join(sorted(SUBCOMMANDS[tool]))))
                continue
            known = helps.options(tool, sub)
            if known is None or option in known or (tool, option) in ALLOWED:
                continue
            problems.append("%s:%d: %s%s: --%s is not in its --help" % (doc, number, tool,
                                                                       " " + sub if sub else "", option))
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for key in re.findall(r"ParameterKey=(\w+)", line):
                    if key not in template_parameters() and not re.fullmatch(r"[A-Z_]+", key):
                        problems.append("%s:%d: ParameterKey=%s is no parameter of cloudformation/*.yaml"
                                        % (doc, number, key))
        for number, name in doc_paths(path):
            if not path_exists(doc, name):
                problems.append("%s:%d: %s does not exist in the repository" % (doc, number, name.lstrip("@")))
    return problems


class Planted(unittest.TestCase):
    """The checker finds what it is for, on made-up documents."""

    def write(self, text):
        folder = tempfile.mkdtemp(prefix="docs-check-")
        self.addCleanup(shutil.rmtree, folder)
        for name, content in (("doc.md", text), ("beside.md", "")):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(content)
        return os.path.join(folder, "doc.md")

    def test_renamed_option_and_missing_path(self):
        doc = self.write("Run it:\n\n```sh\nmpirun -np 2 --bind-to none ./build/src/hpctrain --epochs 1 \\\n"
                         "    --chekpoint-dir ck   # typo\nsbatch --time=1:00 slurm/train.sbatch --epochs 2\n"
                         "bench/chaos.sh --seed 1 --durration 1m\nhpctrain evalute --checkpoint ck\n```\n\n"
                         "Then `launch/hpctrain-plot run.jsonl --output x` and `slurm/nope.sbatch`, "
                         "[this](beside.md), [that](no-such.md).\n"
                         "aws cloudformation create-stack --parameters ParameterKey=KeyName,ParameterValue=k "
                         "ParameterKey=Keyname,ParameterValue=k\n")

        class Fake(Helps):
            def options(self, tool, sub):
                return {"hpctrain": {"epochs", "checkpoint-dir", "checkpoint"},
                        "bench/chaos.sh": {"seed", "duration"}, "hpctrain-plot": {"out", "prefix"}}[tool]
        problems = [p.split(": ", 1)[1] for p in check([doc], Fake(""))]
        self.assertEqual(problems, ["hpctrain: --chekpoint-dir is not in its --help",
                                    "bench/chaos.sh: --durration is not in its --help",
                                    "hpctrain: evalute is not one of its subcommands (clean-snapshots, evaluate, "
                                    "export, inspect, persist-snapshot, predict, train)",
                                    "hpctrain-plot: --output is not in its --help",
                                    "ParameterKey=Keyname is no parameter of cloudformation/*.yaml",
                                    "slurm/nope.sbatch does not exist in the repository",
                                    "no-such.md does not exist in the repository"])
        self.assertTrue(all(p.startswith(doc + ":") for p in check([doc], Fake(""))))

    def test_owners(self):
        owned = [(t, s, o) for c in commands("hpcrun -H a:2 --min-np 2 -- ./build/src/hpctrain evaluate --checkpoint x"
                                             " && hpcdata pack --split val | tee --append log")
                 for t, s, o in uses(c)]
        self.assertEqual(owned, [("hpcrun", None, "min-np"), ("hpctrain", "evaluate", "checkpoint"),
                                 ("hpcdata", "pack", "split")])


class Documents(unittest.TestCase):
    def test_documents(self):
        if not BUILD:
            print("BUILD_DIR unset: the built programs' options are not checked", file=sys.stderr)
        problems = check(DOCS, Helps(BUILD))
        self.assertEqual(problems, [], "\n" + "\n".join(problems))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--list":  # what the checker reads, for a person
        for doc in DOCS:
            for number, tool, sub, option in doc_uses(os.path.join(SOURCE, doc)):
                print("%s:%d: %s%s --%s" % (doc, number, tool, " " + sub if sub else "", option))
        sys.exit(0)
    unittest.main()
