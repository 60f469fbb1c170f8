"""The runtimes of busbar/server/runtime.py, run on Linux: the standard library's event loop in one
process (how busbar runs on Windows: no uvloop, no fork, signals through signal.signal, reload
through the admin API) and forked workers accepting on one inherited socket (how they share the
port on macOS, where SO_REUSEPORT does not balance). The SDK suites run on the first, so that the
path Linux does not take by default cannot rot."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time

import pytest

from busbar.server.runtime import Runtime, RuntimeChoiceError, choose
from tests import sdk_suites
from tests.conftest import env, free_port, start_gateway, stop


def test_choose_defaults_and_switches():
    assert choose({}, "linux") == Runtime("uvloop", True, "reuseport")
    assert choose({}, "darwin") == Runtime("uvloop", True, "inherit")
    assert choose({"BUSBAR_LOOP": "asyncio"}, "linux") == Runtime("asyncio", False, "reuseport")
    assert choose({"BUSBAR_LISTENER": "inherit"}, "linux") == Runtime("uvloop", True, "inherit")
    for bad, says in (({"BUSBAR_LOOP": "trio"}, "BUSBAR_LOOP=trio: expected uvloop or asyncio"),
                      ({"BUSBAR_LISTENER": "x"}, "BUSBAR_LISTENER=x: expected reuseport or inherit"),
                      ({"BUSBAR_LISTENER": "reuseport"}, "balances connections across processes on "
                                                         "Linux only")):
        with pytest.raises(RuntimeChoiceError) as e:
            choose(bad, "darwin")
        assert says in str(e.value)


def test_sdk_suites_on_the_stdlib_loop():
    sdk_suites.run({"BUSBAR_LOOP": "asyncio"})


CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:%(admin)d"
identity-providers:
  admin-tokens: {module: admin-tokens, token: {env: ADMIN_TOKEN}}
auth:
  chain: []
  admin_auth: [admin-tokens]
providers:
  mock: {protocol: openai, base_url: "http://127.0.0.1:%(mock)d", api_key: {env: MOCK_KEY}}
models:
%(models)s
"""


def _config(admin, mock, models):
    return CONFIG % {"admin": admin, "mock": mock,
                     "models": "\n".join("  %s: {provider: mock, upstream_model: gpt-4o-mini}" % m
                                         for m in models)}


def _chat(port, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _until(pred, secs=10.0):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]


def _maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return f.read()


def test_stdlib_loop_one_process_signals_and_reload(mock_port, tmp_path):
    admin = free_port()
    e = dict(env(), BUSBAR_LOOP="asyncio", ADMIN_TOKEN="t" * 32)
    gw = start_gateway(tmp_path, _config(admin, mock_port, ["m1"]), workers=2, extra_env=e,
                       stderr=subprocess.PIPE)
    try:
        assert _chat(gw.port, "m1")[0] == 200
        # one process, and no uvloop in it: the standard library's loop serves
        assert _children(gw.proc.pid) == []
        assert "uvloop" not in _maps(gw.proc.pid)
        # SIGHUP (Linux has it) reloads through a Python signal handler
        gw.config_path.write_text(_config(admin, mock_port, ["m1", "m2"]).replace(
            "{port}", str(gw.port)))
        gw.proc.send_signal(signal.SIGHUP)
        assert _until(lambda: _chat(gw.port, "m2")[0] == 200)
        # the reload Windows has: the admin API
        gw.config_path.write_text(_config(admin, mock_port, ["m1", "m2", "m3"]).replace(
            "{port}", str(gw.port)))
        c = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
        c.request("POST", "/api/v1/admin/config/reload", headers={"authorization": "Bearer " + "t" * 32})
        r = c.getresponse()
        assert r.status == 200, r.read()
        assert _chat(gw.port, "m3")[0] == 200
        # SIGTERM drains and exits 0
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(15) == 0
        assert "one process: busbar runs no worker processes on the standard library's event loop " \
               "(2 asked for; BUSBAR_LOOP=asyncio)" in gw.proc.stderr.read().decode()
    finally:
        stop(gw.proc)


def test_stdlib_loop_sigint_exits_zero(mock_port, tmp_path):
    gw = start_gateway(tmp_path, _config(free_port(), mock_port, ["m1"]),
                       extra_env=dict(env(), BUSBAR_LOOP="asyncio", ADMIN_TOKEN="t" * 32))
    try:
        assert _chat(gw.port, "m1")[0] == 200
        gw.proc.send_signal(signal.SIGINT)
        assert gw.proc.wait(15) == 0
    finally:
        stop(gw.proc)


def _listening_inodes(port):
    """Inodes of the LISTEN sockets on 127.0.0.1:port (/proc/net/tcp: state 0A)."""
    want = "0100007F:%04X" % port
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {r[9] for r in rows if r[1] == want and r[3] == "0A"}


def _socket_inodes(pid):
    out = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _established_to(port):
    """Inodes of the established sockets whose local end is 127.0.0.1:port (the server side)."""
    want = "0100007F:%04X" % port
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {r[9] for r in rows if r[1] == want and r[3] == "01"}


@pytest.mark.parametrize("listener", ["inherit", "reuseport"])
def test_workers_share_the_port(mock_port, tmp_path, listener):
    """inherit: one listening socket, bound before the fork, held by both workers (no SO_REUSEPORT
    group); reuseport: one per worker. Either way both workers accept connections."""
    gw = start_gateway(tmp_path, _config(free_port(), mock_port, ["m1"]), workers=2,
                       extra_env=dict(env(), BUSBAR_LISTENER=listener, ADMIN_TOKEN="t" * 32))
    try:
        assert _until(lambda: len(_children(gw.proc.pid)) == 1)
        workers = [gw.proc.pid] + _children(gw.proc.pid)
        listening = _listening_inodes(gw.port)
        assert len(listening) == (1 if listener == "inherit" else 2)
        if listener == "inherit":
            assert all(listening <= _socket_inodes(w) for w in workers)
        # Connections held open until each worker has accepted some (the kernel decides who).
        held, served = [], {w: 0 for w in workers}
        try:
            for _ in range(200):
                c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
                c.request("GET", "/healthz")
                assert c.getresponse().read() is not None
                held.append(c)
                mine = _established_to(gw.port)
                served = {w: len(mine & _socket_inodes(w)) for w in workers}
                if all(served.values()):
                    break
            assert all(served.values()), served
        finally:
            for c in held:
                c.close()
        assert _chat(gw.port, "m1")[0] == 200
    finally:
        stop(gw.proc)
