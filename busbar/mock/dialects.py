"""The six provider wire formats, as the mock speaks them.

Every dialect has the identical shape:

    name, content_type, stream_content_type
    read(doc, route) -> Ask              the request body (already a dict) into the neutral Ask
    auth(headers, query) -> None | (status, message)   require_auth: the provider's own carrier
    body(ask, plan, rid) -> bytes        a buffered 2xx body
    frames(ask, plan, rid) -> iterator   the stream, one wire frame (SSE event, array element,
                                         eventstream message) per item
    stream_error(ask, plan, rid, msg) -> list[bytes]   the native in-band error frames that end a stream
    error(status, message, rid) -> bytes the native error envelope
    headers(status, rid) -> bytes        extra response header lines (request ids)
    error_headers(status, message) -> bytes   extra header lines on errors (Bedrock's error type)

This is an independent implementation of each format, written from the official SDKs' types
(openai, anthropic, google-genai, cohere, botocore's bedrock-runtime model and eventstream.py), so
that a gateway codec bug shows up as a mismatch instead of being mirrored. It must not import
cbusbar.
"""

import struct
import time
import uuid
import zlib

import orjson

from busbar.mock.answer import (Ask, BadRequest, FORCE_ANY, STOP_MAX_TOKENS,
                                STOP_TOOL, new_id)

_dumps = orjson.dumps


# ---------------------------------------------------------------------------------------------
# Shared request-reading helpers: each raises BadRequest (a 400 in the native envelope) on a shape
# the real provider would reject, so the mock never answers 500 to a malformed body.

def _need(cond, message):
    if not cond:
        raise BadRequest(message)


def _list(doc, key, message):
    v = doc.get(key)
    _need(isinstance(v, list), message)
    return v


def _max_tokens(value, field):
    if value is None:
        return None
    _need(isinstance(value, int) and not isinstance(value, bool), field + " must be an integer")
    return value


def _text(value):
    """A text field: a string, or absent."""
    if value is None:
        return ""
    _need(isinstance(value, str), "text must be a string")
    return value


def _model(doc):
    m = doc.get("model")
    _need(isinstance(m, str) and m != "", "Missing required parameter: 'model'.")
    return m


def _join(texts):
    # Parts are joined with a newline; the answer collapses whitespace runs, so "a" + "b" parts and
    # "a\nb" echo the same way whichever way a gateway merges them.
    if len(texts) < 2:
        return texts[0] if texts else ""
    return "\n".join(t for t in texts if t)


def _json_text(value):
    return value if isinstance(value, str) else _dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _sse(event, data):
    """One SSE event with an `event:` line (anthropic, responses, cohere)."""
    return b"event: " + event + b"\ndata: " + _dumps(data) + b"\n\n"


def _sse_data(data):
    """One SSE event with only a `data:` line (openai chat)."""
    return b"data: " + _dumps(data) + b"\n\n"


class _Dialect:
    """Defaults shared by the six dialects; each overrides what its wire format needs."""

    name = ""
    content_type = b"application/json"
    stream_content_type = b"text/event-stream"

    def headers(self, status, rid):
        return b""

    def error_headers(self, status, message):
        return b""


# ---------------------------------------------------------------------------------------------
# OpenAI Chat Completions

def _oai_text_and_images(content):
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    _need(isinstance(content, list), "messages[].content must be a string or an array")
    texts = []
    images = 0
    for part in content:
        _need(isinstance(part, dict), "content parts must be objects")
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("text")))
        elif kind == "image_url":
            images += 1
    return _join(texts), images


_OPENAI_ERROR = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 429: "rate_limit_error"}


def _openai_error(status, message):
    kind = _OPENAI_ERROR.get(status) or ("server_error" if status >= 500 else "invalid_request_error")
    return _dumps({"error": {"message": message, "type": kind, "param": None,
                             "code": "invalid_api_key" if status == 401 else None}})


def _bearer(headers):
    v = headers.get(b"authorization", b"")
    return v[:7].lower() == b"bearer " and v[7:].strip() != b""


