"""Keys, groups, limits and usage (issue 10) through the real gateway (two workers) over real HTTP,
with the official SDKs: a good key works, a bad, revoked, disabled or expired one gets the vendor's
own error; limits hold exactly across both workers under concurrency; usage equals what the mock
reported; a SQLite store keeps keys and usage through kill -9."""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import cohere
import openai
import pytest
from google import genai
from google.genai import types as gt

from tests.conftest import start_gateway, stop
from tests.integration.gov_helpers import Admin, gov_config, gov_env, key_day, post, start, wait_usage

MODELS = ["oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model",
          "dead-model", "one-slot"]
# output costs 1000 units/Mtok (1000 micro-units a token) = 1 cent per 10-token answer; input is
# free, so a request sent with max_tokens = 10 reserves exactly what it costs, and a budget of 10
# cents is exactly ten answers.
CARD = "rate_card:\n" + "".join("  %s: {input_utok: 0.0, output_utok: 1000.0}\n" % m for m in MODELS)
TAIL = """
groups:
  org:     {limits: [{budget: 100000, per: month}]}
  team:    {parent: org, limits: [{requests: 1000, per: minute}]}
  rl:      {limits: [{requests: 20, per: minute}]}
  money:   {limits: [{budget: 10, per: day}]}
  one:     {limits: [{concurrent: 1}]}
  tok:     {limits: [{tokens: 25, per: hour}]}
  frozen:  {enabled: false}
  scoped:  {limits: [{requests: 1, per: minute, pool: oai-model}]}
store: {module: memory}
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
  access: {module: access-log, settings: {path: "off"}}
""" + CARD


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    g = start(tmp_path_factory.mktemp("gov"), mock_port, TAIL, workers=2)
    yield g
    stop(g.proc)


def chat(gw, token, model="oai-model", max_tokens=None, text="hi", header="authorization"):
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    h = {"authorization": "Bearer " + token} if header == "authorization" else {header: token}
    return post(gw, "/v1/chat/completions", body, h)


# ------------------------------------------------------------------ keys through every SDK
def _sdk_calls(url, token):
    o = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=20)
    a = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=20)
    g = genai.Client(api_key=token, http_options=gt.HttpOptions(base_url=url, api_version="v1beta",
                                                                timeout=20000))
    c = cohere.ClientV2(api_key=token, base_url=url, timeout=20)
    return {
        "openai": lambda: o.chat.completions.create(model="oai-model", messages=[
            {"role": "user", "content": "hi"}]).choices[0].message.content,
        "openai-stream": lambda: "".join(ch.choices[0].delta.content or "" for ch in
                                         o.chat.completions.create(model="oai-model", stream=True,
                                         messages=[{"role": "user", "content": "hi"}]) if ch.choices),
        "responses": lambda: o.responses.create(model="resp-model", input="hi").output_text,
        "anthropic": lambda: a.messages.create(model="ant-model", max_tokens=50, messages=[
            {"role": "user", "content": "hi"}]).content[0].text,
        "anthropic-stream": lambda: "".join(a.messages.stream(
            model="ant-model", max_tokens=50,
            messages=[{"role": "user", "content": "hi"}]).__enter__().text_stream),
        "gemini": lambda: g.models.generate_content(model="gem-model", contents="hi").text,
        "cohere": lambda: c.chat(model="coh-model", messages=[
            {"role": "user", "content": "hi"}]).message.content[0].text,
    }


def _native_error(name, exc):
    """(status, the vendor's own marker) of an SDK's exception."""
    if name.startswith("openai") or name == "responses":
        assert isinstance(exc, openai.AuthenticationError)
        return exc.status_code, exc.body["code"]
    if name.startswith("anthropic"):
        assert isinstance(exc, anthropic.AuthenticationError)
        return exc.status_code, exc.body["error"]["type"]
    if name == "gemini":
        assert isinstance(exc, genai.errors.ClientError)
        return exc.code, exc.status
    assert exc.status_code == 401, exc
    return exc.status_code, exc.body["message"]


NATIVE = {"openai": (401, "invalid_api_key"), "openai-stream": (401, "invalid_api_key"),
          "responses": (401, "invalid_api_key"), "anthropic": (401, "authentication_error"),
          "anthropic-stream": (401, "authentication_error"),
          "gemini": (400, "INVALID_ARGUMENT"), "cohere": (401, "invalid api token")}


