"""`per_request_fee`: a flat charge in cents per request, counted in every group budget beside the
tokens at the rate card, refunded when the answer is not a 2xx. Through the real server, with the
memory store and with the valkey store (a real redis-server)."""
from __future__ import annotations

import json
import time

import pytest

from tests.conftest import stop
from tests.integration.gov_helpers import post, start

# No rate card: tokens price at 0 and the budget counts the fee alone (the Rust grammar's "absent
# = budgets count only the flat fee"). 3 cents a request under a 10-cent budget: three requests.
FEE = """
per_request_fee: 3
groups:
  team: {limits: [{budget: 10, per: month}]}
"""


def _chat(g, token, text="hi"):
    s, data, _ = post(g, "/v1/chat/completions", {"model": "oai-model", "max_tokens": 5,
                      "messages": [{"role": "user", "content": text}]},
                      {"authorization": "Bearer " + token})
    return s, json.loads(data)


def _run(g):
    token = g.admin.mint(name="fee", group="team")["token"]
    assert _chat(g, token)[0] == 200                  # 3
    assert _chat(g, token)[0] == 200                  # 6
    # a refused upstream answer pays no fee
    assert _chat(g, token, "hi #mock:status=400")[0] == 400
    # Valkey and Postgres settle behind the answer (one write per batch, in the background), as
    # the Rust stores do: the refund is in the store a moment later
    time.sleep(0.5)
    assert _chat(g, token)[0] == 200                  # 9
    s, body = _chat(g, token)                         # 12 > 10: the budget's refusal
    assert s == 429 and body["error"]["code"] == "insufficient_quota", body
    assert "group 'team'" in body["error"]["message"]


def test_the_fee_counts_in_a_group_budget(tmp_path, mock_port):
    g = start(tmp_path, mock_port, FEE + "store: {module: memory}\n")
    try:
        _run(g)
    finally:
        stop(g.proc)


def test_the_fee_counts_in_a_group_budget_in_valkey(tmp_path, mock_port):
    from tests.redis_server import RedisServer, redis_server_path
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed (make redis)")
    srv = RedisServer().start()
    try:
        g = start(tmp_path, mock_port, FEE + "store: {module: valkey, settings: {url: %s}}\n"
                  % srv.url, workers=2)
        try:
            _run(g)
        finally:
            stop(g.proc)
    finally:
        srv.stop()


def test_a_negative_fee_is_refused(tmp_path, mock_port):
    from busbar.config import ConfigError, load
    from tests.conftest import CONFIG, free_port
    with pytest.raises(ConfigError) as info:
        load(text=CONFIG.format(port=0, mock=mock_port, dead=free_port()) + "per_request_fee: -1\n",
             env={"MOCK_KEY": "k", "MOCK_AWS": "a:b"})
    assert any(p.startswith("per_request_fee: expected a non-negative integer")
               for p in info.value.problems), info.value.problems


def test_the_fee_counts_in_a_group_budget_in_postgres(tmp_path, mock_port):
    from tests.busbar.governance.conftest import _need_postgres
    from tests.postgres_server import PostgresServer
    _need_postgres()
    srv = PostgresServer().start()
    try:
        g = start(tmp_path, mock_port, FEE + "store: {module: postgres, settings: {url: %s}}\n"
                  % srv.url, workers=2)
        try:
            _run(g)
        finally:
            stop(g.proc)
    finally:
        srv.close()
