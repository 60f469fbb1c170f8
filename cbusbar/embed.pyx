"""Embeddings: a small IR (embed.pxd) and each protocol's request/response reader and writer, as
tables keyed by protocol name (READ_REQUEST, WRITE_REQUEST, READ_RESPONSE, WRITE_RESPONSE,
UPSTREAM_PATH), the h11 way, instead of if-chains in the engine.

Wire formats from the official SDKs and service models: openai `embeddings.create` (the SDK asks
for base64 unless told otherwise), google-genai `embed_content` (always :batchEmbedContents, every
request naming `models/{m}`), cohere `ClientV2.embed` (input_type and embedding_types), and
botocore's bedrock-runtime InvokeModel with Amazon Titan Text Embeddings (`inputText`, one text per
call, `dimensions`, `normalize`) or Cohere Embed on Bedrock (`texts`, `input_type`).
"""
import base64
from array import array
from urllib.parse import quote

import orjson

from cbusbar cimport ids

from cbusbar.ir import CodecError

PROTOCOLS = ("openai", "gemini", "cohere", "bedrock")

BAD_JSON = "We could not parse the JSON body of your request."
UPSTREAM_BAD = "The upstream returned an embeddings response busbar could not read."

# canonical input type <-> each protocol's name
GEMINI_TASK = {"query": "RETRIEVAL_QUERY", "document": "RETRIEVAL_DOCUMENT",
               "classification": "CLASSIFICATION", "clustering": "CLUSTERING",
               "similarity": "SEMANTIC_SIMILARITY"}
COHERE_TYPE = {"query": "search_query", "document": "search_document",
               "classification": "classification", "clustering": "clustering"}
_FROM_GEMINI = {v: k for k, v in GEMINI_TASK.items()}
_FROM_COHERE = {v: k for k, v in COHERE_TYPE.items()}
# Cohere's v3+ embedding models require input_type; a caller that did not say is embedding
# documents far more often than queries (indexing is the bulk of embedding traffic).
COHERE_DEFAULT_TYPE = "search_document"
# The output types busbar can produce from float vectors; int8/uint8/binary need the vendor's
# own quantisation and are not offered.
COHERE_TYPES = ("float", "base64")


cdef class EmbedRequest:
    def __init__(self):
        self.inputs = []
        self.encoding = "float"


cdef class EmbedResponse:
    def __init__(self):
        self.vectors = []
        self.input_tokens = -1


cdef object _json(bytes body, str msg):
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(msg)
    if not isinstance(d, dict):
        raise CodecError(msg if msg is UPSTREAM_BAD else "The request body must be a JSON object.")
    return d


cdef object _dimensions(object v, str field):
    if v is None:
        return None
    if type(v) is not int or v < 1:
        raise CodecError("%s: must be a positive integer" % field)
    return v


cdef list _texts(object v, str field):
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(t, str) for t in v):
        return list(v)
    if isinstance(v, list) and v:
        raise CodecError("%s: only text inputs are supported (not token ids or images)" % field)
    raise CodecError("%s: expected a non-empty string or list of strings" % field)


# ---------------------------------------------------------------------------------------------
# float32 base64 (little-endian, as OpenAI and Cohere send it)

cpdef str b64_of(list vector):
    a = array("f", vector)
    if array("H", [1]).tobytes() != b"\x01\x00":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


cpdef list floats_of_b64(str text):
    a = array("f")
    a.frombytes(base64.b64decode(text))
    if array("H", [1]).tobytes() != b"\x01\x00":
        a.byteswap()
    return a.tolist()


cdef list _vector(object v):
    if isinstance(v, str):
        return floats_of_b64(v)
    if isinstance(v, list):
        return v
    raise CodecError(UPSTREAM_BAD)


# ---------------------------------------------------------------------------------------------
# OpenAI: POST /v1/embeddings

cpdef EmbedRequest openai_read_request(bytes body):
    d = _json(body, BAD_JSON)
    r = EmbedRequest()
    if "input" not in d:
        raise CodecError("Missing required parameter: 'input'.")
    r.inputs = _texts(d["input"], "input")
    r.model = d.get("model") if isinstance(d.get("model"), str) else None
    r.dimensions = _dimensions(d.get("dimensions"), "dimensions")
    enc = d.get("encoding_format")
    if enc is not None and enc not in ("float", "base64"):
        raise CodecError("encoding_format: must be 'float' or 'base64'")
    r.encoding = enc or "float"
    return r


