"""The 6×6 matrix: every ingress protocol × every egress lane × {buffered, streaming} × {plain text,
tool call round trip, image input, system prompt, max-tokens stop}, through the real gateway over
loopback, with raw HTTP. Each answer is read back in the ingress protocol's own native shape by an
independent reader below (Bedrock's eventstream through botocore's parser), and its content is
checked against what the mock echoes.
"""
from __future__ import annotations

import base64
import http.client
import json
from urllib.parse import quote

import pytest
from botocore.eventstream import EventStreamBuffer

from tests.conftest import LANES

PROTOCOLS = ["openai", "responses", "anthropic", "gemini", "cohere", "bedrock"]
CASES = ["text", "tools", "image", "system", "max_tokens"]
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001" "0d0a2db40000000049454e44ae426082")).decode()
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = "be brief"


# ------------------------------------------------------------------------------------ requests
def build(proto, model, stream, text, *, system=None, image=False, max_tokens=None, tools=False,
          history=None):
    """(path, headers, body) of a native request. history = (call_id, args) adds a completed tool
    call and its result ('sunny') after the user turn."""
    h = {"content-type": "application/json"}
    if proto == "openai":
        content = [{"type": "text", "text": text}] + (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}}] if image else [])
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": content if image else text}]
        if history:
            cid, args = history
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": cid, "content": "sunny"}]
        body = {"model": model, "messages": msgs, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if max_tokens:
            body["max_tokens"] = max_tokens
        if tools:
            body["tools"] = [{"type": "function", "function": {
                "name": "get_weather", "description": "weather", "parameters": SCHEMA}}]
        return "/v1/chat/completions", h, body
    if proto == "responses":
        content = [{"type": "input_text", "text": text}] + (
            [{"type": "input_image", "image_url": "data:image/png;base64," + PNG}] if image else [])
        items = [{"role": "user", "content": content}]
        if history:
            cid, args = history
            items += [{"type": "function_call", "call_id": cid, "name": "get_weather", "arguments": json.dumps(args)},
                      {"type": "function_call_output", "call_id": cid, "output": "sunny"}]
        body = {"model": model, "input": items, "stream": stream}
        if system:
            body["instructions"] = system
        if max_tokens:
            body["max_output_tokens"] = max_tokens
        if tools:
            body["tools"] = [{"type": "function", "name": "get_weather", "description": "weather",
                              "parameters": SCHEMA}]
        return "/v1/responses", h, body
    if proto == "anthropic":
        h["anthropic-version"] = "2023-06-01"
        content = [{"type": "text", "text": text}] + (
            [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}] if image else [])
        msgs = [{"role": "user", "content": content}]
        if history:
            cid, args = history
            msgs += [{"role": "assistant",
                      "content": [{"type": "tool_use", "id": cid, "name": "get_weather", "input": args}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": "sunny"}]}]
        body = {"model": model, "messages": msgs, "max_tokens": max_tokens or 200, "stream": stream}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [{"name": "get_weather", "description": "weather", "input_schema": SCHEMA}]
        return "/v1/messages", h, body
    if proto == "gemini":
        h["x-goog-api-key"] = "k"
        parts = [{"text": text}] + ([{"inlineData": {"mimeType": "image/png", "data": PNG}}] if image else [])
        contents = [{"role": "user", "parts": parts}]
        if history:
            cid, args = history
            contents += [{"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": args}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": "get_weather",
                                                                           "response": {"result": "sunny"}}}]}]
        body = {"contents": contents, "generationConfig": {}}
        if system:
            body["systemInstruction"] = {"role": "user", "parts": [{"text": system}]}
        if max_tokens:
            body["generationConfig"]["maxOutputTokens"] = max_tokens
        if tools:
            body["tools"] = [{"functionDeclarations": [{"name": "get_weather", "description": "weather",
                                                        "parameters": SCHEMA}]}]
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return "/v1beta/models/%s:%s" % (model, action), h, body
    if proto == "cohere":
        content = [{"type": "text", "text": text}] + (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}}] if image else [])
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": content if image else text}]
        if history:
            cid, args = history
            msgs += [{"role": "assistant", "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": cid, "content": "sunny"}]
        body = {"model": model, "messages": msgs, "stream": stream}
        if max_tokens:
            body["max_tokens"] = max_tokens
        if tools:
            body["tools"] = [{"type": "function", "function": {
                "name": "get_weather", "description": "weather", "parameters": SCHEMA}}]
        return "/v2/chat", h, body
    if proto == "bedrock":
        content = [{"text": text}] + (
            [{"image": {"format": "png", "source": {"bytes": PNG}}}] if image else [])
        msgs = [{"role": "user", "content": content}]
        if history:
            cid, args = history
            msgs += [{"role": "assistant",
                      "content": [{"toolUse": {"toolUseId": cid, "name": "get_weather", "input": args}}]},
                     {"role": "user", "content": [{"toolResult": {"toolUseId": cid, "content": [{"text": "sunny"}]}}]}]
        body = {"messages": msgs}
        if system:
            body["system"] = [{"text": system}]
        if max_tokens:
            body["inferenceConfig"] = {"maxTokens": max_tokens}
        if tools:
            body["toolConfig"] = {"tools": [{"toolSpec": {"name": "get_weather", "description": "weather",
                                                          "inputSchema": {"json": SCHEMA}}}]}
        return "/model/%s/%s" % (quote(model, safe=""), "converse-stream" if stream else "converse"), h, body
    raise AssertionError(proto)


