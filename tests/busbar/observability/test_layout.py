"""In-process: the parent's plans for a reload. Metric names keep their slots and new ones take
spares (past them a name is left out and said so); breaker cells of a new pool go where the plan
puts them in every worker, and a plan past the spare slots is refused. The governance gauges'
board: what the parent writes after the fork, a worker reads whole."""
from __future__ import annotations


from busbar import config as cfgmod
from busbar.observability import metrics as M

BASE = """
listen: "127.0.0.1:1"
providers:
  m: {provider_kw}
models:
  a: {{provider: m, upstream_model: a}}
  b: {{provider: m, upstream_model: b}}
{more}pools:
  p: {{members: [{{model: a}}, {{model: b}}]}}
{pools}"""


def load(more="", pools=""):
    text = BASE.format(provider_kw='{protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}',
                       more=more, pools=pools)
    return cfgmod.load(text=text, env={"K": "k" * 24})


def test_metric_names_keep_their_slots_and_new_ones_take_spares(monkeypatch):
    c1 = load()
    L = M.Layout(c1, 2)
    before = dict(L.pool_i), dict(L.pair_i), L.size
    c2 = load("  c: {provider: m, upstream_model: c}\n", "  q: {members: [{model: c}, {model: a}]}\n")
    plan = L.plan(c2)
    assert plan["left_out"] == []
    L.adopt(plan)
    assert all(L.pool_i[k] == v for k, v in before[0].items())
    assert all(L.pair_i[k] == v for k, v in before[1].items())
    assert {"q", "c"} <= set(L.pool_i) and ("q", "c") in L.pair_i and L.size == before[2]
    # A worker that adopts the same plan agrees slot for slot.
    other = M.Layout(c1, 2)
    other.adopt(plan)
    assert other.pool_i == L.pool_i and other.pair_i == L.pair_i
    # Past the spares: left out, counted as unresolved.
    monkeypatch.setattr(M, "SPARE_POOLS_MIN", 1)
    small = M.Layout(c1, 1)         # room for as many names again as the boot config's
    many = load("".join("  x%d: {provider: m, upstream_model: x}\n" % i for i in range(10)))
    plan = small.plan(many)
    assert len(plan["pools"]) == small.P and len(plan["left_out"]) == 10 - (small.P - 4)


# Breaker cells' blocks across a reload: tests/busbar/reliability/test_layout.py.


def test_the_governance_board_written_by_the_parent_is_read_by_a_forked_worker():
    import os
    board = M.GovBoard(1024)
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:        # the worker: reads what the parent writes after the fork
        try:
            os.read(go_r, 1)
            first = board.read()
            os.read(go_r, 1)
            os.write(out_w, (first + "|" + board.read()).encode())
        finally:
            os._exit(0)
    assert board.read() == ""
    board.write("busbar_key_spend_cents{key=\"a\"} 1\n")
    os.write(go_w, b"1")
    board.write("busbar_key_spend_cents{key=\"a\"} 2\n")     # the other half, then the live one
    os.write(go_w, b"2")
    got = os.read(out_r, 4096).decode()
    os.waitpid(pid, 0)
    first, second = got.split("|")
    assert second == "busbar_key_spend_cents{key=\"a\"} 2\n"
    assert first in (second, "busbar_key_spend_cents{key=\"a\"} 1\n")
    # Past its capacity a text is cut at a line's end, never mid-series.
    small = M.GovBoard(30)
    small.write("a 1\n" + "b" * 30 + " 2\n" + "c 3\n")
    assert small.read() == "a 1\n"
