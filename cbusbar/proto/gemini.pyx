# cython: language_level=3
"""Gemini generateContent codec (docs/codecs.md). The wire authority is the google-genai SDK
(google/genai/types.py, models.py and its _*_to_mldev / _*_from_mldev converters, _api_client.py
for streaming).

Gemini is a path-model protocol: the model and the stream flag live in
`/v1{beta}/models/{model}:{generateContent|streamGenerateContent}`, so read_request leaves
req.model / req.stream for the engine. The SDK sends camelCase keys except where it passes a
pydantic dump through unconverted (`parameters_json_schema`, `inlineData.mime_type`,
`thinkingConfig.thinking_budget`, snake_case keys inside a `parameters` Schema), and the API's
proto-JSON parser accepts both spellings: the reader does too, the writer emits camelCase."""

import hashlib

import orjson

from cbusbar cimport ids

from cbusbar.ir cimport (
    Usage, Block, Message, Tool, Request, Response, Event,
    ev_message_start, ev_message_delta,
    ev_message_stop, ev_error, text_block,
    B_TEXT, B_IMAGE, B_DOCUMENT, B_TOOL_USE, B_TOOL_RESULT, B_THINKING,
    SRC_BASE64, SRC_URL, SRC_VENDOR, ROLE_USER, ROLE_ASSISTANT,
    TC_AUTO, TC_NONE, TC_REQUIRED, TC_TOOL,
    RF_TEXT, RF_JSON_OBJECT, RF_JSON_SCHEMA,
    SR_UNSET, SR_END_TURN, SR_STOP_SEQUENCE, SR_MAX_TOKENS, SR_TOOL_USE, SR_SAFETY, SR_ERROR,
    SR_OTHER,
    EV_MESSAGE_START, EV_BLOCK_START, EV_BLOCK_DELTA, EV_BLOCK_STOP, EV_MESSAGE_DELTA,
    EV_MESSAGE_STOP, EV_ERROR,
    D_TEXT, D_INPUT_JSON, D_THINKING, D_SIGNATURE,
)
from cbusbar.ir import CodecError, STATUS_OF_KIND, kind_of_status
from cbusbar.framing import FramingError
from cbusbar.framing cimport JsonArrayParser, json_array_item, sse_data_crlf, top_field
from cbusbar cimport jsonget
from cbusbar.ir cimport text_is_empty
from cbusbar.jsonspan cimport text_value
from cbusbar.jsonget cimport (
    Shape, as_dict, req_list, is_int, is_number, J_STRING, J_INTEGER, J_NUMBER, J_OBJECT, J_ARRAY,
)
from cbusbar.jsonget import PARSE_ERROR, UPSTREAM_NOT_JSON
from cbusbar.usage cimport merge_usage
from cbusbar.arguments cimport object_of
from cbusbar.reasoning cimport budget_of_effort
from cbusbar.proto._common cimport SSEDecoder, error_object, own_error_in
from cbusbar.proto._common import (body_as_is, no_error_headers, no_forced_tool, no_response_headers,
                                   usage_always_sent)

NAME = "gemini"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"text/event-stream"
BODY_MODEL = False          # the model name travels in the path
NEEDS_MAX_TOKENS = False    # maxOutputTokens is optional
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"generationConfig")
MAX_TOKENS_PATH = ((b"generationConfig", b"maxOutputTokens"),)
PROBE_MAX_TOKENS = 1        # health probes: maxOutputTokens >= 1
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"google-genai-sdk/0.8.0 gl-python/3.11"
API_HEADERS = ()
BETA_HEADERS = ()
AZURE_FORMS = ()
# Gemini on Vertex AI: Vertex's `google` publisher; the codec's path already names the model.
VERTEX_PUBLISHER = "google"
vertex_body = None

cdef str _BAD_SHAPE = (
    "Invalid JSON payload received: the body does not have the generateContent shape.")

# Gemini rejects more than 5 stop sequences (GenerationConfig.stop_sequences: "up to 5").
cdef int MAX_STOP = 5

# Gemini 3 rejects a model turn whose function call lacks the thoughtSignature Gemini minted for
# it ("Function call ... is missing a thought_signature"). History that came from another vendor
# has none; Google documents this value for exactly that case (ai.google.dev/gemini-api/docs/
# thought-signatures, "conversation transferred from another model"). Older models ignore it.
cdef str _FOREIGN_SIGNATURE = "skip_thought_signature_validator"


# Gemini Schema (OpenAPI subset) is turned into JSON Schema for the IR; deeper nesting than this
# is copied as given instead of recursed into.
cdef int MAX_SCHEMA_DEPTH = 64

cdef dict _FINISH = {
    "STOP": SR_END_TURN, "MAX_TOKENS": SR_MAX_TOKENS,
    "SAFETY": SR_SAFETY, "RECITATION": SR_SAFETY, "IMAGE_SAFETY": SR_SAFETY, "SPII": SR_SAFETY,
    "BLOCKLIST": SR_SAFETY, "PROHIBITED_CONTENT": SR_SAFETY,
    "IMAGE_PROHIBITED_CONTENT": SR_SAFETY, "IMAGE_RECITATION": SR_SAFETY,
    "MALFORMED_FUNCTION_CALL": SR_ERROR,
}

# google.rpc.Code names by HTTP status (google/rpc/code.proto's HTTP mapping).
cdef dict _RPC_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
    501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
cdef dict _KIND_OF_RPC = {
    "INVALID_ARGUMENT": "invalid_request", "FAILED_PRECONDITION": "invalid_request",
    "OUT_OF_RANGE": "invalid_request", "UNAUTHENTICATED": "authentication",
    "PERMISSION_DENIED": "permission", "NOT_FOUND": "not_found",
    "RESOURCE_EXHAUSTED": "rate_limit", "UNAVAILABLE": "overloaded",
    "DEADLINE_EXCEEDED": "timeout",
}

# Gemini Schema field names (snake_case as the SDK dumps them) -> JSON Schema keywords.
cdef dict _SCHEMA_KEYS = {
    "any_of": "anyOf", "max_items": "maxItems", "min_items": "minItems",
    "max_length": "maxLength", "min_length": "minLength", "max_properties": "maxProperties",
    "min_properties": "minProperties", "property_ordering": "propertyOrdering",
    "additional_properties": "additionalProperties", "ref": "$ref", "defs": "$defs",
}

cdef dict _MIME_OF_EXT = {
    "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
    "webp": "image/webp", "heic": "image/heic", "heif": "image/heif", "pdf": "application/pdf",
}

# generationConfig fields the IR carries; every other one is kept in extra (same-protocol only).
cdef frozenset _GEN_KNOWN = frozenset((
    "maxOutputTokens", "max_output_tokens", "temperature", "topP", "top_p", "topK", "top_k",
    "stopSequences", "stop_sequences", "candidateCount", "candidate_count", "seed",
    "presencePenalty", "presence_penalty", "frequencyPenalty", "frequency_penalty",
    "responseLogprobs", "response_logprobs", "logprobs", "thinkingConfig", "thinking_config",
    "responseMimeType", "response_mime_type", "responseSchema", "response_schema",
    "responseJsonSchema", "response_json_schema",
))
cdef frozenset _TOP_KNOWN = frozenset((
    "contents", "systemInstruction", "system_instruction", "generationConfig",
    "generation_config", "tools", "toolConfig", "tool_config",
    # the engine's path-model shims, never forwarded
    "model", "stream",
))


