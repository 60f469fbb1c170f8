"""The SDK suites (the official SDKs against the six lanes on the mock) run in a pytest of their own
whose gateways and mock run some other way: a built executable (BUSBAR_TEST_EXECUTABLE, tests/
conftest.py), the standard library's event loop (BUSBAR_LOOP=asyncio, busbar/server/runtime.py),
another architecture under emulation. The paths CI does not run natively stay tested this way."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = ["tests/integration/test_sdk_openai_anthropic.py", "tests/integration/test_sdk_more.py"]


def run(env_extra: dict, timeout: float = 600, suites=SUITES) -> str:
    """`suites` with os.environ plus `env_extra`; their output. Fails unless every test passed
    (none skipped)."""
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x",
                        "--timeout", str(int(timeout)), *suites], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout + 60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary) and not re.search(r"skipped|xfail|error", summary), summary
    return out
