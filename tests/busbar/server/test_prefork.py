"""Forked workers import nothing (busbar/supervisor.py `_import_serving`): an import in a worker
after the fork walks the import machinery's shared objects and copies the pages they sit on, so
every module a worker's setup needs is imported by the parent first. A config with every optional
part on (metrics, access log, request-log sinks, OTLP, keys, every protocol), two workers: the
forked one reports the modules it imported after the fork."""
import json
import os
import signal
import subprocess
import time

from tests.conftest import CONFIG, PY, ROOT, free_port

TAIL = """
admin_listen: "127.0.0.1:{admin}"
auth:
  chain: [keys]
  signing_key: {{env: BB_SIGNING}}
export:
  access: {{module: access-log, settings: {{path: "{log}"}}}}
  metrics: {{module: prometheus, settings: {{buffer_seconds: 60}}}}
  traces: {{module: otlp, settings: {{url: "http://127.0.0.1:{otlp}/v1/traces"}}}}
  requests: {{module: request-log-file, settings: {{path: "{req}"}}}}
"""

SCRIPT = r"""
import os, sys, threading, time, json
from busbar import supervisor as gateway
PARENT = os.getpid()
OUT = sys.argv[2]
orig = gateway.run_worker
def run_worker(*a, **k):
    if os.getpid() != PARENT:
        before = set(sys.modules)
        def report():
            time.sleep(1.5)     # the worker's setup and its first second of serving
            with open(OUT + ".tmp", "w") as f:
                json.dump(sorted(set(sys.modules) - before), f)
            os.rename(OUT + ".tmp", OUT)
        threading.Thread(target=report, daemon=True).start()
    return orig(*a, **k)
gateway.run_worker = run_worker
from busbar import cli
sys.argv = ["busbar", "serve", "--config", sys.argv[1], "--workers", "2"]
cli.main()
"""


def test_a_forked_worker_imports_nothing(tmp_path):
    cfg = tmp_path / "busbar.yaml"
    cfg.write_text(CONFIG.format(port=free_port(), mock=free_port(), dead=free_port()) + TAIL.format(
        admin=free_port(), log=tmp_path / "access.log", otlp=free_port(), req=tmp_path / "req.log"))
    out = tmp_path / "imported.json"
    env = dict(os.environ, MOCK_KEY="k", MOCK_AWS="AKIDEXAMPLE:secret", BB_SIGNING="ab" * 32,
               PYTHONPATH=str(ROOT))
    p = subprocess.Popen([PY, "-c", SCRIPT, str(cfg), str(out)], env=env, cwd=str(ROOT),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not out.exists():
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no report from the forked worker"
            time.sleep(0.1)
        assert json.loads(out.read_text()) == []
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