# ---------------------------------------------------------------------------------------------
# Helpers


cdef inline object _get(dict d, str camel, str snake):
    cdef object v = d.get(camel)
    if v is None:
        v = d.get(snake)
    return v


cdef str _camel(str key):
    """A proto field's JSON name (lowerCamelCase). Fields kept in extra are stored under it, so a
    same-protocol rewrite never sends both spellings of one field."""
    cdef list words
    if "_" not in key:
        return key
    words = key.split("_")
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


# Gemini's wording of a shape error (google.rpc INVALID_ARGUMENT field violations): `Invalid value
# at 'contents': expected a list.`, and for an absent required field the API's own
# `* GenerateContentRequest.contents: contents is not specified`.
cdef tuple GEMINI_WORDS = (None, "a string", "an integer", "a number", "a boolean", "an object",
                           "a list", "a string or a list", "a list of strings", "an object")


cdef class GeminiShape(Shape):

    cpdef object bad_type(self, str path, int expected, object value):
        return CodecError("Invalid value at '%s': expected %s." % (path, GEMINI_WORDS[expected]))

    cpdef object missing(self, str path):
        return CodecError("* GenerateContentRequest.%s: %s is not specified" % (path, path))


cdef GeminiShape SHAPE = GeminiShape()


# Gemini fields arrive under two spellings (camelCase, snake_case), so they are read as values
# (`_get`) and checked here through the shared Shape; None is unset.
cdef dict _dict_or_none(object v, str what):
    if v is None or type(v) is dict:
        return v
    raise SHAPE.bad_type(what, J_OBJECT, v)


cdef list _list_or_none(object v, str what):
    if v is None or type(v) is list:
        return v
    raise SHAPE.bad_type(what, J_ARRAY, v)


cdef object _number(object v, str what):
    if v is None or is_number(v):
        return v
    raise SHAPE.bad_type(what, J_NUMBER, v)


cdef object _integer(object v, str what):
    if v is None or is_int(v):
        return v
    if type(v) is float and (<double>v).is_integer():
        return int(v)  # the SDK types topK as a float and sends 3.0
    raise SHAPE.bad_type(what, J_INTEGER, v)


cdef str _string(object v, str what):
    if v is None or type(v) is str:
        return v
    raise SHAPE.bad_type(what, J_STRING, v)


cdef inline int _b64_value(Py_UCS4 c):
    if u'A' <= c <= u'Z':
        return <int>c - 65
    if u'a' <= c <= u'z':
        return <int>c - 71
    if u'0' <= c <= u'9':
        return <int>c + 4
    if c == u'+' or c == u'-':
        return 62
    if c == u'/' or c == u'_':
        return 63
    return -1


cdef bint _is_b64(str s):
    """True when the google-genai SDK can decode `s` as a thoughtSignature (pydantic's strict
    base64): one alphabet, standard or URL-safe; padding absent or short, never extra; no stray
    bits after the last byte. A signature it cannot decode fails the whole response, so such a
    value is never sent."""
    cdef Py_ssize_t n = len(s), pad = 0, d, i, rem
    cdef int last = 0
    cdef bint std = False, urlsafe = False
    cdef Py_UCS4 c
    while pad < n and s[n - 1 - pad] == u'=':
        pad += 1
    d = n - pad
    if d == 0:
        return False
    for i in range(d):
        c = s[i]
        last = _b64_value(c)
        if last < 0:
            return False
        if c == u'+' or c == u'/':
            std = True
        elif c == u'-' or c == u'_':
            urlsafe = True
    if std and urlsafe:  # one alphabet or the other, never both
        return False
    rem = d % 4
    if rem == 1 or pad > (4 - rem) % 4:  # short padding is accepted, extra padding is not
        return False
    if rem == 2:
        return last & 15 == 0
    if rem == 3:
        return last & 3 == 0
    return True


cdef str _call_id(str seed):
    """A tool-call id for a Gemini function call, which usually has none. Derived from a seed
    (the responseId and the call's position, or the call's position in the request) so that the
    same history maps to the same ids on every turn, which keeps other vendors' prompt caches
    warm; random when there is no seed."""
    if seed is None:
        return "call_" + ids.hex_id(12)
    return "call_" + hashlib.blake2b(seed.encode("utf-8"), digest_size=12).hexdigest()


cdef str _mime_of_url(str url):
    cdef str path = url.split("?", 1)[0].split("#", 1)[0]
    cdef Py_ssize_t dot = path.rfind(".")
    if dot < 0 or path.rfind("/") > dot:
        return None
    return _MIME_OF_EXT.get(path[dot + 1:].lower())


cdef bint _is_google_ref(str uri):
    """A fileData URI only Google can resolve: a gs:// object or a Gemini Files API file."""
    return (uri.startswith("gs://")
            or uri.startswith("https://generativelanguage.googleapis.com/")
            or uri.startswith("files/"))


# ---------------------------------------------------------------------------------------------
# Helpers: schemas


cdef object _schema_to_json(object s, int depth):
    """A Gemini Schema (OpenAPI 3.0 subset: upper-case types, `nullable`, `example`, snake_case
    keys when the SDK dumped it) as JSON Schema, the IR's schema language."""
    cdef dict out
    cdef object k2, t
    if not isinstance(s, dict) or depth > MAX_SCHEMA_DEPTH:
        return s
    out = {}
    for k, v in (<dict>s).items():
        k2 = _SCHEMA_KEYS.get(k, k)
        if k2 == "type" and isinstance(v, str):
            if v == "TYPE_UNSPECIFIED":
                continue
            v = v.lower()
        elif (k2 == "properties" or k2 == "$defs") and isinstance(v, dict):
            v = {name: _schema_to_json(sub, depth + 1) for name, sub in (<dict>v).items()}
        elif (k2 == "items" or k2 == "additionalProperties") and isinstance(v, dict):
            v = _schema_to_json(v, depth + 1)
        elif k2 == "anyOf" and isinstance(v, list):
            v = [_schema_to_json(sub, depth + 1) for sub in <list>v]
        elif k2 == "$ref" and isinstance(v, str) and v.startswith("#/defs/"):
            v = "#/$defs/" + v[7:]
        elif k2 == "propertyOrdering":
            # Gemini-only; the order of `properties` carries it (responseJsonSchema follows it)
            continue
        elif k2 == "example":
            k2 = "examples"
            v = [v]
        out[k2] = v
    if out.pop("nullable", None) is True:
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
        elif isinstance(out.get("anyOf"), list):
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
    return out


# ---------------------------------------------------------------------------------------------
# Helpers: usage and logprobs