class OpenAIChat(_Dialect):
    name = "openai"

    def read(self, doc, route):
        ask = Ask()
        ask.model = _model(doc)
        messages = _list(doc, "messages", "Missing required parameter: 'messages'.")
        _need(messages, "'messages' must contain at least one message.")
        system = []
        last_assistant = -1
        for i, m in enumerate(messages):
            _need(isinstance(m, dict), "messages[] must be objects")
            role = m.get("role")
            if role in ("system", "developer"):
                system.append(_oai_text_and_images(m.get("content"))[0])
            elif role == "user":
                text, images = _oai_text_and_images(m.get("content"))
                ask.images += images
                if text:
                    ask.user_text = text
            elif role == "assistant":
                last_assistant = i
            elif role != "tool":
                raise BadRequest("Invalid value for 'messages[].role'.")
        for m in messages[last_assistant + 1:]:
            if m.get("role") == "tool":
                ask.tool_result = _oai_text_and_images(m.get("content"))[0]
                break
        ask.system = _join(system)
        for t in doc.get("tools") or ():
            if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict):
                fn = t["function"]
                _need(isinstance(fn.get("name"), str), "tools[].function.name is required")
                ask.tools.append((fn["name"], fn.get("parameters")))
        choice = doc.get("tool_choice")
        if choice == "required":
            ask.forced = FORCE_ANY
        elif isinstance(choice, dict):
            if choice.get("type") == "function" and isinstance(choice.get("function"), dict):
                ask.forced = choice["function"].get("name") or FORCE_ANY
            elif choice.get("type") == "allowed_tools" and \
                    (choice.get("allowed_tools") or {}).get("mode") == "required":
                ask.forced = FORCE_ANY
        limit = doc.get("max_completion_tokens")
        if limit is None:
            limit = doc.get("max_tokens")
        ask.max_tokens = _max_tokens(limit, "max_completion_tokens")
        ask.stream = doc.get("stream") is True
        opts = doc.get("stream_options")
        ask.include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        return ask

    def auth(self, headers, query):
        if not _bearer(headers):
            return 401, "Incorrect API key provided."
        return None

    @staticmethod
    def _usage(plan):
        return {"prompt_tokens": plan.input_tokens, "completion_tokens": plan.output_tokens,
                "total_tokens": plan.input_tokens + plan.output_tokens,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}}

    @staticmethod
    def _finish(plan):
        return "tool_calls" if plan.stop == STOP_TOOL else \
            "length" if plan.stop == STOP_MAX_TOKENS else "stop"

    def body(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            message = {"role": "assistant", "content": None, "refusal": None, "annotations": [],
                       "tool_calls": [{"id": "call_" + new_id(24), "type": "function",
                                       "function": {"name": plan.tool_name,
                                                    "arguments": plan.tool_args}}]}
        else:
            message = {"role": "assistant", "content": plan.text, "refusal": None, "annotations": []}
        return _dumps({"id": "chatcmpl-" + rid, "object": "chat.completion", "created": int(time.time()),
                       "model": ask.model,
                       "choices": [{"index": 0, "message": message, "logprobs": None,
                                    "finish_reason": self._finish(plan)}],
                       "usage": self._usage(plan), "service_tier": "default",
                       "system_fingerprint": "fp_mock"})

    def frames(self, ask, plan, rid):
        base = {"id": "chatcmpl-" + rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": ask.model, "service_tier": "default", "system_fingerprint": "fp_mock",
                "choices": None}
        if ask.include_usage:
            # The API puts "usage": null on every chunk once the client opts in (SPEC, SDK notes).
            base["usage"] = None

        def chunk(delta, finish=None):
            base["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            return _sse_data(base)

        if plan.stop == STOP_TOOL:
            yield chunk({"role": "assistant", "content": None, "refusal": None,
                         "tool_calls": [{"index": 0, "id": "call_" + new_id(24), "type": "function",
                                         "function": {"name": plan.tool_name, "arguments": ""}}]})
            for frag in plan.arg_fragments():
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": frag}}]})
        else:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
            for d in plan.deltas():
                yield chunk({"content": d})
        yield chunk({}, self._finish(plan))
        if ask.include_usage:
            base["choices"] = []
            base["usage"] = self._usage(plan)
            yield _sse_data(base)
        yield b"data: [DONE]\n\n"

    def stream_error(self, ask, plan, rid, message):
        return [_sse_data({"error": {"message": message, "type": "server_error", "param": None,
                                     "code": None}})]

    def error(self, status, message, rid):
        return _openai_error(status, message)

    def headers(self, status, rid):
        return b"x-request-id: req_" + rid.encode() + b"\r\n"


# ---------------------------------------------------------------------------------------------
# OpenAI Responses

def _resp_content(content):
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    _need(isinstance(content, list), "input[].content must be a string or an array")
    texts = []
    images = 0
    for part in content:
        _need(isinstance(part, dict), "content parts must be objects")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            texts.append(_text(part.get("text")))
        elif kind == "input_image":
            images += 1
    return _join(texts), images


class OpenAIResponses(_Dialect):
    name = "responses"

    def read(self, doc, route):
        ask = Ask()
        ask.model = _model(doc)
        system = []
        instructions = doc.get("instructions")
        if isinstance(instructions, str):
            system.append(instructions)
        items = doc.get("input")
        if isinstance(items, str):
            ask.user_text = items
            items = []
        _need(isinstance(items, list), "Missing required parameter: 'input'.")
        last_assistant = -1
        for i, item in enumerate(items):
            _need(isinstance(item, dict), "input[] items must be objects")
            kind = item.get("type")
            role = item.get("role")
            if kind in ("function_call", "reasoning") or role == "assistant":
                last_assistant = i
            elif role in ("system", "developer"):
                system.append(_resp_content(item.get("content"))[0])
            elif role == "user":
                text, images = _resp_content(item.get("content"))
                ask.images += images
                if text:
                    ask.user_text = text
        for item in items[last_assistant + 1:]:
            if item.get("type") == "function_call_output":
                ask.tool_result = _resp_content(item.get("output"))[0]
                break
        ask.system = _join(system)
        for t in doc.get("tools") or ():
            if isinstance(t, dict) and t.get("type") == "function":
                _need(isinstance(t.get("name"), str), "tools[].name is required")
                ask.tools.append((t["name"], t.get("parameters")))
        choice = doc.get("tool_choice")
        if choice == "required":
            ask.forced = FORCE_ANY
        elif isinstance(choice, dict):
            if choice.get("type") == "function":
                ask.forced = choice.get("name") or FORCE_ANY
            elif choice.get("type") == "allowed_tools" and choice.get("mode") == "required":
                ask.forced = FORCE_ANY
        ask.max_tokens = _max_tokens(doc.get("max_output_tokens"), "max_output_tokens")
        ask.stream = doc.get("stream") is True
        return ask

    def auth(self, headers, query):
        if not _bearer(headers):
            return 401, "Incorrect API key provided."
        return None

    @staticmethod
    def _usage(plan):
        return {"input_tokens": plan.input_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": plan.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": plan.input_tokens + plan.output_tokens}

    @staticmethod
    def _response(ask, rid, created, status, output, usage):
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": "resp_" + rid, "object": "response", "created_at": created, "status": status,
                "background": False, "error": None, "incomplete_details": incomplete,
                "instructions": None, "max_output_tokens": ask.max_tokens, "model": ask.model,
                "output": output, "parallel_tool_calls": True, "previous_response_id": None,
                "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": 1.0,
                "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
                "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": None,
                "metadata": {}}

    @staticmethod
    def _items(plan, rid):
        """(output item in progress, the same item completed)"""
        if plan.stop == STOP_TOOL:
            item = {"id": "fc_" + rid, "type": "function_call", "status": "in_progress",
                    "arguments": "", "call_id": "call_" + new_id(24), "name": plan.tool_name}
            done = dict(item, status="completed", arguments=plan.tool_args)
        else:
            item = {"id": "msg_" + rid, "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            done = dict(item, status="incomplete" if plan.stop == STOP_MAX_TOKENS else "completed",
                        content=[{"type": "output_text", "text": plan.text, "annotations": [],
                                  "logprobs": []}])
        return item, done

    def body(self, ask, plan, rid):
        status = "incomplete" if plan.stop == STOP_MAX_TOKENS else "completed"
        return _dumps(self._response(ask, rid, int(time.time()), status, [self._items(plan, rid)[1]],
                                     self._usage(plan)))

    def frames(self, ask, plan, rid):
        created = int(time.time())
        seq = 0

        def event(kind, data):
            nonlocal seq
            data["type"] = kind
            data["sequence_number"] = seq
            seq += 1
            return _sse(kind.encode(), data)

        running = self._response(ask, rid, created, "in_progress", [], None)
        yield event("response.created", {"response": running})
        yield event("response.in_progress", {"response": running})
        item, done = self._items(plan, rid)
        iid = item["id"]
        yield event("response.output_item.added", {"output_index": 0, "item": item})
        if plan.stop == STOP_TOOL:
            for frag in plan.arg_fragments():
                yield event("response.function_call_arguments.delta",
                            {"item_id": iid, "output_index": 0, "delta": frag})
            yield event("response.function_call_arguments.done",
                        {"item_id": iid, "output_index": 0, "arguments": plan.tool_args})
        else:
            yield event("response.content_part.added",
                        {"item_id": iid, "output_index": 0, "content_index": 0,
                         "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
            for d in plan.deltas():
                yield event("response.output_text.delta",
                            {"item_id": iid, "output_index": 0, "content_index": 0, "delta": d,
                             "logprobs": []})
            yield event("response.output_text.done",
                        {"item_id": iid, "output_index": 0, "content_index": 0, "text": plan.text,
                         "logprobs": []})
            yield event("response.content_part.done",
                        {"item_id": iid, "output_index": 0, "content_index": 0,
                         "part": done["content"][0]})
        yield event("response.output_item.done", {"output_index": 0, "item": done})
        if plan.stop == STOP_MAX_TOKENS:
            final = self._response(ask, rid, created, "incomplete", [done], self._usage(plan))
            yield event("response.incomplete", {"response": final})
        else:
            final = self._response(ask, rid, created, "completed", [done], self._usage(plan))
            yield event("response.completed", {"response": final})

    def stream_error(self, ask, plan, rid, message):
        failed = self._response(ask, rid, int(time.time()), "failed", [], None)
        failed["error"] = {"code": "server_error", "message": message}
        # The sequence number continues after the one frame already sent (response.created = 0).
        return [_sse(b"response.failed", {"type": "response.failed", "sequence_number": 1,
                                          "response": failed})]

    def error(self, status, message, rid):
        return _openai_error(status, message)

    def headers(self, status, rid):
        return b"x-request-id: req_" + rid.encode() + b"\r\n"


# ---------------------------------------------------------------------------------------------
# Anthropic Messages

_ANTHROPIC_ERROR = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 504: "timeout_error",
                    529: "overloaded_error"}


def _anthropic_blocks_text(content):
    """(text, images, tool results [texts]) of a message's content."""
    if isinstance(content, str):
        return content, 0, []
    _need(isinstance(content, list), "messages[].content must be a string or an array")
    texts = []
    images = 0
    results = []
    for block in content:
        _need(isinstance(block, dict), "content blocks must be objects")
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block.get("text")))
        elif kind == "image":
            images += 1
        elif kind == "tool_result":
            inner = block.get("content")
            if inner is None:
                results.append("")
            else:
                results.append(_anthropic_blocks_text(inner)[0])
    return _join(texts), images, results


