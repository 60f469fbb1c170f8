"""A fleet sharing one real redis-server (issue 10): two gateway processes, each with two
workers, enforce one rate limit and one budget exactly; a key minted on one instance works on the
other, and a revoke on one holds on the other within a second; with Redis stopped, fail_mode closed
refuses in the caller's own shape and serving resumes when Redis is back; the admin API says the
store is unreachable (503, the reason, no traceback) instead of failing inside."""
from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.busbar.governance.conftest import _need_redis
from tests.conftest import free_port, start_gateway, stop, wait_http
from tests.redis_server import RedisServer
from tests.integration.gov_helpers import ADMIN, Admin, gov_config, gov_env, post, start, wait_usage
from tests.integration.test_governance import CARD

TAIL = """
groups:
  rl:    {limits: [{requests: 20, per: minute}]}
  money: {limits: [{budget: 10, per: day}]}
store: {module: valkey, settings: {url: {env: BB_REDIS}, fail_mode: closed}}
""" + CARD


def chat(gw, token, max_tokens=None):
    body = {"model": "oai-model", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return post(gw, "/v1/chat/completions", body, {"authorization": "Bearer " + token})


@pytest.fixture
def fleet(mock_port, tmp_path):
    _need_redis()
    # persisted (saved on stop, loaded on start), as a production Redis is: keys outlive a restart
    own_redis = RedisServer(persist=True).start()
    env = {"BB_REDIS": own_redis.url}
    a = start(tmp_path, mock_port, TAIL, workers=2, extra_env=env)
    try:
        b = start(tmp_path, mock_port, TAIL, workers=2, extra_env=env)
    except Exception:
        stop(a.proc)
        raise
    yield a, b, own_redis
    stop(a.proc)
    stop(b.proc)
    own_redis.close()


def _spread(gws, n, fn):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: fn(gws[i % len(gws)]), range(n)))


def _within_one_minute(secs):
    """Waits for the next UTC minute when fewer than `secs` seconds are left in this one: the `rl`
    group's limit counts per calendar minute (governance/model.py `window`), so a test that spends
    it and then expects a 429 must not straddle the roll (it failed so, once, in `make test`)."""
    left = 60 - time.time() % 60
    if left < secs:
        time.sleep(left + 0.05)


def test_fleet_limits_are_exact(fleet):
    a, b, _ = fleet
    _within_one_minute(15)
    k = a.admin.mint(name="rl", group="rl")["token"]
    assert chat(b, k)[0] == 200                  # minted on a, known to b
    out = _spread([a, b], 60, lambda g: chat(g, k)[0])
    assert out.count(200) == 19 and out.count(429) == 41
    m = b.admin.mint(name="money", group="money")
    out = _spread([a, b], 50, lambda g: chat(g, m["token"], max_tokens=10)[0])
    ok = out.count(200)
    assert 1 <= ok <= 10 and out.count(429) == 50 - ok
    more = 0
    while chat(a if more % 2 else b, m["token"], max_tokens=10)[0] == 200:
        more += 1
        assert more <= 10
    assert ok + more == 10
    u = wait_usage(a.admin, "/keys/%s/usage" % m["id"], lambda d: d["requests"] >= 10)
    assert u["requests"] == 10 and u["spend_cents"] == 10


def test_revoke_on_one_instance_holds_on_the_other(fleet):
    a, b, _ = fleet
    k = a.admin.mint(name="r")
    assert chat(b, k["token"])[0] == 200
    assert b.admin.call("POST", "/keys/%s/revoke" % k["id"])[0] == 200
    deadline = time.monotonic() + 1.0
    while chat(a, k["token"])[0] != 401:
        assert time.monotonic() < deadline, "the revoke did not reach the other instance in 1 s"
        time.sleep(0.05)
    assert {chat(g, k["token"])[0] for g in (a, b) for _ in range(4)} == {401}
    # one audit chain in the valkey layout (busbar:audit, the records' JSON scored by seq): the
    # mint on one instance, the revoke on the other chained after it, read from either
    import redis as redis_py
    r = redis_py.Redis.from_url(fleet[2].url)
    deadline = time.monotonic() + 2
    while r.zcard("busbar:audit") < 2:
        assert time.monotonic() < deadline, r.zrange("busbar:audit", 0, -1)
        time.sleep(0.05)
    rows = [json.loads(m) for m, _ in r.zrange("busbar:audit", 0, -1, withscores=True)]
    r.close()
    assert [(x["action"], x["resource"], x["seq"]) for x in rows] == [
        ("key.create", "key:" + k["id"], 1), ("key.revoke", "key:" + k["id"], 2)]
    assert rows[1]["prev_hash"] == rows[0]["hash"]
    assert list(rows[0]) == ["seq", "ts", "action", "resource", "outcome", "principal",
                             "prev_hash", "hash"]
    s, d = a.admin.call("GET", "/audit?resource=key:" + k["id"])
    assert s == 200 and [e["action"] for e in d["items"]] == ["key.revoke", "key.create"]