cdef Usage _usage_from(dict um):
    cdef Usage u = Usage.__new__(Usage)
    cdef object prompt = _get(um, "promptTokenCount", "prompt_token_count")
    cdef object tool_prompt = _get(um, "toolUsePromptTokenCount", "tool_use_prompt_token_count")
    cdef object cand = _get(um, "candidatesTokenCount", "candidates_token_count")
    cdef object thoughts = _get(um, "thoughtsTokenCount", "thoughts_token_count")
    cdef object cached = _get(um, "cachedContentTokenCount", "cached_content_token_count")
    # promptTokenCount already includes cached content (IR convention); tool-use prompt tokens
    # (e.g. search results fed back to the model) are billed as input on top of it.
    u.input_known = isinstance(prompt, int)
    u.input_tokens = (prompt if isinstance(prompt, int) else 0) + (
        tool_prompt if isinstance(tool_prompt, int) else 0)
    u.reasoning_tokens = thoughts if isinstance(thoughts, int) else 0
    u.output_tokens = (cand if isinstance(cand, int) else 0) + u.reasoning_tokens
    u.cache_read_tokens = cached if isinstance(cached, int) else 0
    return u


cdef dict _usage_to(Usage u):
    cdef dict um = {"promptTokenCount": u.input_tokens,
                    "candidatesTokenCount": max(u.output_tokens - u.reasoning_tokens, 0),
                    "totalTokenCount": u.input_tokens + u.output_tokens}
    if u.reasoning_tokens:
        um["thoughtsTokenCount"] = u.reasoning_tokens
    if u.cache_read_tokens:
        um["cachedContentTokenCount"] = u.cache_read_tokens
    return um


cdef list _logprobs_from(object lr):
    """Gemini logprobsResult -> the IR's OpenAI-shaped [{token, logprob, top_logprobs}]."""
    cdef list chosen, top, out = [], alts
    cdef object c, t, lp
    cdef Py_ssize_t i
    if not isinstance(lr, dict):
        return None
    chosen = _get(lr, "chosenCandidates", "chosen_candidates")
    top = _get(lr, "topCandidates", "top_candidates")
    if not isinstance(chosen, list):
        return None
    if not isinstance(top, list):
        top = []
    for i in range(len(chosen)):
        c = chosen[i]
        if not isinstance(c, dict):
            continue
        lp = _get(c, "logProbability", "log_probability")
        alts = []
        if i < len(top) and isinstance(top[i], dict) and isinstance(top[i].get("candidates"), list):
            for t in top[i]["candidates"]:
                if isinstance(t, dict):
                    alts.append({"token": t.get("token") or "",
                                 "logprob": _get(t, "logProbability", "log_probability") or 0.0})
        out.append({"token": c.get("token") or "", "logprob": lp if lp is not None else 0.0,
                    "top_logprobs": alts})
    return out


cdef dict _logprobs_to(object lps):
    cdef list chosen = [], top = []
    if not isinstance(lps, list):
        return None
    for e in lps:
        if not isinstance(e, dict):
            continue
        chosen.append({"token": e.get("token") or "", "logProbability": e.get("logprob") or 0.0})
        top.append({"candidates": [
            {"token": t.get("token") or "", "logProbability": t.get("logprob") or 0.0}
            for t in (e.get("top_logprobs") or ()) if isinstance(t, dict)]})
    if not chosen:
        return None
    return {"topCandidates": top, "chosenCandidates": chosen}


cdef int _stop_of(object finish, bint saw_tool):
    """SPEC 1.5: Gemini says STOP after a function call, so tool use is read from the parts."""
    if finish is None:
        return SR_TOOL_USE if saw_tool else SR_UNSET
    if not isinstance(finish, str):
        return SR_OTHER
    if finish == "STOP" and saw_tool:
        return SR_TOOL_USE
    return _FINISH.get(finish, SR_OTHER)


cdef str _finish_of(int stop):
    if stop == SR_END_TURN or stop == SR_STOP_SEQUENCE or stop == SR_TOOL_USE or stop == SR_UNSET:
        return "STOP"
    if stop == SR_MAX_TOKENS:
        return "MAX_TOKENS"
    if stop == SR_SAFETY:
        return "SAFETY"
    return "OTHER"


# ---------------------------------------------------------------------------------------------
# Request


cdef Block _media_block(str mime, int src_kind, str data):
    cdef Block b = Block.__new__(Block)
    b.kind = B_IMAGE if mime is not None and mime.startswith("image/") else B_DOCUMENT
    b.src_kind = src_kind
    b.media_type = mime
    b.data = data
    return b


cdef list _read_parts(object parts, list pending, dict state, str where):
    """Parts of one Content -> IR blocks. `pending` holds [name, id] of function calls not yet
    answered, so a functionResponse without an id answers the earliest call of its name;
    state["calls"] counts function calls for minted ids."""
    cdef list blocks = []
    cdef dict p, fc, fr, blob
    cdef Block b
    cdef str text, sig, mime, uri, name, cid
    cdef object args, resp, v
    cdef Py_ssize_t i
    parts = _list_or_none(parts, where + ".parts")
    if parts is None:
        return blocks
    for raw in <list>parts:
        if not isinstance(raw, dict):
            raise CodecError("Invalid value at '%s.parts': expected objects." % where)
        p = <dict>raw
        sig = _string(_get(p, "thoughtSignature", "thought_signature"), where + ".thoughtSignature")
        text = _string(p.get("text"), where + ".text")
        if p.get("thought") is True:
            b = Block.__new__(Block)
            b.kind = B_THINKING
            b.text = text if text is not None else ""
            b.signature = sig
            blocks.append(b)
            continue
        if text is not None:
            if text:
                b = text_block(text)
                b.signature = sig
                blocks.append(b)
            continue
        v = _get(p, "inlineData", "inline_data")
        if v is not None:
            blob = _dict_or_none(v, where + ".inlineData")
            mime = _string(_get(blob, "mimeType", "mime_type"), where + ".inlineData.mimeType")
            blocks.append(_media_block(mime, SRC_BASE64,
                                       _string(blob.get("data"), where + ".inlineData.data") or ""))
            continue
        v = _get(p, "fileData", "file_data")
        if v is not None:
            blob = _dict_or_none(v, where + ".fileData")
            mime = _string(_get(blob, "mimeType", "mime_type"), where + ".fileData.mimeType")
            uri = _string(_get(blob, "fileUri", "file_uri"), where + ".fileData.fileUri") or ""
            if mime is None:
                mime = _mime_of_url(uri)
            blocks.append(_media_block(mime, SRC_VENDOR if _is_google_ref(uri) else SRC_URL, uri))
            continue
        v = _get(p, "functionCall", "function_call")
        if v is not None:
            fc = _dict_or_none(v, where + ".functionCall")
            name = _string(fc.get("name"), where + ".functionCall.name") or ""
            args = fc.get("args")
            cid = _string(fc.get("id"), where + ".functionCall.id")
            state["calls"] += 1
            if not cid:
                cid = _call_id("request:%d:%s" % (state["calls"], name))
            b = Block.__new__(Block)
            b.kind = B_TOOL_USE
            b.id = cid
            b.name = name
            b.input = args if args is not None else {}
            b.signature = sig
            blocks.append(b)
            pending.append([name, cid])
            continue
        v = _get(p, "functionResponse", "function_response")
        if v is not None:
            fr = _dict_or_none(v, where + ".functionResponse")
            name = _string(fr.get("name"), where + ".functionResponse.name") or ""
            cid = _string(fr.get("id"), where + ".functionResponse.id")
            for i in range(len(pending)):
                if (cid and pending[i][1] == cid) or (not cid and pending[i][0] == name):
                    cid = pending[i][1]
                    del pending[i]
                    break
            else:
                if not cid:
                    # an answer to a call that is not in the history: still a consistent id
                    state["calls"] += 1
                    cid = _call_id("request:%d:%s" % (state["calls"], name))
            resp = fr.get("response")
            b = Block.__new__(Block)
            b.kind = B_TOOL_RESULT
            b.id = cid
            b.name = name
            b.content = []
            if resp is not None:
                b.content.append(text_block(orjson.dumps(resp).decode("utf-8")))
                # Google's convention: {"error": ...} reports a failed call
                b.is_error = isinstance(resp, dict) and len(resp) == 1 and "error" in resp
            # multimodal function responses carry their media in FunctionResponse.parts
            for fp in _list_or_none(fr.get("parts"), where + ".functionResponse.parts") or ():
                if isinstance(fp, dict):
                    v = _get(<dict>fp, "inlineData", "inline_data")
                    if isinstance(v, dict):
                        mime = _string(_get(<dict>v, "mimeType", "mime_type"), where + ".mimeType")
                        b.content.append(_media_block(
                            mime, SRC_BASE64, _string(v.get("data"), where + ".data") or ""))
            blocks.append(b)
            continue
        # executableCode, codeExecutionResult, videoMetadata...: no IR home
    return blocks


