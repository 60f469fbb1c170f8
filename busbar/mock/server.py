"""The mock's HTTP/1.1 server: an asyncio.Protocol driving httptools directly.

One connection object per socket. Requests are answered strictly in arrival order (HTTP/1.1
pipelining): a request whose reply cannot be written at once (a delay directive, or a stream held
back by a full socket buffer) makes the requests parsed behind it wait in `_pending`. The common
case, a small reply to a request with nothing in flight, is written inside `data_received` without
creating a task.
"""

import asyncio
import collections
import http
import itertools
import sys
from urllib.parse import parse_qsl, unquote

import httptools
import orjson

from busbar.mock.answer import BadRequest, new_id, plan as make_plan, read_directives
from busbar.mock.dialects import Anthropic, Bedrock, Cohere, Gemini, OpenAIChat, OpenAIResponses
from busbar.server import runtime

# Bodies beyond this are refused with 413. Twice the reference gateway's default request cap
# (32 MiB, SPEC 1.1) so that the mock never refuses what a default gateway forwards.
MAX_BODY = 64 * 1024 * 1024
# Pipelined requests held behind a slow reply before the connection stops reading, so a client
# that pipelines without reading cannot grow the queue without bound; reading resumes at half.
MAX_PENDING = 64

_OPENAI = OpenAIChat()
_RESPONSES = OpenAIResponses()
_ANTHROPIC = Anthropic()
_GEMINI = Gemini()
_COHERE = Cohere()
_BEDROCK = Bedrock()

_EXACT_ROUTES = {b"/v1/chat/completions": _OPENAI, b"/v1/responses": _RESPONSES,
                 b"/v1/messages": _ANTHROPIC, b"/v2/chat": _COHERE}

_PHRASES = {s.value: s.phrase.encode() for s in http.HTTPStatus}
_PHRASES[529] = b"Overloaded"   # Anthropic's own status, not in the IANA registry

_NO_QUERY = {}


class _Route:
    __slots__ = ("dialect", "model", "stream", "sse", "query", "supported")

    def __init__(self, dialect, query):
        self.dialect = dialect
        self.model = ""
        self.stream = False
        self.sse = True
        self.query = query
        self.supported = True


def _query(raw):
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else _NO_QUERY


def _route(path, raw_query):
    dialect = _EXACT_ROUTES.get(path)
    if dialect is not None:
        return _Route(dialect, _NO_QUERY)
    if path.startswith(b"/v1beta/models/") or path.startswith(b"/v1/models/"):
        r = _Route(_GEMINI, _query(raw_query))
        tail = path[path.index(b"/models/") + 8:]
        model, colon, action = tail.rpartition(b":")
        r.model = unquote(model.decode("latin-1"))
        r.supported = bool(colon) and model != b"" and action in (b"generateContent",
                                                                   b"streamGenerateContent")
        r.stream = action == b"streamGenerateContent"
        r.sse = r.query.get("alt") == "sse"
        return r
    if path.startswith(b"/model/"):
        r = _Route(_BEDROCK, _NO_QUERY)
        model, slash, action = path[7:].rpartition(b"/")
        # boto3 percent-encodes the model id (":" -> %3A, "/" -> %2F) in this one path segment.
        r.model = unquote(model.decode("latin-1"))
        r.supported = bool(slash) and model != b"" and action in (b"converse", b"converse-stream")
        r.stream = action == b"converse-stream"
        return r
    return None


def _auth_scheme(headers, query):
    auth = headers.get(b"authorization", b"")
    if auth.startswith(b"AWS4-HMAC-SHA256"):
        return "sigv4"
    if auth[:7].lower() == b"bearer " and auth[7:].strip():
        return "bearer"
    if headers.get(b"x-api-key", b"").strip():
        return "x-api-key"
    if headers.get(b"x-goog-api-key", b"").strip():
        return "x-goog-api-key"
    if query.get("key"):
        return "key-param"
    return "none"


class _Request:
    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "too_large")

    def __init__(self, method, url, headers, body, keep_alive, too_large):
        parsed = httptools.parse_url(url)
        self.method = method
        self.path = parsed.path
        self.query = parsed.query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.too_large = too_large


class _Reply:
    """One response: a buffered body, or a chunked stream of frames written as the socket allows."""

    __slots__ = ("head", "body", "frames", "delay", "abort_after", "keep_alive", "drop",
                 "head_sent", "sent")

    def __init__(self, head, body, frames, delay, abort_after, keep_alive):
        self.head = head
        self.body = body
        self.frames = frames
        self.delay = delay
        self.abort_after = abort_after
        self.keep_alive = keep_alive
        self.drop = False
        self.head_sent = False
        self.sent = 0


