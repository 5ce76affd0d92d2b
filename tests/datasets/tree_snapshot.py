"""What the dataset tests share: what they compare before and after a refused command (nothing
changed), and a Ctrl-C sent to hpcdata as its own imports begin."""
import hashlib
import os
import signal
import subprocess
import sys


def snapshot(*roots):
    """Every path under the roots (a missing one: nothing) with the SHA-256 of its bytes (None for
    a directory, "-> TARGET" for a link, which may lead nowhere or to itself); a root that is a
    file counts as itself."""
    seen = {}
    for root in roots:
        if os.path.isfile(root):
            with open(root, "rb") as f:
                seen[root] = hashlib.sha256(f.read()).hexdigest()
        for d, _, files in os.walk(root):
            seen[d] = None
            for n in files:
                path = os.path.join(d, n)
                if os.path.islink(path):
                    seen[path] = "-> " + os.readlink(path)
                    continue
                with open(path, "rb") as f:
                    seen[path] = hashlib.sha256(f.read()).hexdigest()
    return seen


def interrupted_as_imports_begin(args):
    """Runs `python3 -X importtime ARGS` (hpcdata and its arguments) and sends SIGINT as the
    script's first import after its own hook (argparse) loads: earlier, while the interpreter starts
    and compiles the script, no code of it runs to catch one. Returns (status, stderr without the
    import-time lines)."""
    job = subprocess.Popen([sys.executable, "-X", "importtime", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    seen = []
    for line in job.stderr:
        seen.append(line)
        if line.rstrip().endswith("| argparse"):
            job.send_signal(signal.SIGINT)
            break
    _, err = job.communicate(timeout=60)
    return job.returncode, "".join(line for line in seen + err.splitlines(True) if not line.startswith("import time:"))