cdef void _read_generation(Request req, dict gen) except *:
    cdef dict extra_gen = {}, tc
    cdef object v, mime, schema, budget, level
    cdef list stops
    req.max_tokens = _integer(_get(gen, "maxOutputTokens", "max_output_tokens"),
                              "generationConfig.maxOutputTokens")
    req.temperature = _number(gen.get("temperature"), "generationConfig.temperature")
    req.top_p = _number(_get(gen, "topP", "top_p"), "generationConfig.topP")
    v = _number(_get(gen, "topK", "top_k"), "generationConfig.topK")
    req.top_k = int(v) if isinstance(v, float) and (<double>v).is_integer() else v
    req.n = _integer(_get(gen, "candidateCount", "candidate_count"),
                     "generationConfig.candidateCount")
    req.seed = _integer(gen.get("seed"), "generationConfig.seed")
    req.presence_penalty = _number(_get(gen, "presencePenalty", "presence_penalty"),
                                   "generationConfig.presencePenalty")
    req.frequency_penalty = _number(_get(gen, "frequencyPenalty", "frequency_penalty"),
                                    "generationConfig.frequencyPenalty")
    stops = _list_or_none(_get(gen, "stopSequences", "stop_sequences"),
                          "generationConfig.stopSequences")
    if stops is not None:
        for s in stops:
            _string(s, "generationConfig.stopSequences")
        req.stop = list(stops)
    v = _get(gen, "responseLogprobs", "response_logprobs")
    if v is not None:
        req.logprobs = bool(v)
    req.top_logprobs = _integer(gen.get("logprobs"), "generationConfig.logprobs")

    mime = _string(_get(gen, "responseMimeType", "response_mime_type"),
                   "generationConfig.responseMimeType")
    schema = _get(gen, "responseJsonSchema", "response_json_schema")
    if schema is None:
        schema = _get(gen, "responseSchema", "response_schema")
        if schema is not None:
            schema = _schema_to_json(schema, 0)
    if mime == "application/json":
        if schema is not None:
            req.response_format = RF_JSON_SCHEMA
            # Gemini schemas are nameless; OpenAI-style targets require a name
            req.rf_name = "response"
            req.rf_schema = schema
        else:
            req.response_format = RF_JSON_OBJECT
    elif mime == "text/plain" and schema is None:
        req.response_format = RF_TEXT
    elif mime is not None:
        # text/x.enum and friends: no IR home
        extra_gen["responseMimeType"] = mime
        for k in ("responseSchema", "response_schema",
                  "responseJsonSchema", "response_json_schema"):
            if gen.get(k) is not None:
                extra_gen[_camel(k)] = gen[k]

    tc = _dict_or_none(_get(gen, "thinkingConfig", "thinking_config"),
                       "generationConfig.thinkingConfig")
    if tc is not None:
        budget = _integer(_get(tc, "thinkingBudget", "thinking_budget"),
                          "generationConfig.thinkingConfig.thinkingBudget")
        level = _string(_get(tc, "thinkingLevel", "thinking_level"),
                        "generationConfig.thinkingConfig.thinkingLevel")
        if budget is not None:
            if budget < 0:
                req.reasoning_effort = "medium"  # SPEC 1.5: dynamic (-1) becomes medium
            else:
                req.reasoning_budget = budget
        if level is not None and level != "THINKING_LEVEL_UNSPECIFIED":
            level = level.lower()
            req.reasoning_effort = "high" if level == "xhigh" else level
        # a same-protocol rewrite sends the client's exact thinkingConfig (thinkingLevel vs
        # thinkingBudget, includeThoughts), normalised to camelCase
        extra_gen["thinkingConfig"] = {_camel(k): tv for k, tv in tc.items()}

    for k, v in gen.items():
        if k not in _GEN_KNOWN:
            extra_gen[_camel(k)] = v
    if extra_gen:
        req.extra["generationConfig"] = extra_gen


cdef void _read_tools(Request req, list tools) except *:
    cdef list other = []
    cdef dict t, fd, rest
    cdef Tool tool
    cdef object decls, schema
    for raw in tools:
        t = _dict_or_none(raw, "tools")
        if t is None:
            continue
        decls = _list_or_none(_get(t, "functionDeclarations", "function_declarations"),
                              "tools.functionDeclarations")
        for d in decls or ():
            fd = _dict_or_none(d, "tools.functionDeclarations")
            if fd is None:
                continue
            tool = Tool.__new__(Tool)
            tool.name = _string(fd.get("name"), "tools.functionDeclarations.name") or ""
            tool.description = _string(fd.get("description"),
                                       "tools.functionDeclarations.description")
            schema = _get(fd, "parametersJsonSchema", "parameters_json_schema")
            if schema is None and fd.get("parameters") is not None:
                schema = _schema_to_json(fd["parameters"], 0)
            tool.schema = schema
            req.tools.append(tool)
        rest = {k: v for k, v in t.items()
                if k != "functionDeclarations" and k != "function_declarations"}
        if rest:
            other.append(rest)  # googleSearch, codeExecution, urlContext...: same-protocol only
    if other:
        req.extra["tools"] = other


cdef void _read_tool_config(Request req, dict tc) except *:
    cdef dict fcc = _dict_or_none(_get(tc, "functionCallingConfig", "function_calling_config"),
                                  "toolConfig.functionCallingConfig")
    cdef str mode
    cdef list allowed
    cdef bint named = False
    cdef bint exact = all(k == "functionCallingConfig" or k == "function_calling_config"
                          for k in tc)
    if fcc is not None:
        mode = _string(fcc.get("mode"), "toolConfig.functionCallingConfig.mode")
        allowed = _list_or_none(_get(fcc, "allowedFunctionNames", "allowed_function_names"),
                                "toolConfig.functionCallingConfig.allowedFunctionNames")
        if mode == "ANY" and allowed is not None and len(allowed) == 1:
            req.tool_choice = TC_TOOL
            req.tool_choice_name = _string(allowed[0], "allowedFunctionNames")
            named = True
        elif mode == "ANY":
            req.tool_choice = TC_REQUIRED
        elif mode == "NONE":
            req.tool_choice = TC_NONE
        elif mode == "AUTO" or mode == "VALIDATED":
            req.tool_choice = TC_AUTO
        if mode is not None and mode != "AUTO" and mode != "ANY" and mode != "NONE":
            exact = False
        for k in fcc:
            if k != "mode" and not (named and (k == "allowedFunctionNames"
                                               or k == "allowed_function_names")):
                exact = False
    if not exact:
        # allowedFunctionNames subsets, VALIDATED, retrievalConfig: same-protocol only
        req.extra["toolConfig"] = tc