def test_every_sdk_good_key_works_bad_keys_get_native_errors(gw):
    good = gw.admin.mint(name="sdk", group="team")
    for name, call in _sdk_calls(gw.url, good["token"]).items():
        assert call().startswith("mock: hi"), name
    revoked = gw.admin.mint(name="revoked")
    assert gw.admin.call("POST", "/keys/%s/revoke" % revoked["id"])[0] == 200
    disabled = gw.admin.mint(name="disabled")
    assert gw.admin.call("PATCH", "/keys/%s" % disabled["id"], {"enabled": False})[0] == 200
    forged = good["token"][:-3] + ("AAA" if not good["token"].endswith("AAA") else "BBB")
    for bad in ("", "sk-not-ours", forged, revoked["token"], disabled["token"]):
        for name, call in _sdk_calls(gw.url, bad or "x").items():
            with pytest.raises(Exception) as e:
                call()
            assert _native_error(name, e.value) == NATIVE[name], (name, bad)


def test_key_carriers_and_missing_key(gw):
    k = gw.admin.mint(name="carriers")["token"]
    s, _, _ = post(gw, "/v1/messages", {"model": "ant-model", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"}]}, {"x-api-key": k, "anthropic-version": "2023-06-01"})
    assert s == 200
    s, _, _ = post(gw, "/v1beta/models/gem-model:generateContent",
                   {"contents": [{"parts": [{"text": "hi"}]}]}, {"x-goog-api-key": k})
    assert s == 200
    s, _, _ = post(gw, "/v1beta/models/gem-model:generateContent?key=" + k,
                   {"contents": [{"parts": [{"text": "hi"}]}]}, {})
    assert s == 200
    s, body, _ = post(gw, "/v1/chat/completions", {"model": "oai-model", "messages": []}, {})
    assert s == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    s, body, _ = post(gw, "/v1beta/models/gem-model:generateContent", {"contents": []}, {})
    err = json.loads(body)["error"]
    assert s == 400 and err["status"] == "INVALID_ARGUMENT"
    assert err["message"] == "API key not valid. Please pass a valid API key."
    assert err["details"][0]["reason"] == "API_KEY_INVALID"
    s, body, h = post(gw, "/model/bed-model/converse", {"messages": []}, {})
    assert s == 403 and json.loads(body)["__type"] == "AccessDeniedException"
    assert h["x-amzn-errortype"].startswith("AccessDeniedException")


def test_expired_key_is_refused(gw):
    k = gw.admin.mint(name="short", expires_in="2s")
    assert chat(gw, k["token"])[0] == 200
    time.sleep(2.2)
    assert chat(gw, k["token"])[0] == 401


def test_rotate_revoke_patch_take_effect_on_every_worker_at_once(gw):
    k = gw.admin.mint(name="rot", group="team")
    s, rot = gw.admin.call("POST", "/keys/%s/rotate" % k["id"])
    assert s == 200 and rot["id"] == k["id"] and rot["token"] != k["token"]
    # 2 workers: ten calls land on both
    assert {chat(gw, k["token"])[0] for _ in range(10)} == {401}
    assert {chat(gw, rot["token"])[0] for _ in range(10)} == {200}
    assert gw.admin.call("PATCH", "/keys/%s" % k["id"], {"group": "frozen"})[0] == 200
    s, body, _ = chat(gw, rot["token"])
    assert s == 403 and "disabled" in json.loads(body)["error"]["message"]
    assert gw.admin.call("PATCH", "/keys/%s" % k["id"], {"group": "team"})[0] == 200
    assert {chat(gw, rot["token"])[0] for _ in range(4)} == {200}
    # allowed_pools is fixed at the mint (PATCH changes enabled and group only, as the Rust API)
    assert gw.admin.call("PATCH", "/keys/%s" % k["id"], {"allowed_pools": ["x"]})[0] == 400
    pooled = gw.admin.mint(name="pooled", group="team", allowed_pools=["ant-model"])
    s, body, _ = chat(gw, pooled["token"])
    assert s == 403 and json.loads(body)["error"]["message"] == (
        "Your API key does not have permission to access this resource.")
    assert {chat(gw, pooled["token"], model="ant-model", max_tokens=20)[0]
            for _ in range(4)} == {200}
    assert gw.admin.call("DELETE", "/keys/%s" % k["id"])[0] == 204
    assert {chat(gw, rot["token"], model="ant-model")[0] for _ in range(4)} == {401}
    # the row stays for GET (usage and audit refer to it), tombstoned
    assert gw.admin.call("GET", "/keys/%s" % k["id"])[1]["state"] == "tombstoned"
    # the token is never shown again, nor any hash or secret
    listed = json.dumps(gw.admin.call("GET", "/keys")[1])
    assert rot["token"] not in listed and "token_hash" not in listed and "aws_secret" not in listed


# ------------------------------------------------------------------ limits, exactly
def _burst(gw, n, fn):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: fn(), range(n)))


