"""TLS connections' reads into one shared buffer, for the listeners and the upstream pool.

With a plain asyncio.Protocol, uvloop's SSL transport reads each decrypted chunk with
`SSLObject.read(256 KiB)`, which allocates 256 KiB per call (twice per message: the read, then
the one that finds nothing more). Under busbar's fixed 128 KiB mmap threshold
(busbar/supervisor.py MMAP_THRESHOLD, which returns large request bodies to the system) each
of those is an mmap, a page fault and a munmap: measured on a TLS listener, 2 page faults and
~40 µs of CPU per small request (73 µs against 33 plain; the floor, without that threshold, paid
~3 µs for TLS). As a BufferedProtocol the transport decrypts into the buffer it is given, and each
chunk is copied out at its own size. Every upstream call to a provider over HTTPS reads through
the same transport, so the pool's connections go through this too.
"""
from __future__ import annotations

import asyncio

# One read buffer for every TLS connection of the process: uvloop's SSL transport decrypts into it
# and hands it to the protocol in the same callback (get_buffer, read, buffer_updated), so no two
# connections ever use it at once. 256 KiB: what uvloop reads at most per call.
TLS_READ_BUFFER = 256 * 1024
_shared = None


class TlsReader(asyncio.BufferedProtocol):
    """`inner` (an asyncio.Protocol) behind a buffered reader; every other callback is passed on."""

    __slots__ = ("inner", "view")

    def __init__(self, inner):
        global _shared
        if _shared is None:
            _shared = memoryview(bytearray(TLS_READ_BUFFER))
        self.inner = inner
        self.view = _shared

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
