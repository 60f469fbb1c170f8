"""Hooks through a sidecar (`module: busbar-webrequest-hook`, busbar/hooks/) through the real
server: the JSON wire both ways, what each grant lets a hook see, every reply arm, the reconcile of
gates that fire together, on_error and fallback chains when a sidecar is slow, dead or broken, and
taps that never hold an answer back. The sidecar is tests/sidecar.py; the lanes are the built-in
mock (its answer echoes the prompt it received) and the hostile upstream (what a lane received)."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.hostile import HostileUpstream, http_response, openai_body
from tests.sidecar import Sidecar

SECRET = "the-launch-code-is-1234"


@pytest.fixture
def sidecar():
    made = []

    def make(routes, delay=None):
        s = Sidecar(routes, delay)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def text(mock, hooks: str, pools: str, extra: str = "", up=None) -> str:
    return """\
listen: "127.0.0.1:{port}"
providers:
  m-openai: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: MOCK_KEY}}
  m-anthropic: {protocol: anthropic, base_url: "http://127.0.0.1:%d", api_key: {env: MOCK_KEY}}
  dead: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: MOCK_KEY}}
  up: {protocol: openai, base_url: "%s", api_key: {env: MOCK_KEY}}
models:
  oai: {provider: m-openai, upstream_model: gpt-4o-mini}
  ant: {provider: m-anthropic, upstream_model: claude-haiku-4-5}
  dead: {provider: dead, upstream_model: gpt-dead}
  up-a: {provider: up, upstream_model: up-a}
  up-b: {provider: up, upstream_model: up-b}
hooks:
%s
pools:
%s
%s""" % (mock, mock, free_port(), up.url if up is not None else "http://127.0.0.1:9", hooks,
         pools, extra)


def chat(g, model="p", content="hello", **kw):
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    body.update(kw)
    with httpx.Client(timeout=20) as c:
        return c.post(g.url + "/v1/chat/completions", json=body)


def hook(name, url, **fields):
    f = ", ".join("%s: %s" % (k, json.dumps(v)) for k, v in fields.items())
    return "  %s: {module: busbar-webrequest-hook, settings: {url: \"%s\"}%s}" % (
        name, url, (", " + f) if f else "")


def answering(upstream_models, fail=()):
    """A hostile upstream answering each model with an OpenAI body echoing its last message (and
    503 for `fail`); it keeps every request it received."""
    def fn(c, req):
        if req.model in fail:
            c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))
            return
        msg = json.loads(req.body)["messages"][-1]["content"]
        c.sendall(http_response(200, openai_body("echo: %s" % msg, model=req.model)))
    return HostileUpstream({m: fn for m in upstream_models})


# ---------------------------------------------------------------- the wire and the grants

def test_a_gate_sees_shapes_and_candidates_but_no_prompt_by_default(mock_port, inproc_gateway,
                                                                    sidecar):
    sc = sidecar({"/g": lambda m: {}})
    g = inproc_gateway(text(mock_port, hook("g", sc.url + "/g", timeout_ms=2000), """\
  p:
    hooks: [g]
    members: [{model: oai, tier: primary, tags: [eu, baa]}, {model: ant, weight: 3}]""", """\
rate_card:
  oai: {input_utok: 0.15, output_utok: 0.6}
  ant: {input_utok: 1, output_utok: 5}
  dead: {input_utok: 0, output_utok: 0}
  up-a: {input_utok: 0, output_utok: 0}
  up-b: {input_utok: 0, output_utok: 0}
