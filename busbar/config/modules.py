"""Python packages that only some configs need, checked when a config is built (`busbar validate`,
`serve`, a reload): a missing one is one line naming the feature, the package and how to install
it, never a ModuleNotFoundError traceback when the feature is first used.

    require(out, "store.kind", "store redis", "redis")      # False (and an error) when absent

Every one is in pyproject.toml's `[project] dependencies`, so a pip install has them all, and so
does the single-file executable (packaging/busbar.spec; tests/packaging/test_executable_features.py
validates a config that needs each of them there); they are imported lazily because most configs
never use them. The install line's pin is read from that same list (the source tree's
pyproject.toml, else the installed package's metadata), never written twice.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys

from .checks import Problems

# module -> distribution (pip's name), for the ones busbar imports only when a config asks.
OPTIONAL = {
    "redis": "redis",                   # store: {module: valkey}
    "asyncpg": "asyncpg",               # store: {module: postgres}
    "aiohttp": "aiohttp",               # export: otlp, request-log-webhook
    "botocore": "botocore",             # Bedrock credentials from the AWS chain (no api_key)
    "cryptography": "cryptography",     # Vertex service-account credentials (RS256)
}

# Optional modules whose work cbusbar does itself where it can: module -> the compiled module whose
# AVAILABLE says it can here (RS256 through the interpreter's own libcrypto: the executable carries
# no `cryptography`, packaging/busbar.spec).
DONE_NATIVELY = {"cryptography": "cbusbar.rs256"}

_PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "pyproject.toml")
_PIN = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(==\s*[^;\s]+)?")


def lacks(module: str) -> bool:
    """True when `module` cannot be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def _native(module: str) -> bool:
    name = DONE_NATIVELY.get(module)
    if name is None:
        return False
    try:
        return bool(importlib.import_module(name).AVAILABLE)
    except ImportError:
        return False


def requirement(dist: str) -> str:
    """`dist` pinned as busbar's dependencies pin it (`redis==8.1.0`), else the bare name."""
    for spec in _dependencies():
        m = _PIN.match(spec)
        if m and m.group(1).lower().replace("_", "-") == dist.lower().replace("_", "-"):
            return m.group(1) + (m.group(2) or "").replace(" ", "")
    return dist


def _dependencies() -> list[str]:
    if os.path.isfile(_PYPROJECT):          # running from the source tree
        try:
            import tomllib
            with open(_PYPROJECT, "rb") as f:
                return list(tomllib.load(f)["project"]["dependencies"])
        except (ImportError, OSError, ValueError, KeyError):
            pass
    try:                                    # a pip install; the executable has no metadata
        from importlib import metadata
        return list(metadata.requires("busbar") or ())
    except Exception:
        return []


def require(out: Problems, path: str, feature: str, module: str, offline: bool = False) -> bool:
    """Records one line when `feature` (at config `path`) needs `module` and this install lacks
    it; a warning under `validate --offline` (CI may lint on another install than the one that
    serves). True when the module is there."""
    if not lacks(module) or _native(module):
        return True
    dist = OPTIONAL.get(module, module)
    if getattr(sys, "frozen", False):
        # Every OPTIONAL module is packed into the executable: only a broken build gets here.
        how = ("this executable was built without it (a packaging error: packaging/busbar.spec "
               "must carry every module busbar imports on demand); `pip install busbar` has it")
    else:
        how = "this install lacks it (pip install '%s')" % requirement(dist)
    message = "%s needs the Python package `%s`; %s" % (feature, dist, how)
    (out.warn if offline else out.error)(path, message)
    return False
