"""busbar's own Redis/Valkey client for the request path (the ledger's admission and settlement
scripts): one connection per worker, pipelined, on an asyncio Protocol, with the RESP framing in C
(cbusbar/resp.pyx).

- Many commands in flight on the connection at once; replies are matched to them in order (FIFO),
  each caller awaiting a plain future: no Task, no wait_for, no timeout object per command. The
  commands of one event-loop turn go out in one write (one system call) at the turn's end.
- One deadline per connection: while commands are in flight a timer ticks every `timeout / 2`;
  when the oldest of them has gone unanswered for `timeout` (between 1 and 1.5 x `timeout`), the
  connection is declared dead and aborted, and every command on it fails with TimeoutError.
- A connection that is lost (reset, refused, the server gone) fails every command in flight with
  ConnectionError; the next call connects again. Nothing is ever sent twice here: whether to retry
  is the caller's decision (an EVALSHA resent after an ambiguous failure could charge twice), but
  for NOSCRIPT (the script did not run) `evalsha` loads the script and sends it once more.
- The URL is understood exactly as redis-py understands it (its parse_url: redis://, rediss://,
  unix://, user and password, the db as path or `?db=`, the `ssl_*` options of a rediss URL);
  AUTH, SELECT and CLIENT SETNAME are sent at connect, pipelined, before any command.

Error replies come back as RespError (cbusbar.resp), raised in the caller; a connection that
cannot be used raises ConnectionError, TimeoutError or OSError (`DOWN`).
"""
from __future__ import annotations

import asyncio
import hashlib
import sys
from collections import deque

from cbusbar.resp import RespError, RespParser, RespProtocolError, encode_command, encode_script

DOWN = (ConnectionError, TimeoutError, OSError)     # "the server did not answer"
# Replies of cancelled commands kept until their caller claims them (RespConnection.orphaned):
# a caller claims in the loop turn after its cancellation, so a handful suffices; the bound only
# keeps unclaimed ones (cancelled commands of a shutdown) from piling up.
ORPHANS_KEPT = 256
_NONE = object()


def redis_py():
    """redis-py's asyncio package, imported on first use.

    The single-file executable (packaging/busbar.spec) leaves out importlib.metadata and what it
    imports (email, csv, zipfile). redis-py imports importlib.metadata at import time only to read
    its own version (redis.utils.get_lib_version, which already falls back when the distribution
    is not found), so when the module is absent a stand-in that says "not found" takes its place."""
    mod = sys.modules.get("redis.asyncio")
    if mod is not None:
        return mod
    try:
        import importlib.metadata  # noqa: F401
    except ImportError:
        import importlib
        import types

        stub = types.ModuleType("importlib.metadata")

        class PackageNotFoundError(ModuleNotFoundError):
            pass

        def version(name):
            raise PackageNotFoundError(name)

        stub.PackageNotFoundError = PackageNotFoundError
        stub.version = version
        sys.modules["importlib.metadata"] = stub
        importlib.metadata = stub
    import redis.asyncio
    return redis.asyncio


class Endpoint:
    """Where and how to connect: host and port or a unix socket path, the TLS context, AUTH and
    SELECT, from a Redis URL (redis-py's own reading of it)."""

    __slots__ = ("host", "port", "path", "ssl", "server_hostname", "username", "password", "db",
                 "client_name")

    def __init__(self, url: str):
        redis_py()
        from redis.asyncio.connection import SSLConnection, parse_url
        kw = parse_url(url)
        self.path = kw.get("path")
        self.host = kw.get("host", "localhost")
        self.port = int(kw.get("port", 6379))
        self.username = kw.get("username")
        self.password = kw.get("password")
        self.db = int(kw.get("db", 0) or 0)
        self.client_name = kw.get("client_name")
        self.ssl = None
        self.server_hostname = None
        cls = kw.get("connection_class")
        if cls is not None and issubclass(cls, SSLConnection):
            opts = {k: v for k, v in kw.items() if k.startswith("ssl_")}
            self.ssl = SSLConnection(**opts).ssl_context.get()
            self.server_hostname = self.host if self.ssl.check_hostname else None

    def handshake(self) -> list:
        """The commands sent first on a new connection."""
        cmds = []
        if self.password:
            cmds.append([b"AUTH", self.username, self.password] if self.username
                        else [b"AUTH", self.password])
        if self.db:
            cmds.append([b"SELECT", self.db])
        if self.client_name:
            cmds.append([b"CLIENT", b"SETNAME", self.client_name])
        return cmds


