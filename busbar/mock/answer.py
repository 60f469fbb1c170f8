"""What the mock answers, independent of any wire format.

A dialect reads a request body into an `Ask` (the few facts the answer depends on); `plan()` turns
the Ask plus the request's directives into a `Plan` (the words to send, or the tool call, the stop
kind, the usage); the dialect then renders the Plan in its own wire format. Keeping the answer
protocol-neutral is what lets a gateway test send one question through any ingress/egress pair and
assert on the same text.
"""

import os
import re
import itertools

import orjson

# Directive values are restricted so a directive can never smuggle JSON or header syntax.
_BODY_DIRECTIVE = re.compile(rb"#mock:([a-z_]+)=([A-Za-z0-9_.-]+)")
_HEADER_PREFIX = b"x-mock-"

# Caps keep a typo in a test from pinning a worker for hours or allocating gigabytes.
MAX_DELAY_MS = 60_000
MAX_TOKENS = 100_000
DEFAULT_TOKENS = 8

# The echo is cut to these lengths (characters) before it is split into words.
USER_ECHO_CHARS = 200
SYSTEM_ECHO_CHARS = 60
TOOL_RESULT_ECHO_CHARS = 100

STOP_END = 0
STOP_MAX_TOKENS = 1
STOP_TOOL = 2

FORCE_NONE = None     # Ask.forced: no tool forced by tool_choice
FORCE_ANY = ""        # Ask.forced: some tool must be called (any/required); the mock picks the first


class BadRequest(Exception):
    """A request body the real provider would refuse with 400; the message is caller-safe."""


class Ask:
    """The protocol-neutral facts of one chat request."""

    __slots__ = ("model", "stream", "user_text", "system", "images", "tool_result", "tools",
                 "forced", "max_tokens", "include_usage", "sse")

    def __init__(self):
        self.model = ""
        self.stream = False
        self.user_text = ""          # text of the last user message that has any text
        self.system = ""             # all system text, joined
        self.images = 0              # image parts anywhere in the conversation
        self.tool_result = None      # text of the first tool result in the trailing user turn
        self.tools = []              # [(name, json schema dict or None)] in declaration order
        self.forced = FORCE_NONE     # FORCE_NONE, FORCE_ANY or a tool name
        self.max_tokens = None       # the protocol's own max-tokens field, when sent
        self.include_usage = False   # openai chat: stream_options.include_usage
        self.sse = True              # gemini without ?alt=sse streams a JSON array instead


class Directives:
    """Failure and shape switches, from `x-mock-<key>` headers or `#mock:<key>=<value>` in the body."""

    __slots__ = ("status", "delay", "abort_after", "tokens", "tool", "stream_error", "echo_auth")

    def __init__(self):
        self.status = 0              # 400..599: answer this error instead
        self.delay = 0.0             # seconds to wait before the response headers
        self.abort_after = -1        # >= 0: drop the connection after that many stream frames
        self.tokens = DEFAULT_TOKENS
        self.tool = ""               # non-empty: force a tool call ("1" or a declared tool's name)
        self.stream_error = False
        self.echo_auth = False

    def set(self, key, value):
        # Unknown keys and unparsable values are ignored: a directive is a test aid, and a request
        # that happens to contain "#mock:" text must still be answered.
        if key == "status":
            if value.isdigit() and 400 <= int(value) <= 599:
                self.status = int(value)
        elif key == "delay_ms":
            if value.isdigit():
                self.delay = min(int(value), MAX_DELAY_MS) / 1000.0
        elif key == "abort_after":
            if value.isdigit():
                self.abort_after = int(value)
        elif key == "tokens":
            if value.isdigit():
                self.tokens = min(int(value), MAX_TOKENS)
        elif key == "tool":
            self.tool = "" if value in ("0", "false", "no") else value
        elif key == "stream_error":
            self.stream_error = value not in ("0", "false", "no")
        elif key == "echo_auth":
            self.echo_auth = value not in ("0", "false", "no")


