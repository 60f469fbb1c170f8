"""Embeddings through the real server with the official SDKs: openai `embeddings.create` (float and
base64), google-genai `embed_content`, cohere `ClientV2.embed`, boto3 `invoke_model` (Titan and
Cohere-on-Bedrock bodies), each against lanes of all four protocols (and both Bedrock dialects).
The upstream checks what it receives (path, auth, SigV4, the body's shape) and answers vectors
derived from each input, so every translation is checked end to end. Also: routing by operation in
pools, the native 404 for an operation no lane serves, failover, and translation errors."""
import json
import urllib.parse

import boto3
import cohere
import openai
import pytest
from botocore.config import Config as BotoConfig
from google import genai
from google.genai import types

from cbusbar.embed import b64_of
from tests.conftest import free_port, stop, start_gateway
from tests.integration.fakes import Fake


def vec(text):
    # Exactly representable in float32, so base64 round trips compare equal.
    return [float(len(text)), 0.5, -0.25]


def _json(status, obj):
    return status, "application/json", json.dumps(obj).encode()


def upstream(req):
    """The four embedding APIs, each refusing a request without its own auth."""
    path, h = req["path"], req["headers"]
    body = json.loads(req["body"])
    if path == "/v1/embeddings":
        if h.get("authorization") != "Bearer sk-test-key":
            return _json(401, {"error": {"message": "bad key"}})
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        b64 = body.get("encoding_format") == "base64"
        return _json(200, {"object": "list", "model": body["model"],
                           "data": [{"object": "embedding", "index": i,
                                     "embedding": b64_of(vec(t)) if b64 else vec(t)} for i, t in enumerate(texts)],
                           "usage": {"prompt_tokens": 7, "total_tokens": 7}})
    if path == "/v2/embed":
        if h.get("authorization") != "Bearer sk-test-key" or not body.get("input_type"):
            return _json(400, {"message": "invalid request: input_type is required"})
        by_type = {"float": [vec(t) for t in body["texts"]], "base64": [b64_of(vec(t)) for t in body["texts"]]}
        return _json(200, {"id": "e1", "embeddings": {t: by_type[t] for t in body["embedding_types"]},
                           "texts": body["texts"], "response_type": "embeddings_by_type",
                           "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 5}}})
    if path.endswith(":batchEmbedContents"):
        model = "models/" + path.split("/models/")[1].split(":")[0]
        if h.get("x-goog-api-key") != "sk-test-key" or any(r["model"] != model for r in body["requests"]):
            return _json(400, {"error": {"code": 400, "message": "model mismatch", "status": "INVALID_ARGUMENT"}})
        return _json(200, {"embeddings": [{"values": vec(r["content"]["parts"][0]["text"])}
                                          for r in body["requests"]]})
    if path.startswith("/model/") and path.endswith("/invoke"):
        if not h.get("authorization", "").startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"):
            return _json(403, {"message": "missing signature"})
        model = urllib.parse.unquote(path[len("/model/"):-len("/invoke")])
        if model.startswith("cohere."):
            if "texts" not in body:
                return _json(400, {"message": "Malformed input request: texts"})
            return _json(200, {"id": "b1", "embeddings": [vec(t) for t in body["texts"]],
                               "texts": body["texts"], "response_type": "embeddings_floats"})
        if "inputText" not in body:
            return _json(400, {"message": "Malformed input request: inputText"})
        return _json(200, {"embedding": vec(body["inputText"]), "inputTextTokenCount": 3})
    return _json(404, {"error": {"message": "no route"}})


LANES = ["oai-emb", "gem-emb", "coh-emb", "titan-emb", "bcoh-emb"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embed")
    fake = Fake()
    fake.routes.append((lambda m, p: m == "POST", upstream))
    port = free_port()
    u = fake.url
    gw = start_gateway(tmp, f"""
listen: "127.0.0.1:{port}"
providers:
  e-openai:  {{protocol: openai,  base_url: "{u}", api_key: {{env: MOCK_KEY}}}}
  e-gemini:  {{protocol: gemini,  base_url: "{u}", api_key: {{env: MOCK_KEY}}}}
  e-cohere:  {{protocol: cohere,  base_url: "{u}", api_key: {{env: MOCK_KEY}}}}
  e-bedrock: {{protocol: bedrock, base_url: "{u}", api_key: {{env: MOCK_AWS}}, region: us-east-1}}
  dead:      {{protocol: openai,  base_url: "http://127.0.0.1:{free_port()}", api_key: {{env: MOCK_KEY}}}}
models:
  oai-emb:   {{provider: e-openai, upstream_model: text-embedding-3-small}}
  gem-emb:   {{provider: e-gemini, upstream_model: gemini-embedding-001}}
  coh-emb:   {{provider: e-cohere, upstream_model: embed-v4.0}}
  titan-emb: {{provider: e-bedrock, upstream_model: "amazon.titan-embed-text-v2:0"}}
  bcoh-emb:  {{provider: e-bedrock, upstream_model: "cohere.embed-english-v3"}}
  dead-emb:  {{provider: dead, upstream_model: text-embedding-3-large}}
  chat-only: {{provider: e-openai, upstream_model: gpt-4o-mini}}
pools:
  mixed:     {{members: [{{model: chat-only, weight: 100}}, {{model: oai-emb, weight: 1}}]}}
  chat-pool: {{members: [{{model: chat-only}}]}}
  failover:  {{members: [{{model: dead-emb, weight: 100}}, {{model: coh-emb, weight: 1}}]}}
""", port=port)
    yield "http://127.0.0.1:%d" % port, fake
    stop(gw.proc)
    fake.close()


def texts_for(lane):
    return ["hello"] if lane == "titan-emb" else ["hello", "busbar!"]


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_openai_sdk(gw, lane, fmt):
    url, _ = gw
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    texts = texts_for(lane)
    if fmt == "base64":
        r = c.embeddings.create(model=lane, input=texts)     # the SDK asks for base64 and decodes it
    else:
        r = c.embeddings.create(model=lane, input=texts, encoding_format="float")
    assert [d.embedding for d in r.data] == [vec(t) for t in texts]
    assert [d.index for d in r.data] == list(range(len(texts)))


@pytest.mark.parametrize("lane", LANES)
def test_google_genai_sdk(gw, lane):
    url, _ = gw
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=url))
    texts = texts_for(lane)
    r = g.models.embed_content(model=lane, contents=texts,
                               config=types.EmbedContentConfig(task_type="RETRIEVAL_QUERY"))
    assert [e.values for e in r.embeddings] == [vec(t) for t in texts]


@pytest.mark.parametrize("lane", LANES)
def test_cohere_sdk(gw, lane):
    url, _ = gw
    c = cohere.ClientV2(api_key="x", base_url=url, timeout=20)
    texts = texts_for(lane)
    r = c.embed(model=lane, texts=texts, input_type="search_query", embedding_types=["float", "base64"])
    assert r.embeddings.float_ == [vec(t) for t in texts]
    assert r.embeddings.base64 == [b64_of(vec(t)) for t in texts]


def bedrock(url):
    return boto3.client("bedrock-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="AKIDCLIENT", aws_secret_access_key="s",
                        config=BotoConfig(retries={"max_attempts": 1}, read_timeout=20))


@pytest.mark.parametrize("lane", LANES)
def test_boto3_titan_body(gw, lane):
    url, _ = gw
    r = bedrock(url).invoke_model(modelId=lane, body=json.dumps({"inputText": "hello", "dimensions": 256}),
                                  contentType="application/json", accept="application/json")
    out = json.loads(r["body"].read())
    assert out["embedding"] == vec("hello")


@pytest.mark.parametrize("lane", [l for l in LANES if l != "titan-emb"])
def test_boto3_cohere_body(gw, lane):
    url, _ = gw
    r = bedrock(url).invoke_model(modelId=lane, body=json.dumps({"texts": ["hello", "busbar!"],
                                                                  "input_type": "search_document"}))
    out = json.loads(r["body"].read())
    assert out["embeddings"] == [vec("hello"), vec("busbar!")]


def test_same_protocol_is_spliced_bytes(gw):
    url, fake = gw
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    c.embeddings.create(model="oai-emb", input="same", encoding_format="float", user="u-1")
    sent = json.loads(fake.find("/v1/embeddings")[-1]["body"])
    assert sent == {"model": "text-embedding-3-small", "input": "same", "encoding_format": "float", "user": "u-1"}


def test_pool_routes_by_operation(gw):
    url, fake = gw
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    for _ in range(3):   # chat-only has weight 100 but does not embed
        assert c.embeddings.create(model="mixed", input="x", encoding_format="float").data[0].embedding == vec("x")
    assert json.loads(fake.find("/v1/embeddings")[-1]["body"])["model"] == "text-embedding-3-small"
    with pytest.raises(openai.NotFoundError) as e:
        c.embeddings.create(model="chat-pool", input="x")
    assert e.value.body["message"] == "This endpoint does not support that operation."
    with pytest.raises(openai.NotFoundError) as e:      # an embedding model does not chat
        c.chat.completions.create(model="oai-emb", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["message"] == "This endpoint does not support that operation."


def test_failover_to_the_next_embedding_lane(gw):
    url, _ = gw
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    r = c.embeddings.create(model="failover", input=["a", "bb"], encoding_format="float")
    assert [d.embedding for d in r.data] == [vec("a"), vec("bb")]


def test_errors_in_the_callers_shape(gw):
    url, _ = gw
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    with pytest.raises(openai.BadRequestError) as e:     # Titan takes one text per call
        c.embeddings.create(model="titan-emb", input=["a", "b"])
    assert "one text per request" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="nope", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model="oai-emb", input=[[1, 2, 3]])
    assert "only text inputs" in e.value.body["message"]