def test_requests_limit_is_exact_across_workers(gw):
    k = gw.admin.mint(name="rl", group="rl")["token"]
    out = _burst(gw, 60, lambda: chat(gw, k))
    ok = [r for r in out if r[0] == 200]
    refused = [r for r in out if r[0] == 429]
    assert len(ok) == 20 and len(refused) == 40
    err = json.loads(refused[0][1])["error"]
    assert err["type"] == "rate_limit_error" and "requests per minute" in err["message"]
    assert all(1 <= int(r[2]["retry-after"]) <= 60 for r in refused)


def test_budget_holds_exactly_under_concurrency(gw):
    k = gw.admin.mint(name="money", group="money")
    out = _burst(gw, 50, lambda: chat(gw, k["token"], max_tokens=10))
    ok = sum(r[0] == 200 for r in out)
    assert 1 <= ok <= 10
    denied = [r for r in out if r[0] == 429]
    assert all(json.loads(r[1])["error"]["code"] == "insufficient_quota" for r in denied)
    assert all("retry-after" not in r[2] for r in denied)
    # what the burst left: refunds settle, then sequential calls use the rest of the budget
    more = 0
    while chat(gw, k["token"], max_tokens=10)[0] == 200:
        more += 1
        assert more <= 10
    assert ok + more == 10
    u = key_day(gw.admin, k["id"], 10)
    # 100 output tokens at 1000 micro-units each: 0.10 units, 100000 micro-units, 10 cents
    assert u["requests"] == 10 and u["spend_micros"] == 100000 and u["tokens_output"] == 100
    s, ku = gw.admin.call("GET", "/keys/%s/usage" % k["id"])
    assert s == 200 and ku["requests"] == 10 and ku["spend_cents"] == 10
    assert ku["budget_period"] == "total" and ku["group"] == "money"


def test_concurrent_limit_and_release(gw):
    k = gw.admin.mint(name="one", group="one")["token"]
    out = _burst(gw, 4, lambda: chat(gw, k, text="slow #mock:delay_ms=400"))
    assert sorted(r[0] for r in out) == [200, 429, 429, 429]
    assert all("retry-after" not in r[2] for r in out if r[0] == 429)
    assert chat(gw, k)[0] == 200        # released at the end of the first


def test_tokens_limit_is_post_paid(gw):
    k = gw.admin.mint(name="tok", group="tok")["token"]
    # 18 in + 10 out = 28 tokens: the first request passes (0 < 25), the next is refused.
    assert chat(gw, k)[0] == 200
    s, body, h = chat(gw, k)
    assert s == 429 and "tokens per hour" in json.loads(body)["error"]["message"]
    assert int(h["retry-after"]) >= 1


def test_pool_scoped_limit_and_group_chain(gw):
    k = gw.admin.mint(name="scoped", group="scoped")["token"]
    assert chat(gw, k)[0] == 200
    assert chat(gw, k)[0] == 429
    assert chat(gw, k, model="ant-model", max_tokens=10)[0] == 200      # another pool: no limit