def read_directives(headers, body):
    """Directives from the request headers (lower-cased bytes keys) and the raw body.

    Headers win over the body for the same key, so a test can override a directive that a prompt
    carries.
    """
    marked = b"#mock:" in body
    if not marked:
        for name in headers:
            if name.startswith(_HEADER_PREFIX):
                break
        else:
            return NO_DIRECTIVES
    d = Directives()
    if marked:
        for m in _BODY_DIRECTIVE.finditer(body):
            d.set(m.group(1).decode("ascii"), m.group(2).decode("ascii"))
    for name, value in headers.items():
        if name.startswith(_HEADER_PREFIX):
            d.set(name[7:].decode("latin-1").replace("-", "_"), value.decode("latin-1").strip())
    return d


# Shared by every request without directives (the benchmark's case); never mutated.
NO_DIRECTIVES = Directives()


class Plan:
    """What to send: either words of text or one tool call, then a stop kind and usage."""

    __slots__ = ("words", "tool_name", "tool_args", "stop", "input_tokens", "output_tokens")

    def __init__(self):
        self.words = []
        self.tool_name = None
        self.tool_args = ""          # the call's arguments, a JSON object serialised
        self.stop = STOP_END
        self.input_tokens = 1
        self.output_tokens = 0

    @property
    def text(self):
        return " ".join(self.words)

    def deltas(self):
        """The text as stream deltas: one word each, the space travelling with the next word."""
        words = self.words
        if not words:
            return []
        return [words[0]] + [" " + w for w in words[1:]]

    def arg_fragments(self):
        """The tool arguments in 8-character fragments (at least two: the shortest object is 16)."""
        a = self.tool_args
        return [a[i:i + 8] for i in range(0, len(a), 8)]


def _tool_arguments(schema):
    required = schema.get("required") if isinstance(schema, dict) else None
    names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
    if not names:
        return {"input": "mock"}
    return {n: "mock" for n in names}


def plan(ask, directives, body_len, auth_scheme):
    """The deterministic answer to `ask` (see the package docstring for the rules)."""
    p = Plan()
    p.input_tokens = max(1, body_len // 4)
    if ask.tools and (directives.tool or ask.forced is not FORCE_NONE):
        names = [t[0] for t in ask.tools]
        if directives.tool in names:
            pick = directives.tool
        elif ask.forced and ask.forced in names:
            pick = ask.forced
        else:
            pick = names[0]
        schema = ask.tools[names.index(pick)][1]
        p.tool_name = pick
        p.tool_args = orjson.dumps(_tool_arguments(schema)).decode()
        p.stop = STOP_TOOL
        # One token for the call plus one per argument value: deterministic and small.
        p.output_tokens = 1 + p.tool_args.count('"mock"')
        return p
    echo = "mock: " + ask.user_text[:USER_ECHO_CHARS]
    if ask.system:
        echo += " [system: " + ask.system[:SYSTEM_ECHO_CHARS] + "]"
    if ask.images:
        echo += " [images: %d]" % ask.images
    if ask.tool_result is not None:
        echo += " [tool_result: " + ask.tool_result[:TOOL_RESULT_ECHO_CHARS] + "]"
    if directives.echo_auth:
        echo += " [auth:" + auth_scheme + "]"
    words = echo.split()
    words.extend(_FILLER[:directives.tokens] if directives.tokens <= len(_FILLER)
                 else ["w%d" % i for i in range(1, directives.tokens + 1)])
    limit = ask.max_tokens
    if limit is not None and limit < len(words):
        del words[max(limit, 0):]
        p.stop = STOP_MAX_TOKENS
    p.words = words
    p.output_tokens = len(words)
    return p


# The usual answer lengths come from this table instead of being formatted per request.
_FILLER = ["w%d" % i for i in range(1, 257)]


# Ids: a per-process random prefix plus a counter is unique, cheap, and looks like the real shapes.
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def new_id(width=24):
    """A fresh lower-case hex id of `width` characters: 16 random per process, then a counter."""
    ident = _ID_PREFIX + "%08x" % next(_ID_COUNTER)
    if width <= 24:
        return ident[-width:]
    return ident + os.urandom(width).hex()[:width - 24]
