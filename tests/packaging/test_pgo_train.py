"""The profile-guided build's pieces (packaging/build_ext.sh): the training run serves every protocol
pair through the real gateway and fails loudly when one does not answer 2xx, and setup.py refuses
a BUSBAR_PGO it does not know instead of building unoptimised without a word."""
from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

from tests.bench import ROOT


def _run(args, env=None, timeout=180):
    return subprocess.run([sys.executable] + args, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def test_training_run_serves_every_pair():
    r = _run(["packaging/pgo_train.py", "--rounds", "1"])
    assert r.returncode == 0, r.stderr[-2000:]
    # 6 ingress x 6 lanes x 2 sizes x (buffered, streamed), plain and observed (keys, access log)
    assert "pgo_train: 288 requests in" in r.stdout, r.stdout


def test_training_run_stops_on_a_failing_pair():
    # An upstream that answers every request 500: the gateway (one lane, no failover) answers 502
    # and the run stops on the first pair, saying which, rather than training on error paths.
    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"message": "down", "type": "server_error"}}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = _run(["packaging/pgo_train.py", "--rounds", "1", "--upstream-port",
                  str(server.server_address[1])])
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode != 0
    assert "pgo_train: openai -> oai-model (buffered): HTTP 5" in r.stderr, r.stderr[-2000:]


def test_setup_refuses_an_unknown_pgo_mode():
    r = _run(["setup.py", "--name"], env={"BUSBAR_PGO": "fast"})
    assert r.returncode != 0
    assert "BUSBAR_PGO='fast': expected generate, use or nothing" in r.stderr
