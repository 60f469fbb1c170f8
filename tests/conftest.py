"""Fixtures that run the real thing: the built-in mock provider and the gateway as separate
processes on loopback ports, talked to over real sockets. Every process is bounded in time and
stopped at the end of the session."""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
# BUSBAR_TEST_EXECUTABLE=<path>: every gateway and mock these fixtures start is that executable
# (dist/busbar, or another architecture's under emulation) instead of this interpreter running
# the source tree; tests/packaging runs the SDK suites this way.
EXECUTABLE = os.environ.get("BUSBAR_TEST_EXECUTABLE")


def busbar_argv(executable: str | None = None) -> list[str]:
    """The command that runs busbar: `executable` (else BUSBAR_TEST_EXECUTABLE's), else
    `python -m busbar.cli` on the source tree."""
    executable = executable or EXECUTABLE
    return [executable] if executable else [PY, "-m", "busbar.cli"]


def _for_executable(e: dict, executable: str | None = None) -> dict:
    # An executable carries its own busbar: nothing from the source tree may reach it.
    if executable or EXECUTABLE:
        e.pop("PYTHONPATH", None)
    return e
# Every gateway a test starts would otherwise want the admin listener's default 127.0.0.1:8081
# (tests that build their environment from os.environ get it from here).
os.environ.setdefault("BUSBAR_ADMIN_LISTEN", "127.0.0.1:0")

# The six lanes every integration test can reach, one per egress protocol, all on the mock.
LANES = {
    "openai": "oai-model",
    "responses": "resp-model",
    "anthropic": "ant-model",
    "gemini": "gem-model",
    "cohere": "coh-model",
    "bedrock": "bed-model",
}

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  m-openai:    {{protocol: openai,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-responses: {{protocol: responses, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-anthropic: {{protocol: anthropic, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-gemini:    {{protocol: gemini,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-cohere:    {{protocol: cohere,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-bedrock:   {{protocol: bedrock,   base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_AWS}},
                region: us-east-1}}
  m-dead:      {{protocol: openai,    base_url: "http://127.0.0.1:{dead}", api_key: {{env: MOCK_KEY}}}}
models:
  oai-model:  {{provider: m-openai, upstream_model: gpt-4o-mini}}
  resp-model: {{provider: m-responses, upstream_model: gpt-4.1-mini}}
  ant-model:  {{provider: m-anthropic, upstream_model: claude-haiku-4-5, reasoning: true}}
  gem-model:  {{provider: m-gemini, upstream_model: gemini-2.5-flash}}
  coh-model:  {{provider: m-cohere, upstream_model: command-r}}
  bed-model:  {{provider: m-bedrock, upstream_model: "amazon.nova-lite-v1:0"}}
  dead-model: {{provider: m-dead, upstream_model: gpt-dead}}
  one-slot:   {{provider: m-openai, upstream_model: gpt-4o-mini, max_concurrent: 1}}
pools:
  mixed:
    members:
      - {{model: oai-model, weight: 1}}
      - {{model: ant-model, weight: 1}}
  failover:
    members:
      - {{model: dead-model, weight: 100}}
      - {{model: ant-model, weight: 1}}
limits:
  request_body_max_bytes: 1048576
  header_read_timeout_secs: 2
  idle_timeout_secs: 5
advanced:
  response_headers:
    server_timing: true
"""


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this session handed out before: the kernel may give the
    same ephemeral port to two calls in a row once the first socket is closed, and a test that
    asks for a data and an admin port at once would then get one address twice."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_http(port: int, proc: subprocess.Popen, path: str = "/healthz", timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("process exited with %s" % proc.returncode)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
                if s.recv(64).startswith(b"HTTP/1.1"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("port %d did not answer in time" % port)


def stop(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    e["MOCK_KEY"] = "sk-test-key"
    # Every gateway a test starts would otherwise want the admin listener's default 127.0.0.1:8081.
    e["BUSBAR_ADMIN_LISTEN"] = "127.0.0.1:0"
    e["MOCK_AWS"] = "AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    return e


def pytest_collection_modifyitems(config, items):
    """`slow` tests (another architecture's executable under emulation: minutes) run only when the
    run asks for them by name, `-m slow` (`make test-arm64`); any other run skips them."""
    if (config.option.markexpr or "").strip() == "slow":
        return
    skip = pytest.mark.skip(reason="slow (emulated): run with -m slow, as `make test-arm64` does")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mock_port():
    port = free_port()
    proc = subprocess.Popen(busbar_argv() + ["mock", "--port", str(port), "--require-auth"],
                            cwd=ROOT, env=_for_executable(env()))
    try:
        wait_http(port, proc)
        yield port
    finally:
        stop(proc)


class Gateway:
    def __init__(self, port, proc, config_path):
        self.port = port
        self.proc = proc
        self.config_path = config_path
        self.url = "http://127.0.0.1:%d" % port


@pytest.fixture(scope="session")
def gateway(mock_port, tmp_path_factory):
    port = free_port()
    gw = start_gateway(tmp_path_factory.mktemp("gw"), CONFIG.format(port=port, mock=mock_port,
                       dead=free_port()), port=port, stdout=None)
    yield gw
    stop(gw.proc)


def start_gateway(tmp_path, config_text: str, workers: int = 1, extra_env=None, *, port=None,
                  base_env=None, stdout=subprocess.DEVNULL, stderr=None, ready=None,
                  executable=None) -> Gateway:
    """A gateway process on its own config (a test's own lanes): `{port}` in the text becomes its
    listen port (or pass `port` for a text formatted already); the environment is `env()` (or
    `base_env`) plus `extra_env`; it returns once `ready(port, proc)` (default: /healthz answers)
    holds. `executable`: a built busbar to run instead of the source tree (busbar_argv). The
    caller stops it with `stop(gw.proc)` (or uses the `gateway_factory` fixture, which does).
    Every test that runs `busbar serve` in a process starts it here."""
    port = port or free_port()
    cfg = tmp_path / ("config-%d.yaml" % port)
    cfg.write_text(config_text.replace("{port}", str(port)))
    e = dict(base_env) if base_env is not None else env()
    if extra_env:
        e.update(extra_env)
    proc = subprocess.Popen(busbar_argv(executable) + ["serve", "--config", str(cfg), "--workers", str(workers)],
                            cwd=ROOT, env=_for_executable(e, executable), stdout=stdout, stderr=stderr)
    try:
        (ready or wait_http)(port, proc)
    except Exception:
        stop(proc)
        raise
    return Gateway(port, proc, cfg)


@pytest.fixture
def gateway_factory(tmp_path):
    started = []

    def make(config_text, workers=1, extra_env=None):
        gw = start_gateway(tmp_path, config_text, workers, extra_env)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        stop(gw.proc)


@pytest.fixture
def inproc_gateway():
    """make(config_text, env=None, setup=None, drain=False) -> tests/inproc.py InprocGateway, a
    gateway in this process; each is stopped after the test."""
    from tests.inproc import InprocGateway
    started = []

    def make(config_text, env=None, setup=None, drain=False):
        g = InprocGateway(config_text, env, setup, drain)
        started.append(g)
        return g

    yield make
    for g in started:
        g.stop()
