# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""What a request is, as the server's dispatcher decided it from (method, path, headers): the
engine receives a Route and never looks at the path again."""
from __future__ import annotations

# Route kinds. A call (CHAT, EMBED, COUNT_TOKENS) goes upstream; every other kind is answered by
# busbar itself, by the route's `handler` (an entry of the listener's route table,
# busbar/server/routes.py).
LOCAL = 1           # busbar's answer about itself (/healthz, /stats, the models, /metrics): no record
CHAT = 3            # a protocol call
NOT_FOUND = 4       # a path no protocol owns (answered in the dialect inferred from the path)
METHOD = 5          # a protocol path with the wrong method → 405
UNSUPPORTED = 6     # a protocol path for an operation busbar does not serve (moderations, …) → 404
# Operations other than chat (busbar/engine/operations.py)
EMBED = 7           # POST /v1/embeddings, /v2/embed, Gemini :embedContent / :batchEmbedContents
COUNT_TOKENS = 8    # POST /v1/messages/count_tokens, Gemini :countTokens (same-protocol lanes)


# A Route's members (route.pxd types them).
FIELDS = ("kind", "protocol", "name", "stream", "gemini_version", "json_array", "name_in_body",
          "may_embed", "handler")


class Route:
    def __init__(self, kind, protocol, name=None, stream=False, name_in_body=True):
        self.kind = kind
        self.protocol = protocol
        self.name = name
        self.stream = stream
        self.name_in_body = name_in_body
        self.gemini_version = None
        self.json_array = False
        # A path whose body may be an embeddings request instead (Bedrock /model/{id}/invoke):
        # the engine tells the two apart by the body's shape (operations.select).
        self.may_embed = False
        # What answers a request busbar answers itself (every kind but a call): handler(exchange),
        # from the listener's route table; None for a call.
        self.handler = None
