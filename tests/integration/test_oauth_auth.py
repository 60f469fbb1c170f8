"""The Rust grammar's self-minting OAuth auth styles, through the real server against a fake token
endpoint and upstream (tests/integration/fakes.py): `auth: jwt-bearer` (a service account in
api_key, its signed assertion traded for a bearer; `scope`, `subject`) with `path_base` (Gemini
and Claude on Vertex AI as the Rust project's providers.yaml spells them), and `auth:
oauth-client-credentials` (CLIENT_ID:CLIENT_SECRET at `token_url` for a bearer of `scope`)."""
from __future__ import annotations

import json
import urllib.parse

import pytest

from tests.conftest import start_gateway, stop
from tests.integration.fakes import Fake, b64url_decode, service_account
from tests.integration.gov_helpers import post

GOOGLE = "/v1/projects/proj-test/locations/us-central1/publishers/google/models"
CLAUDE = "/v1/projects/proj-test/locations/us-central1/publishers/anthropic/models"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oauth")
    fake = Fake()
    key = service_account(tmp / "sa.json", token_uri=fake.url + "/token")
    fake.public_key = key.public_key()

    def client_credentials(req):
        form = dict(urllib.parse.parse_qsl(req["body"].decode()))
        if form != {"grant_type": "client_credentials", "client_id": "my-app",
                    "client_secret": "s3cret:with-colon", "scope": "https://cog.example/.default"}:
            return 401, "application/json", b'{"error":"invalid_client"}'
        return 200, "application/json", b'{"access_token":"entra-token","expires_in":"3599"}'
    fake.routes.append((lambda m, p: p == "/entra/token", client_credentials))
    text = """
listen: "127.0.0.1:{port}"
providers:
  gemini-vertex: {protocol: gemini, base_url: "FAKE", path_base: GOOGLE, auth: jwt-bearer,
                  api_key: {file: sa.json}}
  claude-vertex: {protocol: anthropic, base_url: "FAKE", path_base: CLAUDE, auth: jwt-bearer,
                  api_key: {env: SA_PATH}, subject: someone@example.com}
  azure-entra: {protocol: openai, base_url: "FAKE", path: /openai/deployments/d/chat/completions,
                auth: oauth-client-credentials, api_key: {env: ENTRA_CREDS},
                token_url: "FAKE/entra/token", scope: "https://cog.example/.default"}
models:
  gem: {provider: gemini-vertex, upstream_model: gemini-2.5-flash}
  claude: {provider: claude-vertex, upstream_model: "claude-sonnet-4-5@20250929"}
  gpt: {provider: azure-entra, upstream_model: gpt-4o}
""".replace("FAKE", fake.url).replace("GOOGLE", GOOGLE).replace("CLAUDE", CLAUDE)
    g = start_gateway(tmp, text, 1, {"SA_PATH": str(tmp / "sa.json"),
                                     "ENTRA_CREDS": "my-app:s3cret:with-colon"})
    yield g, fake
    stop(g.proc)
    fake.close()


def _chat(g, model):
    s, data, _ = post(g, "/v1/chat/completions", {"model": model, "messages": [
        {"role": "user", "content": "hi"}]}, {"authorization": "Bearer x"})
    assert s == 200, data
    assert json.loads(data)["choices"][0]["message"]["content"] == "hello from upstream"


def _claims(fake, n=-1):
    form = dict(urllib.parse.parse_qsl(fake.find("/token")[n]["body"].decode()))
    return json.loads(b64url_decode(form["assertion"].split(".")[1]))


def test_jwt_bearer_mints_a_bearer_from_the_service_account(world):
    g, fake = world
    _chat(g, "gem")
    req = fake.find(GOOGLE)[-1]
    assert req["path"] == GOOGLE + "/gemini-2.5-flash:generateContent"
    assert req["headers"]["authorization"].startswith("Bearer ya29.fake-")
    assert "x-goog-api-key" not in req["headers"]
    assert "sa.json" not in json.dumps(req["headers"]) and "PRIVATE" not in json.dumps(req["headers"])


def test_jwt_bearer_subject_is_the_sub_claim_only_when_set(world):
    g, fake = world
    _chat(g, "claude")
    req = fake.find(CLAUDE)[-1]
    assert req["path"] == CLAUDE + "/claude-sonnet-4-5@20250929:rawPredict"
    assert req["headers"]["authorization"].startswith("Bearer ya29.fake-")
    subs = {c.get("sub") for c in (_claims(fake, i) for i in range(len(fake.find("/token"))))}
    # one account with a subject (claude-vertex), one without (gemini-vertex): no sub claim at all
    assert subs == {"someone@example.com", None}


def test_client_credentials_trade_the_pair_for_a_bearer(world):
    g, fake = world
    _chat(g, "gpt")
    req = fake.find("/openai/deployments/d/chat/completions")[-1]
    assert req["headers"]["authorization"] == "Bearer entra-token"
    assert "s3cret" not in json.dumps(req["headers"])
    assert len(fake.find("/entra/token")) >= 1


def test_what_an_oauth_provider_needs_is_checked():
    from busbar.config import ConfigError, load
    key = "models:\n  m: {provider: p}\nproviders:\n  p: "
    env = {"K": "id:secret", "J": "not json"}
    cases = {
        "{protocol: openai, base_url: \"https://e.example\", auth: oauth-client-credentials, "
        "api_key: {env: K}, scope: s}":
            "providers.p.auth: auth 'oauth-client-credentials' needs token_url",
        "{protocol: openai, base_url: \"https://e.example\", auth: oauth-client-credentials, "
        "api_key: {env: K}, token_url: \"https://t.example/t\"}":
            "providers.p.auth: auth 'oauth-client-credentials' needs scope",
        "{protocol: openai, base_url: \"https://e.example\", auth: oauth-client-credentials, "
        "api_key: {env: K}, token_url: \"http://t.example/t\", scope: s}":
            "providers.p.token_url: ",
        "{protocol: gemini, base_url: \"https://e.example\", auth: jwt-bearer, api_key: {env: J}}":
            "providers.p.api_key: auth 'jwt-bearer': the api_key is neither a service account's "
            "JSON key nor a readable key file",
    }
    for provider, want in cases.items():
        with pytest.raises(ConfigError) as info:
            load(text=key + provider + "\n", env=env)
        assert any(p.startswith(want) for p in info.value.problems), (provider, info.value.problems)
    c = load(text=key + "{protocol: openai, base_url: \"https://e.example\", api_key: {env: K}, "
             "subject: x}\n", env=env)
    assert "providers.p.subject: has no effect with auth bearer (it is for auth: jwt-bearer)" \
        in c.warnings
