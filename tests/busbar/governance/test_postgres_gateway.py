"""A fleet sharing one real PostgreSQL (issue 37): two gateway processes, each with two workers,
on one database enforce one rate limit and one budget exactly under concurrent load; keys minted
over the admin API are rows of the Rust schema's `keys` table; a key minted on one instance works
on the other, and a revoke on one holds on the other within a second; with the database stopped,
data calls are refused in the caller's own shape and admin calls say the store is unreachable
(503, the reason, no password, no traceback), and serving resumes when it is back."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.busbar.governance.conftest import _need_postgres
from tests.conftest import stop
from tests.integration.gov_helpers import post, start, wait_usage
from tests.integration.test_governance import CARD

TAIL = """
groups:
  rl:    {limits: [{requests: 10, per: minute}]}
  money: {limits: [{budget: 10, per: day}]}
  pair:  {limits: [{concurrent: 2}]}
store: {module: postgres, settings: {url: {env: BB_POSTGRES}}}
""" + CARD


def chat(gw, token, max_tokens=None):
    body = {"model": "oai-model", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return post(gw, "/v1/chat/completions", body, {"authorization": "Bearer " + token})


def sql(url, query, *args):
    """Rows of one statement, read with a connection of the test's own."""
    import asyncpg

    async def go():
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()
    return asyncio.run(go())


@pytest.fixture
def fleet(mock_port, tmp_path, postgres_server):
    _need_postgres()
    url = postgres_server.create_database("fleet_" + uuid.uuid4().hex[:8])
    env = {"BB_POSTGRES": url}
    a = start(tmp_path, mock_port, TAIL, workers=2, extra_env=env)
    try:
        b = start(tmp_path, mock_port, TAIL, workers=2, extra_env=env)
    except Exception:
        stop(a.proc)
        raise
    yield a, b, url
    stop(a.proc)
    stop(b.proc)


def _spread(gws, n, fn):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: fn(gws[i % len(gws)]), range(n)))


def _within_one_minute(secs):
    """The `rl` limit counts per calendar minute: a test that spends it and expects the 429 after
    must not straddle the roll."""
    left = 60 - time.time() % 60
    if left < secs:
        time.sleep(left + 0.05)


def test_fleet_limits_are_exact(fleet):
    a, b, url = fleet
    _within_one_minute(20)
    k = a.admin.mint(name="rl", group="rl")
    # minted over the admin API: a row of the Rust schema, read by the other instance
    row = sql(url, "SELECT name, key_group, enabled, generation_hash, deleted_at FROM keys "
                   "WHERE id = $1", k["id"])
    assert len(row) == 1 and tuple(row[0][:3]) == ("rl", "rl", True)
    assert row[0][3].startswith("binding:%s:" % k["id"]) and row[0][4] is None
    # 2 instances x 2 workers, 40 concurrent calls against 10 per minute: exactly 10
    out = _spread([a, b], 40, lambda g: chat(g, k["token"])[0])
    assert out.count(200) == 10 and out.count(429) == 30, out
    assert chat(b, k["token"])[0] == 429
    m = b.admin.mint(name="money", group="money")
    out = _spread([a, b], 40, lambda g: chat(g, m["token"], max_tokens=10)[0])
    ok = out.count(200)
    assert 1 <= ok <= 10 and out.count(429) == 40 - ok
    more = 0
    while chat(a if more % 2 else b, m["token"], max_tokens=10)[0] == 200:
        more += 1
        assert more <= 10
    assert ok + more == 10                      # never more than the budget, to the cent
    u = wait_usage(a.admin, "/keys/%s/usage" % m["id"], lambda d: d["requests"] >= 10)
    assert u["requests"] == 10 and u["spend_cents"] == 10
    # the ledger as the Rust store keeps it: requests and tokens of the group's bucket
    day = int(time.time()) // 86400 * 86400
    (head,) = sql(url, "SELECT requests FROM usage_windows WHERE bucket_id = 'group:money@day' "
                       "AND window_start = $1", day)
    assert head[0] == 10                        # admitted ones only: a refusal charges nothing
    time.sleep(0.3)
    (res,) = sql(url, "SELECT reserved FROM busbar_inflight WHERE bucket_id = 'group:money@day' "
                      "AND window_start = $1", day)
    assert res[0] == 0                          # every reservation given back at settlement


def test_concurrent_limit_across_instances(fleet):
    """`concurrent: 2` over both instances: the slow mock holds each call, so of 8 at once
    exactly 2 run, and the slots come back when they end."""
    a, b, _ = fleet
    k = a.admin.mint(name="pair", group="pair")["token"]
    body = {"model": "oai-model", "messages": [{"role": "user",
                                                  "content": "slow #mock:delay_ms=800"}]}
    out = _spread([a, b], 8, lambda g: post(g, "/v1/chat/completions", body,
                                            {"authorization": "Bearer " + k})[0])
    assert out.count(200) == 2 and out.count(429) == 6, out
    # the slots come back with the settlements (written in the background, within milliseconds)
    time.sleep(0.2)
    assert _spread([a, b], 2, lambda g: chat(g, k)[0]) == [200, 200]