def _head(status, content_type, extra, length, keep_alive):
    parts = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (status, _PHRASES.get(status, b"Unknown"),
                                                           content_type)]
    if length is None:
        parts.append(b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n")
    else:
        parts.append(b"content-length: %d\r\n" % length)
    parts.append(extra)
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def _buffered(status, content_type, extra, body, keep_alive, delay=0.0):
    return _Reply(_head(status, content_type, extra, len(body), keep_alive), body, None, delay, -1,
                  keep_alive)


def _error(dialect, status, message, rid, keep_alive, delay=0.0):
    return _buffered(status, b"application/json",
                     dialect.headers(status, rid) + dialect.error_headers(status, message),
                     dialect.error(status, message, rid), keep_alive, delay)


def respond(req, require_auth):
    """The reply to one complete request (pure: no I/O)."""
    keep_alive = req.keep_alive
    route = _route(req.path, req.query)
    if route is None:
        if req.path == b"/healthz" and req.method == b"GET":
            return _buffered(200, b"text/plain; charset=utf-8", b"", b"ok", keep_alive)
        return _buffered(404, b"application/json", b"", orjson.dumps({"error": {
            "message": "mock: no route for %s %s" % (req.method.decode("latin-1"),
                                                     req.path.decode("latin-1")),
            "type": "not_found_error", "param": None, "code": None}}), keep_alive)
    dialect = route.dialect
    rid = new_id(24)
    if req.too_large:
        return _error(dialect, 413, "request body exceeds the maximum allowed size", rid, False)
    if not route.supported:
        return _error(dialect, 404, "mock: unsupported operation %s" % req.path.decode("latin-1"),
                      rid, keep_alive)
    if req.method != b"POST":
        return _error(dialect, 405, "mock: method %s not allowed" % req.method.decode("latin-1"),
                      rid, keep_alive)
    headers = req.headers
    body = req.body
    directives = read_directives(headers, body)
    delay = directives.delay
    if require_auth:
        failure = dialect.auth(headers, route.query)
        if failure is not None:
            return _error(dialect, failure[0], failure[1], rid, keep_alive, delay)
    if directives.status:
        return _error(dialect, directives.status, "mock failure %d" % directives.status, rid,
                      keep_alive, delay)
    try:
        doc = orjson.loads(body)
        if not isinstance(doc, dict):
            raise BadRequest("We could not parse the JSON body of your request.")
        ask = dialect.read(doc, route)
    except orjson.JSONDecodeError:
        return _error(dialect, 400, "We could not parse the JSON body of your request.", rid,
                      keep_alive, delay)
    except BadRequest as e:
        return _error(dialect, 400, str(e), rid, keep_alive, delay)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError):
        # A field of the wrong JSON type somewhere the readers did not check explicitly.
        return _error(dialect, 400, "mock: malformed request body", rid, keep_alive, delay)
    p = make_plan(ask, directives, len(body),
                  _auth_scheme(headers, route.query) if directives.echo_auth else "")
    extra = dialect.headers(200, rid)
    if not ask.stream:
        if directives.abort_after >= 0:
            # A buffered request cannot fail mid-stream: it loses its connection before any byte.
            reply = _Reply(b"", None, None, delay, -1, False)
            reply.drop = True
            return reply
        return _buffered(200, dialect.content_type, extra, dialect.body(ask, p, rid), keep_alive,
                         delay)
    frames = dialect.frames(ask, p, rid)
    if directives.stream_error:
        frames = itertools.chain(itertools.islice(frames, 1),
                                 dialect.stream_error(ask, p, rid, "mock failure stream_error"))
    content_type = dialect.stream_content_type if ask.sse else b"application/json"
    return _Reply(_head(200, content_type, extra, None, keep_alive), None, iter(frames), delay,
                  directives.abort_after, keep_alive)


class _State:
    __slots__ = ("require_auth", "connections")

    def __init__(self, require_auth):
        self.require_auth = require_auth
        self.connections = set()


