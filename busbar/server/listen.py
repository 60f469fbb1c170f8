"""Listening addresses: one busbar per address, and TLS on a listener.

Workers share the data port through SO_REUSEPORT, which would just as happily let a *second*
busbar join the same port (the kernel then splits requests between two configs). So before
binding, the address is probed with a plain socket (SO_REUSEADDR only): Linux refuses that bind
while any socket listens on the port, reuseport group or not. The probe is closed just before the
real bind; a second instance starting in that microsecond window is the only gap.
"""
from __future__ import annotations

import asyncio
import errno
import socket


class ListenError(Exception):
    """An address cannot be bound; str() is the one line the CLI prints after 'error: '."""


def probe(host: str, port: int, key: str = "listen") -> None:
    """Raises ListenError when (host, port) is taken or unusable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError as exc:
        raise ListenError("%s %s: %s" % (key, _addr(host, port), _reason(exc))) from None
    finally:
        s.close()


def _addr(host, port):
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "address already in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "address not available on this host"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if isinstance(exc, socket.gaierror):
        return "cannot resolve host"
    return exc.strerror or str(exc)


def tls_options(tls, limits) -> dict:
    """create_server keyword arguments for a listener with `tls` (a config.control.Tls) or none."""
    if tls is None:
        return {}
    from busbar.config.control import ssl_context
    return {"ssl": ssl_context(tls), "ssl_handshake_timeout": limits.tls_handshake_timeout_secs}


# One read buffer for every TLS connection of the process: uvloop's SSL transport decrypts into it
# and hands it to the protocol in the same callback (get_buffer, read, buffer_updated), so no two
# connections ever use it at once. 256 KiB: what uvloop reads at most per call.
TLS_READ_BUFFER = 256 * 1024
_tls_buf = None


class TlsReader(asyncio.BufferedProtocol):
    """A TLS listener's connection protocol: the HTTP connection behind a buffered reader.

    With a plain Protocol, uvloop's SSL transport reads each decrypted chunk with
    `SSLObject.read(256 KiB)`, which allocates 256 KiB per call, twice per request; busbar's fixed
    128 KiB mmap threshold (gateway.MMAP_THRESHOLD) turns each into an mmap, a page fault and a
    munmap: measured, 2.0 page faults and ~73 µs of CPU per small request over TLS against ~33
    plain (the floor, without that threshold, paid ~2 µs for TLS). Read into one shared buffer,
    each chunk is copied out at its own size."""

    __slots__ = ("inner", "view")

    def __init__(self, inner):
        global _tls_buf
        if _tls_buf is None:
            _tls_buf = memoryview(bytearray(TLS_READ_BUFFER))
        self.inner = inner
        self.view = _tls_buf

    def get_buffer(self, sizehint):
        return self.view

    def buffer_updated(self, nbytes):
        self.inner.data_received(self.view[:nbytes].tobytes())

    def connection_made(self, transport):
        self.inner.connection_made(transport)

    def connection_lost(self, exc):
        self.inner.connection_lost(exc)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()


def protocol_factory(factory, tls):
    """`factory` as create_server takes it, behind a TlsReader when the listener has TLS."""
    if tls is None:
        return factory
    return lambda: TlsReader(factory())
