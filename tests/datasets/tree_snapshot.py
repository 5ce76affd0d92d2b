"""What the dataset tests compare before and after a refused command: nothing changed."""
import hashlib
import os


def snapshot(*roots):
    """Every path under the roots (a missing one: nothing) with the SHA-256 of its bytes (None for
    a directory); a root that is a file counts as itself."""
    seen = {}
    for root in roots:
        if os.path.isfile(root):
            with open(root, "rb") as f:
                seen[root] = hashlib.sha256(f.read()).hexdigest()
        for d, _, files in os.walk(root):
            seen[d] = None
            for n in files:
                with open(os.path.join(d, n), "rb") as f:
                    seen[os.path.join(d, n)] = hashlib.sha256(f.read()).hexdigest()
    return seen