# ------------------------------------------------------------------------------------ answers
class Answer:
    def __init__(self):
        self.text = ""
        self.calls = []      # [(id, name, args dict)]
        self.stop = None     # end | max | tool

    def __repr__(self):
        return "Answer(%r, %r, %r)" % (self.text, self.calls, self.stop)


def _sse(raw):
    out = []
    for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        ev, data = None, []
        for line in frame.split(b"\n"):
            if line.startswith(b"event:"):
                ev = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].strip())
        if data:
            out.append((ev, b"\n".join(data)))
    return out


def read_buffered(proto, doc):
    a = Answer()
    if proto == "openai":
        m = doc["choices"][0]["message"]
        a.text = m.get("content") or ""
        a.calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                   for c in m.get("tool_calls") or []]
        a.stop = {"stop": "end", "length": "max", "tool_calls": "tool"}[doc["choices"][0]["finish_reason"]]
    elif proto == "responses":
        for item in doc["output"]:
            if item["type"] == "message":
                a.text += "".join(p["text"] for p in item["content"] if p["type"] == "output_text")
            elif item["type"] == "function_call":
                a.calls.append((item["call_id"], item["name"], json.loads(item["arguments"])))
        if doc["status"] == "incomplete":
            assert doc["incomplete_details"]["reason"] == "max_output_tokens"
            a.stop = "max"
        else:
            assert doc["status"] == "completed"
            a.stop = "tool" if a.calls else "end"
    elif proto == "anthropic":
        assert doc["type"] == "message" and doc["id"].startswith("msg_")
        for b in doc["content"]:
            if b["type"] == "text":
                a.text += b["text"]
            elif b["type"] == "tool_use":
                a.calls.append((b["id"], b["name"], b["input"]))
        a.stop = {"end_turn": "end", "max_tokens": "max", "tool_use": "tool"}[doc["stop_reason"]]
        assert doc["usage"]["output_tokens"] > 0
    elif proto == "gemini":
        cand = doc["candidates"][0]
        for p in cand["content"]["parts"]:
            if "functionCall" in p:
                a.calls.append((p["functionCall"].get("id"), p["functionCall"]["name"], p["functionCall"]["args"]))
            elif "text" in p and not p.get("thought"):
                a.text += p["text"]
        fr = cand["finishReason"]
        a.stop = "max" if fr == "MAX_TOKENS" else ("tool" if a.calls else {"STOP": "end"}[fr])
        assert doc["usageMetadata"]["candidatesTokenCount"] > 0
    elif proto == "cohere":
        m = doc["message"]
        a.text = "".join(c["text"] for c in m.get("content") or [] if c["type"] == "text")
        a.calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                   for c in m.get("tool_calls") or []]
        a.stop = {"COMPLETE": "end", "MAX_TOKENS": "max", "TOOL_CALL": "tool"}[doc["finish_reason"]]
    elif proto == "bedrock":
        for b in doc["output"]["message"]["content"]:
            if "text" in b:
                a.text += b["text"]
            elif "toolUse" in b:
                t = b["toolUse"]
                a.calls.append((t["toolUseId"], t["name"], t["input"]))
        a.stop = {"end_turn": "end", "max_tokens": "max", "tool_use": "tool"}[doc["stopReason"]]
        assert doc["usage"]["outputTokens"] > 0
    return a