cpdef bytes openai_write_request(EmbedRequest r):
    d = {"model": r.model, "input": r.inputs[0] if len(r.inputs) == 1 else r.inputs,
         # base64 is a quarter of the bytes of JSON floats; busbar decodes it either way.
         "encoding_format": "base64"}
    if r.dimensions is not None:
        d["dimensions"] = r.dimensions
    return orjson.dumps(d)


def _index(x):
    i = x.get("index")
    return i if isinstance(i, int) else 0


cpdef EmbedResponse openai_read_response(bytes body):
    d = _json(body, UPSTREAM_BAD)
    data = d.get("data")
    if not isinstance(data, list):
        raise CodecError(UPSTREAM_BAD)
    resp = EmbedResponse()
    items = []
    for x in data:
        if isinstance(x, dict):
            items.append(x)
    items.sort(key=_index)
    for x in items:
        resp.vectors.append(_vector(x.get("embedding")))
    u = d.get("usage")
    if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
        resp.input_tokens = u["prompt_tokens"]
    resp.model = d.get("model") if isinstance(d.get("model"), str) else None
    return resp


cpdef bytes openai_write_response(EmbedResponse resp, EmbedRequest req):
    b64 = req.encoding == "base64"
    n = max(resp.input_tokens, 0)
    return orjson.dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": b64_of(v) if b64 else v}
                 for i, v in enumerate(resp.vectors)],
        "model": resp.model or req.model,
        "usage": {"prompt_tokens": n, "total_tokens": n}})


# ---------------------------------------------------------------------------------------------
# Gemini: POST /v1beta/models/{m}:embedContent | :batchEmbedContents

cdef str _gemini_text(object content, str field):
    if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
        raise CodecError("%s: expected a content with parts" % field)
    texts = []
    for p in content["parts"]:
        if not isinstance(p, dict) or not isinstance(p.get("text"), str):
            raise CodecError("%s: only text parts are supported" % field)
        texts.append(p["text"])
    if not texts:
        raise CodecError("%s: expected at least one part" % field)
    return "\n".join(texts)


cdef void _gemini_options(EmbedRequest r, dict item, str field) except *:
    task = item.get("taskType")
    if task is not None:
        if task not in _FROM_GEMINI and task != "TASK_TYPE_UNSPECIFIED":
            raise CodecError("%s.taskType: unknown task type" % field)
        r.input_type = _FROM_GEMINI.get(task)
    dims = _dimensions(item.get("outputDimensionality"), field + ".outputDimensionality")
    if dims is not None:
        r.dimensions = dims


cpdef EmbedRequest gemini_read_request(bytes body):
    d = _json(body, BAD_JSON)
    r = EmbedRequest()
    if "requests" in d:
        reqs = d["requests"]
        if not isinstance(reqs, list) or not reqs:
            raise CodecError("requests: expected a non-empty list")
        for i, item in enumerate(reqs):
            if not isinstance(item, dict):
                raise CodecError("requests[%d]: expected an object" % i)
            r.inputs.append(_gemini_text(item.get("content"), "requests[%d].content" % i))
            _gemini_options(r, item, "requests[%d]" % i)
        r.dialect = "batchEmbedContents"
    else:
        r.inputs = [_gemini_text(d.get("content"), "content")]
        _gemini_options(r, d, "")
        r.dialect = "embedContent"
    return r


cpdef bytes gemini_write_request(EmbedRequest r):
    name = r.model if "/" in r.model else "models/" + r.model
    reqs = []
    for t in r.inputs:
        item = {"model": name, "content": {"parts": [{"text": t}], "role": "user"}}
        if r.input_type in GEMINI_TASK:
            item["taskType"] = GEMINI_TASK[r.input_type]
        if r.dimensions is not None:
            item["outputDimensionality"] = r.dimensions
        reqs.append(item)
    return orjson.dumps({"requests": reqs})


cpdef EmbedResponse gemini_read_response(bytes body):
    d = _json(body, UPSTREAM_BAD)
    resp = EmbedResponse()
    if isinstance(d.get("embeddings"), list):
        items = d["embeddings"]
    elif isinstance(d.get("embedding"), dict):
        items = [d["embedding"]]
    else:
        raise CodecError(UPSTREAM_BAD)
    for e in items:
        if not isinstance(e, dict) or not isinstance(e.get("values"), list):
            raise CodecError(UPSTREAM_BAD)
        resp.vectors.append(e["values"])
    u = d.get("usageMetadata")
    if isinstance(u, dict) and isinstance(u.get("promptTokenCount"), int):
        resp.input_tokens = u["promptTokenCount"]
    return resp