def test_groups_api(gw):
    a = gw.admin
    s, g = a.call("POST", "/groups", {"name": "api-team", "config": {
        "parent": "org", "limits": [{"requests": 2, "per": "minute"}]}})
    assert s == 201 and g["limits"] == [{"metric": "requests", "amount": 2, "per": "minute"}]
    assert a.call("PATCH", "/groups/team", {"enabled": False})[0] == 409     # file-owned
    s, body = a.call("POST", "/groups", {"name": "bad", "config": {"limits": [{"requests": 1}]}})
    assert s == 400 and "groups.bad.limits[0].per" in body["error"]["message"]
    assert a.call("POST", "/groups", {"name": "loop", "config": {"parent": "nowhere"}})[0] == 400
    k = a.mint(name="api", group="api-team")["token"]
    assert [chat(gw, k)[0] for _ in range(3)] == [200, 200, 429]
    assert a.call("PATCH", "/groups/api-team", {"limits": [{"requests": 100, "per": "minute"}]})[0] == 200
    assert chat(gw, k)[0] == 200
    assert a.call("DELETE", "/groups/api-team")[0] == 409      # a key is in it
    u = wait_usage(a, "/groups/org/usage", lambda d: d["buckets"][0]["requests"] >= 3)
    assert u["buckets"][0]["window"] == "month" and u["buckets"][0]["requests"] >= 3


def test_usage_equals_what_the_upstream_reported(gw):
    k = gw.admin.mint(name="usage", group="team")
    t = k["token"]
    reported = {"input": 0, "output": 0, "requests": 0}
    bodies = {
        "/v1/chat/completions": ({"model": "oai-model", "messages": [{"role": "user", "content": "a b"}]},
                                 {"authorization": "Bearer " + t},
                                 lambda d: (d["usage"]["prompt_tokens"], d["usage"]["completion_tokens"])),
        "/v1/responses": ({"model": "resp-model", "input": "a b c"}, {"authorization": "Bearer " + t},
                          lambda d: (d["usage"]["input_tokens"], d["usage"]["output_tokens"])),
        "/v1/messages": ({"model": "ant-model", "max_tokens": 30, "messages": [{"role": "user", "content": "a"}]},
                         {"x-api-key": t, "anthropic-version": "2023-06-01"},
                         lambda d: (d["usage"]["input_tokens"], d["usage"]["output_tokens"])),
        "/v1beta/models/gem-model:generateContent": (
            {"contents": [{"parts": [{"text": "a b c d"}]}]}, {"x-goog-api-key": t},
            lambda d: (d["usageMetadata"]["promptTokenCount"], d["usageMetadata"]["candidatesTokenCount"])),
        "/v2/chat": ({"model": "coh-model", "messages": [{"role": "user", "content": "x"}]},
                     {"authorization": "Bearer " + t},
                     lambda d: (d["usage"]["tokens"]["input_tokens"], d["usage"]["tokens"]["output_tokens"])),
    }
    for path, (body, headers, read) in bodies.items():
        s, data, _ = post(gw, path, body, headers)
        assert s == 200, (path, data)
        i, o = read(json.loads(data))
        reported["input"] += i
        reported["output"] += o
        reported["requests"] += 1
    # streamed, same protocol and translated: the SDKs' own usage figures
    o = openai.OpenAI(base_url=gw.url + "/v1", api_key=t, max_retries=0, timeout=20)
    for model in ("oai-model", "ant-model"):
        chunks = list(o.chat.completions.create(model=model, stream=True, max_tokens=30,
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "s t"}]))
        reported["input"] += chunks[-1].usage.prompt_tokens
        reported["output"] += chunks[-1].usage.completion_tokens
        reported["requests"] += 1
    a = anthropic.Anthropic(base_url=gw.url, api_key=t, max_retries=0, timeout=20)
    for model in ("ant-model", "gem-model"):
        with a.messages.stream(model=model, max_tokens=30, messages=[{"role": "user", "content": "q"}]) as st:
            final = st.get_final_message()
        reported["input"] += final.usage.input_tokens
        reported["output"] += final.usage.output_tokens
        reported["requests"] += 1
    u = key_day(gw.admin, k["id"], reported["requests"])
    assert (u["requests"], u["tokens_input"], u["tokens_output"]) == (
        reported["requests"], reported["input"], reported["output"])
    assert u["spend_micros"] == reported["output"] * 1000
    s, day = gw.admin.call("GET", "/usage")
    assert s == 200 and day["currency"] == "USD" and day["by_key_truncated"] is False
    assert gw.admin.call("GET", "/usage?window=12345")[0] == 400