def test_fail_closed_then_recovers(fleet):
    a, b, redis = fleet
    k = a.admin.mint(name="fc", group="rl")["token"]
    assert chat(a, k)[0] == 200 and chat(b, k)[0] == 200
    redis.stop()
    try:
        s, body, h = chat(a, k)
        assert s == 503 and json.loads(body)["error"]["type"] == "server_error"
        s, body, h = post(b, "/v1/messages", {"model": "ant-model", "max_tokens": 5, "messages": [
            {"role": "user", "content": "hi"}]}, {"x-api-key": k, "anthropic-version": "2023-06-01"})
        assert s in (503, 529) and json.loads(body)["error"]["type"] == "overloaded_error"
    finally:
        redis.start()
    deadline = time.monotonic() + 5
    while chat(a, k)[0] != 200:
        assert time.monotonic() < deadline, "serving did not resume after Redis came back"
        time.sleep(0.2)


def test_fail_open_admits_counts_locally_and_reconciles(mock_port, tmp_path):
    _need_redis()
    redis = RedisServer(persist=True).start()
    g = start(tmp_path, mock_port, TAIL.replace("fail_mode: closed", "fail_mode: open"), workers=1,
              extra_env={"BB_REDIS": redis.url})
    try:
        _within_one_minute(25)      # the outage and the reconciliation below take up to ~10 s
        k = g.admin.mint(name="open", group="rl")
        assert chat(g, k["token"])[0] == 200           # the key is now cached in the worker
        time.sleep(0.3)                                  # its settlement written to Redis
        redis.stop()
        # Redis gone: admitted on local counts, and the local count still holds the limit
        codes = [chat(g, k["token"])[0] for _ in range(25)]
        assert codes.count(200) == 19 and set(codes) == {200, 429}
        redis.start()
        # back: the local counts are pushed to Redis, so the fleet's count includes them
        deadline = time.monotonic() + 5
        while True:
            u = wait_usage(g.admin, "/keys/%s/usage" % k["id"], lambda d: True)
            if u.get("requests") == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert u.get("requests") == 20, u
        assert chat(g, k["token"])[0] == 429            # 20 per minute, used up across the outage
    finally:
        stop(g.proc)
        redis.close()


def _get(port, path, token=ADMIN):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers={"authorization": "Bearer " + token})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def test_admin_calls_with_redis_down_are_503_with_the_reason(mock_port, tmp_path):
    _need_redis()
    redis = RedisServer().start()
    text, admin = gov_config(mock_port, TAIL)
    port = free_port()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as fh:
        proc = start_gateway(tmp_path, text.replace("{port}", str(port)), port=port,
                             extra_env=gov_env({"BB_REDIS": redis.url}), stderr=fh,
                             ready=lambda p, pr: (wait_http(p, pr), wait_http(admin, pr))).proc
    try:
        a = Admin(admin)
        a.mint(name="before", group="money")
        assert _get(admin, "/healthz") == (200, b"ok")
        redis.stop()
        why = "the governance store is unreachable: redis at %s: " % redis.url
        for method, path, body in (("POST", "/keys", {"name": "during"}), ("GET", "/keys", None),
                                   ("GET", "/groups/money/usage", None)):
            status, out = a.call(method, path, body)
            assert status == 503, (path, out)
            assert out["error"]["code"] == "unavailable" and out["error"]["message"].startswith(why)
        status, text = _get(admin, "/healthz")
        assert status == 503 and text.decode().startswith(why)
        # the status page still renders; its spend table says why it is empty
        status, text = _get(admin, "/status.json")
        page = json.loads(text)
        assert status == 200 and page["spend_by_group"] is None
        assert page["spend_off"].startswith(why)
        redis.start()
        deadline = time.monotonic() + 5
        while a.call("POST", "/keys", {"name": "after"})[0] != 201:
            assert time.monotonic() < deadline, "minting did not resume after Redis came back"
            time.sleep(0.2)
        assert _get(admin, "/healthz") == (200, b"ok")
    finally:
        stop(proc)
        redis.close()
    err = log.read_text()
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