cpdef Request read_request(bytes body):
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(PARSE_ERROR) from None
    if not isinstance(data, dict):
        raise CodecError(_BAD_SHAPE)
    try:
        return _read_request(<dict>data)
    except CodecError:
        raise
    except Exception:
        # untrusted input must never surface as another exception type
        raise CodecError(_BAD_SHAPE)


cdef Request _read_request(dict data):
    cdef Request req = Request()
    cdef dict si, content, state = {"calls": 0}
    cdef list contents, pending = []
    cdef Message m
    cdef str role
    cdef object v
    v = _get(data, "systemInstruction", "system_instruction")
    if isinstance(v, str):
        if v:
            req.system.append(text_block(v))
    elif v is not None:
        si = _dict_or_none(v, "systemInstruction")
        for b in _read_parts(si.get("parts"), pending, state, "systemInstruction"):
            if (<Block>b).kind == B_TEXT:
                req.system.append(b)

    contents = req_list(data, "contents", "contents", SHAPE)
    for i in range(len(contents)):
        content = contents[i] if type(contents[i]) is dict else as_dict(contents[i], "contents[%d]" % i, SHAPE)
        role = _string(content.get("role"), "contents.role")
        m = Message.__new__(Message)
        if role is None or role == "user" or role == "function":
            m.role = ROLE_USER
        elif role == "model":
            m.role = ROLE_ASSISTANT
        else:
            raise CodecError("Please use a valid role: user, model.")
        m.content = _read_parts(content.get("parts"), pending, state, "contents[%d]" % i)
        req.messages.append(m)

    v = _get(data, "generationConfig", "generation_config")
    if v is not None:
        _read_generation(req, _dict_or_none(v, "generationConfig"))
    v = _list_or_none(data.get("tools"), "tools")
    if v is not None:
        _read_tools(req, v)
    v = _get(data, "toolConfig", "tool_config")
    if v is not None:
        _read_tool_config(req, _dict_or_none(v, "toolConfig"))

    for k, v in data.items():
        if k not in _TOP_KNOWN:
            # safetySettings, cachedContent, labels, ...: same-protocol only
            req.extra[_camel(k)] = v
    return req


cdef dict _tool_response(Block b):
    cdef list texts = []
    cdef str text
    cdef object parsed
    for c in b.content or ():
        if (<Block>c).kind == B_TEXT and (<Block>c).text:
            texts.append((<Block>c).text)
    text = "".join(texts)
    if text[:1] == "{":
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"error": text} if b.is_error else {"result": text}


cdef dict _media_part(Block b):
    cdef dict fd
    if b.src_kind == SRC_BASE64:
        return {"inlineData": {"mimeType": b.media_type or "application/octet-stream",
                               "data": b.data or ""}}
    if b.src_kind == SRC_URL or (b.src_kind == SRC_VENDOR and b.data and _is_google_ref(b.data)):
        fd = {"fileUri": b.data or ""}
        if b.media_type is not None or _mime_of_url(b.data or "") is not None:
            fd["mimeType"] = b.media_type or _mime_of_url(b.data or "")
        return {"fileData": fd}
    if b.kind == B_DOCUMENT and b.text:
        return {"text": b.text}
    return None  # a foreign vendor reference (OpenAI file id, s3 uri): Gemini cannot read it


cdef list _write_parts(Message m, dict names):
    cdef list parts = []
    cdef dict p, call
    cdef Block b
    cdef bint model = m.role == ROLE_ASSISTANT
    cdef dict first_call = None
    cdef bint call_signed = False
    for blk in m.content:
        b = <Block>blk
        if b.kind == B_TEXT:
            if not text_is_empty(b):
                p = {"text": text_value(b)}     # a client's literal stays one (jsonspan)
                if model and b.signature and _is_b64(b.signature):
                    p["thoughtSignature"] = b.signature
                parts.append(p)
        elif b.kind == B_THINKING:
            # Gemini reads nothing from unsigned thought text, and a redacted (Anthropic-only)
            # payload means nothing to it: send only signed thoughts.
            if model and not b.redacted and b.signature and _is_b64(b.signature):
                parts.append({"text": b.text or "", "thought": True,
                              "thoughtSignature": b.signature})
        elif b.kind == B_IMAGE or b.kind == B_DOCUMENT:
            p = _media_part(b)
            if p is not None:
                parts.append(p)
        elif b.kind == B_TOOL_USE:
            names[b.id] = b.name
            call = {"name": b.name or "",
                    "args": object_of(b.input)}
            if b.id:
                call["id"] = b.id
            p = {"functionCall": call}
            if b.signature and _is_b64(b.signature):
                p["thoughtSignature"] = b.signature
                call_signed = True
            elif first_call is None:
                first_call = p
            parts.append(p)
        elif b.kind == B_TOOL_RESULT:
            call = {"name": names.get(b.id) or b.name or b.id or "", "response": _tool_response(b)}
            if b.id:
                call["id"] = b.id
            parts.append({"functionResponse": call})
            # images a tool returned ride along as parts of the same turn, which every Gemini
            # model reads (FunctionResponse.parts is newer and model-dependent)
            for c in b.content or ():
                if (<Block>c).kind == B_IMAGE or (<Block>c).kind == B_DOCUMENT:
                    p = _media_part(<Block>c)
                    if p is not None and "text" not in p:
                        parts.append(p)
    if model and first_call is not None and not call_signed:
        first_call["thoughtSignature"] = _FOREIGN_SIGNATURE
    return parts


