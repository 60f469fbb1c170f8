"""Dynamic upstream credentials through the real server: Bedrock lanes signed with credentials from
botocore's chain (container endpoint, web identity from a profile or from the EKS environment
variables, a role assumed through STS) and Vertex AI lanes with OAuth tokens from a service
account's JWT bearer grant; refreshed in the background before they expire. What the upstream
receives is checked: the SigV4 signature recomputed with the credentials the fake issued, the
bearer token the fake token endpoint minted."""
import json
import os
import time

import anthropic
import openai
import pytest

from busbar.upstream.sigv4 import SigV4Signer
from tests import conftest
from tests.conftest import ROOT, free_port, stop
from tests.integration.fakes import Fake, service_account


def gateway_env(extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    e["PYTHONPATH"] = str(ROOT)
    e["AWS_EC2_METADATA_DISABLED"] = "true"
    e["AWS_CONFIG_FILE"] = "/nonexistent/busbar-test"
    e["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/busbar-test"
    e["AZURE_KEY"] = "azure-test-key"
    e.update(extra)
    return e


def start_gateway(tmp, config, env):
    port = int(config.split('listen: "127.0.0.1:')[1].split('"')[0])
    return port, conftest.start_gateway(tmp, config, port=port, base_env=env).proc


def check_sigv4(req, access, secret, token, host):
    """Recomputes the request's signature from the credentials the fake issued."""
    h = req["headers"]
    assert h.get("x-amz-security-token") == token
    path, _, query = req["path"].partition("?")
    expect = dict(SigV4Signer(access, secret, token, "us-east-1").sign(
        "POST", host, path, query, req["body"], amz_date=h["x-amz-date"]))
    assert h["authorization"] == expect["Authorization"]
    assert ("Credential=%s/" % access) in h["authorization"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("creds")
    key = service_account(tmp / "sa.json")
    fake = Fake(public_key=key.public_key(), token_lifetime=3, creds_lifetime=3600)
    (tmp / "webid-token").write_text("eks-projected-jwt")
    (tmp / "aws-config").write_text(
        "[profile wi]\nrole_arn = arn:aws:iam::123456789012:role/from-profile\n"
        "web_identity_token_file = %s\n\n[profile base]\naws_access_key_id = AKIDBASE\n"
        "aws_secret_access_key = base-secret\n" % (tmp / "webid-token"))
    port = free_port()
    config = f"""
listen: "127.0.0.1:{port}"
providers:
  bed-chain:   {{protocol: bedrock, base_url: "{fake.url}", auth: sigv4, region: us-east-1}}
  bed-profile: {{protocol: bedrock, base_url: "{fake.url}", profile: wi, region: us-east-1}}
  bed-role:    {{protocol: bedrock, base_url: "{fake.url}", profile: base, region: us-east-1,
                 role_arn: "arn:aws:iam::123456789012:role/assumed"}}
  vtx-gemini:  {{protocol: gemini, base_url: "{fake.url}", vertex: {{project: proj-test, location: us-central1}},
                 credentials: {{file: sa.json}}, token_url: "{fake.url}/token"}}
  vtx-claude:  {{protocol: anthropic, base_url: "{fake.url}", vertex: {{project: proj-test, location: europe-west1}},
                 credentials: {{file: sa.json}}, token_url: "{fake.url}/token"}}
models:
  chain:   {{provider: bed-chain, upstream_model: "amazon.nova-lite-v1:0"}}
  profile: {{provider: bed-profile, upstream_model: "amazon.nova-lite-v1:0"}}
  role:    {{provider: bed-role, upstream_model: "amazon.nova-lite-v1:0"}}
  gem:     {{provider: vtx-gemini, upstream_model: gemini-2.5-flash}}
  claude:  {{provider: vtx-claude, upstream_model: "claude-sonnet-4-5@20250929"}}
"""
    port, proc = start_gateway(tmp, config, gateway_env({
        "AWS_CONFIG_FILE": str(tmp / "aws-config"),
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": fake.url + "/creds",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN": "ecs-auth-token",
        "AWS_ENDPOINT_URL_STS": fake.url + "/sts",
    }))
    yield port, fake, tmp
    stop(proc)
    fake.close()


def chat(port, model):
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0, timeout=20)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "hello from upstream"


def test_container_credentials_sign_bedrock(world):
    port, fake, _ = world
    chat(port, "chain")
    get = fake.find("/creds", "GET")[0]
    assert get["headers"]["authorization"] == "ecs-auth-token"
    req = [r for r in fake.find("/model/") if "ASIACONTAINER" in r["headers"]["authorization"]][-1]
    assert req["path"] == "/model/amazon.nova-lite-v1%3A0/converse"
    n = int(req["headers"]["authorization"].split("Credential=ASIACONTAINER")[1].split("/")[0])
    check_sigv4(req, "ASIACONTAINER%d" % n, "container-secret-%d" % n, "container-token-%d" % n,
                "127.0.0.1:%d" % fake.port)


def test_web_identity_profile_goes_through_sts(world):
    port, fake, _ = world
    chat(port, "profile")
    sts = [r for r in fake.find("/sts") if b"AssumeRoleWithWebIdentity" in r["body"]]
    assert sts and b"WebIdentityToken=eks-projected-jwt" in sts[0]["body"]
    assert b"role%2Ffrom-profile" in sts[0]["body"]
    req = [r for r in fake.find("/model/") if "ASIAWEBID" in r["headers"]["authorization"]][-1]
    check_sigv4(req, "ASIAWEBID", "ASIAWEBID-secret", "ASIAWEBID-token", "127.0.0.1:%d" % fake.port)


def test_role_arn_is_assumed_with_the_profile_keys(world):
    port, fake, _ = world
    chat(port, "role")
    sts = [r for r in fake.find("/sts") if b"Action=AssumeRole&" in r["body"]]
    assert sts and b"RoleSessionName=busbar" in sts[0]["body"]
    assert b"role%2Fassumed" in sts[0]["body"]
    # STS itself was called with the base profile's keys.
    assert "Credential=AKIDBASE/" in sts[0]["headers"]["authorization"]
    req = [r for r in fake.find("/model/") if "ASIAROLE" in r["headers"]["authorization"]][-1]
    check_sigv4(req, "ASIAROLE", "ASIAROLE-secret", "ASIAROLE-token", "127.0.0.1:%d" % fake.port)


def test_vertex_gemini_path_and_bearer_token(world):
    port, fake, _ = world
    chat(port, "gem")
    req = fake.find("/v1/projects/")[-1]
    assert req["path"] == ("/v1/projects/proj-test/locations/us-central1/publishers/google/models/"
                           "gemini-2.5-flash:generateContent")
    assert req["headers"]["authorization"].startswith("Bearer ya29.fake-")
    assert "x-goog-api-key" not in req["headers"]
    assert json.loads(req["body"])["contents"][0]["parts"][0]["text"] == "hi"


def test_vertex_claude_raw_predict_same_protocol(world):
    port, fake, _ = world
    c = anthropic.Anthropic(base_url="http://127.0.0.1:%d" % port, api_key="x", max_retries=0, timeout=20)
    r = c.messages.create(model="claude", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert r.content[0].text == "hello from upstream"
    req = fake.find("/v1/projects/proj-test/locations/europe-west1/publishers/anthropic/")[-1]
    assert req["path"].endswith("/models/claude-sonnet-4-5@20250929:rawPredict")
    body = json.loads(req["body"])
    assert "model" not in body and body["anthropic_version"] == "vertex-2023-10-16"
    assert body["max_tokens"] == 10
    assert req["headers"]["authorization"].startswith("Bearer ya29.fake-")
    assert "anthropic-version" not in req["headers"] and "x-api-key" not in req["headers"]


def test_vertex_streams(world):
    port, fake, _ = world
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0, timeout=20)
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="gem", stream=True, messages=[{"role": "user", "content": "hi"}]) if ch.choices)
    assert text == "hello stream"
    assert fake.find("/v1/projects/")[-1]["path"] == (
        "/v1/projects/proj-test/locations/us-central1/publishers/google/models/"
        "gemini-2.5-flash:streamGenerateContent?alt=sse")
    a = anthropic.Anthropic(base_url="http://127.0.0.1:%d" % port, api_key="x", max_retries=0, timeout=20)
    with a.messages.stream(model="claude", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == "hello stream"
    req = fake.find("/v1/projects/")[-1]
    assert req["path"].endswith("/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict")
    body = json.loads(req["body"])
    assert body["stream"] is True and "model" not in body and body["anthropic_version"] == "vertex-2023-10-16"
    # Claude on Vertex from an OpenAI caller: translated, then the body reshaped for Vertex.
    r = c.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "hello from upstream"
    assert "model" not in json.loads(fake.find("/v1/projects/")[-1]["body"])


def test_tokens_are_refreshed_before_expiry_off_the_hot_path(world):
    # The fake's tokens live 3 s: the refresher renews at half-life, so a later request carries a
    # newer token while no request waited for the token endpoint.
    port, fake, _ = world
    chat(port, "gem")
    first = fake.find("/v1/projects/")[-1]["headers"]["authorization"]
    time.sleep(3.0)
    t0 = time.monotonic()
    chat(port, "gem")
    assert time.monotonic() - t0 < 2.0
    later = fake.find("/v1/projects/")[-1]["headers"]["authorization"]
    assert later != first and fake.tokens_issued >= 3


def test_web_identity_from_eks_environment(tmp_path):
    fake = Fake()
    try:
        (tmp_path / "token").write_text("irsa-jwt")
        port = free_port()
        config = f"""
listen: "127.0.0.1:{port}"
providers:
  bed: {{protocol: bedrock, base_url: "{fake.url}", auth: sigv4, region: us-east-1}}
models:
  m: {{provider: bed, upstream_model: "amazon.nova-lite-v1:0"}}
"""
        port, proc = start_gateway(tmp_path, config, gateway_env({
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token"),
            "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/irsa",
            "AWS_ENDPOINT_URL_STS": fake.url + "/sts"}))
        try:
            chat(port, "m")
        finally:
            stop(proc)
        sts = fake.find("/sts")[0]
        assert b"WebIdentityToken=irsa-jwt" in sts["body"] and b"role%2Firsa" in sts["body"]
        check_sigv4(fake.find("/model/")[-1], "ASIAWEBID", "ASIAWEBID-secret", "ASIAWEBID-token",
                    "127.0.0.1:%d" % fake.port)
    finally:
        fake.close()


def test_no_credentials_fails_over_natively(tmp_path):
    # Nothing in the chain: the gateway still starts, and the lane answers a native 503.
    port = free_port()
    config = f"""
listen: "127.0.0.1:{port}"
providers:
  bed: {{protocol: bedrock, base_url: "http://127.0.0.1:{free_port()}", auth: sigv4, region: us-east-1}}
models:
  m: {{provider: bed, upstream_model: "amazon.nova-lite-v1:0"}}
"""
    port, proc = start_gateway(tmp_path, config, gateway_env({}))
    try:
        c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0, timeout=20)
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503
        assert e.value.body["message"].startswith(
            "busbar has no credentials for the upstream provider yet")
    finally:
        stop(proc)
