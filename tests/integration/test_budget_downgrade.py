"""A pool-scoped budget with `on_exhaust: downgrade, downgrade_to: <pool>`: once it is spent, the
pool's requests are re-admitted and served through the downgrade pool (its own limits, its
charges) instead of refused; the key's pool ACL holds on the hop; the downgrade pool's own
exhaustion is the plain refusal. Through the real server, memory and valkey stores."""
from __future__ import annotations

import json

import pytest

from tests.conftest import stop
from tests.integration.gov_helpers import post

# 1 cent a request and no rate card: each budget admits exactly its amount in requests.
# frontier is the Anthropic lane, value the OpenAI one: the upstream's answer says which served.
DOWNGRADE = """
  frontier: {members: [{model: ant-model}]}
  value: {members: [{model: oai-model}]}
per_request_fee: 1
groups:
  team:
    limits:
      - {budget: 2, per: month, pool: frontier, on_exhaust: downgrade, downgrade_to: value}
      - {budget: 2, per: month, pool: value}
"""


def _chat(g, token, model="frontier"):
    s, data, _ = post(g, "/v1/chat/completions", {"model": model, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]},
                      {"authorization": "Bearer " + token})
    return s, json.loads(data)


def _gateway(tmp_path, mock_port, store, workers=1):
    # the pools go under the CONFIG's own `pools:` (its last section before limits)
    from tests.conftest import CONFIG, free_port, start_gateway
    from tests.integration.gov_helpers import GOV, Admin, gov_env
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port())
    head, sep, tail = text.partition("pools:\n")
    first, _, rest = DOWNGRADE.lstrip("\n").partition("per_request_fee")
    text = head + sep + first + tail + "per_request_fee" + rest + GOV.format(admin=admin) + store
    g = start_gateway(tmp_path, text, workers, gov_env())
    g.admin = Admin(admin)
    return g


def _run(g):
    token = g.admin.mint(name="dg", group="team")["token"]
    lanes = []
    for _ in range(4):
        s, body = _chat(g, token)
        assert s == 200, body
        lanes.append(body["model"])
    # two through frontier (Anthropic's model answered), then its budget is spent: two through
    # value (OpenAI's), whose own budget is then spent too: the plain refusal, naming the group
    assert lanes[:2] == ["claude-haiku-4-5"] * 2 and lanes[2:] == ["gpt-4o-mini"] * 2, lanes
    s, body = _chat(g, token)
    assert s == 429 and body["error"]["code"] == "insufficient_quota", body
    assert "group 'team'" in body["error"]["message"]
    # the charges landed on value's budget: a request to value itself is refused as well
    assert _chat(g, token, "value")[0] == 429
    # a key that may not use value is not downgraded into it: frontier's plain refusal
    token2 = g.admin.mint(name="acl", group="team", allowed_pools=["frontier"])["token"]
    s, body = _chat(g, token2)
    assert s == 429 and body["error"]["code"] == "insufficient_quota", body


def test_an_exhausted_budget_downgrades_to_its_pool(tmp_path, mock_port):
    g = _gateway(tmp_path, mock_port, "store: {module: memory}\n")
    try:
        _run(g)
    finally:
        stop(g.proc)


def test_an_exhausted_budget_downgrades_to_its_pool_in_valkey(tmp_path, mock_port):
    from tests.redis_server import RedisServer, redis_server_path
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed (make redis)")
    srv = RedisServer().start()
    try:
        g = _gateway(tmp_path, mock_port, "store: {module: valkey, settings: {url: %s}}\n"
                     % srv.url, workers=2)
        try:
            _run(g)
        finally:
            stop(g.proc)
    finally:
        srv.stop()


def test_downgrade_is_checked_at_the_door():
    from busbar.config import ConfigError, load
    base = """
providers:
  p: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}
models:
  m: {provider: p}
  n: {provider: p}
pools:
  a: {members: [{model: m}]}
  b: {members: [{model: n}]}
groups:
  g:
    limits:
"""
    cases = {
        "{budget: 5, per: day, pool: a, on_exhaust: downgrade}":
            "groups.g.limits[0].downgrade_to: on_exhaust: downgrade needs the pool to downgrade to",
        "{budget: 5, per: day, on_exhaust: downgrade, downgrade_to: b}":
            "groups.g.limits[0].pool: on_exhaust: downgrade needs the budget scoped to a pool",
        "{budget: 5, per: day, pool: a, on_exhaust: downgrade, downgrade_to: a}":
            "groups.g.limits[0].downgrade_to: must name another pool than pool: a",
        "{budget: 5, per: day, pool: a, on_exhaust: downgrade, downgrade_to: m}":
            "groups.g.limits[0].downgrade_to: unknown pool 'm'",
        "{requests: 5, per: day, pool: a, on_exhaust: downgrade, downgrade_to: b}":
            "groups.g.limits[0].on_exhaust: only a budget has one",
        "{budget: 5, per: day, pool: a, downgrade_to: b}":
            "groups.g.limits[0].downgrade_to: needs on_exhaust: downgrade",
    }
    for limit, want in cases.items():
        with pytest.raises(ConfigError) as info:
            load(text=base + "      - " + limit + "\n", env={"K": "k"})
        assert any(p.startswith(want) for p in info.value.problems), (limit, info.value.problems)
    ok = load(text=base + "      - {budget: 5, per: day, pool: a, on_exhaust: downgrade, "
              "downgrade_to: b}\n", env={"K": "k"})
    lim = ok.governance.groups["g"].limits[0]
    assert (lim.pool, lim.downgrade_to) == ("a", "b")
    assert lim.public() == {"budget": 5, "per": "day", "pool": "a", "on_exhaust": "downgrade",
                            "downgrade_to": "b"}


def test_an_exhausted_budget_downgrades_to_its_pool_in_postgres(tmp_path, mock_port):
    from tests.busbar.governance.conftest import _need_postgres
    from tests.postgres_server import PostgresServer
    _need_postgres()
    srv = PostgresServer().start()
    try:
        g = _gateway(tmp_path, mock_port, "store: {module: postgres, settings: {url: %s}}\n"
                     % srv.url, workers=2)
        try:
            _run(g)
        finally:
            stop(g.proc)
    finally:
        srv.close()