cpdef bytes write_request(Request req):
    cdef dict body = {}, gen = {}, names = {}, extra = req.extra or {}, tc
    cdef object extra_gen
    cdef list contents = [], parts, decls
    cdef object budget
    cdef Tool t
    for m in req.messages:
        parts = _write_parts(<Message>m, names)
        if parts:  # Gemini rejects a Content without parts
            contents.append({"role": "model" if (<Message>m).role == ROLE_ASSISTANT else "user",
                             "parts": parts})
    body["contents"] = contents
    parts = [{"text": text_value(<Block>b)} for b in req.system if not text_is_empty(<Block>b)]
    if parts:
        body["systemInstruction"] = {"parts": parts}

    if req.max_tokens is not None:
        gen["maxOutputTokens"] = req.max_tokens
    if req.temperature is not None:
        gen["temperature"] = req.temperature
    if req.top_p is not None:
        gen["topP"] = req.top_p
    if req.top_k is not None:
        gen["topK"] = req.top_k
    if req.stop:
        gen["stopSequences"] = req.stop[:MAX_STOP]
    if req.n is not None:
        gen["candidateCount"] = req.n
    if req.seed is not None:
        gen["seed"] = req.seed
    if req.presence_penalty is not None:
        gen["presencePenalty"] = req.presence_penalty
    if req.frequency_penalty is not None:
        gen["frequencyPenalty"] = req.frequency_penalty
    if req.response_format == RF_JSON_SCHEMA:
        gen["responseMimeType"] = "application/json"
        if req.rf_schema is not None:
            # JSON Schema as given; `responseSchema` is the narrower OpenAPI subset that rejects
            # keywords such as additionalProperties which OpenAI strict schemas always carry
            gen["responseJsonSchema"] = req.rf_schema
    elif req.response_format == RF_JSON_OBJECT:
        gen["responseMimeType"] = "application/json"
    elif req.response_format == RF_TEXT:
        gen["responseMimeType"] = "text/plain"
    if req.logprobs is not None:
        gen["responseLogprobs"] = req.logprobs
    if req.top_logprobs is not None:
        gen["logprobs"] = req.top_logprobs
    extra_gen = extra.get("generationConfig")
    if not isinstance(extra_gen, dict):
        extra_gen = {}
    if "thinkingConfig" not in extra_gen:
        budget = req.reasoning_budget
        if budget is None and req.reasoning_effort is not None:
            budget = budget_of_effort(req.reasoning_effort)
        if budget is not None:
            tc = {"thinkingBudget": budget}
            if budget:
                # thought summaries are what other protocols carry as thinking blocks
                tc["includeThoughts"] = True
            gen["thinkingConfig"] = tc
    gen.update(extra_gen)
    if gen:
        body["generationConfig"] = gen

    decls = []
    for tool in req.tools:
        t = <Tool>tool
        fd = {"name": t.name or ""}
        if t.description:
            fd["description"] = t.description
        if t.schema is not None:
            # JSON Schema as given (see responseJsonSchema above)
            fd["parametersJsonSchema"] = t.schema
        decls.append(fd)
    tools = [{"functionDeclarations": decls}] if decls else []
    if isinstance(extra.get("tools"), list):
        tools.extend(extra["tools"])
    if tools:
        body["tools"] = tools
    if decls:
        if isinstance(extra.get("toolConfig"), dict):
            body["toolConfig"] = extra["toolConfig"]
        elif req.tool_choice == TC_AUTO:
            body["toolConfig"] = {"functionCallingConfig": {"mode": "AUTO"}}
        elif req.tool_choice == TC_NONE:
            body["toolConfig"] = {"functionCallingConfig": {"mode": "NONE"}}
        elif req.tool_choice == TC_REQUIRED:
            body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}
        elif req.tool_choice == TC_TOOL:
            body["toolConfig"] = {"functionCallingConfig": {
                "mode": "ANY", "allowedFunctionNames": [req.tool_choice_name or ""]}}
    for k, v in extra.items():
        if k not in body and k != "generationConfig" and k != "tools" and k != "toolConfig":
            body[k] = v
    return orjson.dumps(body)


cpdef str upstream_path(str model, bint stream):
    cdef str resource = model if "/" in model else "models/" + model  # tunedModels/x stays
    if stream:
        return "/v1beta/" + resource + ":streamGenerateContent?alt=sse"
    return "/v1beta/" + resource + ":generateContent"


# ---------------------------------------------------------------------------------------------
# Response and usage (buffered)


cdef list _response_parts(object cand):
    cdef object content, parts
    if not isinstance(cand, dict):
        return []
    content = (<dict>cand).get("content")
    if not isinstance(content, dict):
        return []
    parts = (<dict>content).get("parts")
    return <list>parts if isinstance(parts, list) else []


cpdef Response read_response(bytes body):
    cdef Response resp = Response()
    cdef object data, cand, um, fb
    cdef list chunks, candidates
    cdef dict p, fc
    cdef Block b, last
    cdef str text, sig, mime
    cdef bint saw_tool = False
    cdef object finish = None, lp
    cdef int calls = 0, kind
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(UPSTREAM_NOT_JSON) from None
    # a streamed JSON array answered to a buffered call is folded into one response
    chunks = data if isinstance(data, list) else [data]
    for chunk in chunks:
        if not isinstance(chunk, dict):
            raise CodecError("The upstream response does not have the generateContent shape.")
        if resp.id is None and isinstance(chunk.get("responseId"), str):
            resp.id = chunk["responseId"]
        if isinstance(chunk.get("modelVersion"), str):
            resp.model = chunk["modelVersion"]
        um = chunk.get("usageMetadata")
        if isinstance(um, dict):
            resp.usage = _usage_from(um)
        fb = chunk.get("promptFeedback")
        if isinstance(fb, dict) and fb.get("blockReason"):
            finish = "SAFETY"
        candidates = chunk.get("candidates") if isinstance(chunk.get("candidates"), list) else []
        if not candidates:
            continue
        cand = candidates[0]
        if not isinstance(cand, dict):
            continue
        if (<dict>cand).get("finishReason") is not None:
            finish = (<dict>cand)["finishReason"]
        lp = _logprobs_from((<dict>cand).get("logprobsResult"))
        if lp is not None:
            resp.logprobs = (resp.logprobs or []) + lp
        for raw in _response_parts(cand):
            if not isinstance(raw, dict):
                continue
            p = <dict>raw
            sig = p.get("thoughtSignature") if isinstance(p.get("thoughtSignature"), str) else None
            text = p.get("text") if isinstance(p.get("text"), str) else None
            last = resp.content[len(resp.content) - 1] if resp.content else None
            if text is not None:
                kind = B_THINKING if p.get("thought") is True else B_TEXT
                # adjacent parts of one kind are one block (a stream folds into whole blocks);
                # a signature ends a thought run
                if last is not None and last.kind == kind and (
                        kind == B_TEXT or last.signature is None):
                    last.text += text
                    if sig is not None:
                        last.signature = sig
                elif text or sig is not None:
                    b = Block.__new__(Block)
                    b.kind = kind
                    b.text = text
                    b.signature = sig
                    resp.content.append(b)
                continue
            fc = p.get("functionCall") if isinstance(p.get("functionCall"), dict) else None
            if fc is not None:
                saw_tool = True
                b = Block.__new__(Block)
                b.kind = B_TOOL_USE
                b.name = fc.get("name") if isinstance(fc.get("name"), str) else ""
                b.input = fc.get("args") if fc.get("args") is not None else {}
                b.id = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else _call_id(
                    None if resp.id is None else "%s:%d" % (resp.id, calls))
                b.signature = sig
                calls += 1
                resp.content.append(b)
                continue
            blob = p.get("inlineData")
            if isinstance(blob, dict) and isinstance(blob.get("data"), str):
                mime = blob.get("mimeType") if isinstance(blob.get("mimeType"), str) else None
                resp.content.append(_media_block(mime, SRC_BASE64, blob["data"]))
    resp.stop_reason = _stop_of(finish, saw_tool)
    return resp