"""))
    r = chat(g, content=SECRET, max_tokens=64, stream=False)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith(
        "mock: " + SECRET)
    [m] = sc.messages("/g")
    raw = sc.raw("/g")[0]
    assert SECRET.encode() not in raw
    assert list(m) == ["request", "candidates", "context", "op"] and m["op"] == "decide"
    req = m["request"]
    assert isinstance(req["request_id"], int)
    assert {k: v for k, v in req.items() if k != "request_id"} == {
        "pool": "p", "ingress_protocol": "openai", "message_count": 1, "has_tools": False,
        "total_chars": len(SECRET), "max_tokens": 64, "stream": False}
    c0, c1 = m["candidates"]
    assert c0["idx"] == 0 and c0["model"] == "oai" and c0["provider"] == "m-openai"
    assert c0["weight"] == 1 and c0["tier"] == "primary" and c0["tags"] == ["eu", "baa"]
    assert c0["cost_per_mtok"] == pytest.approx(0.375)
    assert c0["available_concurrency"] == (1 << 61) - 1
    # Absent, not null: the second member names no tier and no tags; no latency sample yet.
    assert c1["idx"] == 1 and c1["weight"] == 3 and "tier" not in c1 and "tags" not in c1
    assert "latency_ms" not in c1 and c1["cost_per_mtok"] == 3.0
    assert m["context"] == {}


def test_prompt_ro_sees_the_text_and_user_ro_the_end_user(mock_port, inproc_gateway, sidecar):
    sc = sidecar({"/ro": lambda m: {}, "/no": lambda m: {}})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("ro", sc.url + "/ro", timeout_ms=2000, prompt="ro", user="ro"),
        hook("shapes", sc.url + "/no", timeout_ms=2000, prompt=False)]), """\
  p: {hooks: [ro, shapes], members: [{model: oai}]}"""))
    body = {"model": "p", "user": "end-user-7",
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "first " + SECRET},
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "second"}]}
    with httpx.Client(timeout=20) as c:
        assert c.post(g.url + "/v1/chat/completions", json=body).status_code == 200
    [ro] = sc.messages("/ro")
    assert ro["request"]["system"] == "be brief"
    assert ro["request"]["messages"] == [
        {"role": "user", "text": "first " + SECRET}, {"role": "assistant", "text": "ok"},
        {"role": "user", "text": "second"}]
    assert ro["request"]["user"] == {"user": "end-user-7"}
    [no] = sc.messages("/no")
    assert "messages" not in no["request"] and "system" not in no["request"]
    assert "user" not in no["request"] and SECRET.encode() not in sc.raw("/no")[0]


# ---------------------------------------------------------------- reply arms

def test_reject_is_the_callers_native_error_with_the_gates_status(mock_port, inproc_gateway,
                                                                  sidecar):
    sc = sidecar({"/g": lambda m: {"reject": {"status": 451, "message": "blocked\u202e\n by policy"}},
                  "/bad": lambda m: {"reject": {"status": 200, "message": 7}}})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("g", sc.url + "/g", timeout_ms=2000), hook("bad", sc.url + "/bad", timeout_ms=2000)]),
        """\
  p: {hooks: [g], members: [{model: oai}]}
  q: {hooks: [bad], members: [{model: oai}]}"""))
    r = chat(g)
    assert r.status_code == 451
    assert r.json()["error"]["message"] == "blocked by policy"
    with httpx.Client(timeout=20) as c:
        r = c.post(g.url + "/v1/messages", json={"model": "p", "max_tokens": 10, "messages": [
            {"role": "user", "content": "hi"}]}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 451 and r.json()["type"] == "error"
    # A malformed reject is still a reject, with the defaults (403, the canned message).
    r = chat(g, model="q")
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "Request rejected by the routing policy."


def test_order_ranks_the_failover_walk(mock_port, inproc_gateway, sidecar):
    up = answering(["up-a", "up-b"], fail=("up-b",))
    try:
        sc = sidecar({"/g": lambda m: {"order": [1, 0, 99, 1]}})
        g = inproc_gateway(text(mock_port, hook("g", sc.url + "/g", timeout_ms=2000), """\
  p: {hooks: [g], members: [{model: up-a}, {model: up-b}]}""", up=up))
        r = chat(g)
        # up-b first (it fails), then up-a on the same call.
        assert r.status_code == 200 and r.json()["model"] == "up-a"
        assert [q.model for q in up.requests] == ["up-b", "up-a"]
    finally:
        up.close()


def test_restrict_holds_on_every_hop_and_on_empty_decides(mock_port, inproc_gateway, sidecar):
    up = answering(["up-a", "up-b"], fail=("up-a",))
    try:
        sc = sidecar({"/baa": lambda m: {"restrict": {"tags_any": ["baa"]}},
                      "/none": lambda m: {"restrict": {"tags_any": ["nowhere"]}},
                      "/junk": lambda m: {"restrict": "yes"}})
        g = inproc_gateway(text(mock_port, "\n".join([
            hook("baa", sc.url + "/baa", timeout_ms=2000),
            hook("none", sc.url + "/none", timeout_ms=2000),
            hook("soft", sc.url + "/none", timeout_ms=2000, on_empty="weighted"),
            hook("junk", sc.url + "/junk", timeout_ms=2000)]), """\
  p: {hooks: [baa], members: [{model: up-a, tags: [baa]}, {model: up-b}]}
  e: {hooks: [none], members: [{model: up-a, tags: [baa]}, {model: up-b}]}
  w: {hooks: [soft], members: [{model: up-b}]}
  j: {hooks: [junk], members: [{model: up-b, tags: [x]}]}""", up=up))
        # Only up-a carries the tag; it fails, and the restrict holds: no hop to up-b.
        r = chat(g)
        assert r.status_code in (502, 503) and up.count("up-b") == 0 and up.count("up-a") == 1
        r = chat(g, model="e")
        assert r.status_code == 503
        assert r.json()["error"]["message"] == (
            "No upstream satisfies a required gate's restriction. Please retry shortly.")
        r = chat(g, model="w")      # on_empty: weighted skips the restrict
        assert r.status_code == 200 and r.json()["model"] == "up-b"
        r = chat(g, model="j")      # a malformed restrict restricts to nothing (fail closed)
        assert r.status_code == 503
    finally:
        up.close()


def test_gates_fire_together_and_reconcile_by_priority(mock_port, inproc_gateway, sidecar):
    sc = sidecar({"/slow-order": lambda m: {"order": [1, 0]},
                  "/slow-restrict": lambda m: {"restrict": {"tags_any": ["keep"]}},
                  "/r1": lambda m: {"reject": {"status": 429, "message": "first"}},
                  "/r2": lambda m: {"reject": {"status": 451, "message": "second"}}},
                 delay={"/slow-order": 0.4, "/slow-restrict": 0.4})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("o", sc.url + "/slow-order", timeout_ms=3000),
        hook("k", sc.url + "/slow-restrict", timeout_ms=3000),
        hook("r1", sc.url + "/r1", timeout_ms=3000, priority=5),
        hook("r2", sc.url + "/r2", timeout_ms=3000, priority=1)]), """\
  p: {hooks: [o, k], members: [{model: oai, tags: [keep]}, {model: ant}]}
  r: {hooks: [r1, r2], members: [{model: oai}]}"""))
    t = time.monotonic()
    r = chat(g)
    took = time.monotonic() - t
    # Both waited 0.4 s, at once; the order named ant first, the restrict kept oai only.
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"
    assert took < 0.75, took
    # Both reject: the lower priority value reconciles first.
    r = chat(g, model="r")
    assert r.status_code == 451 and r.json()["error"]["message"] == "second"


def test_a_rw_gate_rewrites_before_routing_for_every_lane_and_hop(mock_port, inproc_gateway,
                                                                 sidecar):
    up = answering(["up-a", "up-b"], fail=("up-a",))
    try:
        def redact(m):
            return {"rewrite": {"messages": [
                {"role": x["role"], "content": x["text"].replace(SECRET, "[redacted]")}
                for x in m["request"]["messages"]]}}
        sc = sidecar({"/rw": redact, "/after": lambda m: {}, "/ro": redact})
        g = inproc_gateway(text(mock_port, "\n".join([
            hook("rw", sc.url + "/rw", timeout_ms=2000, prompt="rw"),
            hook("ro", sc.url + "/ro", timeout_ms=2000, prompt="ro"),
            hook("after", sc.url + "/after", timeout_ms=2000, prompt="ro")]), """\
  p: {hooks: [rw, after], members: [{model: up-a}, {model: up-b}]}
  q: {hooks: [ro], members: [{model: up-b}]}""", up=up))
        r = chat(g, content="say " + SECRET)
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "echo: say [redacted]"
        # Both lanes (the failed one and the failover) got the rewritten body; so did the next gate.
        assert [q.model for q in up.requests] == ["up-a", "up-b"]
        assert all(SECRET.encode() not in q.body for q in up.requests)
        [t] = sc.messages("/rw", op="transform")
        assert t["candidates"] == [] and t["request"]["messages"][0]["text"] == "say " + SECRET
        [after] = sc.messages("/after")
        assert after["request"]["messages"] == [{"role": "user", "text": "say [redacted]"}]
        # A gate without prompt: rw may not rewrite: its rewrite is dropped.
        r = chat(g, model="q", content="say " + SECRET)
        assert r.json()["choices"][0]["message"]["content"] == "echo: say " + SECRET
    finally:
        up.close()


# ---------------------------------------------------------------- a broken sidecar

def _dead_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d/g" % port


@pytest.mark.parametrize("on_error,status", [("nothing", 200), ("weighted", 200), ("reject", 503)])
def test_a_slow_or_dead_sidecar_follows_on_error(mock_port, inproc_gateway, sidecar, on_error,
                                                 status):
    sc = sidecar({"/slow": lambda m: {"reject": {}}}, delay={"/slow": 1.0})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("slow", sc.url + "/slow", timeout_ms=80, on_error=on_error),
        hook("dead", _dead_url(), timeout_ms=500, on_error=on_error)]), """\
  s: {hooks: [slow], members: [{model: oai}]}
  d: {hooks: [dead], members: [{model: oai}]}"""))
    t = time.monotonic()
    r = chat(g, model="s")
    assert time.monotonic() - t < 0.8         # cut at timeout_ms: the late reject is not seen
    assert r.status_code == status
    if status == 503:
        assert r.json()["error"]["message"] == "A required gate could not complete. Please retry shortly."
        assert r.headers["retry-after"] == "1"
    assert chat(g, model="d").status_code == status


@pytest.mark.parametrize("reply", [
    (500, b'{"reject": {}}'),                       # an error status, even with a reply body
    (200, b"not json"),
    (200, b'{"order": ' + b"[" * 2000 + b"]" * 2000 + b"}"),     # nesting past the parser's cap
    (200, b'{"order": [0], "pad": "' + b"x" * 70000 + b'"}'),     # over the 64 KiB reply cap
    (204, b""),                                     # an empty answer is an error, not an abstain
], ids=["status", "garbage", "deep", "oversized", "empty"])
def test_a_broken_reply_follows_on_error_and_never_reaches_the_caller(mock_port, inproc_gateway,
                                                                      sidecar, reply):
    sc = sidecar({"/g": lambda m: reply})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("strict", sc.url + "/g", timeout_ms=2000, on_error="reject"),
        hook("lax", sc.url + "/g", timeout_ms=2000)]), """\
  s: {hooks: [strict], members: [{model: oai}]}
  l: {hooks: [lax], members: [{model: oai}]}"""))
    assert chat(g, model="s").status_code == 503
    r = chat(g, model="l")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("mock: hello")


def test_on_error_first_and_fallback_chains(mock_port, inproc_gateway, sidecar):
    sc = sidecar({"/dead": lambda m: (500, b"{}"), "/fb": lambda m: {"order": [1, 0]}})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("firstly", sc.url + "/dead", timeout_ms=2000, on_error="first"),
        "  chain: {module: busbar-webrequest-hook, settings: {url: \"%s/dead\"}, timeout_ms: 2000, "
        "prompt: ro, on_error: {hook: also}}" % sc.url,
        "  also: {module: busbar-webrequest-hook, settings: {url: \"%s/dead\"}, timeout_ms: 2000, "
        "on_error: {hook: fb}}" % sc.url,
        "  fb: {module: busbar-webrequest-hook, settings: {url: \"%s/fb\"}, timeout_ms: 2000}" % sc.url,
        "  ranked: {module: busbar-webrequest-hook, settings: {url: \"%s/dead\"}, timeout_ms: 2000, "
        "on_error: {hook: cheapest}}" % sc.url]), """\
  f: {hooks: [firstly], members: [{model: ant}, {model: oai}]}
  c: {hooks: [chain], members: [{model: oai}, {model: ant}]}
  r: {hooks: [ranked], members: [{model: ant}, {model: oai}]}""", """\