class RespConnection(asyncio.Protocol):
    """One pipelined connection. `send(frame)` writes an encoded command and returns the future of
    its reply."""

    def __init__(self, loop, timeout: float):
        self._loop = loop
        self._timeout = timeout
        self._parser = RespParser()
        self._waiting = deque()     # the futures of the commands in flight, oldest first
        self._orphans = None        # future -> callback(reply or exception): a cancelled caller's
        self._transport = None
        self._closed = None         # the exception every later send fails with
        self._sent = 0              # commands sent on this connection
        self._got = 0               # replies read
        self._timer = None          # the deadline tick, while commands are in flight
        self._out = []              # frames of this loop turn, written together at its end
        self._marks = []            # _sent at the last three ticks

    # -- asyncio.Protocol
    def connection_made(self, transport):
        self._transport = transport

    def data_received(self, data):
        try:
            replies = self._parser.feed(data)
        except RespProtocolError as e:
            self._fail(ConnectionError("Redis sent bytes that are not RESP: %s" % e))
            return
        waiting = self._waiting
        self._got += len(replies)
        for r in replies:
            if not waiting:
                self._fail(ConnectionError("Redis sent a reply nothing asked for"))
                return
            fut = waiting.popleft()
            if fut.done():
                self._orphan(fut, r)
            elif r.__class__ is RespError:
                # LOADING: a server still reading its dataset answers nothing yet (redis-py's
                # BusyLoadingError, a ConnectionError too)
                fut.set_exception(r if r.code != "LOADING" else ConnectionError(r.message))
            else:
                fut.set_result(r)

    def connection_lost(self, exc):
        self._fail(exc if isinstance(exc, DOWN) and exc is not None else
                   ConnectionError("the connection to Redis was closed" +
                                   (": %s" % exc if exc else "")))

    # -- commands
    @property
    def alive(self) -> bool:
        return self._closed is None

    def send(self, frame: bytes):
        """Writes one encoded command; the future of its reply (an error reply: RespError)."""
        fut = self._loop.create_future()
        if self._closed is not None:
            fut.set_exception(self._closed)
            return fut
        self._waiting.append(fut)
        self._sent += 1
        out = self._out
        out.append(frame)
        if len(out) == 1:           # one write (one system call) for the turn's commands
            self._loop.call_soon(self._write)
        if self._timer is None:
            self._marks = [self._sent]
            self._timer = self._loop.call_later(self._timeout / 2, self._tick)
        return fut

    def orphaned(self, fut, callback):
        """`fut` was cancelled by its caller while in flight: `callback` gets its reply (or the
        exception that ended the connection) when it comes, or now if it came already (between
        the cancellation and the caller's turn to say so)."""
        if self._orphans is None:
            self._orphans = {}
        early = self._orphans.pop(fut, _NONE)
        if early is _NONE:
            self._orphans[fut] = callback
        else:
            try:
                callback(early)
            except Exception:
                pass

    def close(self):
        self._fail(ConnectionError("the connection to Redis was closed by busbar"))

    # -- inside
    def _write(self):
        out, self._out = self._out, []
        t = self._transport
        if t is not None and out:
            t.write(out[0] if len(out) == 1 else b"".join(out))

    def _tick(self):
        self._timer = None
        if self._closed is not None:
            return
        if self._got >= self._sent:
            return              # nothing in flight: the next send arms the timer again
        marks = self._marks
        marks.append(self._sent)
        if len(marks) > 3:
            del marks[0]
        # every command counted at the tick two ticks ago (>= timeout ago) must be answered
        if len(marks) == 3 and self._got < marks[0]:
            self._fail(TimeoutError("no reply from Redis within %.3gs" % self._timeout))
            return
        self._timer = self._loop.call_later(self._timeout / 2, self._tick)

    def _orphan(self, fut, reply):
        """The reply of a command whose caller was cancelled: to its callback, or kept for one
        that its caller has not registered yet (at most ORPHANS_KEPT; a cancelled command
        nobody claims, e.g. at shutdown, is dropped with them)."""
        orphans = self._orphans
        if orphans is None:
            orphans = self._orphans = {}
        cb = orphans.pop(fut, None)
        if cb is None:
            if len(orphans) >= ORPHANS_KEPT:
                orphans.clear()
            orphans[fut] = reply
            return
        try:
            cb(reply)
        except Exception:       # an orphan's bookkeeping must not break the connection
            pass

    def _fail(self, exc):
        if self._closed is None:
            self._closed = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._out = []
        waiting, self._waiting = self._waiting, deque()
        for fut in waiting:
            if fut.done():
                self._orphan(fut, exc)
            else:
                fut.set_exception(exc)
        self._orphans = None
        t = self._transport
        if t is not None:
            self._transport = None
            t.abort()


