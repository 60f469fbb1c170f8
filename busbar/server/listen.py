"""Listening addresses: one busbar per address, and TLS on a listener.

Workers share the data port through SO_REUSEPORT, which would just as happily let a *second*
busbar join the same port (the kernel then splits requests between two configs). So before
binding, the address is probed with a plain socket (SO_REUSEADDR only): Linux refuses that bind
while any socket listens on the port, reuseport group or not. The probe is closed just before the
real bind; a second instance starting in that microsecond window is the only gap.
"""
from __future__ import annotations

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


def protocol_factory(factory, tls):
    """`factory` as create_server takes it, behind a TlsReader when the listener has TLS
    (busbar/upstream/tlsread.py says why)."""
    if tls is None:
        return factory
    from busbar.upstream.tlsread import TlsReader
    return lambda: TlsReader(factory())


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock
