"""Config keys for the providers users run on: Azure OpenAI, Vertex AI (service-account
credentials, token_url), Bedrock credential sources (profile, role_arn, the default chain), and
models' `operations`. Every problem names its key path."""
from __future__ import annotations

import textwrap

import pytest

from busbar.config import ConfigError, load
from tests.integration.fakes import service_account


def cfg(text, env=None, tmp=None):
    if tmp is not None:
        (tmp / "config.yaml").write_text(textwrap.dedent(text))
        return load(str(tmp / "config.yaml"), env=env or {"K": "k"})
    return load(text=textwrap.dedent(text), env=env or {"K": "k", "AWS": "AK:SK"})


def problems(text, env=None, tmp=None):
    with pytest.raises(ConfigError) as info:
        cfg(text, env, tmp)
    return info.value.problems


def test_azure_deployment_and_v1():
    c = cfg("""
        providers:
          az: {catalog: azure-openai, base_url: "https://r1.openai.azure.com", api_key: {env: K},
               azure: {deployment: gpt4o-prod, api_version: 2024-10-21}}
          az1: {protocol: openai, base_url: "https://r1.openai.azure.com", api_key: {env: K}, azure: {}}
          azd: {protocol: openai, base_url: "https://r1.openai.azure.com", api_key: {env: K}, azure: {deployment: d}}
        models: {}
    """)
    az = c.providers["az"]
    assert (az.auth, az.azure, az.azure_deployment, az.azure_api_version) == (
        "api-key", True, "gpt4o-prod", "2024-10-21")
    assert c.providers["az1"].auth == "api-key" and c.providers["az1"].azure_deployment is None
    assert c.providers["azd"].azure_api_version == "2024-10-21"   # the GA default
    errs = problems("""
        providers:
          a: {catalog: azure-openai, api_key: {env: K}}
          b: {protocol: anthropic, base_url: "https://x.example.com", api_key: {env: K}, azure: {deployment: d}}
          c: {protocol: openai, base_url: "https://x.example.com", api_key: {env: K}, azure: {deploy: d}}
          d: {protocol: openai, base_url: "https://x.example.com", api_key: {env: K}, azure: {deployment: "a/b"}}
        models: {}
    """)
    assert "providers.a: set base_url to your Azure OpenAI resource (https://<resource>.openai.azure.com)" in errs
    assert "providers.b.azure: azure applies only to protocol openai or responses" in errs
    assert "providers.c.azure.deploy: unknown key (did you mean 'deployment'?)" in errs
    assert "providers.d.azure.deployment: expected letters, digits, '.', '_' or '-'" in errs


def test_vertex_with_service_account(tmp_path):
    service_account(tmp_path / "sa.json")
    c = cfg("""
        providers:
          g: {catalog: vertex, vertex: {project: proj-test, location: us-central1}, credentials: {file: sa.json}}
          a: {catalog: vertex-anthropic, vertex: {project: proj-test, location: global}, credentials: {file: sa.json},
              token_url: "http://127.0.0.1:9/token"}
        models: {}
    """, tmp=tmp_path)
    g, a = c.providers["g"], c.providers["a"]
    assert g.base_url == "https://us-central1-aiplatform.googleapis.com" and g.auth == "oauth2"
    assert g.token_url == "https://oauth2.googleapis.com/token"
    assert a.base_url == "https://aiplatform.googleapis.com" and a.token_url == "http://127.0.0.1:9/token"
    assert "PRIVATE KEY" not in repr(g) and "<redacted>" in repr(g)


def test_vertex_problems(tmp_path):
    service_account(tmp_path / "sa.json")
    (tmp_path / "bad.json").write_text('{"type": "authorized_user"}')
    errs = problems("""
        providers:
          a: {catalog: vertex, credentials: {file: sa.json}}
          b: {protocol: gemini, vertex: {project: proj-test}, credentials: {file: bad.json}}
          c: {protocol: openai, base_url: "https://x.example.com", vertex: {project: p-1234, location: x1},
              api_key: {env: K}}
          d: {catalog: vertex, vertex: {project: proj-test, location: us-central1}, credentials: {file: sa.json},
              token_url: "http://169.254.169.254/token"}
          e: {catalog: vertex, vertex: {project: proj-test, location: us-central1}, credentials: {file: nope.json}}
        models: {}
    """, tmp=tmp_path)
    assert "providers.a: a Vertex AI provider needs vertex: {project: P, location: L}" in errs
    assert "providers.b.vertex: missing required key 'location'" in errs
    assert 'providers.b.credentials: expected a service-account key file ("type": "service_account")' in errs
    assert "providers.c.vertex: vertex applies only to protocol gemini or anthropic" in errs
    assert any(e.startswith("providers.d.token_url: host 169.254.169.254 is a cloud metadata endpoint") for e in errs)
    assert any(e.startswith("providers.e.credentials: cannot read credentials file nope.json") for e in errs)


def test_bedrock_credential_sources():
    c = cfg("""
        providers:
          chain: {catalog: bedrock}
          prof: {catalog: bedrock, profile: prod}
          role: {catalog: bedrock, role_arn: "arn:aws:iam::123456789012:role/bedrock"}
          local: {protocol: bedrock, base_url: "http://127.0.0.1:9", region: us-east-1}
          local-signed: {protocol: bedrock, base_url: "http://127.0.0.1:9", region: us-east-1, auth: sigv4}
          inv: {catalog: bedrock-invoke, api_key: {env: AWS}}
        models: {}
    """)
    p = c.providers
    assert (p["chain"].auth, p["chain"].api_key, p["chain"].region) == ("sigv4", None, "us-east-1")
    assert p["prof"].profile == "prod" and p["role"].role_arn.endswith("role/bedrock")
    assert p["local"].auth == "none"                 # the keyless mock, as before
    assert p["local-signed"].auth == "sigv4"
    assert (p["inv"].protocol, p["inv"].auth) == ("bedrock-invoke", "sigv4")
    errs = problems("""
        providers:
          a: {catalog: bedrock, role_arn: "arn:aws:iam::12:role/x"}
          b: {catalog: openai, api_key: {env: K}, profile: prod}
          c: {catalog: bedrock, api_key: {env: AWS}, profile: prod}
        models: {}
    """)
    assert "providers.a.role_arn: expected an IAM role ARN such as arn:aws:iam::123456789012:role/name" in errs
    assert "providers.b.profile: applies only to protocol bedrock or bedrock-invoke" in errs
    assert "providers.c.api_key: give either api_key or profile, not both" in errs


def test_model_operations():
    c = cfg("""
        providers:
          openai: {api_key: {env: K}}
        models:
          gpt: {provider: openai}
          emb: {provider: openai, upstream_model: text-embedding-3-small}
          both: {provider: openai, operations: [chat, embeddings]}
        """)
    assert c.models["gpt"].operations == ("chat",)
    assert c.models["emb"].operations == ("embeddings",)
    assert c.models["both"].operations == ("chat", "embeddings")
    errs = problems("""
        providers:
          openai: {api_key: {env: K}}
        models:
          a: {provider: openai, operations: [embedding]}
          b: {provider: openai, operations: chat}
        """)
    assert "models.a.operations[0]: unknown operation 'embedding' (did you mean 'embeddings'?)" in errs
    assert "models.b.operations: expected a non-empty list such as [chat] or [embeddings], got a string" in errs