rate_card:
  oai: {input_utok: 0.15, output_utok: 0.6}
  ant: {input_utok: 1, output_utok: 5}
  dead: {input_utok: 0, output_utok: 0}
  up-a: {input_utok: 0, output_utok: 0}
  up-b: {input_utok: 0, output_utok: 0}
"""))
    # first: member order, every time (weighted would alternate).
    assert [chat(g, model="f").json()["model"] for _ in range(4)] == ["claude-haiku-4-5"] * 4
    # chain -> also -> fb: the fallback answers in the failed gate's place, with its own grants.
    assert chat(g, model="c").json()["model"] == "claude-haiku-4-5"
    fb = sc.messages("/fb")[-1]
    assert "messages" not in fb["request"]       # fb has prompt: no, though chain had ro
    dead = sc.messages("/dead")
    assert "messages" in dead[-2]["request"] and "messages" not in dead[-1]["request"]
    # A ranking strategy ends a chain: cheapest orders by the rate card.
    assert [chat(g, model="r").json()["model"] for _ in range(3)] == ["gpt-4o-mini"] * 3


# ---------------------------------------------------------------- taps

def test_taps_fire_and_forget_at_every_stage(mock_port, inproc_gateway, sidecar):
    sc = sidecar({"/tap": lambda m: {"reject": {"status": 451}}, "/no": lambda m: {
        "reject": {"status": 451, "message": "no"}}}, delay={"/tap": 0.6})
    g = inproc_gateway(text(mock_port, "\n".join([
        hook("audit", sc.url + "/tap", kind="tap", prompt="ro"),
        hook("late", sc.url + "/tap", kind="tap", phase=["response"]),
        hook("deny", sc.url + "/no", timeout_ms=2000)]), """\
  hooks: [audit, late]
  p: {members: [{model: dead}, {model: oai}]}
  n: {hooks: [deny], members: [{model: oai}]}"""))
    t = time.monotonic()
    r = chat(g, content="watched")
    took = time.monotonic() - t
    assert r.status_code == 200 and took < 0.5, took   # the sidecar holds each tap 0.6 s
    msgs = sc.wait("/tap", 6)
    audit = [m for m in msgs if "messages" in m["request"]]
    assert all(m["op"] == "notify" for m in msgs)
    stages = sorted((m.get("stage") or {}).get("at", "request") for m in audit)
    assert stages == ["candidate", "request", "response", "routing", "routing"]
    routing = sorted((m["stage"] for m in audit if m.get("stage", {}).get("at") == "routing"),
                     key=lambda s: s["attempt_number"])
    assert routing[0]["model"] == "dead" and "previous_failure" not in routing[0]
    assert routing[1]["model"] == "oai" and routing[1]["previous_failure"] == "connect"
    resp = [m["stage"] for m in msgs if m.get("stage", {}).get("at") == "response"]
    assert resp == [{"at": "response", "outcome": "ok", "status": 200}] * 2
    assert {m["request"]["request_id"] for m in audit} == {audit[0]["request"]["request_id"]}
    # A gate's rejection reaches the response taps as rejected_by_gate.
    assert chat(g, model="n").status_code == 451
    msgs = sc.wait("/tap", 9)     # request + response (audit), response (late)
    assert {"at": "response", "outcome": "rejected_by_gate", "status": 451} in [
        m.get("stage") for m in msgs]


def test_a_stalled_tap_sidecar_drops_taps_never_requests(mock_port, inproc_gateway, sidecar,
                                                        monkeypatch):
    from busbar.hooks import run
    monkeypatch.setattr(run, "TAPS_INFLIGHT_MAX", 3)
    release = threading.Event()
    sc = sidecar({"/tap": lambda m: release.wait(5) and None})
    g = inproc_gateway(text(mock_port, hook("t", sc.url + "/tap", kind="tap", phase=["request"]),
                            """\
  hooks: [t]
  p: {members: [{model: oai}]}"""))
    for _ in range(6):
        assert chat(g).status_code == 200
    time.sleep(0.2)
    assert len(sc.messages("/tap")) == 3        # three under way, three dropped
    # ... counted as such, and in the Rust gateway's counter of them
    from prometheus_client.parser import text_string_to_metric_families
    shown = g.gw.snapshot.routing.hooks.stats.prometheus().decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(shown) for s in f.samples}
    assert got[("busbar_hook_calls_total", (("hook", "t"), ("outcome", "dropped")))] == 3
    assert got[("busbar_tap_notifications_dropped_total", ())] == 3
    release.set()


# ---------------------------------------------------------------- config

def test_hook_definitions_and_references_are_checked_at_boot():
    from busbar import config as cfgmod
    base = """
