"""Messages between the parent (worker 0) and the workers it forked, over socketpairs made before
the fork: a 4-byte big-endian length and a pickle (both ends are this program, in processes it
forked, so pickle carries config objects and records as they are). The control plane
(busbar/admin/plane.py: config swaps, governance changes) and governance's usage channel
(busbar/governance/plane.py) both speak it.
"""
from __future__ import annotations

import asyncio
import struct

_LEN = struct.Struct(">I")


def frame(obj) -> bytes:
    """One message's bytes (for a sender that writes them itself, e.g. blocking at exit)."""
    import pickle       # (on first use: one worker and no reload never load it)
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


async def recv_exact(loop, sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            raise EOFError("channel closed")
        buf += chunk
    return bytes(buf)


async def send_msg(loop, sock, obj):
    await loop.sock_sendall(sock, frame(obj))


async def recv_msg(loop, sock):
    n = _LEN.unpack(await recv_exact(loop, sock, 4))[0]
    import pickle       # (after the wait: a worker idling on its channel has not loaded it)
    return pickle.loads(await recv_exact(loop, sock, n))


async def call_worker(loop, sock, msg, timeout):
    async def call():
        await send_msg(loop, sock, msg)
        return await recv_msg(loop, sock)
    return await asyncio.wait_for(call(), timeout)


async def broadcast(loop, workers, msg, timeout, ok):
    """Sends `msg` to every worker of `workers` ((pid, sock) pairs) at once and waits for their
    replies; returns the pids whose reply did not come within `timeout` or that `ok(reply)`
    refuses (empty: every worker took it)."""
    acks = await asyncio.gather(*(call_worker(loop, sock, msg, timeout) for _, sock in workers),
                                return_exceptions=True)
    return [pid for (pid, _), a in zip(workers, acks) if isinstance(a, BaseException) or not ok(a)]