class Anthropic(_Dialect):
    name = "anthropic"

    def read(self, doc, route):
        ask = Ask()
        ask.model = _model(doc)
        messages = _list(doc, "messages", "messages: Field required")
        # The real API refuses a request without max_tokens: a gateway must inject it (SPEC 1.6).
        _need("max_tokens" in doc, "max_tokens: Field required")
        ask.max_tokens = _max_tokens(doc.get("max_tokens"), "max_tokens")
        system = doc.get("system")
        if system is not None:
            ask.system = _anthropic_blocks_text(system)[0]
        last_assistant = -1
        for i, m in enumerate(messages):
            _need(isinstance(m, dict), "messages[] must be objects")
            role = m.get("role")
            _need(role in ("user", "assistant"), "messages: roles must be 'user' or 'assistant'")
            text, images, _ = _anthropic_blocks_text(m.get("content"))
            ask.images += images
            if role == "assistant":
                last_assistant = i
            elif text:
                ask.user_text = text
        for m in messages[last_assistant + 1:]:
            results = _anthropic_blocks_text(m.get("content"))[2]
            if results:
                ask.tool_result = results[0]
                break
        for t in doc.get("tools") or ():
            # Server tools (web search, code execution...) have a versioned type and no schema.
            if isinstance(t, dict) and t.get("type") in (None, "custom"):
                _need(isinstance(t.get("name"), str), "tools[].name: Field required")
                ask.tools.append((t["name"], t.get("input_schema")))
        choice = doc.get("tool_choice")
        if isinstance(choice, dict):
            if choice.get("type") == "any":
                ask.forced = FORCE_ANY
            elif choice.get("type") == "tool":
                ask.forced = choice.get("name") or FORCE_ANY
        ask.stream = doc.get("stream") is True
        return ask

    def auth(self, headers, query):
        if not (headers.get(b"x-api-key", b"").strip() or _bearer(headers)):
            return 401, "invalid x-api-key"
        if not headers.get(b"anthropic-version", b"").strip():
            # The real API answers 400 here, not 401: the credential is fine, the request is not.
            return 400, "anthropic-version: header is required"
        return None

    @staticmethod
    def _stop(plan):
        return "tool_use" if plan.stop == STOP_TOOL else \
            "max_tokens" if plan.stop == STOP_MAX_TOKENS else "end_turn"

    @staticmethod
    def _usage(input_tokens, output_tokens):
        return {"input_tokens": input_tokens, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": output_tokens,
                "service_tier": "standard"}

    def body(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            content = [{"type": "tool_use", "id": "toolu_01" + new_id(22), "name": plan.tool_name,
                        "input": orjson.loads(plan.tool_args)}]
        else:
            content = [{"type": "text", "text": plan.text}]
        return _dumps({"id": "msg_01" + rid[-22:], "type": "message", "role": "assistant",
                       "model": ask.model, "content": content, "stop_reason": self._stop(plan),
                       "stop_sequence": None,
                       "usage": self._usage(plan.input_tokens, plan.output_tokens)})

    def frames(self, ask, plan, rid):
        # output_tokens starts at 1 as on the real API, and message_delta carries the running
        # total: a gateway that adds the two instead of replacing is caught by the usage tests.
        yield _sse(b"message_start", {"type": "message_start", "message": {
            "id": "msg_01" + rid[-22:], "type": "message", "role": "assistant", "model": ask.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": self._usage(plan.input_tokens, 1)}})
        yield b'event: ping\ndata: {"type":"ping"}\n\n'
        if plan.stop == STOP_TOOL:
            yield _sse(b"content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": "toolu_01" + new_id(22), "name": plan.tool_name, "input": {}}})
            for frag in plan.arg_fragments():
                yield _sse(b"content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "input_json_delta",
                                                              "partial_json": frag}})
        else:
            yield _sse(b"content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})
            for d in plan.deltas():
                yield _sse(b"content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "text_delta", "text": d}})
        yield _sse(b"content_block_stop", {"type": "content_block_stop", "index": 0})
        usage = self._usage(plan.input_tokens, plan.output_tokens)
        del usage["service_tier"]
        yield _sse(b"message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": self._stop(plan), "stop_sequence": None},
                                      "usage": usage})
        yield b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

    def stream_error(self, ask, plan, rid, message):
        return [_sse(b"error", {"type": "error", "error": {"type": "api_error", "message": message},
                                "request_id": "req_" + rid})]

    def error(self, status, message, rid):
        kind = _ANTHROPIC_ERROR.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": message},
                       "request_id": "req_" + rid})

    def headers(self, status, rid):
        return b"request-id: req_" + rid.encode() + b"\r\n"