class _Connection(asyncio.Protocol):
    __slots__ = ("_state", "_parser", "_transport", "_url", "_headers", "_body", "_size",
                 "_too_large", "_pending", "_task", "_paused", "_drained", "_closed", "_discard",
                 "_reading")

    def __init__(self, state):
        self._state = state
        self._parser = httptools.HttpRequestParser(self)
        self._transport = None
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._too_large = False
        self._pending = collections.deque()
        self._task = None
        self._paused = False
        self._drained = None
        self._closed = False
        self._discard = False
        self._reading = True

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport):
        self._transport = transport
        self._state.connections.add(self)

    def connection_lost(self, exc):
        self._closed = True
        self._state.connections.discard(self)
        if self._task is not None:
            self._task.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self):
        self._paused = True

    def resume_writing(self):
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data):
        if self._discard:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(b"HTTP/1.1 501 Not Implemented\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        except httptools.HttpParserError:
            self._refuse(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    def close(self):
        """Close at once (server shutdown)."""
        if not self._closed:
            self._closed = True
            self._transport.close()

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self):
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._too_large = False

    def on_url(self, url):
        self._url += url

    def on_header(self, name, value):
        self._headers[name.lower()] = value

    def on_headers_complete(self):
        if self._discard:
            return
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            self._too_large = True
            self._refuse_too_large()
        elif self._headers.get(b"expect", b"").lower() == b"100-continue" \
                and self._task is None and not self._pending:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk):
        if self._too_large:
            return
        self._size += len(chunk)
        if self._size > MAX_BODY:
            self._too_large = True
            self._body = []
            self._refuse_too_large()
            return
        self._body.append(chunk)

    def on_message_complete(self):
        if self._too_large or self._discard:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._dispatch(_Request(self._parser.get_method(), self._url, self._headers, body,
                                self._parser.should_keep_alive(), False))

    # -- replying -----------------------------------------------------------------------------

    def _refuse(self, raw):
        """A request the parser cannot read: answer in order if possible, then hang up."""
        self._discard = True
        if self._task is None:
            self._transport.write(raw)
            self.close()
        else:
            self._pending.append(raw)

    def _refuse_too_large(self):
        # Answer 413 in the route's dialect and stop reading: the rest of the body is not wanted.
        self._discard = True
        self._transport.pause_reading()
        self._reading = False
        self._dispatch(_Request(self._parser.get_method(), self._url, self._headers, b"", False, True))

    def _dispatch(self, req):
        if self._closed:
            return
        if self._task is not None:
            self._pending.append(req)
            if len(self._pending) > MAX_PENDING and self._reading:
                self._transport.pause_reading()
                self._reading = False
            return
        reply = respond(req, self._state.require_auth)
        if not reply.delay and self._pump(reply):
            return
        self._task = asyncio.get_running_loop().create_task(self._serve(reply))

    async def _serve(self, reply):
        try:
            while True:
                if reply.delay and not self._closed:
                    await asyncio.sleep(reply.delay)
                while not self._closed and not self._pump(reply):
                    self._drained = asyncio.get_running_loop().create_future()
                    await self._drained
                    self._drained = None
                if self._closed or not self._pending:
                    break
                nxt = self._pending.popleft()
                if not self._reading and len(self._pending) <= MAX_PENDING // 2 and not self._discard:
                    self._transport.resume_reading()
                    self._reading = True
                if isinstance(nxt, bytes):
                    self._transport.write(nxt)
                    self.close()
                    break
                reply = respond(nxt, self._state.require_auth)
        finally:
            self._task = None

    def _pump(self, r):
        """Write as much of `r` as the socket takes; True once the reply is finished."""
        if self._closed:
            return True
        t = self._transport
        if r.drop:
            self.close()
            return True
        if r.body is not None:
            t.write(r.head + r.body)
            if not r.keep_alive:
                self.close()
            return True
        if not r.head_sent:
            t.write(r.head)
            r.head_sent = True
        abort_after = r.abort_after
        for frame in r.frames:
            if r.sent == abort_after:
                # Mid-stream failure: the frames so far are flushed, the chunked body never ends.
                self.close()
                return True
            t.write(b"%x\r\n%b\r\n" % (len(frame), frame))
            r.sent += 1
            if self._paused:
                return False
        if abort_after >= 0:
            self.close()
            return True
        t.write(b"0\r\n\r\n")
        if not r.keep_alive:
            self.close()
        return True


async def start(host="127.0.0.1", port=0, *, require_auth=False):
    """Listen on (host, port) on the running loop; return (server, bound port)."""
    state = _State(require_auth)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(state), host, port, backlog=1024)
    return server, server.sockets[0].getsockname()[1]


async def _run(host, port, require_auth):
    state = _State(require_auth)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(state), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    runtime.on_signals(loop, runtime.current(), runtime.stop_signals(), lambda s: stop.set())
    print("busbar mock listening on http://%s:%d%s" % (host, bound,
                                                        " (require_auth)" if require_auth else ""),
          file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        for conn in list(state.connections):
            conn.close()
        await server.wait_closed()


def main(host="127.0.0.1", port=8089, require_auth=False):
    """Serve forever on the gateway's event loop (uvloop, or the standard library's: busbar/server/
    runtime.py); return after SIGINT or SIGTERM."""
    loop = runtime.current().new_event_loop()
    try:
        loop.run_until_complete(_run(host, port, require_auth))
    finally:
        loop.close()
