"""The gateway as a process: `busbar validate`, `--workers N` with SO_REUSEPORT, SIGTERM draining
in-flight requests then exiting 0, `--version`."""
import http.client
import json
import os
import signal
import subprocess
import threading
import time

from tests.conftest import CONFIG, PY, ROOT, env, free_port, stop, start_gateway


def _cli(*args, **kw):
    return subprocess.run([PY, "-m", "busbar.cli", *args], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=60, **kw)


def test_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("busbar ")


def test_validate_ok_and_bad(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(CONFIG.format(port=8080, mock=9, dead=10))
    r = _cli("validate", "--config", str(good))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: config valid") and "7 provider(s), 8 model(s), 2 pool(s)" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.format(port=8080, mock=9, dead=10).replace("max_concurrent: 1", "max_concurent: 1")
                   .replace("api_key: {env: MOCK_KEY}}", "api_key: sk-inline}", 1))
    r = _cli("validate", "--config", str(bad))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert any("models.one-slot.max_concurent" in l and "max_concurrent" in l for l in lines), lines
    assert any("providers.m-openai.api_key" in l for l in lines), lines
    assert "sk-inline" not in r.stderr  # a secret is never printed, even a misplaced one


def _post(port, text, model="oai-model", timeout=20):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": text}]}),
            {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _start(mock_port, tmp_path, workers):
    port = free_port()
    gw = start_gateway(tmp_path, CONFIG.format(port=port, mock=mock_port, dead=free_port()), workers,
                       port=port, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return port, gw.proc


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_workers_share_the_port_and_all_exit_on_sigterm(mock_port, tmp_path):
    port, proc = _start(mock_port, tmp_path, 2)
    try:
        kids = _children(proc.pid)
        assert len(kids) == 1  # the parent serves too
        for i in range(20):
            assert _post(port, "w%d" % i)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        for k in kids:
            assert not os.path.exists("/proc/%d" % k) or open("/proc/%d/stat" % k).read().split()[2] == "Z"
    finally:
        stop(proc)


def test_sigterm_drains_in_flight_then_exits_zero(mock_port, tmp_path):
    port, proc = _start(mock_port, tmp_path, 1)
    result = {}

    def slow():
        result["r"] = _post(port, "slow #mock:delay_ms=1500")

    t = threading.Thread(target=slow)
    try:
        t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        t.join(15)
        status, body = result["r"]
        assert status == 200 and b"slow" in body
        assert proc.wait(15) == 0
    finally:
        stop(proc)