cpdef bytes write_response(Response resp):
    cdef list parts = []
    cdef dict p, call, cand, out, lr
    cdef Block b
    for blk in resp.content:
        b = <Block>blk
        if b.kind == B_TEXT:
            p = {"text": b.text or ""}
            if b.signature and _is_b64(b.signature):
                p["thoughtSignature"] = b.signature
            parts.append(p)
        elif b.kind == B_THINKING:
            if b.redacted:
                continue  # an opaque Anthropic payload has no Gemini form
            p = {"text": b.text or "", "thought": True}
            if b.signature and _is_b64(b.signature):
                p["thoughtSignature"] = b.signature
            parts.append(p)
        elif b.kind == B_TOOL_USE:
            call = {"name": b.name or "",
                    "args": object_of(b.input)}
            if b.id:
                call["id"] = b.id
            p = {"functionCall": call}
            if b.signature and _is_b64(b.signature):
                p["thoughtSignature"] = b.signature
            parts.append(p)
        elif (b.kind == B_IMAGE or b.kind == B_DOCUMENT) and b.src_kind == SRC_BASE64:
            parts.append({"inlineData": {"mimeType": b.media_type or "application/octet-stream",
                                         "data": b.data or ""}})
    if not parts:
        parts.append({"text": ""})
    cand = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if resp.stop_reason != SR_UNSET:
        cand["finishReason"] = _finish_of(resp.stop_reason)
    lr = _logprobs_to(resp.logprobs)
    if lr is not None:
        cand["logprobsResult"] = lr
    out = {"candidates": [cand],
           "usageMetadata": _usage_to(resp.usage if resp.usage is not None else Usage())}
    if resp.model is not None:
        out["modelVersion"] = resp.model
    if resp.id is not None:
        out["responseId"] = resp.id
    return orjson.dumps(out)


cpdef Usage read_usage(bytes body):
    cdef object um
    try:
        um = top_field(body, b"usageMetadata")
    except FramingError:
        # a streamed JSON array answered to a buffered call: the last chunk's usage counts
        um = None
        try:
            chunks = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise CodecError(UPSTREAM_NOT_JSON) from None
        if not isinstance(chunks, list):
            raise CodecError(UPSTREAM_NOT_JSON)
        for chunk in chunks:
            if isinstance(chunk, dict) and isinstance(chunk.get("usageMetadata"), dict):
                um = chunk["usageMetadata"]
    return _usage_from(um) if isinstance(um, dict) else Usage(input_known=False)


# ---------------------------------------------------------------------------------------------
# Errors and discovery: errors, ids


cdef str _rpc_status(int status):
    cdef str name = _RPC_STATUS.get(status)
    if name is not None:
        return name
    if 400 <= status < 500:
        return "FAILED_PRECONDITION" if status == 412 else "INVALID_ARGUMENT"
    return "INTERNAL"


cpdef bytes write_error(int status, str kind, str message, str request_id=None):
    cdef dict err = {"code": status, "message": message or "", "status": _rpc_status(status)}
    if kind == "authentication":
        err["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                           "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]
    return orjson.dumps({"error": err})


# busbar's own refusals in Google's words (_common.own_error_in says what each kind is).
cdef dict OWN_ERRORS = {
    "authentication": (400, "API key not valid. Please pass a valid API key."),
    "permission": (403, None),
    "quota": (429, None),
}


cpdef tuple own_error(str kind):
    return own_error_in(OWN_ERRORS, kind)


cpdef tuple read_error_detail(bytes body):
    """(message, code) of an upstream error body; the code is Google's `error.status`
    (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...)."""
    # a non-SSE streaming call reports its error inside the JSON array
    cdef dict data = error_object(body, True)
    cdef object err, msg = None, code = None
    if data is None:
        return (None, None)
    err = data.get("error")
    if isinstance(err, dict):
        if isinstance(err.get("message"), str) and err["message"]:
            msg = err["message"]
        if isinstance(err.get("status"), str) and err["status"]:
            code = err["status"]
    return (msg, code)


# ---------------------------------------------------------------------------------------------
# Discovery: what the engine asks the codec instead of branching on its name


# Gemini has responseSchema: structured output never becomes a forced tool. Its final chunk
# always carries usageMetadata: nothing for the client to ask, nothing to hide. No headers of its
# own.
forced_tool_name = no_forced_tool
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is
response_headers = no_response_headers
error_headers = no_error_headers


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    """json_array: the client called streamGenerateContent without ?alt=sse."""
    cdef StreamEncoder enc = StreamEncoder(id, model)
    enc.json_array = json_array
    return enc


cpdef str not_found_message(str name, str api_version):
    return ("models/%s is not found for API version %s, or is not supported for the task you are "
            "trying to perform." % (name, api_version or "v1beta"))


cpdef bytes write_model_list(list names):
    return orjson.dumps({"models": [
        {"name": "models/" + n, "displayName": n,
         "supportedGenerationMethods": ["generateContent", "streamGenerateContent"]}
        for n in names]})


cpdef str mint_id():
    """A responseId-like token: Gemini's are ~23 URL-safe base64 characters."""
    return ids.urlsafe(17)


# ---------------------------------------------------------------------------------------------
# Decoder