def read_stream(proto, raw):
    a = Answer()
    if proto == "bedrock":
        buf = EventStreamBuffer()
        buf.add_data(raw)
        args = {}
        for msg in buf:
            hd = msg.headers
            assert hd[":message-type"] == "event", hd
            ev = json.loads(msg.payload)
            et = hd[":event-type"]
            if et == "contentBlockStart" and "toolUse" in ev["start"]:
                t = ev["start"]["toolUse"]
                args[ev["contentBlockIndex"]] = [t["toolUseId"], t["name"], ""]
            elif et == "contentBlockDelta":
                d = ev["delta"]
                if "text" in d:
                    a.text += d["text"]
                elif "toolUse" in d:
                    args[ev["contentBlockIndex"]][2] += d["toolUse"]["input"]
            elif et == "messageStop":
                a.stop = {"end_turn": "end", "max_tokens": "max", "tool_use": "tool"}[ev["stopReason"]]
        a.calls = [(i, n, json.loads(s)) for i, n, s in args.values()]
        return a
    frames = _sse(raw)
    if proto == "openai":
        assert frames[-1][1] == b"[DONE]"
        calls = {}
        usage = None
        for _, data in frames[:-1]:
            c = json.loads(data)
            if c.get("usage"):
                usage = c["usage"]
            for ch in c["choices"]:
                d = ch["delta"]
                a.text += d.get("content") or ""
                for tc in d.get("tool_calls") or []:
                    e = calls.setdefault(tc["index"], [None, None, ""])
                    e[0] = tc.get("id") or e[0]
                    e[1] = (tc.get("function") or {}).get("name") or e[1]
                    e[2] += (tc.get("function") or {}).get("arguments") or ""
                if ch.get("finish_reason"):
                    a.stop = {"stop": "end", "length": "max", "tool_calls": "tool"}[ch["finish_reason"]]
        a.calls = [(i, n, json.loads(s)) for i, n, s in calls.values()]
        assert usage and usage["completion_tokens"] > 0
    elif proto == "responses":
        final = None
        delta = ""
        for ev, data in frames:
            d = json.loads(data)
            assert d["type"] == ev
            if ev == "response.output_text.delta":
                delta += d["delta"]
            if ev in ("response.completed", "response.incomplete"):
                final = d["response"]
        a = read_buffered("responses", final)
        assert delta == a.text
    elif proto == "anthropic":
        blocks = {}
        for ev, data in frames:
            d = json.loads(data)
            assert d["type"] == ev
            if ev == "content_block_start":
                blocks[d["index"]] = dict(d["content_block"], _json="")
            elif ev == "content_block_delta":
                b = blocks[d["index"]]
                if d["delta"]["type"] == "text_delta":
                    a.text += d["delta"]["text"]
                elif d["delta"]["type"] == "input_json_delta":
                    b["_json"] += d["delta"]["partial_json"]
            elif ev == "message_delta":
                a.stop = {"end_turn": "end", "max_tokens": "max", "tool_use": "tool"}[d["delta"]["stop_reason"]]
            elif ev == "error":
                raise AssertionError(d)
        a.calls = [(b["id"], b["name"], json.loads(b["_json"] or "{}"))
                   for b in blocks.values() if b["type"] == "tool_use"]
    elif proto == "gemini":
        fr = None
        for _, data in frames:
            c = json.loads(data)
            assert "error" not in c, c
            cand = c["candidates"][0]
            for p in (cand.get("content") or {}).get("parts") or []:
                if "functionCall" in p:
                    a.calls.append((p["functionCall"].get("id"), p["functionCall"]["name"], p["functionCall"]["args"]))
                elif "text" in p and not p.get("thought"):
                    a.text += p["text"]
            fr = cand.get("finishReason") or fr
        a.stop = "max" if fr == "MAX_TOKENS" else ("tool" if a.calls else {"STOP": "end"}[fr])
    elif proto == "cohere":
        calls = {}
        for _, data in frames:
            if data == b"[DONE]":
                continue
            d = json.loads(data)
            t = d["type"]
            if t == "content-delta":
                a.text += d["delta"]["message"]["content"]["text"]
            elif t == "tool-call-start":
                tc = d["delta"]["message"]["tool_calls"]
                calls[d["index"]] = [tc["id"], tc["function"]["name"], tc["function"].get("arguments") or ""]
            elif t == "tool-call-delta":
                calls[d["index"]][2] += d["delta"]["message"]["tool_calls"]["function"]["arguments"]
            elif t == "message-end":
                a.stop = {"COMPLETE": "end", "MAX_TOKENS": "max", "TOOL_CALL": "tool"}[d["delta"]["finish_reason"]]
        a.calls = [(i, n, json.loads(s)) for i, n, s in calls.values()]
    return a


