"""Breaker cells for lanes and pools added by a live config change (issue 8), with `--workers 2`
through the admin API: the parent assigns the new cells' shared slots and sends them with the
swap, so a lane one worker trips is open in the other, and /stats answers the same from both."""
import http.client
import json

import yaml

from tests.conftest import stop
from tests.hostile import HostileUpstream, http_response, openai_body
from tests.integration.test_admin import A, call, start


def _down(c, req):
    c.sendall(http_response(500, b'{"error":{"message":"down","type":"server_error"}}'))


def _fine(c, req):
    c.sendall(http_response(200, openai_body("fine")))


def _ask(port, model):
    # A fresh connection per request: SO_REUSEPORT spreads them over both workers.
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/v1/chat/completions",
              json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
              {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def _cell(port, pool, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/stats")
    stats = json.loads(c.getresponse().read())
    c.close()
    for x in stats["lanes"]:
        if x["pool"] == pool and x["model"] == model:
            return (x["breaker_state"], x["trips"], x["err"], x["ok"])
    return None


def test_cells_of_a_pool_added_by_apply_are_shared_by_both_workers(tmp_path, mock_port):
    up = HostileUpstream({"newbad": _down, "newgood": _fine})
    g = start(tmp_path, mock_port, workers=2)
    try:
        doc = yaml.safe_load(g.path.read_text())
        doc["providers"]["h"] = {"protocol": "openai", "base_url": up.url,
                                 "api_key": {"env": "MOCK_KEY"}}
        doc["models"]["nb"] = {"provider": "h", "upstream_model": "newbad"}
        doc["models"]["ng"] = {"provider": "h", "upstream_model": "newgood"}
        doc["pools"]["q"] = {"members": [{"model": "nb", "weight": 100}, {"model": "ng"}],
                             "breaker": {"trip": {"mode": "consecutive", "consecutive_n": 1},
                                         "base_cooldown_secs": 60, "max_cooldown_secs": 120}}
        st, body = call(g.admin, "POST", A("config/apply"), {"config": doc})
        assert st == 200 and body["workers"] == 2, body
        # Forty requests over fresh connections, so both workers serve them: the failing member
        # is tried once in the whole gateway, then its (q, nb) cell is open in both workers.
        assert [_ask(g.port, "q") for _ in range(40)] == [200] * 40
        assert up.count("newbad") == 1
        views = {_cell(g.port, "q", "nb") for _ in range(16)}
        assert len(views) == 1, views           # every answer, whichever worker gave it
        state, trips, err, ok = views.pop()
        assert (state, trips, err) == ("open", 1, 1)
        assert {_cell(g.port, "q", "ng")[3] for _ in range(8)} == {40}

        # A second apply that drops the pool and adds another over the same lanes: fresh cells
        # (closed), and the lane's direct cell untouched by the pool's trip.
        del doc["pools"]["q"]
        doc["pools"]["r"] = {"members": [{"model": "nb"}, {"model": "ng"}],
                             "breaker": {"trip": {"mode": "consecutive", "consecutive_n": 1},
                                         "base_cooldown_secs": 60, "max_cooldown_secs": 120}}
        st, body = call(g.admin, "POST", A("config/apply"), {"config": doc})
        assert st == 200, body
        assert {_cell(g.port, "r", "nb") for _ in range(8)} == {("closed", 0, 0, 0)}
        assert _cell(g.port, "q", "nb") is None
        assert [_ask(g.port, "r") for _ in range(20)] == [200] * 20
        assert up.count("newbad") == 2
        assert {_cell(g.port, "r", "nb")[:3] for _ in range(8)} == {("open", 1, 1)}
        assert {_cell(g.port, "", "nb")[:3] for _ in range(8)} == {("closed", 0, 0)}
    finally:
        stop(g.proc)
        up.close()