def test_read_only_token_cannot_mint(gw, mock_port):
    s, body = gw.admin.call("POST", "/keys", {"name": "x"}, token="wrong")
    assert s == 401


# ------------------------------------------------------------------ SQLite through kill -9
def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_sqlite_keeps_keys_and_usage_through_kill_9(mock_port, tmp_path):
    tail = TAIL.replace("store: {module: memory}", "store: {module: sqlite, settings: {db_path: "
                                                   "%s}}" % (tmp_path / "gov.db"))
    text, admin = gov_config(mock_port, tail)
    # usage flushed every 100 ms (the base config has the advanced: block)
    text = text.replace("advanced:\n", "advanced:\n  usage_flush_interval_ms: 100\n", 1)

    def start_sqlite():
        gw = start_gateway(tmp_path, text, 2, gov_env())
        gw.admin = Admin(admin)
        return gw
    g = start_sqlite()
    try:
        k = g.admin.mint(name="durable", group="team")
        for _ in range(12):
            assert chat(g, k["token"])[0] == 200
        # the stated window: a worker batch plus a parent batch (2 x flush_interval_ms)
        time.sleep(0.4)
        pids = [g.proc.pid] + _children(g.proc.pid)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        g.proc.wait(5)
    finally:
        stop(g.proc)
    for pid in pids:
        for _ in range(50):
            if not os.path.exists("/proc/%d" % pid):
                break
            time.sleep(0.05)
    # the same config, the same database
    g2 = start_sqlite()
    try:
        assert chat(g2, k["token"])[0] == 200
        u = key_day(g2.admin, k["id"], 13)
        assert u["requests"] == 13 and u["tokens_output"] == 130
    finally:
        stop(g2.proc)


# ------------------------------------------------------------------ BYOK
def test_byok_passthrough_forwards_the_callers_own_key(mock_port, tmp_path):
    """upstream_credentials: passthrough: busbar holds no key for the provider, skips its own key
    check for it, and forwards the caller's key in the provider's carrier (the mock, started with
    --require-auth, accepts only sk-test-key); other targets still need a busbar key."""
    base_providers = "providers:\n"
    from tests.conftest import CONFIG, free_port, start_gateway
    from tests.integration.gov_helpers import GOV, Admin, gov_env
    admin = free_port()
    cfg = CONFIG.format(port="{port}", mock=mock_port, dead=free_port())
    cfg = cfg.replace(base_providers, base_providers + "  byok: {protocol: anthropic, base_url: "
                      "\"http://127.0.0.1:%d\", upstream_credentials: passthrough}\n" % mock_port)
    cfg = cfg.replace("models:\n", "models:\n  byok-model: {provider: byok, upstream_model: claude-haiku-4-5}\n")
    cfg += GOV.format(admin=admin)
    g = start_gateway(tmp_path, cfg, 1, gov_env())
    g.admin = Admin(admin)
    try:
        body = {"model": "byok-model", "max_tokens": 30,
                "messages": [{"role": "user", "content": "hi #mock:echo_auth=1"}]}
        s, data, _ = post(g, "/v1/messages", body, {"x-api-key": "sk-callers-own",
                                                    "anthropic-version": "2023-06-01"})
        assert s == 200, data
        assert "[auth:x-api-key]" in json.loads(data)["content"][0]["text"]
        # no key from the caller: nothing forwarded, the upstream's own 401 is relayed
        s, data, _ = post(g, "/v1/messages", body, {"anthropic-version": "2023-06-01"})
        assert s == 401 and json.loads(data)["error"]["type"] == "authentication_error"
        body["model"] = "ant-model"
        s, data, _ = post(g, "/v1/messages", body, {"x-api-key": "sk-test-key",
                                                    "anthropic-version": "2023-06-01"})
        assert s == 401 and json.loads(data)["error"]["message"] == "invalid x-api-key"
    finally:
        stop(g.proc)


