"""Operations other than chat: embeddings and token counting.

- Embeddings (POST /v1/embeddings, /v2/embed, Gemini :embedContent / :batchEmbedContents, Bedrock
  /model/{id}/invoke with a Titan or Cohere body): any of the four protocols reaches any lane that
  speaks one of them, through the embeddings IR (cbusbar/embed.pyx); same protocol (and, for
  Bedrock, the same body dialect) goes through byte for byte with the model spliced.
- Token counting (Anthropic /v1/messages/count_tokens, Gemini :countTokens): passed through to a
  lane of the same protocol, model spliced; a target with no such lane is a native 404.

Embeddings and token counting run through the same Exchange as chat, with its one lifecycle
(attempts, failover, deadlines, `end_attempt`, `finish`): an `Op` only says which lanes are
candidates, what body and path each attempt sends, and how a buffered answer is read and written
back. Lanes whose model does not list the operation (`operations:`) are never candidates; an
operation no lane of the target serves is a native 404.
"""
from __future__ import annotations

from cbusbar import embed
from cbusbar.framing import FramingError, scan_top, splice
from cbusbar.ir import CodecError, Usage

from busbar.engine import route as R
from busbar.engine.translate import forwarded

NOT_SERVED = "This endpoint does not support that operation."

# Token counting paths per lane protocol (a table, as the codecs' own paths are).
COUNT_PATHS = {
    "anthropic": lambda model: "/v1/messages/count_tokens",
    "gemini": lambda model: "/v1beta/" + (model if "/" in model else "models/" + model) + ":countTokens",
}


def select(ex):
    """The Op for the Exchange's route, or None for chat. Called once, before routing."""
    route = ex.route
    kind = route.kind
    if kind == R.EMBED:
        return EmbedOp(route.protocol)
    if kind == R.COUNT_TOKENS:
        return CountOp(route.protocol)
    if route.may_embed and embed.is_embed_body(ex.req.body):
        # /model/{id}/invoke carries either Claude's Messages or an embedding model's body.
        return EmbedOp("bedrock")
    return None


class EmbedOp:
    name = "embeddings"
    __slots__ = ("proto", "ir", "span")

    def __init__(self, proto):
        self.proto = proto      # the ingress protocol's embeddings dialect
        self.ir = None
        self.span = None

    def begin(self, ex, body):
        """Reads the request; returns an error message for a 400, or None."""
        if ex.route.name_in_body:
            try:
                self.span = scan_top(body, (b"model",)).get(b"model")
            except FramingError:
                return embed.BAD_JSON
        try:
            self.ir = embed.READ_REQUEST[self.proto](body)
        except CodecError as e:
            return str(e) or embed.BAD_JSON
        return None

    def candidate(self, eg) -> bool:
        return eg.protocol in embed.PROTOCOLS

    def request(self, ex, lane, eg):
        """(body, path, same, extra) for one attempt. CodecError: not writable for this lane."""
        eproto = eg.protocol
        wire = lane.model.upstream_model
        body = ex.req.body
        same = embed.passthrough(self.proto, self.ir, eproto, wire)
        if same:
            if self.span is not None:
                body = splice(body, self.span[0], self.span[1], ex.snap.wire(wire))
        else:
            self.ir.model = wire
            body = embed.WRITE_REQUEST[eproto](self.ir)
        return body, embed.upstream_path(eproto, wire), same, b""

    def read_usage(self, eproto, body):
        """A same-protocol answer, checked before it is relayed. CodecError: not an answer."""
        resp = embed.READ_RESPONSE[eproto](body)
        return _usage(resp.input_tokens)

    def response(self, ex, eproto, body):
        resp = embed.READ_RESPONSE[eproto](body)
        if len(resp.vectors) != len(self.ir.inputs):
            raise CodecError("The upstream returned a different number of embeddings.")
        if not resp.model:
            resp.model = ex.last_model
        return embed.WRITE_RESPONSE[self.proto](resp, self.ir), _usage(resp.input_tokens)


class CountOp:
    name = "count_tokens"
    __slots__ = ("proto", "span")

    def __init__(self, proto):
        self.proto = proto
        self.span = None

    def begin(self, ex, body):
        try:
            self.span = scan_top(body, (b"model",)).get(b"model")
        except FramingError:
            return "We could not parse the JSON body of your request."
        return None

    def candidate(self, eg) -> bool:
        # No translation for counting: only lanes of the caller's protocol (and not one whose
        # Vertex form reshapes the body, Claude's, whose count endpoint is another path).
        return eg.protocol == self.proto and eg.vertex_body is None

    def request(self, ex, lane, eg):
        wire = lane.model.upstream_model
        body = ex.req.body
        if self.span is not None:
            body = splice(body, self.span[0], self.span[1], ex.snap.wire(wire))
        extra = forwarded(ex.snap.beta_headers.get(eg.protocol, ()), ex.req.headers)
        return body, COUNT_PATHS[eg.protocol](wire), True, extra

    def read_usage(self, eproto, body):
        try:
            scan_top(body, ())
        except FramingError:
            raise CodecError("The upstream returned a body that is not a JSON object.") from None
        return None     # counting tokens uses none

    def response(self, ex, eproto, body):   # never: counting is same-protocol only
        raise CodecError("token counting does not translate")


def _usage(input_tokens):
    if input_tokens is None or input_tokens < 0:
        return None
    u = Usage()
    u.input_tokens = input_tokens
    u.input_known = True
    return u