providers: {m: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}}
models: {a: {provider: m}}
"""
    def problems(t):
        with pytest.raises(cfgmod.ConfigError) as e:
            cfgmod.load(text=base + t, env={"K": "k"})
        return e.value.problems
    assert problems("hooks: {x: {module: my-guard-plugin, settings: {url: \"http://127.0.0.1/\"}}}") == [
        "hooks.x.module: 'my-guard-plugin' is not a hook module busbar has: busbar runs hooks "
        "through its built-in busbar-webrequest-hook (a sidecar over HTTP)"]
    for url, why in (("http://169.254.169.254/x", "metadata"), ("http://0xa9fea9fe/", "metadata"),
                     ("http://10.1.2.3/x", "private"), ("http://[::ffff:192.168.0.1]/", "private"),
                     ("http://[64:ff9b::a00:1]/", "private"), ("https://100.64.0.9/", "private"),
                     ("http://hooks.example.com/", "https"), ("ftp://127.0.0.1/", "http")):
        errs = problems("hooks: {x: {module: busbar-webrequest-hook, settings: {url: \"%s\"}}}" % url)
        assert len(errs) == 1 and errs[0].startswith("hooks.x.settings.url: "), (url, errs)
        assert why in errs[0], (url, errs)
        assert url.split("//")[1].split("/")[0] not in errs[0]      # the URL is never echoed
    for url in ("http://127.0.0.1:8787/pii", "http://localhost/x?token=abc", "http://[::1]:9/",
                "http://0x7f.1/",
                "https://hooks.example.com/rank", "http://u:p@127.0.0.2/x"):
        cfgmod.load(text=base + "hooks: {x: {module: busbar-webrequest-hook, settings: {url: \"%s\"}}}"
                    % url, env={"K": "k"})
    errs = problems("""