# ------------------------------------------------------------------ Bedrock: SigV4 with the issued pair
def test_boto3_with_the_issued_aws_credential(gw):
    import boto3
    import botocore.exceptions
    from botocore.config import Config as BotoConfig

    k = gw.admin.mint(name="aws", group="team", issue_aws_credential=True)
    assert k["aws_access_key_id"].startswith("AKIA") and len(k["aws_access_key_id"]) == 20
    assert len(k["aws_secret_access_key"]) == 40

    def client(akid, secret):
        return boto3.client("bedrock-runtime", endpoint_url=gw.url, region_name="us-east-1",
                            aws_access_key_id=akid, aws_secret_access_key=secret,
                            config=BotoConfig(retries={"max_attempts": 1}, read_timeout=20))

    br = client(k["aws_access_key_id"], k["aws_secret_access_key"])
    msgs = [{"role": "user", "content": [{"text": "hi"}]}]
    r = br.converse(modelId="bed-model", messages=msgs)
    assert r["output"]["message"]["content"][0]["text"].startswith("mock: hi")
    stream = br.converse_stream(modelId="ant-model", messages=msgs,
                                inferenceConfig={"maxTokens": 20})["stream"]
    text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in stream if "contentBlockDelta" in e)
    assert text.startswith("mock: hi")
    # a wrong secret and an unknown access key id look the same: 403 AccessDeniedException
    for akid, secret in ((k["aws_access_key_id"], "x" * 40), ("AKIA0000000000000000", "y" * 40)):
        with pytest.raises(botocore.exceptions.ClientError) as e:
            client(akid, secret).converse(modelId="bed-model", messages=msgs)
        assert e.value.response["Error"]["Code"] == "AccessDeniedException"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # the signature covers the body: a tampered body with the old signature is refused
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    body = json.dumps({"messages": msgs}).encode()
    req = botocore.awsrequest.AWSRequest("POST", gw.url + "/model/bed-model/converse", data=body,
                                         headers={"content-type": "application/json"})
    botocore.auth.SigV4Auth(botocore.credentials.Credentials(
        k["aws_access_key_id"], k["aws_secret_access_key"]), "bedrock", "us-east-1").add_auth(req)
    headers = dict(req.headers.items())
    assert post(gw, "/model/bed-model/converse", {"messages": msgs}, headers)[0] == 200
    tampered = {"messages": [{"role": "user", "content": [{"text": "hj"}]}]}
    assert post(gw, "/model/bed-model/converse", tampered, headers)[0] == 403
    # revoking the key revokes the pair
    assert gw.admin.call("POST", "/keys/%s/revoke" % k["id"])[0] == 200
    with pytest.raises(botocore.exceptions.ClientError):
        br.converse(modelId="bed-model", messages=msgs)


def test_metrics_count_refusals_by_gate_and_spend_by_key(gw):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", gw.admin.port, timeout=10)
        c.request("GET", "/metrics", headers={"authorization": "Bearer " + gw.admin.token})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        assert r.status == 200
        out = {}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
        return out

    def denied(m, gate):
        return m.get(("busbar_governance_denied_total", (("gate", gate),)), 0)

    before = scrape()
    for _ in range(3):
        chat(gw, "bbk_nothing.valid")
    k = gw.admin.mint(name="metrics", group="team", allowed_pools=["ant-model"])
    chat(gw, k["token"])                                      # pool not allowed
    assert chat(gw, k["token"], model="ant-model", max_tokens=10)[0] == 200
    deadline = time.monotonic() + 8         # spend is refreshed every 5 s from stored usage
    while True:
        after = scrape()
        spend = after.get(("busbar_key_spend_cents", (("key", k["id"]),)))
        if spend or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert denied(after, "auth") - denied(before, "auth") == 3
    assert denied(after, "pool_acl") - denied(before, "pool_acl") == 1
    assert spend == 1       # 10 tokens at 1000 per million: a hundredth of the unit, one cent