def test_revoke_on_one_instance_holds_on_the_other(fleet):
    a, b, url = fleet
    k = a.admin.mint(name="r")
    assert chat(b, k["token"])[0] == 200
    assert b.admin.call("POST", "/keys/%s/revoke" % k["id"])[0] == 200
    deadline = time.monotonic() + 1.0
    while chat(a, k["token"])[0] != 401:
        assert time.monotonic() < deadline, "the revoke did not reach the other instance in 1 s"
        time.sleep(0.05)
    assert {chat(g, k["token"])[0] for g in (a, b) for _ in range(4)} == {401}
    assert [tuple(r) for r in sql(url, "SELECT sub, reason FROM denylist")] == [
        (k["id"], "revoked")]
    # one audit chain in the shared store: the mint on one instance, the revoke on the other
    # chained after it; either instance reads both from the audit_log table
    rows = sql(url, "SELECT seq, action, resource, prev_hash, hash FROM audit_log ORDER BY seq")
    assert [(r[1], r[2]) for r in rows] == [("key.create", "key:" + k["id"]),
                                            ("key.revoke", "key:" + k["id"])]
    assert rows[1][3] == rows[0][4] and rows[1][0] == rows[0][0] + 1
    s, d = a.admin.call("GET", "/audit?resource=key:" + k["id"])
    assert s == 200 and [e["action"] for e in d["items"]] == ["key.revoke", "key.create"]


def test_database_down_refuses_then_recovers(fleet, postgres_server):
    a, b, url = fleet
    k = a.admin.mint(name="fc", group="rl")
    assert chat(a, k["token"])[0] == 200 and chat(b, k["token"])[0] == 200
    postgres_server.stop()
    try:
        s, body, _ = chat(a, k["token"])
        assert s == 503 and json.loads(body)["error"]["type"] == "server_error"
        s, body, _ = post(b, "/v1/messages", {"model": "ant-model", "max_tokens": 5, "messages": [
            {"role": "user", "content": "hi"}]},
            {"x-api-key": k["token"], "anthropic-version": "2023-06-01"})
        assert s in (503, 529) and json.loads(body)["error"]["type"] == "overloaded_error"
        status, out = a.admin.call("GET", "/keys")
        assert status == 503 and out["error"]["code"] == "unavailable"
        assert out["error"]["message"].startswith(
            "the governance store is unreachable: postgres at %s: " % url.split("?")[0])
    finally:
        postgres_server.start()
    deadline = time.monotonic() + 10
    while chat(a, k["token"])[0] != 200 or chat(b, k["token"])[0] != 200:
        assert time.monotonic() < deadline, "serving did not resume after the database came back"
        time.sleep(0.2)
    assert a.admin.call("GET", "/keys")[0] == 200


def test_sigv4_pair_minted_on_one_instance_signs_on_the_other(fleet):
    """The AWS pair issued with a key is a `credentials` row (kind sigv4): a boto3 client signing
    with it is served by the other instance, and revoking the key revokes the pair on both."""
    import boto3
    import botocore.exceptions
    from botocore.config import Config as BotoConfig
    a, b, url = fleet
    k = a.admin.mint(name="aws", issue_aws_credential=True)
    (row,) = sql(url, "SELECT kind, slot, public_id, secret_form, revoked_at FROM credentials "
                      "WHERE key_id = $1", k["id"])
    assert tuple(row) == ("sigv4", 0, k["aws_access_key_id"], "recoverable", None)

    def converse(gw):
        br = boto3.client("bedrock-runtime", endpoint_url=gw.url, region_name="us-east-1",
                          aws_access_key_id=k["aws_access_key_id"],
                          aws_secret_access_key=k["aws_secret_access_key"],
                          config=BotoConfig(retries={"max_attempts": 1}, read_timeout=20))
        return br.converse(modelId="bed-model",
                           messages=[{"role": "user", "content": [{"text": "hi"}]}])
    assert converse(b)["output"]["message"]["content"][0]["text"].startswith("mock: hi")
    assert b.admin.call("POST", "/keys/%s/revoke" % k["id"])[0] == 200
    deadline = time.monotonic() + 1.0
    while True:
        try:
            converse(a)
        except botocore.exceptions.ClientError as e:
            assert e.response["Error"]["Code"] == "AccessDeniedException"
            break
        assert time.monotonic() < deadline, "the revoke did not reach the other instance in 1 s"
        time.sleep(0.05)
    (row,) = sql(url, "SELECT revoked_at IS NOT NULL, revoke_reason FROM credentials "
                      "WHERE key_id = $1", k["id"])
    assert tuple(row) == (True, "revoked")
