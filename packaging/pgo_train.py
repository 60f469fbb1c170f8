"""The training run of the profile-guided build (`make build`; setup.py's BUSBAR_PGO).

The extensions are first built instrumented (BUSBAR_PGO=generate), then this script serves the traffic
a gateway lives on through them: every ingress protocol to every lane protocol, small and ~4 KB
conversations, buffered and streamed, once with observability and virtual keys off and once with
the access log, metrics and SQLite virtual keys on. The gateway (`busbar serve --workers 1`, this
tree, the built-in mock as upstream) writes its counters to build/pgo/ when it exits on SIGTERM;
the final build (BUSBAR_PGO=use) then lays each function out hot path first and moves the blocks
this traffic never ran (error handling, argument conversion for other call shapes) out of line,
into .text.unlikely. Why: at concurrency 1, when another process has run on the core between two
requests, a request pays for every page and cache line of code it touches; the instrumented
profile packs what it touches together (docs/performance.md: "Issue #13: what stands in the way",
its first item).

Only successful requests are trained, deliberately: a fault path trained as often as the success
path would be laid out as hot as it. Code this run does not reach at all keeps its ordinary -O2
layout (-fprofile-partial-training), so nothing untrained is optimised for size.

    .venv/bin/python packaging/pgo_train.py [--rounds N] [--upstream-port PORT]

The mock is killed with SIGKILL (it imports no extension today, but if it ever does, its counters
must not describe the gateway's hot path). Exits non-zero if any trained request is not a 2xx.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import payloads  # noqa: E402

# bench/run.py's gateway (its lanes, its config) with an admin listener to mint a key on.
LANES = payloads.LANES
CONFIG = payloads.GATEWAY_CONFIG + 'admin_listen: "127.0.0.1:{admin}"\n'
OBSERVED = """\
export:
  access: {{module: access-log, settings: {{path: "{log}"}}}}
  metrics: {{module: prometheus, settings: {{buffer_seconds: 60}}}}
identity-providers:
  pgo: {{module: admin-tokens, token: {{env: PGO_ADMIN_TOKEN}}}}
auth:
  chain: [keys]
  signing_key: {{env: PGO_SIGNING_KEY}}
  admin_auth: [pgo]
groups:
  pgo: {{limits: [{{requests: 100000000, per: minute}}, {{budget: 10000000000, per: month}}, {{concurrent: 100000}}]}}
rate_card:
{card}store: {{module: sqlite, settings: {{db_path: "{db}"}}}}
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_ready(port: int, proc, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("pgo_train: the process on port %d exited (%s)" % (port, proc.returncode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            c.getresponse().read()
            c.close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("pgo_train: nothing answered on port %d within %.0f s" % (port, timeout))


def serve(env, upstream: int, folder: str, observed: bool):
    port, admin = free_port(), free_port()
    text = CONFIG.format(port=port, admin=admin, mock=upstream)
    if not observed:
        text += 'export: {access: {module: access-log, settings: {path: "off"}}}\n'
    else:
        card = "".join("  %s: {input_utok: 3.0, output_utok: 15.0}\n" % m for m in LANES.values())
        text += OBSERVED.format(log=os.path.join(folder, "access.jsonl"), card=card,
                                db=os.path.join(folder, "keys.db"))
    cfg = os.path.join(folder, "observed.yaml" if observed else "plain.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    gw = subprocess.Popen([sys.executable, "-m", "busbar.cli", "serve", "--config", cfg,
                           "--workers", "1"], env=env, cwd=ROOT,
                          stdout=subprocess.DEVNULL)
    wait_ready(port, gw)
    token = None
    if observed:
        c = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
        c.request("POST", "/api/v1/admin/keys", json.dumps({"name": "pgo", "group": "pgo"}),
                  {"Authorization": "Bearer " + env["PGO_ADMIN_TOKEN"],
                   "Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 201:
            sys.exit("pgo_train: minting a key failed: %d %s" % (r.status, body[:200]))
        token = json.loads(body)["token"]
    return gw, port, token


def train(port: int, token, rounds: int) -> int:
    """Sends every pair `rounds` times over one keep-alive connection; the number of requests."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    n = 0
    for ingress in LANES:
        headers = payloads.headers(ingress)
        if token is not None:
            for k in ("Authorization", "x-api-key", "x-goog-api-key"):
                headers.pop(k, None)
            headers["Authorization"] = "Bearer " + token
        for lane in LANES.values():
            for size in (100, 4096):
                for stream in (False, True):
                    template = payloads.body(ingress, lane, size, stream=stream)
                    path = payloads.path(ingress, lane, stream=stream)
                    for _ in range(rounds):
                        n += 1
                        c.request("POST", path, template.replace(b"@SEQ@", b"pgo%d" % n), headers)
                        r = c.getresponse()
                        body = r.read()
                        if not 200 <= r.status < 300:
                            sys.exit("pgo_train: %s -> %s (%s): HTTP %d %s" % (
                                ingress, lane, "stream" if stream else "buffered", r.status,
                                body[:200]))
    c.close()
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="requests per pair, size and mode")
    ap.add_argument("--upstream-port", type=int, metavar="PORT", help="every lane's upstream, on "
                    "127.0.0.1 (default: a built-in mock started for the run)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="busbar-pgo-")
    env = dict(os.environ, BUSBAR_LOG="WARNING", BENCH_MOCK_KEY="sk-pgo-upstream",
               BENCH_MOCK_AWS="AKIDPGOEXAMPLE:pgoSecretKeyExample0123456789abcdefXYZ",
               PGO_SIGNING_KEY=secrets.token_hex(32), PGO_ADMIN_TOKEN=secrets.token_hex(16),
               NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    mock = None
    upstream = args.upstream_port
    if upstream is None:
        upstream = free_port()
        mock = subprocess.Popen([sys.executable, "-m", "busbar.cli", "mock", "--port",
                                 str(upstream)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        if mock is not None:
            wait_ready(upstream, mock)
        t0 = time.monotonic()
        total = 0
        for observed in (False, True):
            gw, port, token = serve(env, upstream, folder, observed)
            try:
                total += train(port, token, args.rounds)
            finally:
                gw.send_signal(signal.SIGTERM)     # a clean exit writes the profile
                code = gw.wait(60)
            if code != 0:
                sys.exit("pgo_train: the gateway exited with %d" % code)
        print("pgo_train: %d requests in %.1f s" % (total, time.monotonic() - t0))
    finally:
        if mock is not None:
            mock.kill()
            mock.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