def test_usage_is_exact_for_every_ingress_streamed_and_not(gw):
    """Each SDK's own usage figures, summed, equal what the key's usage endpoint reports: all six
    ingress protocols, buffered and streamed, same-protocol lanes and a translated one."""
    import boto3
    from botocore.config import Config as BotoConfig

    k = gw.admin.mint(name="six", group="team", issue_aws_credential=True)
    t = k["token"]
    seen = []      # (input, output) per request, from the SDKs

    o = openai.OpenAI(base_url=gw.url + "/v1", api_key=t, max_retries=0, timeout=20)
    r = o.chat.completions.create(model="oai-model", messages=[{"role": "user", "content": "u1"}])
    seen.append((r.usage.prompt_tokens, r.usage.completion_tokens))
    ch = list(o.chat.completions.create(model="oai-model", stream=True, stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": "u2"}]))
    seen.append((ch[-1].usage.prompt_tokens, ch[-1].usage.completion_tokens))
    # a same-protocol stream whose client did not ask for usage: busbar asks the upstream for it
    # (and hides it from the client); the mock answers the same prompt with the same usage, so the
    # asked-for twin below says what it was
    plain = list(o.chat.completions.create(model="oai-model", stream=True,
                                           messages=[{"role": "user", "content": "twin"}]))
    assert all(getattr(x, "usage", None) is None for x in plain) and plain[-1].choices
    twin = list(o.chat.completions.create(model="oai-model", stream=True,
                                          stream_options={"include_usage": True},
                                          messages=[{"role": "user", "content": "twin"}]))
    seen.append((twin[-1].usage.prompt_tokens, twin[-1].usage.completion_tokens))
    seen.append(seen[-1])
    r = o.responses.create(model="resp-model", input="u3")
    seen.append((r.usage.input_tokens, r.usage.output_tokens))
    with o.responses.stream(model="resp-model", input="u4") as s:
        fin = s.get_final_response()
    seen.append((fin.usage.input_tokens, fin.usage.output_tokens))

    a = anthropic.Anthropic(base_url=gw.url, api_key=t, max_retries=0, timeout=20)
    m = a.messages.create(model="ant-model", max_tokens=40, messages=[{"role": "user", "content": "u5"}])
    seen.append((m.usage.input_tokens, m.usage.output_tokens))
    with a.messages.stream(model="oai-model", max_tokens=40, messages=[{"role": "user", "content": "u6"}]) as s:
        fin = s.get_final_message()
    seen.append((fin.usage.input_tokens, fin.usage.output_tokens))

    g = genai.Client(api_key=t, http_options=gt.HttpOptions(base_url=gw.url, api_version="v1beta",
                                                            timeout=20000))
    r = g.models.generate_content(model="gem-model", contents="u7")
    seen.append((r.usage_metadata.prompt_token_count, r.usage_metadata.candidates_token_count))
    last = list(g.models.generate_content_stream(model="gem-model", contents="u8"))[-1]
    seen.append((last.usage_metadata.prompt_token_count, last.usage_metadata.candidates_token_count))

    c = cohere.ClientV2(api_key=t, base_url=gw.url, timeout=20)
    r = c.chat(model="coh-model", messages=[{"role": "user", "content": "u9"}])
    seen.append((int(r.usage.tokens.input_tokens), int(r.usage.tokens.output_tokens)))
    end = [e for e in c.chat_stream(model="coh-model", messages=[{"role": "user", "content": "u10"}])
           if e.type == "message-end"][0]
    seen.append((int(end.delta.usage.tokens.input_tokens), int(end.delta.usage.tokens.output_tokens)))

    br = boto3.client("bedrock-runtime", endpoint_url=gw.url, region_name="us-east-1",
                      aws_access_key_id=k["aws_access_key_id"],
                      aws_secret_access_key=k["aws_secret_access_key"],
                      config=BotoConfig(retries={"max_attempts": 1}))
    msgs = [{"role": "user", "content": [{"text": "u11"}]}]
    r = br.converse(modelId="bed-model", messages=msgs)
    seen.append((r["usage"]["inputTokens"], r["usage"]["outputTokens"]))
    meta = [e["metadata"] for e in br.converse_stream(modelId="bed-model", messages=msgs)["stream"]
            if "metadata" in e][0]
    seen.append((meta["usage"]["inputTokens"], meta["usage"]["outputTokens"]))

    u = key_day(gw.admin, k["id"], len(seen))
    assert u["requests"] == len(seen) == 14
    assert (u["tokens_input"], u["tokens_output"]) == (sum(x for x, _ in seen),
                                                       sum(y for _, y in seen))


def test_the_callers_key_never_reaches_the_upstream(mock_port, tmp_path):
    """An upstream written in the test records every header it receives: the virtual key (in any
    carrier) is not among them, only the provider's own configured key."""
    from tests.conftest import CONFIG, free_port, start_gateway
    from tests.hostile import HostileUpstream, http_response, openai_body
    from tests.integration.gov_helpers import GOV, Admin, gov_env

    up = HostileUpstream({}, default=lambda c, req: c.sendall(http_response(200, openai_body("ok"))))
    admin = free_port()
    cfg = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()).replace(
        "providers:\n", "providers:\n  spy: {protocol: openai, base_url: \"%s\", api_key: {env: MOCK_KEY}}\n"
        % up.url).replace("models:\n", "models:\n  spy-model: {provider: spy, upstream_model: gpt-spy}\n")
    g = start_gateway(tmp_path, cfg + GOV.format(admin=admin), 1, gov_env())
    try:
        tok = Admin(admin).mint(name="spy")["token"]
        body = {"model": "spy-model", "messages": [{"role": "user", "content": "hi"}]}
        assert post(g, "/v1/chat/completions", body, {"authorization": "Bearer " + tok})[0] == 200
        assert post(g, "/v1beta/models/spy-model:generateContent?key=" + tok,
                    {"contents": [{"parts": [{"text": "hi"}]}]}, {})[0] == 200
        assert post(g, "/v1beta/models/spy-model:generateContent",
                    {"contents": [{"parts": [{"text": "hi"}]}]}, {"x-goog-api-key": tok})[0] == 200
        s, _, _ = post(g, "/v1/messages", {"model": "spy-model", "max_tokens": 5, "messages": [
            {"role": "user", "content": "hi"}]}, {"x-api-key": tok, "anthropic-version": "2023-06-01"})
        assert s == 200
        assert len(up.requests) == 4
        assert all(tok not in r.path for r in up.requests)
        for req in up.requests:
            raw = json.dumps({k.decode() if isinstance(k, bytes) else k:
                              v.decode() if isinstance(v, bytes) else v
                              for k, v in dict(req.headers).items()})
            assert tok not in raw and "bbk_" not in raw
            assert "sk-test-key" in raw          # the provider's own key, and only it
    finally:
        stop(g.proc)
        up.close()


def test_bedrock_budget_refusal_is_its_own(gw):
    import boto3
    import botocore.exceptions
    from botocore.config import Config as BotoConfig
    k = gw.admin.mint(name="bq", group="money", issue_aws_credential=True)
    while chat(gw, k["token"], max_tokens=10)[0] == 200:
        pass
    br = boto3.client("bedrock-runtime", endpoint_url=gw.url, region_name="us-east-1",
                      aws_access_key_id=k["aws_access_key_id"],
                      aws_secret_access_key=k["aws_secret_access_key"],
                      config=BotoConfig(retries={"max_attempts": 1}))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        br.converse(modelId="bed-model", messages=[{"role": "user", "content": [{"text": "hi"}]}],
                    inferenceConfig={"maxTokens": 10})
    assert e.value.response["Error"]["Code"] == "ServiceQuotaExceededException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_a_key_alone_still_bills_a_relayed_stream(mock_port, tmp_path):
    """Usage is asked for where something reads it: with keys on and no finish hook at all (no
    access log, metrics, request logs or traces), a same-protocol OpenAI stream whose client did
    not ask for usage is still billed what the upstream reported (busbar asks it for the usage
    chunk for the key's settlement), and the client still sees none."""
    g = start(tmp_path, mock_port, "groups:\n  team: {}\nstore: {module: memory}\n"
              "export: {access: {module: access-log, settings: {path: \"off\"}}}\n")
    try:
        k = g.admin.mint(name="alone", group="team")
        o = openai.OpenAI(base_url=g.url + "/v1", api_key=k["token"], max_retries=0, timeout=20)
        msgs = [{"role": "user", "content": "twin"}]
        plain = list(o.chat.completions.create(model="oai-model", stream=True, messages=msgs))
        assert plain[-1].choices and all(getattr(x, "usage", None) is None for x in plain)
        u = key_day(g.admin, k["id"], 1)
        twin = list(o.chat.completions.create(model="oai-model", stream=True, messages=msgs,
                                              stream_options={"include_usage": True}))[-1].usage
        assert u["requests"] == 1
        assert (u["tokens_input"], u["tokens_output"]) == (twin.prompt_tokens,
                                                           twin.completion_tokens)
        assert u["tokens_output"] > 0
    finally:
        stop(g.proc)
