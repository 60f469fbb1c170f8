"""The built executable, shared by the packaging tests: packaging/build.sh runs once per session
and is itself a no-op when dist/busbar is current for today's inputs (packaging/inputs.py)."""
from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXE = os.path.join(ROOT, "dist", "busbar")
# A build from scratch takes ~2 min on two busy cores; the PyInstaller analysis is most of it.
BUILD_TIMEOUT = 900


@pytest.fixture(scope="session")
def exe():
    r = subprocess.run([os.path.join(ROOT, "packaging", "build.sh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=BUILD_TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    return EXE