cpdef bytes gemini_write_response(EmbedResponse resp, EmbedRequest req):
    if req.dialect == "embedContent":
        return orjson.dumps({"embedding": {"values": resp.vectors[0] if resp.vectors else []}})
    return orjson.dumps({"embeddings": [{"values": v} for v in resp.vectors]})


# ---------------------------------------------------------------------------------------------
# Cohere v2: POST /v2/embed

cpdef EmbedRequest cohere_read_request(bytes body):
    d = _json(body, BAD_JSON)
    r = EmbedRequest()
    if d.get("images") or d.get("inputs"):
        raise CodecError("Only texts are supported for embeddings.")
    r.inputs = _texts(d.get("texts"), "texts")
    r.model = d.get("model") if isinstance(d.get("model"), str) else None
    it = d.get("input_type")
    if it is not None:
        if it not in _FROM_COHERE:
            raise CodecError("invalid input_type: %s" % it if isinstance(it, str) else "invalid input_type")
        r.input_type = _FROM_COHERE[it]
    r.dimensions = _dimensions(d.get("output_dimension"), "output_dimension")
    types = d.get("embedding_types")
    if types is not None:
        if not isinstance(types, list):
            raise CodecError("embedding_types: expected a list of strings")
        r.types = []
        for t in types:
            if not isinstance(t, str):
                raise CodecError("embedding_types: expected a list of strings")
            if t in COHERE_TYPES:
                r.types.append(t)
        if not r.types:
            raise CodecError("embedding_types: busbar serves float and base64 embeddings only")
    return r


cpdef bytes cohere_write_request(EmbedRequest r):
    d = {"model": r.model, "texts": r.inputs,
         "input_type": COHERE_TYPE.get(r.input_type, COHERE_DEFAULT_TYPE),
         "embedding_types": ["float"]}
    if r.dimensions is not None:
        d["output_dimension"] = r.dimensions
    return orjson.dumps(d)


cdef list _cohere_vectors(object emb):
    if isinstance(emb, dict):
        if isinstance(emb.get("float"), list):
            return emb["float"]
        if isinstance(emb.get("base64"), list):
            return [floats_of_b64(s) for s in emb["base64"]]
        raise CodecError(UPSTREAM_BAD)
    if isinstance(emb, list):       # v1 / Bedrock "embeddings_floats"
        return emb
    raise CodecError(UPSTREAM_BAD)


cpdef EmbedResponse cohere_read_response(bytes body):
    d = _json(body, UPSTREAM_BAD)
    resp = EmbedResponse()
    resp.vectors = _cohere_vectors(d.get("embeddings"))
    meta = d.get("meta")
    bu = meta.get("billed_units") if isinstance(meta, dict) else None
    if isinstance(bu, dict) and isinstance(bu.get("input_tokens"), (int, float)):
        resp.input_tokens = int(bu["input_tokens"])
    return resp


cdef dict _by_type(EmbedResponse resp, list types):
    out = {}
    for t in types or ["float"]:
        out[t] = resp.vectors if t == "float" else [b64_of(v) for v in resp.vectors]
    return out


cpdef bytes cohere_write_response(EmbedResponse resp, EmbedRequest req):
    d = {"id": ids.uuid4(), "embeddings": _by_type(resp, req.types), "texts": req.inputs,
         "meta": {"api_version": {"version": "2"}}, "response_type": "embeddings_by_type"}
    if resp.input_tokens >= 0:
        d["meta"]["billed_units"] = {"input_tokens": resp.input_tokens}
    return orjson.dumps(d)


# ---------------------------------------------------------------------------------------------
# Bedrock InvokeModel: Amazon Titan Text Embeddings or Cohere Embed on Bedrock

cpdef str bedrock_dialect(str model):
    """Which body a Bedrock embedding model takes: Cohere's models (cohere.embed-*, and inference
    profiles us.cohere.embed-*) take Cohere's; Amazon Titan's take inputText."""
    return "cohere" if "cohere." in model else "titan"