hooks:
  t: {module: busbar-webrequest-hook, kind: tap, prompt: rw, settings: {url: "http://127.0.0.1/"}}
  a: {module: busbar-webrequest-hook, on_error: {hook: b}, settings: {url: "http://127.0.0.1/"}}
  b: {module: busbar-webrequest-hook, on_error: {hook: a}, settings: {url: "http://127.0.0.1/"}}
  c: {module: busbar-webrequest-hook, on_error: {hook: tp}, settings: {url: "http://127.0.0.1/"}}
  tp: {module: busbar-webrequest-hook, kind: tap, settings: {url: "http://127.0.0.1/"}}
  d: {module: busbar-webrequest-hook, on_error: {hook: zz}, settings: {url: "http://127.0.0.1/"}}
  e: {module: busbar-webrequest-hook, on_error: sometimes, phase: [attempt], settings: {url: "http://127.0.0.1/"}}
  cheapest: {module: busbar-webrequest-hook, settings: {url: "http://127.0.0.1/"}}
pools:
  hooks: [tp]
  p: {hooks: [tp, nope], members: [{model: a}]}
""")
    assert errs == [
        "hooks.t.prompt: a tap never replies, so it cannot rewrite: prompt: rw is for gates (a "
        "tap may have prompt: ro)",
        "hooks.e.phase[0]: 'attempt' was renamed to 'routing' (busbar --migrate-config rewrites it)",
        "hooks.e.on_error: 'sometimes' is not a terminal (nothing | weighted | reject | first); a "
        "fallback hook is named as {hook: sometimes}",
        "hooks.cheapest: 'cheapest' is a reserved name (an on_error terminal, a ranking strategy "
        "or a built-in auth module) and cannot name a hook",
        "hooks.a.on_error: the on_error chain does not end: a -> b -> a is a cycle; every chain "
        "ends on nothing, weighted, reject, first or a ranking strategy",
        "hooks.b.on_error: the on_error chain does not end: b -> a -> b is a cycle; every chain "
        "ends on nothing, weighted, reject, first or a ranking strategy",
        "hooks.c.on_error: the fallback 'tp' is a tap; a fallback must be a gate (a tap never "
        "answers)",
        "hooks.d.on_error: unknown fallback hook 'zz'",
        "pools.p.hooks[0]: 'tp' is a tap: a pool's own hooks: list takes gates (a tap cannot steer "
        "routing); attach taps with pools.hooks",
        "pools.p.hooks[1]: unknown hook 'nope'; define it under the top-level hooks:",
    ]


# ---------------------------------------------------------------- what busbar reports

def test_metrics_and_access_log_carry_hook_decisions_over_both_workers(mock_port, sidecar, tmp_path):
    import subprocess

    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import start_gateway, stop
    sc = sidecar({"/g": lambda m: {"order": [0]}, "/t": lambda m: {}, "/bad": lambda m: (500, b"")})
    log = tmp_path / "access.log"
    admin = free_port()
    cfg = text(mock_port, "\n".join([
        hook("g", sc.url + "/g", timeout_ms=2000),
        hook("bad", sc.url + "/bad", timeout_ms=2000),
        hook("t", sc.url + "/t", kind="tap", phase=["response"])]), """\
  hooks: [t]
  p: {hooks: [g, bad], members: [{model: oai}]}
  plain: {members: [{model: oai}]}""", """\