# ---------------------------------------------------------------------------------------------
# Gemini generateContent / streamGenerateContent

_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
                  499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
                  504: "DEADLINE_EXCEEDED"}


def _g(d, camel, snake):
    """A Gemini field under either spelling: the REST API accepts both and the SDK mixes them."""
    v = d.get(camel)
    return d.get(snake) if v is None else v


def _gemini_parts(content):
    """(text, images, function-response texts) of one Content."""
    _need(isinstance(content, dict), "contents[] must be objects")
    parts = content.get("parts") or []
    _need(isinstance(parts, list), "contents[].parts must be an array")
    texts = []
    images = 0
    results = []
    for part in parts:
        _need(isinstance(part, dict), "parts[] must be objects")
        if part.get("thought") is True:
            continue
        text = part.get("text")
        if isinstance(text, str):
            texts.append(text)
            continue
        blob = _g(part, "inlineData", "inline_data") or _g(part, "fileData", "file_data")
        if isinstance(blob, dict):
            mime = _g(blob, "mimeType", "mime_type")
            if isinstance(mime, str) and mime.startswith("image/"):
                images += 1
            continue
        fr = _g(part, "functionResponse", "function_response")
        if isinstance(fr, dict):
            resp = fr.get("response")
            if isinstance(resp, dict) and len(resp) == 1 and isinstance(next(iter(resp.values())), str):
                # {"output": "..."} / {"result": "..."}: the usual wrapping of a plain-text result.
                results.append(next(iter(resp.values())))
            else:
                results.append(_json_text(resp) if resp is not None else "")
    return _join(texts), images, results


