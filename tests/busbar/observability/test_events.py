"""Operational events through the real server's stderr: `boot` with its listeners, and shedding at
the inbound concurrency cap as one WARNING when it starts and one INFO when it stops, however many
requests were refused; a lane whose provider refuses busbar's credentials as one WARNING per
lane and WARN_EVERY_SECS, and nothing for attempts that succeed; no prompt, completion or key in
any line. (The breaker's and reload's lines are checked in test_lane_series.py, the store's in
tests/busbar/governance/test_redis_store.py.)"""
from __future__ import annotations

import threading
import time

import pytest

from tests.busbar.observability.test_lane_series import chat, launch
from tests.hostile import HostileUpstream, http_response, openai_body

CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
auth: {{admin_auth: []}}
providers:
  h: {{protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {{env: MOCK_KEY}}}}
models:
  slow: {{provider: h, upstream_model: slow}}
  denied: {{provider: h, upstream_model: denied}}
  fine: {{provider: h, upstream_model: fine}}
limits:
  max_inbound_concurrent: 1
export: {{access: {{module: access-log, settings: {{path: "off"}}}}}}
"""


def _slow(c, req):
    time.sleep(1.0)
    c.sendall(http_response(200, openai_body("the secret completion text")))


def _denied(c, req):
    c.sendall(http_response(401, b'{"error":{"message":"Incorrect API key","type":"invalid"}}'))


def _fine(c, req):
    c.sendall(http_response(200, openai_body("the secret completion text")))


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"slow": _slow, "denied": _denied, "fine": _fine})
    yield h
    h.close()


def test_boot_and_one_shedding_line_per_burst(hostile, tmp_path):
    gw = launch(tmp_path, CONFIG % hostile.port, workers=1)
    try:
        boot = gw.events(" boot ")
        assert len(boot) == 1 and " INFO " in boot[0]
        assert "boot listen=127.0.0.1:%d admin_listen=127.0.0.1:%d tls=off workers=1 " % (
            gw.port, gw.admin) in boot[0]
        assert "config_version=" in boot[0]

        for burst in range(2):
            held = threading.Thread(target=chat, args=(gw.port, "slow"))
            held.start()                # takes the one inbound slot for a second
            time.sleep(0.3)
            codes = [chat(gw.port, "slow") for _ in range(15)]
            assert codes == [503] * 15
            held.join()
            # The burst ends SHED_QUIET_SECS (2 s) after its last refusal.
            deadline = time.monotonic() + 6
            while len(gw.events("shedding_stopped ")) < burst + 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            started = gw.events(" shedding ")
            stopped = gw.events("shedding_stopped ")
            assert len(started) == burst + 1 and len(stopped) == burst + 1, (started, stopped)
            assert " WARNING " in started[-1] and "max_inbound_concurrent=1 " in started[-1]
            assert " INFO " in stopped[-1] and " shed=15 " in stopped[-1]
        text = gw.err.read_text()
        assert "sk-test-key" not in text and "secret completion" not in text and '"hi"' not in text
    finally:
        from tests.conftest import stop
        stop(gw.proc)


def test_refused_credentials_warn_once_and_successes_say_nothing(hostile, tmp_path):
    gw = launch(tmp_path, CONFIG % hostile.port, workers=1)
    try:
        assert [chat(gw.port, "fine") for _ in range(5)] == [200] * 5
        # the provider refused busbar's key, not the caller's: the caller gets 503, not a 401
        assert [chat(gw.port, "denied") for _ in range(3)] == [503] * 3
        deadline = time.monotonic() + 5
        while not gw.events(" lane_failed "):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [chat(gw.port, "fine") for _ in range(5)] == [200] * 5
        time.sleep(0.3)
        lines = gw.events(" lane_failed ")
        assert len(lines) == 1, lines       # one per lane per WARN_EVERY_SECS, none for "fine"
        assert " WARNING " in lines[0] and "lane=denied " in lines[0] and "status=401 " in lines[0]
        assert "reason=" in lines[0] and "credentials" in lines[0]
        text = gw.err.read_text()
        assert "sk-test-key" not in text and "secret completion" not in text
    finally:
        from tests.conftest import stop
        stop(gw.proc)
