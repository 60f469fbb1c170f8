"""The provider URL schemes the Egress applies to a codec's path: Azure (deployments, v1), Vertex
(Gemini publisher models; Claude's rawPredict with the body reshaped), plain providers unchanged."""
import json

from busbar.config.schema import Provider
from busbar.engine.egress import Egress


def provider(**kw):
    base = dict(name="p", protocol="openai", base_url="https://h", scheme="https", host="h", port=443,
                path_prefix="", api_key="k", auth="bearer")
    base.update(kw)
    return Provider(**base)


def test_plain_path_unchanged():
    assert Egress(provider()).provider_path("/v1/chat/completions") == "/v1/chat/completions"
    assert (Egress(provider(path_prefix="/openai")).provider_path("/v1/chat/completions")
            == "/openai/v1/chat/completions")


def test_a_path_override_replaces_the_codecs_path_after_the_prefix():
    # the catalog's `path` (zai-api, deepinfra, ...): static, whatever the codec asks for
    eg = Egress(provider(path_prefix="/api/paas/v4", path="/chat/completions"))
    assert eg.provider_path("/v1/chat/completions") == "/api/paas/v4/chat/completions"
    assert eg.request("/v1/chat/completions", b"{}", True).startswith(
        b"POST /api/paas/v4/chat/completions HTTP/1.1\r\n")
    q = Egress(provider(path_prefix="/openai/deployments/d", path="/chat/completions?api-version=1"))
    assert q.provider_path("/v1/chat/completions") == "/openai/deployments/d/chat/completions?api-version=1"


def test_azure_paths():
    dep = Egress(provider(auth="api-key", azure=True, azure_deployment="prod 1", azure_api_version="2024-10-21"))
    assert dep.provider_path("/v1/chat/completions") == (
        "/openai/deployments/prod%201/chat/completions?api-version=2024-10-21")
    assert dep.provider_path("/v1/embeddings") == "/openai/deployments/prod%201/embeddings?api-version=2024-10-21"
    v1 = Egress(provider(auth="api-key", azure=True))
    assert v1.provider_path("/v1/responses") == "/openai/v1/responses"
    pre = Egress(provider(auth="api-key", azure=True, azure_api_version="preview"))
    assert pre.provider_path("/v1/chat/completions") == "/openai/v1/chat/completions?api-version=preview"
    req = dep.request("/v1/chat/completions", b"{}", False)
    assert b"\r\napi-key: k\r\n" in req and b"Authorization" not in req


def test_vertex_gemini_path():
    eg = Egress(provider(protocol="gemini", auth="x-goog-api-key", vertex_project="pr", vertex_location="us-central1"))
    assert eg.provider_path("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse") == (
        "/v1/projects/pr/locations/us-central1/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse")


def test_vertex_claude_body_and_path():
    eg = Egress(provider(protocol="anthropic", auth="x-api-key", vertex_project="pr", vertex_location="global"))
    raw = eg.request("/v1/messages", b'{"model":"claude-x@2025","max_tokens":5,"messages":[]}', True)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/projects/pr/locations/global/publishers/anthropic/models/"
                           b"claude-x@2025:streamRawPredict ")
    assert json.loads(body) == {"max_tokens": 5, "messages": [], "anthropic_version": "vertex-2023-10-16"}
    assert b"anthropic-version" not in head


def test_refreshed_token_rebuilds_the_heads_once(tmp_path):
    from tests.integration.fakes import service_account
    service_account(tmp_path / "sa.json")
    eg = Egress(provider(protocol="gemini", api_key=None, auth="oauth2", vertex_project="pr",
                         vertex_location="us-central1", gcp_service_account=(tmp_path / "sa.json").read_text()))
    assert not eg.ready
    eg.apply("tok-1")
    first = eg.request("/v1beta/models/m:generateContent", b"{}", False)
    assert eg.ready and b"Authorization: Bearer tok-1\r\n" in first
    eg.apply("tok-2")
    assert b"Authorization: Bearer tok-2\r\n" in eg.request("/v1beta/models/m:generateContent", b"{}", False)