class Gemini(_Dialect):
    name = "gemini"

    def read(self, doc, route):
        ask = Ask()
        ask.model = route.model
        for shim in ("model", "stream"):
            # Not GenerateContentRequest fields: the model is in the URL (SPEC 1.3 strips the shims).
            _need(shim not in doc, 'Invalid JSON payload received. Unknown name "%s": Cannot find field.'
                  % shim)
        contents = _list(doc, "contents", "* GenerateContentRequest.contents: contents is not specified")
        _need(contents, "* GenerateContentRequest.contents: contents is not specified")
        system = _g(doc, "systemInstruction", "system_instruction")
        if system is not None:
            ask.system = _gemini_parts(system)[0]
        last_model = -1
        for i, c in enumerate(contents):
            text, images, _ = _gemini_parts(c)
            ask.images += images
            if c.get("role") == "model":
                last_model = i
            elif text:
                ask.user_text = text
        for c in contents[last_model + 1:]:
            results = _gemini_parts(c)[2]
            if results:
                ask.tool_result = results[0]
                break
        for t in doc.get("tools") or ():
            if not isinstance(t, dict):
                continue
            for fn in _g(t, "functionDeclarations", "function_declarations") or ():
                _need(isinstance(fn, dict) and isinstance(fn.get("name"), str),
                      "functionDeclarations[].name is required")
                schema = fn.get("parameters")
                if schema is None:
                    schema = _g(fn, "parametersJsonSchema", "parameters_json_schema")
                ask.tools.append((fn["name"], schema))
        config = _g(doc, "toolConfig", "tool_config")
        fcc = _g(config, "functionCallingConfig", "function_calling_config") if isinstance(config, dict) else None
        if isinstance(fcc, dict) and fcc.get("mode") in ("ANY", "VALIDATED"):
            allowed = _g(fcc, "allowedFunctionNames", "allowed_function_names")
            ask.forced = allowed[0] if isinstance(allowed, list) and allowed and \
                isinstance(allowed[0], str) and fcc.get("mode") == "ANY" else FORCE_ANY
        gen = _g(doc, "generationConfig", "generation_config")
        if isinstance(gen, dict):
            ask.max_tokens = _max_tokens(_g(gen, "maxOutputTokens", "max_output_tokens"), "maxOutputTokens")
        ask.stream = route.stream
        ask.sse = route.sse
        return ask

    def auth(self, headers, query):
        if headers.get(b"x-goog-api-key", b"").strip() or query.get("key"):
            return None
        return 403, ("Method doesn't allow unregistered callers (callers without established "
                     "identity). Please use API Key or other form of API consumer identity to call "
                     "this API.")

    @staticmethod
    def _usage(plan, output_tokens):
        return {"promptTokenCount": plan.input_tokens, "candidatesTokenCount": output_tokens,
                "totalTokenCount": plan.input_tokens + output_tokens,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": plan.input_tokens}]}

    @staticmethod
    def _finish(plan):
        # A function call ends with STOP on the real API (SPEC, SDK notes).
        return "MAX_TOKENS" if plan.stop == STOP_MAX_TOKENS else "STOP"

    @staticmethod
    def _chunk(ask, plan, rid, parts, finish, output_tokens):
        cand = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish:
            cand["finishReason"] = finish
        return {"candidates": [cand], "usageMetadata": Gemini._usage(plan, output_tokens),
                "modelVersion": ask.model, "responseId": rid}

    def body(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            parts = [{"functionCall": {"name": plan.tool_name, "args": orjson.loads(plan.tool_args)}}]
        else:
            parts = [{"text": plan.text}]
        return _dumps(self._chunk(ask, plan, rid, parts, self._finish(plan), plan.output_tokens))

    def _objects(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            # Gemini function calls arrive whole, in one chunk: there is no argument streaming on
            # the Gemini API (partialArgs is Vertex-only).
            yield self._chunk(ask, plan, rid, [{"functionCall": {
                "name": plan.tool_name, "args": orjson.loads(plan.tool_args)}}],
                self._finish(plan), plan.output_tokens)
            return
        deltas = plan.deltas() or [""]
        last = len(deltas) - 1
        for i, d in enumerate(deltas):
            yield self._chunk(ask, plan, rid, [{"text": d}], self._finish(plan) if i == last else None,
                              i + 1 if i < last else plan.output_tokens)

    def frames(self, ask, plan, rid):
        if ask.sse:
            # The real API ends SSE lines with CRLF; gateways must cope (SPEC, SDK notes).
            for obj in self._objects(ask, plan, rid):
                yield b"data: " + _dumps(obj) + b"\r\n\r\n"
            return
        # Without ?alt=sse: one JSON array, streamed element by element.
        sep = b"["
        for obj in self._objects(ask, plan, rid):
            yield sep + _dumps(obj)
            sep = b",\r\n"
        yield b"]"

    def stream_error(self, ask, plan, rid, message):
        err = _dumps({"error": {"code": 500, "message": message, "status": "INTERNAL"}})
        if ask.sse:
            return [b"data: " + err + b"\r\n\r\n"]
        return [b",\r\n" + err + b"]"]

    def error(self, status, message, rid):
        return _dumps({"error": {"code": status, "message": message,
                                 "status": _GOOGLE_STATUS.get(status) or
                                 ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")}})


# ---------------------------------------------------------------------------------------------
# Cohere v2 chat

def _cohere_content(content):
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    _need(isinstance(content, list), "messages[].content must be a string or an array")
    texts = []
    images = 0
    for part in content:
        _need(isinstance(part, dict), "content items must be objects")
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("text")))
        elif kind == "image_url":
            images += 1
        elif kind == "document":
            doc = part.get("document")
            data = doc.get("data") if isinstance(doc, dict) else None
            texts.append(_json_text(data) if data is not None else "")
    return _join(texts), images


class Cohere(_Dialect):
    name = "cohere"

    def read(self, doc, route):
        ask = Ask()
        ask.model = _model(doc)
        messages = _list(doc, "messages", "invalid request: messages must be an array")
        system = []
        last_assistant = -1
        for i, m in enumerate(messages):
            _need(isinstance(m, dict), "invalid request: messages must be objects")
            role = m.get("role")
            if role == "system":
                system.append(_cohere_content(m.get("content"))[0])
            elif role == "user":
                text, images = _cohere_content(m.get("content"))
                ask.images += images
                if text:
                    ask.user_text = text
            elif role == "assistant":
                last_assistant = i
            elif role != "tool":
                raise BadRequest("invalid request: unknown message role")
        for m in messages[last_assistant + 1:]:
            if m.get("role") == "tool":
                ask.tool_result = _cohere_content(m.get("content"))[0]
                break
        ask.system = _join(system)
        for t in doc.get("tools") or ():
            if isinstance(t, dict) and isinstance(t.get("function"), dict):
                fn = t["function"]
                _need(isinstance(fn.get("name"), str), "invalid request: tools[].function.name is required")
                ask.tools.append((fn["name"], fn.get("parameters")))
        choice = doc.get("tool_choice")
        if isinstance(choice, str) and choice.upper() == "REQUIRED":
            ask.forced = FORCE_ANY
        ask.max_tokens = _max_tokens(doc.get("max_tokens"), "max_tokens")
        ask.stream = doc.get("stream") is True
        return ask

    def auth(self, headers, query):
        if not _bearer(headers):
            return 401, "invalid api token"
        return None

    @staticmethod
    def _finish(plan):
        return "TOOL_CALL" if plan.stop == STOP_TOOL else \
            "MAX_TOKENS" if plan.stop == STOP_MAX_TOKENS else "COMPLETE"

    @staticmethod
    def _usage(plan):
        return {"billed_units": {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens},
                "tokens": {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens}}

    @staticmethod
    def _tool_call_id(plan):
        # Cohere's own ids are "<tool name>_<random>".
        return plan.tool_name + "_" + new_id(16)

    @staticmethod
    def _plan_text(plan):
        return "mock: calling " + plan.tool_name

    def body(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            message = {"role": "assistant", "tool_plan": self._plan_text(plan),
                       "tool_calls": [{"id": self._tool_call_id(plan), "type": "function",
                                       "function": {"name": plan.tool_name, "arguments": plan.tool_args}}]}
        else:
            message = {"role": "assistant", "content": [{"type": "text", "text": plan.text}]}
        return _dumps({"id": uuid_of(rid), "finish_reason": self._finish(plan), "message": message,
                       "usage": self._usage(plan)})

    def frames(self, ask, plan, rid):
        yield _sse(b"message-start", {"id": uuid_of(rid), "type": "message-start", "delta": {"message": {
            "role": "assistant", "content": [], "tool_plan": "", "tool_calls": [], "citations": []}}})
        if plan.stop == STOP_TOOL:
            for i, w in enumerate(self._plan_text(plan).split(" ")):
                yield _sse(b"tool-plan-delta", {"type": "tool-plan-delta",
                                                "delta": {"message": {"tool_plan": w if i == 0 else " " + w}}})
            yield _sse(b"tool-call-start", {"type": "tool-call-start", "index": 0, "delta": {"message": {
                "tool_calls": {"id": self._tool_call_id(plan), "type": "function",
                               "function": {"name": plan.tool_name, "arguments": ""}}}}})
            for frag in plan.arg_fragments():
                yield _sse(b"tool-call-delta", {"type": "tool-call-delta", "index": 0, "delta": {
                    "message": {"tool_calls": {"function": {"arguments": frag}}}}})
            yield _sse(b"tool-call-end", {"type": "tool-call-end", "index": 0})
        else:
            yield _sse(b"content-start", {"type": "content-start", "index": 0, "delta": {
                "message": {"content": {"type": "text", "text": ""}}}})
            for d in plan.deltas():
                yield _sse(b"content-delta", {"type": "content-delta", "index": 0, "delta": {
                    "message": {"content": {"text": d}}}})
            yield _sse(b"content-end", {"type": "content-end", "index": 0})
        yield _sse(b"message-end", {"type": "message-end", "id": uuid_of(rid), "delta": {
            "finish_reason": self._finish(plan), "usage": self._usage(plan)}})
        yield b"data: [DONE]\n\n"

    def stream_error(self, ask, plan, rid, message):
        # Cohere reports a failed generation in-band as a message-end with finish_reason ERROR and
        # the message in delta.error (the SDK's ChatMessageEndEventDelta.error).
        return [_sse(b"message-end", {"type": "message-end", "id": uuid_of(rid), "delta": {
                    "error": message, "finish_reason": "ERROR", "usage": self._usage(plan)}}),
                b"data: [DONE]\n\n"]

    def error(self, status, message, rid):
        return _dumps({"id": uuid_of(rid), "message": message})


# ---------------------------------------------------------------------------------------------
# Bedrock Converse / ConverseStream

_BEDROCK_ERROR = {400: "ValidationException", 401: "UnrecognizedClientException",
                  403: "AccessDeniedException", 404: "ResourceNotFoundException",
                  408: "ModelTimeoutException", 413: "ValidationException", 424: "ModelErrorException",
                  429: "ThrottlingException", 500: "InternalServerException",
                  503: "ServiceUnavailableException"}

# ConverseRequest members of botocore's bedrock-runtime model (modelId is in the URL). The real
# service refuses any other key, so a gateway leaking a shim key ("model", "stream") is caught.
_BEDROCK_KEYS = frozenset(("messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
                           "projectIdentifier", "additionalModelRequestFields", "promptVariables",
                           "additionalModelResponseFieldPaths", "requestMetadata", "performanceConfig",
                           "serviceTier", "outputConfig"))

_PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _es_header(name, value):
    """One eventstream header of type 7 (string)."""
    return struct.pack("!B", len(name)) + name + b"\x07" + struct.pack("!H", len(value)) + value


def eventstream_message(headers, payload):
    """One AWS eventstream message: prelude (total length, headers length, CRC32), headers,
    payload, message CRC32 (botocore/eventstream.py is the reader this must satisfy)."""
    prelude = struct.pack("!II", 16 + len(headers) + len(payload), len(headers))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + headers + payload
    return message + struct.pack("!I", zlib.crc32(message))


def _event_headers(event_type):
    return (_es_header(b":event-type", event_type) + _es_header(b":content-type", b"application/json")
            + _es_header(b":message-type", b"event"))


_EVENT_HEADERS = {name: _event_headers(name) for name in (
    b"messageStart", b"contentBlockStart", b"contentBlockDelta", b"contentBlockStop", b"messageStop",
    b"metadata")}


def _bedrock_content(content):
    """(text, images, tool result texts) of one message's content blocks."""
    _need(isinstance(content, list), "messages.content: expected a list")
    texts = []
    images = 0
    results = []
    for block in content:
        _need(isinstance(block, dict), "messages.content: expected objects")
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif "image" in block:
            images += 1
        elif isinstance(block.get("toolResult"), dict):
            inner = []
            for c in block["toolResult"].get("content") or ():
                if isinstance(c, dict):
                    if isinstance(c.get("text"), str):
                        inner.append(c["text"])
                    elif "json" in c:
                        inner.append(_json_text(c["json"]))
            results.append(_join(inner))
    return _join(texts), images, results


class Bedrock(_Dialect):
    name = "bedrock"
    stream_content_type = b"application/vnd.amazon.eventstream"

    def read(self, doc, route):
        ask = Ask()
        ask.model = route.model
        for key in doc:
            _need(key in _BEDROCK_KEYS, "extraneous key [%s] is not permitted" % key)
        messages = _list(doc, "messages", "1 validation error detected: messages must not be null")
        system = []
        for s in doc.get("system") or ():
            if isinstance(s, dict) and isinstance(s.get("text"), str):
                system.append(s["text"])
        ask.system = _join(system)
        last_assistant = -1
        for i, m in enumerate(messages):
            _need(isinstance(m, dict), "messages: expected objects")
            role = m.get("role")
            _need(role in ("user", "assistant"), "messages.role: must be user or assistant")
            text, images, _ = _bedrock_content(m.get("content"))
            ask.images += images
            if role == "assistant":
                last_assistant = i
            elif text:
                ask.user_text = text
        for m in messages[last_assistant + 1:]:
            results = _bedrock_content(m.get("content"))[2]
            if results:
                ask.tool_result = results[0]
                break
        config = doc.get("toolConfig")
        if isinstance(config, dict):
            for t in config.get("tools") or ():
                spec = t.get("toolSpec") if isinstance(t, dict) else None
                if isinstance(spec, dict):
                    _need(isinstance(spec.get("name"), str), "toolSpec.name must not be null")
                    schema = spec.get("inputSchema")
                    ask.tools.append((spec["name"], schema.get("json") if isinstance(schema, dict) else None))
            choice = config.get("toolChoice")
            if isinstance(choice, dict):
                if "any" in choice:
                    ask.forced = FORCE_ANY
                elif isinstance(choice.get("tool"), dict):
                    ask.forced = choice["tool"].get("name") or FORCE_ANY
        inference = doc.get("inferenceConfig")
        if isinstance(inference, dict):
            ask.max_tokens = _max_tokens(inference.get("maxTokens"), "inferenceConfig.maxTokens")
        ask.stream = route.stream
        return ask

    def auth(self, headers, query):
        auth = headers.get(b"authorization", b"")
        if not auth.startswith(b"AWS4-HMAC-SHA256 "):
            return 403, "Missing Authentication Token"
        if not headers.get(b"x-amz-date", b"").strip():
            return 403, "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
        return None

    @staticmethod
    def _stop(plan):
        return "tool_use" if plan.stop == STOP_TOOL else \
            "max_tokens" if plan.stop == STOP_MAX_TOKENS else "end_turn"

    @staticmethod
    def _usage(plan):
        return {"inputTokens": plan.input_tokens, "outputTokens": plan.output_tokens,
                "totalTokens": plan.input_tokens + plan.output_tokens,
                "cacheReadInputTokens": 0, "cacheWriteInputTokens": 0}

    def body(self, ask, plan, rid):
        if plan.stop == STOP_TOOL:
            content = [{"toolUse": {"toolUseId": "tooluse_" + new_id(22), "name": plan.tool_name,
                                    "input": orjson.loads(plan.tool_args)}}]
        else:
            content = [{"text": plan.text}]
        return _dumps({"output": {"message": {"role": "assistant", "content": content}},
                       "stopReason": self._stop(plan), "usage": self._usage(plan),
                       "metrics": {"latencyMs": 1}})

    def frames(self, ask, plan, rid):
        n = 0

        def event(kind, data):
            nonlocal n
            # The real service pads every payload with a "p" field of varying length (SPEC, SDK
            # notes); a decoder must ignore it.
            n += 1
            data["p"] = _PADDING[:(n * 7) % len(_PADDING) + 1]
            return eventstream_message(_EVENT_HEADERS[kind], _dumps(data))

        yield event(b"messageStart", {"role": "assistant"})
        if plan.stop == STOP_TOOL:
            yield event(b"contentBlockStart", {"contentBlockIndex": 0, "start": {"toolUse": {
                "toolUseId": "tooluse_" + new_id(22), "name": plan.tool_name}}})
            for frag in plan.arg_fragments():
                yield event(b"contentBlockDelta", {"contentBlockIndex": 0,
                                                   "delta": {"toolUse": {"input": frag}}})
        else:
            for d in plan.deltas():
                yield event(b"contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": d}})
        yield event(b"contentBlockStop", {"contentBlockIndex": 0})
        yield event(b"messageStop", {"stopReason": self._stop(plan)})
        yield event(b"metadata", {"usage": self._usage(plan), "metrics": {"latencyMs": 1}})

    def stream_error(self, ask, plan, rid, message):
        headers = (_es_header(b":exception-type", b"modelStreamErrorException")
                   + _es_header(b":content-type", b"application/json")
                   + _es_header(b":message-type", b"exception"))
        return [eventstream_message(headers, _dumps({"message": message, "originalStatusCode": 500,
                                                     "originalMessage": message}))]

    def error(self, status, message, rid):
        return _dumps({"__type": _bedrock_kind(status, message), "message": message})

    def error_headers(self, status, message):
        # boto3 names the exception from this header (SPEC, SDK notes); __type is the fallback.
        return b"x-amzn-ErrorType: " + _bedrock_kind(status, message).encode() + b"\r\n"

    def headers(self, status, rid):
        return b"x-amzn-RequestId: " + uuid_of(rid).encode() + b"\r\n"


def _bedrock_kind(status, message):
    if status == 403 and message == "Missing Authentication Token":
        return "MissingAuthenticationTokenException"
    if status == 403 and message.startswith("Authorization header requires"):
        return "IncompleteSignatureException"
    return _BEDROCK_ERROR.get(status) or ("InternalServerException" if status >= 500
                                          else "ValidationException")


def uuid_of(rid):
    """The request id spelt as a version-4 UUID (Bedrock request ids, Cohere ids), so every frame
    of one Cohere stream carries the same id."""
    return str(uuid.UUID(hex=(rid + rid)[:32], version=4))
