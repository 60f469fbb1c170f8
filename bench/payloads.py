"""Request bodies for the benchmark: one conversation, written in each of the six wire protocols.

A body is a template holding the marker @SEQ@ once, in the last user message; bench/load.lua (and the
TTFB client) put a per-request counter there, so every body sent is unique. The conversation is a
system prompt plus alternating user/assistant turns of ordinary prose (newlines, quotes and a few
non-ASCII characters, so escaping is exercised), grown until the serialised body reaches the target
size. The last user message is short and carries `#mock:tokens=16`, so the mock's answer stays small
and the measurement stays about the gateway, not about moving a long answer.
"""
from __future__ import annotations

import random

import orjson

MARK = "@SEQ@"
ANSWER_TOKENS = 16

# How each protocol is reached: path (a template on the lane/model name) and the headers an
# official SDK would send. Credentials are dummies: the mock runs without --require-auth, busbar
# replaces them with the lane's own, and the floor passes them through untouched.
PATHS = {
    "openai": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/{model}:generateContent",
    "cohere": "/v2/chat",
    "bedrock": "/model/{model}/converse",
}
STREAM_PATHS = {
    "gemini": "/v1beta/models/{model}:streamGenerateContent?alt=sse",
    "bedrock": "/model/{model}/converse-stream",
}

# busbar's lanes, one per egress protocol, all on the mock (model names are the lanes'), and the
# gateway config serving them: bench/run.py's busbar rows, and the training run of the
# profile-guided build (packaging/pgo_train.py). {port}: busbar's; {mock}: the mock's.
LANES = {"openai": "oai-model", "responses": "resp-model", "anthropic": "ant-model",
         "gemini": "gem-model", "cohere": "coh-model", "bedrock": "bed-model"}
GATEWAY_CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  m-openai:    {{protocol: openai,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
  m-responses: {{protocol: responses, base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
  m-anthropic: {{protocol: anthropic, base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
  m-gemini:    {{protocol: gemini,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
  m-cohere:    {{protocol: cohere,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
  m-bedrock:   {{protocol: bedrock,   base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_AWS}},
                region: us-east-1}}
models:
  oai-model:  {{provider: m-openai,    upstream_model: gpt-4o-mini}}
  resp-model: {{provider: m-responses, upstream_model: gpt-4.1-mini}}
  ant-model:  {{provider: m-anthropic, upstream_model: claude-haiku-4-5}}
  gem-model:  {{provider: m-gemini,    upstream_model: gemini-2.5-flash}}
  coh-model:  {{provider: m-cohere,    upstream_model: command-r}}
  bed-model:  {{provider: m-bedrock,   upstream_model: "amazon.nova-lite-v1:0"}}
advanced:
  response_headers:
    server_timing: true
"""

# The credentials GATEWAY_CONFIG's providers read from the environment (dummies for the mock), and
# the config the one-gateway tools append to it: the admin API on a free port, the access log and
# metrics off (run.py's plain busbar row).
MOCK_ENV = {"BENCH_MOCK_KEY": "sk-bench-upstream",
            "BENCH_MOCK_AWS": "AKIDBENCHEXAMPLE:benchSecretKeyExample0123456789abcdefXYZ"}
QUIET = 'admin_listen: "127.0.0.1:0"\nexport: {access: {module: access-log, settings: {path: "off"}}}\n'

_SIGV4 = ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250101/us-east-1/bedrock/aws4_request, "
          "SignedHeaders=content-type;host;x-amz-date, Signature=" + "0f" * 32)
HEADERS = {
    "openai": {"Authorization": "Bearer sk-bench"},
    "responses": {"Authorization": "Bearer sk-bench"},
    "anthropic": {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"},
    "gemini": {"x-goog-api-key": "bench"},
    "cohere": {"Authorization": "Bearer bench"},
    "bedrock": {"Authorization": _SIGV4, "X-Amz-Date": "20250101T000000Z"},
}

_WORDS = ("the gateway routes each request to a lane and translates between wire protocols while "
          "streaming tokens back to the caller; latency budgets are tight, so every copy, parse and "
          "allocation on the hot path is counted. résumé café naïve — “quoted” text, tabs\tand "
          "numbers 3.14159 42 2048 keep the encoder honest").split(" ")


def _prose(rng: random.Random, nbytes: int) -> str:
    """About nbytes of deterministic prose, in sentences, with a newline now and then."""
    out, size = [], 0
    while size < nbytes:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 18)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice(('. ', '.\n', '? ', ' "ok". '))
        out.append(sentence)
        size += len(sentence.encode())
    return "".join(out).strip()


def _conversation(target: int):
    """(system, [(role, text)], last user text) whose bodies come out near `target` bytes."""
    last = "Question %s: what does the gateway do? #mock:tokens=%d" % (MARK, ANSWER_TOKENS)
    if target <= 200:
        return None, [], "Hi %s #mock:tokens=%d" % (MARK, ANSWER_TOKENS)
    rng = random.Random(target)
    system = _prose(rng, min(600, target // 8))
    turns = []
    budget = target - len(system) - len(last) - 200
    turn = max(300, min(1400, budget // 6))
    role = "user"
    while budget > 0:
        text = _prose(rng, min(turn, budget))
        turns.append((role, text))
        budget -= len(text.encode()) + 40
        role = "assistant" if role == "user" else "user"
    if turns and turns[-1][0] == "user":
        turns.append(("assistant", _prose(rng, 120)))
    return system, turns, last


def body(proto: str, model: str, target: int, stream: bool = False) -> bytes:
    """The body template (with one @SEQ@) for `proto`, addressed to `model`, near `target` bytes."""
    system, turns, last = _conversation(target)
    convo = turns + [("user", last)]
    if proto == "openai":
        msgs = ([{"role": "system", "content": system}] if system else [])
        msgs += [{"role": r, "content": t} for r, t in convo]
        doc = {"model": model, "messages": msgs}
        if stream:
            doc["stream"] = True
    elif proto == "responses":
        doc = {"model": model}
        if system:
            doc["instructions"] = system
        doc["input"] = [{"role": r, "content": t} for r, t in convo]
        if stream:
            doc["stream"] = True
    elif proto == "anthropic":
        doc = {"model": model, "max_tokens": 256}
        if system:
            doc["system"] = system
        doc["messages"] = [{"role": r, "content": t} for r, t in convo]
        if stream:
            doc["stream"] = True
    elif proto == "gemini":
        doc = {}
        if system:
            doc["systemInstruction"] = {"parts": [{"text": system}]}
        doc["contents"] = [{"role": "model" if r == "assistant" else "user", "parts": [{"text": t}]}
                           for r, t in convo]
    elif proto == "cohere":
        msgs = ([{"role": "system", "content": system}] if system else [])
        msgs += [{"role": r, "content": t} for r, t in convo]
        doc = {"model": model, "messages": msgs}
        if stream:
            doc["stream"] = True
    elif proto == "bedrock":
        doc = {}
        if system:
            doc["system"] = [{"text": system}]
        doc["messages"] = [{"role": r, "content": [{"text": t}]} for r, t in convo]
    else:
        raise ValueError("unknown protocol %r" % proto)
    data = orjson.dumps(doc)
    assert data.count(MARK.encode()) == 1
    return data


def path(proto: str, model: str, stream: bool = False) -> str:
    table = STREAM_PATHS if stream and proto in STREAM_PATHS else PATHS
    return table[proto].format(model=model)


def headers(proto: str) -> dict:
    return dict({"Content-Type": "application/json"}, **HEADERS[proto])
