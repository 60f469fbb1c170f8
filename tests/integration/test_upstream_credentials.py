"""`pools.upstream_credentials` (the all-pools default) and a pool's own `upstream_credentials:`
(a scalar: it replaces the default), through the real server: an upstream written in the test
records the credential each request carried upstream."""
from __future__ import annotations

import json

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body
from tests.integration.gov_helpers import post

ANTHROPIC_OK = json.dumps({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m-a",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()
BEDROCK_OK = json.dumps({
    "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
    "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4}}).encode()
OWN = "sk-own-provider-key"


def _answer(body):
    def fn(c, req):
        # no credential at all: the provider's own refusal (a real one answers 401)
        if not any(k in req.headers for k in ("authorization", "x-api-key")):
            c.sendall(http_response(401, b'{"error": {"message": "no key", "type": '
                                         b'"invalid_request_error", "code": "invalid_api_key"}}'))
            return
        c.sendall(http_response(200, body))
    return fn


CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  up-openai:    {protocol: openai, base_url: "URL", api_key: {env: OWN_KEY}}
  up-anthropic: {protocol: anthropic, base_url: "URL", api_key: {env: OWN_KEY}}
  up-bedrock:   {protocol: bedrock, base_url: "URL", api_key: {env: MOCK_AWS}, region: us-east-1}
models:
  o: {provider: up-openai, upstream_model: m-o}
  a: {provider: up-anthropic, upstream_model: m-a}
  b: {provider: up-bedrock, upstream_model: m-b}
pools:
  upstream_credentials: DEFAULT
  byok-o: {upstream_credentials: passthrough, members: [{model: o}]}
  byok-a: {upstream_credentials: passthrough, members: [{model: a}]}
  byok-b: {upstream_credentials: passthrough, members: [{model: b}]}
  house:  {upstream_credentials: own, members: [{model: o}]}
  plain:  {members: [{model: o}]}
"""


@pytest.fixture
def upstream():
    up = HostileUpstream({"m-o": _answer(openai_body("ok")), "m-a": _answer(ANTHROPIC_OK),
                          "m-b": _answer(BEDROCK_OK)})
    yield up
    up.close()


def _gateway(tmp_path, up, default):
    text = CONFIG.replace("URL", up.url).replace("DEFAULT", default)
    return start_gateway(tmp_path, text, 1, {"OWN_KEY": OWN})


def _chat(g, model, key=None):
    h = {"authorization": "Bearer " + key} if key else {}
    s, data, _ = post(g, "/v1/chat/completions",
                      {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, h)
    return s, json.loads(data)


def _sent(up):
    r = up.requests[-1]
    return r.headers.get("authorization"), r.headers.get("x-api-key")


def test_a_pools_own_value_replaces_the_all_pools_default(tmp_path, upstream):
    g = _gateway(tmp_path, upstream, "own")
    try:
        # passthrough pool: the caller's key, never busbar's
        assert _chat(g, "byok-o", "sk-callers-own")[0] == 200
        assert _sent(upstream) == ("Bearer sk-callers-own", None)
        # ... in the lane's own carrier across protocols (OpenAI in, Anthropic's x-api-key out)
        assert _chat(g, "byok-a", "sk-callers-own")[0] == 200
        assert _sent(upstream) == (None, "sk-callers-own")
        # own (explicit, and inherited from the default; and a model named directly)
        for target in ("house", "plain", "o"):
            assert _chat(g, target, "sk-callers-own")[0] == 200
            assert _sent(upstream) == ("Bearer " + OWN, None), target
        # a signing lane signs with a caller's ACCESS_KEY_ID:SECRET, not busbar's credential ...
        assert _chat(g, "byok-b", "AKIDCALLER:callersecret")[0] == 200
        auth = _sent(upstream)[0]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDCALLER/"), auth
        # ... and sends any other token as a bearer (a Bedrock API key)
        assert _chat(g, "byok-b", "ABSKcallersbedrockkey")[0] == 200
        assert _sent(upstream) == ("Bearer ABSKcallersbedrockkey", None)
        # no key from the caller: nothing is sent in its place, the upstream's 401 is the
        # caller's (relayed), and the lane is not benched for it
        n = len(upstream.requests)
        s, body = _chat(g, "byok-o")
        assert s == 401 and body["error"]["message"] == "no key", body
        assert len(upstream.requests) == n + 1 and _sent(upstream) == (None, None)
        assert _chat(g, "byok-o", "sk-callers-own")[0] == 200
    finally:
        stop(g.proc)


def test_the_all_pools_default_covers_models_named_directly(tmp_path, upstream):
    g = _gateway(tmp_path, upstream, "passthrough")
    try:
        assert _chat(g, "plain", "sk-callers-own")[0] == 200       # inherited
        assert _sent(upstream) == ("Bearer sk-callers-own", None)
        assert _chat(g, "o", "sk-callers-own")[0] == 200           # no pool: the default
        assert _sent(upstream) == ("Bearer sk-callers-own", None)
        assert _chat(g, "house", "sk-callers-own")[0] == 200       # the pool's own: own
        assert _sent(upstream) == ("Bearer " + OWN, None)
    finally:
        stop(g.proc)


def test_validate_names_a_key_no_request_sends(tmp_path, upstream):
    """With the all-pools default passthrough, a provider that no `own` pool uses has a key that
    is never sent: --validate says so (a warning, as the Rust gateway's)."""
    import subprocess

    from tests.conftest import PY, ROOT, env
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.replace("URL", upstream.url).replace("DEFAULT", "passthrough")
                   .replace("{port}", "0"))
    r = subprocess.run([PY, "-m", "busbar.cli", "--validate", "--config", str(cfg)], cwd=ROOT,
                       env=dict(env(), OWN_KEY=OWN), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    warned = [line for line in (r.stdout + r.stderr).splitlines() if "never sent" in line]
    assert any("providers.up-anthropic.api_key" in w for w in warned), r.stdout + r.stderr
    assert any("providers.up-bedrock.api_key" in w for w in warned)
    assert not any("providers.up-openai" in w for w in warned)      # `house` sends it
    assert OWN not in r.stdout + r.stderr