cpdef EmbedRequest bedrock_read_request(bytes body):
    d = _json(body, BAD_JSON)
    r = EmbedRequest()
    if "inputText" in d:
        if not isinstance(d["inputText"], str):
            raise CodecError("inputText: expected a string")
        r.inputs = [d["inputText"]]
        r.dimensions = _dimensions(d.get("dimensions"), "dimensions")
        r.dialect = "titan"
        return r
    if "texts" in d:
        r.inputs = _texts(d["texts"], "texts")
        it = d.get("input_type")
        if it is not None:
            if it not in _FROM_COHERE:
                raise CodecError("invalid input_type")
            r.input_type = _FROM_COHERE[it]
        types = d.get("embedding_types")
        if isinstance(types, list):
            r.types = [t for t in types if t in COHERE_TYPES] or ["float"]
        r.dimensions = _dimensions(d.get("output_dimension"), "output_dimension")
        r.dialect = "cohere"
        return r
    raise CodecError("Malformed input request: expected inputText or texts.")


cpdef bytes bedrock_write_request(EmbedRequest r):
    if bedrock_dialect(r.model) == "cohere":
        d = {"texts": r.inputs, "input_type": COHERE_TYPE.get(r.input_type, COHERE_DEFAULT_TYPE)}
        if r.dimensions is not None:
            d["output_dimension"] = r.dimensions
        return orjson.dumps(d)
    if len(r.inputs) != 1:
        raise CodecError("This embedding model (Amazon Titan) embeds one text per request.")
    d = {"inputText": r.inputs[0]}
    if r.dimensions is not None:
        d["dimensions"] = r.dimensions
    return orjson.dumps(d)


cpdef EmbedResponse bedrock_read_response(bytes body):
    d = _json(body, UPSTREAM_BAD)
    resp = EmbedResponse()
    if isinstance(d.get("embedding"), list):          # Titan
        resp.vectors = [d["embedding"]]
        if isinstance(d.get("inputTextTokenCount"), int):
            resp.input_tokens = d["inputTextTokenCount"]
        return resp
    resp.vectors = _cohere_vectors(d.get("embeddings"))
    return resp


cpdef bytes bedrock_write_response(EmbedResponse resp, EmbedRequest req):
    if req.dialect == "titan":
        v = resp.vectors[0] if resp.vectors else []
        return orjson.dumps({"embedding": v, "inputTextTokenCount": max(resp.input_tokens, 0),
                             "embeddingsByType": {"float": v}})
    if req.types is not None:
        return orjson.dumps({"id": ids.uuid4(), "embeddings": _by_type(resp, req.types),
                             "texts": req.inputs, "response_type": "embeddings_by_type"})
    return orjson.dumps({"id": ids.uuid4(), "embeddings": resp.vectors, "texts": req.inputs,
                         "response_type": "embeddings_floats"})


# ---------------------------------------------------------------------------------------------
# paths and tables

cpdef str upstream_path(str protocol, str model):
    if protocol == "openai":
        return "/v1/embeddings"
    if protocol == "cohere":
        return "/v2/embed"
    if protocol == "gemini":
        return "/v1beta/" + (model if "/" in model else "models/" + model) + ":batchEmbedContents"
    return "/model/" + quote(model, safe="") + "/invoke"


READ_REQUEST = {"openai": openai_read_request, "gemini": gemini_read_request,
                "cohere": cohere_read_request, "bedrock": bedrock_read_request}
WRITE_REQUEST = {"openai": openai_write_request, "gemini": gemini_write_request,
                 "cohere": cohere_write_request, "bedrock": bedrock_write_request}
READ_RESPONSE = {"openai": openai_read_response, "gemini": gemini_read_response,
                 "cohere": cohere_read_response, "bedrock": bedrock_read_response}
WRITE_RESPONSE = {"openai": openai_write_response, "gemini": gemini_write_response,
                  "cohere": cohere_write_response, "bedrock": bedrock_write_response}


cpdef bint passthrough(str ingress, EmbedRequest req, str egress, str wire):
    """Whether the client's bytes can go upstream as they are (model spliced): same protocol and,
    for Bedrock, the same body dialect. Gemini's batch bodies name the model in every request,
    so Gemini always goes through the IR."""
    if ingress != egress or ingress == "gemini":
        return False
    return ingress != "bedrock" or bedrock_dialect(wire) == req.dialect


cpdef bint is_embed_body(bytes body):
    """An InvokeModel body for an embedding model (Titan's inputText or Cohere's texts) rather
    than Anthropic Messages: the top-level keys decide, without parsing the whole body."""
    from cbusbar.framing import FramingError, scan_top
    try:
        spans = scan_top(body, (b"inputText", b"texts", b"messages"))
    except FramingError:
        return False
    return b"messages" not in spans and (b"inputText" in spans or b"texts" in spans)