def call(gateway, proto, stream, **kw):
    model = kw.pop("model")
    path, headers, body = build(proto, model, stream, kw.pop("text"), **kw)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=20)
    try:
        conn.request("POST", path, json.dumps(body), headers)
        r = conn.getresponse()
        raw = r.read()
        assert r.status == 200, (r.status, raw[:500])
        if proto == "bedrock":
            assert r.getheader("x-amzn-RequestId")
        if proto == "anthropic":
            assert r.getheader("request-id")
        if stream:
            return read_stream(proto, raw)
        return read_buffered(proto, json.loads(raw))
    finally:
        conn.close()


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("egress", PROTOCOLS)
@pytest.mark.parametrize("ingress", PROTOCOLS)
def test_matrix(gateway, ingress, egress, case, stream):
    model = LANES[egress]
    if case == "text":
        a = call(gateway, ingress, stream, model=model, text="hello matrix")
        assert a.text.startswith("mock: hello matrix") and a.stop == "end" and not a.calls
    elif case == "system":
        a = call(gateway, ingress, stream, model=model, text="sys check", system=SYSTEM)
        assert a.text.startswith("mock: sys check") and "[system: %s]" % SYSTEM in a.text
    elif case == "image":
        a = call(gateway, ingress, stream, model=model, text="look", image=True)
        assert a.text.startswith("mock: look") and "[images: 1]" in a.text
    elif case == "max_tokens":
        a = call(gateway, ingress, stream, model=model, text="one two three four five six", max_tokens=3)
        assert a.stop == "max" and len(a.text.split()) <= 3
    elif case == "tools":
        a = call(gateway, ingress, stream, model=model, text="weather? #mock:tool=1", tools=True)
        assert a.stop == "tool" and len(a.calls) == 1, a
        cid, name, args = a.calls[0]
        assert name == "get_weather" and args == {"city": "mock"}
        b = call(gateway, ingress, stream, model=model, text="weather?", tools=True,
                 history=(cid or "call_1", args))
        assert b.stop == "end" and "sunny" in b.text and not b.calls, b