admin_listen: "127.0.0.1:%d"
identity-providers:
  admin-tokens: {module: admin-tokens, token: {env: BB_ADMIN}}
auth: {admin_auth: [admin-tokens]}
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
  access: {module: access-log, settings: {path: "%s"}}
""" % (admin, log))
    g = start_gateway(tmp_path, cfg, 2, {"BB_ADMIN": "adm-" + "t" * 32}, stderr=subprocess.DEVNULL)
    try:
        for _ in range(6):
            assert chat(g).status_code == 200
        assert chat(g, model="plain").status_code == 200
        sc.wait("/t", 7)
        deadline = time.monotonic() + 5
        while True:     # a tap counts as delivered once its answer is back: after the caller's
            with httpx.Client(timeout=10) as c:
                r = c.get("http://127.0.0.1:%d/metrics" % admin,
                          headers={"authorization": "Bearer adm-" + "t" * 32})
            assert r.status_code == 200
            fams = {f.name: f for f in text_string_to_metric_families(r.text)}
            calls = {(s.labels["hook"], s.labels["outcome"]): s.value
                     for s in fams["busbar_hook_calls"].samples}
            if calls.get(("t", "delivered")) == 7 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert calls == {("g", "order"): 6, ("bad", "error"): 6, ("t", "delivered"): 7}
        count = [s for s in fams["busbar_hook_duration_seconds"].samples
                 if s.name.endswith("_count")]
        assert {s.labels["hook"]: s.value for s in count} == {"g": 6, "bad": 6}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and log.read_text().count("\n") < 7:
            time.sleep(0.05)
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        hooked = [x for x in lines if x["pool"] == "p"]
        assert len(hooked) == 6
        for x in hooked:
            assert sorted(x["hooks"].split(",")) == ["bad:error", "g:order"]
            assert 0 < x["hook_ms"] < 2000
        [plain] = [x for x in lines if x["pool"] == "plain"]
        assert "hooks" not in plain and "hook_ms" not in plain
    finally:
        stop(g.proc)


def test_groups_scope_a_hook_to_callers_of_a_group_or_its_descendants(mock_port, sidecar, tmp_path):
    import subprocess

    from tests.conftest import start_gateway, stop
    from tests.integration.gov_helpers import Admin
    sc = sidecar({"/eng": lambda m: {}, "/all": lambda m: {}})
    admin = free_port()
    cfg = text(mock_port, "\n".join([
        hook("eng", sc.url + "/eng", timeout_ms=2000, groups=["engineering"], user="ro"),
        hook("all", sc.url + "/all", timeout_ms=2000)]), """\
  p: {hooks: [eng, all], members: [{model: oai}]}""", """\
