"""TLS to upstreams: certificates are verified by default (a self-signed upstream is refused), and a
CA bundle given through SSL_CERT_FILE (what the single-file executable carries) is honoured."""
import http.client
import json
import os
import ssl
import subprocess
import time

import pytest

from tests.conftest import free_port, stop, start_gateway
from tests.integration.test_egress import OPENAI_REPLY, Capture


class TlsCapture(Capture):
    def __init__(self, ctx):
        self.ctx = ctx
        super().__init__()

    def _conn(self, c):
        try:
            c = self.ctx.wrap_socket(c, server_side=True)
        except (ssl.SSLError, OSError):
            c.close()
            return
        super()._conn(c)


@pytest.fixture(scope="module")
def tls_upstream(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    cap = TlsCapture(ctx)
    yield cap, cert
    cap.stopped = True


def _gateway(tmp_path, cap, extra_env, extra_config=""):
    port = free_port()
    gw = start_gateway(tmp_path, f"""
listen: "127.0.0.1:{port}"
providers:
  o: {{protocol: openai, base_url: "https://127.0.0.1:{cap.port}", api_key: {{env: MOCK_KEY}}}}
models:
  up-model: {{provider: o}}
""" + extra_config, port=port, extra_env=extra_env)
    return port, gw.proc


def _ask(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "up-model", "messages": [{"role": "user", "content": "tls"}]}),
        {"content-type": "application/json"})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def test_self_signed_upstream_is_refused_by_default(tls_upstream, tmp_path):
    cap, _ = tls_upstream
    port, proc = _gateway(tmp_path, cap, {"SSL_CERT_FILE": os.devnull})
    try:
        status, body = _ask(port)
        assert status == 502 and json.loads(body)["error"]["message"] == (
                "busbar could not connect to the upstream provider: its TLS certificate was not "
                "accepted.")
    finally:
        stop(proc)


def test_ca_bundle_from_ssl_cert_file_is_trusted(tls_upstream, tmp_path):
    cap, cert = tls_upstream
    port, proc = _gateway(tmp_path, cap, {"SSL_CERT_FILE": str(cert)})
    try:
        status, body = _ask(port)
        assert status == 200 and body == OPENAI_REPLY
    finally:
        stop(proc)


def test_responses_from_a_tls_upstream_take_no_page_fault(tls_upstream, tmp_path):
    """uvloop's TLS transport would allocate 256 KiB per read of the upstream's answer: an mmap,
    a page fault and a munmap each under busbar's fixed mmap threshold. The pool's connections
    read through busbar/upstream/tlsread.py instead."""
    cap, cert = tls_upstream
    port, proc = _gateway(tmp_path, cap, {"SSL_CERT_FILE": str(cert)})

    def minflt():
        return int(open("/proc/%d/stat" % proc.pid).read().rsplit(")", 1)[1].split()[7])
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        body = json.dumps({"model": "up-model", "messages": [{"role": "user", "content": "tls"}]})

        def send(n):
            for _ in range(n):
                c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                r = c.getresponse()
                assert r.status == 200 and r.read() == OPENAI_REPLY
        send(50)
        before = minflt()
        send(300)
        assert minflt() - before < 100, minflt() - before
        c.close()
    finally:
        stop(proc)


class SlowHandshake(TlsCapture):
    """An upstream whose TLS handshake starts 0.4 s after the TCP accept."""

    def _conn(self, c):
        time.sleep(0.4)
        super()._conn(c)


def test_a_fresh_connection_is_upstream_time_not_busbars(tls_upstream, tmp_path):
    """Server-Timing's busbar;dur excludes the upstream's time: a connect and handshake the pool
    has to make for the request (0.4 s here) is the upstream's, not busbar's."""
    _, cert = tls_upstream
    cap = SlowHandshake(tls_upstream[0].ctx)
    try:
        port, proc = _gateway(tmp_path, cap, {"SSL_CERT_FILE": str(cert)},
                              "advanced: {response_headers: {server_timing: true}}\n")
    except BaseException:
        cap.stopped = True
        raise
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        t0 = time.monotonic()
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "up-model", "messages": [{"role": "user", "content": "tls"}]}),
            {"content-type": "application/json"})
        r = c.getresponse()
        assert r.status == 200 and r.read() == OPENAI_REPLY
        assert time.monotonic() - t0 >= 0.4             # the handshake did wait
        dur_ms = float(r.getheader("Server-Timing").split("dur=")[1])
        assert dur_ms < 100, dur_ms                      # and it is not counted as busbar's
        c.close()
    finally:
        cap.stopped = True
        stop(proc)
