"""Prints busbar's runtime dependencies, one pinned requirement a line, from pyproject.toml's
`[project] dependencies` (the one list): what `make` and the Dockerfile install before the editable
install, as a requirements file, without building the package first.

    python3 packaging/runtime_deps.py > .venv/requirements-runtime.txt
"""
import os
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    sys.stdout.write("".join(d + "\n" for d in deps))