admin_listen: "127.0.0.1:%d"
identity-providers:
  admin-tokens: {module: admin-tokens, token: {env: BB_ADMIN}}
auth: {chain: [keys], admin_auth: [admin-tokens], signing_key: {env: BB_SIGNING}}
store: {module: memory}
groups:
  org: {}
  engineering: {parent: org}
  platform: {parent: engineering}
  sales: {parent: org}
""" % admin)
    g = start_gateway(tmp_path, cfg, 1, {"BB_ADMIN": "adm-" + "t" * 32, "BB_SIGNING": "ab" * 32},
                      stderr=subprocess.DEVNULL)
    try:
        a = Admin(admin, "adm-" + "t" * 32)
        keys = {grp: a.mint(name="k-" + grp, group=grp) for grp in ("platform", "sales")}
        for grp in ("platform", "sales"):
            with httpx.Client(timeout=20) as c:
                r = c.post(g.url + "/v1/chat/completions",
                           headers={"authorization": "Bearer " + keys[grp]["token"]},
                           json={"model": "p", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
        # platform descends from engineering: both hooks; sales: only the unscoped one.
        assert len(sc.messages("/all")) == 2
        [eng] = sc.messages("/eng")
        assert eng["request"]["user"] == {"key_id": keys["platform"]["id"], "key_name": "k-platform"}
        assert keys["platform"]["token"].encode() not in sc.raw("/eng")[0]
    finally:
        stop(g.proc)


def test_a_bug_behind_a_gates_answer_is_a_500_never_a_hang(mock_port, inproc_gateway, sidecar,
                                                           monkeypatch):
    from busbar.hooks import wire as hook_wire

    def broken(reply, n):
        raise RuntimeError("a bug")
    monkeypatch.setattr(hook_wire, "decision", broken)
    sc = sidecar({"/g": lambda m: {}})
    g = inproc_gateway(text(mock_port, hook("g", sc.url + "/g", timeout_ms=2000), """\
  p: {hooks: [g], members: [{model: oai}]}"""))
    t = time.monotonic()
    r = chat(g)
    assert r.status_code == 500 and time.monotonic() - t < 2