def _retrieved(fut):
    """A connect nobody awaits any more (its callers were cancelled): its failure is not logged
    as never retrieved (the next call connects again and reports its own)."""
    if not fut.cancelled():
        fut.exception()


class RespClient:
    """A pipelined connection to one Redis, opened on first use and again after it is lost."""

    def __init__(self, url: str, timeout: float):
        self.endpoint = Endpoint(url)
        self.timeout = timeout
        self.conn = None                # the live RespConnection, or None
        self._connecting = None         # the future of a connect under way
        self._scripts = {}              # sha1 (hex, bytes) -> the script's source

    async def connection(self) -> RespConnection:
        c = self.conn
        if c is not None and c._closed is None:
            return c
        fut = self._connecting
        if fut is None or fut.done():   # (a done one failed, or its connection is lost since)
            fut = self._connecting = asyncio.ensure_future(self._connect())
            fut.add_done_callback(_retrieved)
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done() and self._connecting is fut:
                self._connecting = None

    async def _connect(self) -> RespConnection:
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        proto = RespConnection(loop, self.timeout)
        try:
            async with asyncio.timeout(self.timeout):
                if ep.path:
                    await loop.create_unix_connection(lambda: proto, ep.path)
                else:
                    await loop.create_connection(lambda: proto, ep.host, ep.port, ssl=ep.ssl,
                                                 server_hostname=ep.server_hostname)
                futs = [proto.send(encode_command(c)) for c in ep.handshake()]
                for f in futs:
                    await f
        except RespError as e:
            proto.close()
            raise ConnectionError("Redis refused the connection's setup: %s" % e.message) from None
        except BaseException:
            proto.close()
            raise
        self.conn = proto
        return proto

    def close(self):
        c, self.conn = self.conn, None
        if c is not None:
            c.close()
        t, self._connecting = self._connecting, None
        if t is not None and not t.done():
            t.cancel()

    async def call(self, *args):
        """One command; its reply (an error reply raises RespError)."""
        return await (await self.connection()).send(encode_command(args))

    def script(self, source: str) -> bytes:
        """A script's sha1 (the EVALSHA name), remembered for the NOSCRIPT reload."""
        sha = hashlib.sha1(source.encode()).hexdigest().encode()
        self._scripts[sha] = source
        return sha

    async def load(self, sha: bytes):
        await self.call(b"SCRIPT", b"LOAD", self._scripts[sha])

    async def evalsha(self, sha: bytes, keys, args, frame: bytes | None = None):
        """EVALSHA; on NOSCRIPT (a restarted or flushed Redis: the script did not run) the script
        is loaded and sent once more. `frame`: the command already encoded."""
        if frame is None:
            frame = encode_script(sha, keys, args)
        c = self.conn
        if c is None or c._closed is not None:
            c = await self.connection()
        try:
            return await c.send(frame)
        except RespError as e:
            if e.code != "NOSCRIPT":
                raise
        await self.load(sha)
        return await (await self.connection()).send(frame)