cdef class StreamDecoder(SSEDecoder):

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.array = JsonArrayParser(max_frame)
        self.seq = BlockSequencer()

    cpdef list feed(self, bytes chunk):
        """SSE mode is SSEDecoder's; the JSON-array mode reads the array's elements as frames.
        close() is SSEDecoder's in both: in JSON-array mode its SSE parser holds nothing, and an
        unfinished stream (no finishReason, or a truncated element) gets nothing more, as the
        engine ends the client stream with an error."""
        cdef list out = [], frames
        cdef Py_ssize_t i, n
        if self.done:
            return out
        if self.mode == 0:
            n = len(chunk)
            i = 0
            while i < n and chunk[i] in b" \t\r\n\xef\xbb\xbf":
                i += 1
            if i == n:
                return out  # whitespace only: the framing is not known yet
            self.mode = 2 if chunk[i] == 91 else 1  # `[`
        if self.mode == 1:
            return SSEDecoder.feed(self, chunk)
        try:
            frames = self.array.feed(chunk)
        except FramingError:
            raise jsonget.frame_too_large() from None
        for data in frames:
            self._frame(None, data, out)
            if self.done:
                break
        return out

    cdef void _fail(self, str kind, str message, list out) except *:
        out.append(ev_error(kind, message))
        self.done = True

    cdef void _frame(self, object event, bytes data, list out) except *:
        data = data.strip()
        if not data or data == b"[DONE]":
            return  # a keep-alive, or the end marker some compatible servers add
        self._chunk(jsonget.frame_object(data), out)

    cdef void _chunk(self, dict chunk, list out) except *:
        cdef object err = chunk.get("error"), um, cand, finish, fb, lp
        cdef str message, kind
        cdef Usage start_usage
        if err is not None:
            message = None
            kind = "api_error"
            if isinstance(err, dict):
                if isinstance(err.get("message"), str):
                    message = err["message"]
                if isinstance(err.get("code"), int) and not isinstance(err.get("code"), bool):
                    kind = kind_of_status(err["code"])
                elif isinstance(err.get("status"), str):
                    kind = _KIND_OF_RPC.get(err["status"], "api_error")
            self._fail(kind, message or "The upstream reported an error.", out)
            return
        um = chunk.get("usageMetadata")
        if isinstance(um, dict):
            self.usage = _usage_from(<dict>um)
        if not self.started:
            self.started = True
            if isinstance(chunk.get("responseId"), str):
                self.response_id = chunk["responseId"]
            if self.usage is not None:
                start_usage = self.usage.copy()
                start_usage.output_tokens = 0
                start_usage.reasoning_tokens = 0
            else:
                start_usage = Usage(input_known=False)
            out.append(ev_message_start(
                self.response_id,
                chunk["modelVersion"] if isinstance(chunk.get("modelVersion"), str) else None,
                start_usage))
        finish = None
        candidates = chunk.get("candidates")
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
            cand = candidates[0]
            lp = _logprobs_from((<dict>cand).get("logprobsResult"))
            for raw in _response_parts(cand):
                if isinstance(raw, dict):
                    self._part(<dict>raw, lp, out)
                    if lp is not None and self.seq.open_kind == B_TEXT:
                        lp = None  # attached to this chunk's first text delta
            finish = (<dict>cand).get("finishReason")
        fb = chunk.get("promptFeedback")
        if finish is None and isinstance(fb, dict) and fb.get("blockReason"):
            finish = "SAFETY"
        if finish is not None:
            self.seq.close(out)
            out.append(ev_message_delta(_stop_of(finish, self.saw_tool), None,
                                        self.usage.copy() if self.usage is not None else Usage()))
            out.append(ev_message_stop())
            self.done = True
            self.finished = True

    cdef void _part(self, dict p, object logprobs, list out) except *:
        cdef object text = p.get("text"), sig = p.get("thoughtSignature"), fc
        cdef Event e
        if isinstance(text, str):
            if p.get("thought") is True:
                if self.seq.open_kind != B_THINKING or self.sealed:
                    if not text and not isinstance(sig, str):
                        return
                    self.seq.close(out)     # a sealed thought run ends: the next one is a new block
                    self.sealed = False
                if text:
                    self.seq.thinking(out, text)
                else:
                    self.seq.ensure(out, B_THINKING)
                if isinstance(sig, str) and sig:
                    self.seq.delta(out, D_SIGNATURE, sig)
                    self.sealed = True  # a signature ends a thought run
                return
            # A signature on a text part signs the turn for Gemini only; no IR event carries it.
            if not text:
                return
            e = self.seq.text(out, text)
            e.data = logprobs
            return
        fc = p.get("functionCall")
        if isinstance(fc, dict):
            self.saw_tool = True
            self.seq.tool_start(
                out, fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else _call_id(
                    None if self.response_id is None else "%s:%d" % (self.response_id, self.tool_count)),
                fc.get("name") if isinstance(fc.get("name"), str) else "")
            self.tool_count += 1
            # Gemini sends a call whole: its arguments are one fragment
            self.seq.tool_args(out, orjson.dumps(
                fc.get("args") if fc.get("args") is not None else {}).decode("utf-8"))
            self.seq.close(out)


# ---------------------------------------------------------------------------------------------
# Encoder


cdef class StreamEncoder:

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.json_array = False
        self.tools = {}
        self.usage = Usage(input_known=False)   # zeros until MESSAGE_START or MESSAGE_DELTA says more

    cdef bytes _frame(self, dict chunk):
        cdef bytes data = orjson.dumps(chunk)
        cdef bint first
        if not self.json_array:
            return sse_data_crlf(data)
        first = not self.wrote
        self.wrote = True
        return json_array_item(data, first)

    cdef bytes _parts_chunk(self, list parts, object logprobs):
        cdef dict cand = {"content": {"parts": parts, "role": "model"}, "index": 0}
        cdef dict lr = _logprobs_to(logprobs)
        if lr is not None:
            cand["logprobsResult"] = lr
        return self._frame({"candidates": [cand], "modelVersion": self.model,
                            "responseId": self.id})

    cdef bytes _final_chunk(self):
        cdef bytes out = self._frame({
            "candidates": [{"content": {"parts": [{"text": ""}], "role": "model"},
                            "finishReason": _finish_of(self.stop_reason), "index": 0}],
            "usageMetadata": _usage_to(self.usage),
            "modelVersion": self.model, "responseId": self.id})
        self.finished = True
        if self.json_array:
            out += b"]"
        return out

    cpdef bytes encode(self, list events):
        cdef bytearray out = bytearray()
        cdef Event e
        cdef list tool
        cdef dict call
        for ev in events:
            if self.finished:
                break
            e = <Event>ev
            if e.kind == EV_MESSAGE_START:
                self.usage = merge_usage(self.usage, e.usage)
            elif e.kind == EV_BLOCK_START:
                if e.block is not None and e.block.kind == B_TOOL_USE:
                    self.tools[e.index] = [e.block.id, e.block.name, []]
                elif e.block is not None and e.block.text and (
                        e.block.kind == B_TEXT or e.block.kind == B_THINKING):
                    out += self._parts_chunk(
                        [{"text": e.block.text, "thought": True} if e.block.kind == B_THINKING
                         else {"text": e.block.text}], None)
            elif e.kind == EV_BLOCK_DELTA:
                if e.delta_kind == D_TEXT and e.text:
                    out += self._parts_chunk([{"text": e.text}], e.data)
                elif e.delta_kind == D_THINKING and e.text:
                    out += self._parts_chunk([{"text": e.text, "thought": True}], None)
                elif e.delta_kind == D_SIGNATURE and e.text and _is_b64(e.text):
                    out += self._parts_chunk(
                        [{"text": "", "thought": True, "thoughtSignature": e.text}], None)
                elif e.delta_kind == D_INPUT_JSON and e.index in self.tools and e.text:
                    (<list>self.tools[e.index])[2].append(e.text)
            elif e.kind == EV_BLOCK_STOP:
                tool = self.tools.pop(e.index, None)
                if tool is not None:
                    # Gemini has no argument deltas: the call goes out whole when it is complete
                    call = {"name": tool[1] or "", "args": object_of("".join(tool[2]))}
                    if tool[0]:
                        call["id"] = tool[0]
                    out += self._parts_chunk([{"functionCall": call}], None)
            elif e.kind == EV_MESSAGE_DELTA:
                self.stop_reason = e.stop_reason
                self.usage = merge_usage(self.usage, e.usage)
            elif e.kind == EV_MESSAGE_STOP:
                out += self._final_chunk()
            elif e.kind == EV_ERROR:
                out += self.error(e.error_kind, e.message)
        return bytes(out)

    cpdef bytes error(self, str kind, str message):
        cdef int status
        cdef bytes data
        if self.finished:
            return b""
        status = STATUS_OF_KIND.get(kind, 500)
        data = orjson.dumps({"error": {"code": status, "message": message or "",
                                       "status": _rpc_status(status)}})
        self.finished = True
        if not self.json_array:
            return sse_data_crlf(data)
        first = not self.wrote
        self.wrote = True
        return json_array_item(data, first) + b"]"


def error_signals(doc):
    """What an error_map is matched against in a Gemini error body (`doc`, parsed; a non-SSE
    stream's error comes inside the JSON array): `error.code` (a number or a string, else
    `error.status`), then `error.status`."""
    if isinstance(doc, list) and doc:
        doc = doc[0]
    if not isinstance(doc, dict):
        return []
    err = doc.get("error")
    err = err if isinstance(err, dict) else {}
    code = err.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        code = str(code)
    if not isinstance(code, str):
        code = err.get("status")
    return [s for s in (code, err.get("status")) if isinstance(s, str) and s]
