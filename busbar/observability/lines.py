"""A line writer that never blocks the event loop: the loop appends each line to a buffer, a daemon
thread takes what accumulated and writes it (the write(2) releases the GIL), FLUSH_SECS after the
first line of a batch. With nothing to write the thread sleeps without a timeout: the loop wakes it
when a line lands in an empty buffer (LineBuffer.on_first), once a batch; it woke 10 times a second
before, costing an idle worker ~1.1 ms of CPU a second (measured).
A writer that cannot keep up (a full stderr pipe, a stalled disk) lets the pending bytes grow to
MAX_BUFFERED; past that, new lines are dropped and counted.

The buffer is cbusbar.accesslog.LineBuffer: two byte buffers that keep their memory, the loop
appending to one while the thread writes the other. Kept as separate objects, 0.1 s of orjson
lines cost ~3.5 µs a line in page faults and allocator work; a bytearray that the thread copied
and trimmed still took 0.18 fresh pages a request (minflt, in the server under load); this takes
none in the steady state.

Used by the access log and the file request-log sink; rotation by size for files (`rotate_mb`):
`path` → `path.1` (one generation kept, as logrotate's `rotate 1`)."""
from __future__ import annotations

import os
import threading

from cbusbar.accesslog import LineBuffer

# A tenth of a second: lines reach the file promptly for `tail -f`, and at 10k req/s a batch is
# ~1k lines, one write.
FLUSH_SECS = 0.1
# 16 MiB of unwritten lines (~40k requests) before dropping: bounded memory, room for a stall of
# seconds at full load.
MAX_BUFFERED = 16 * 1024 * 1024


class LineWriter:
    def __init__(self, target: str, rotate_bytes: int = 0, on_drop=None):
        self.target = target
        self.rotate_bytes = rotate_bytes
        self.on_drop = on_drop
        self.buf = LineBuffer(MAX_BUFFERED)
        self.dropped = 0
        self.lock = threading.Lock()        # flush() from the thread and from close()
        self.wake = threading.Event()       # set by the loop: a line in an empty buffer
        self.stop = threading.Event()       # set by close(): the batch's wait is cut short
        self.stopping = False
        self.buf.on_first = self.wake.set
        self.fd = 2 if target == "stderr" else self._open()
        self.written = 0
        if self.fd != 2:
            try:
                self.written = os.fstat(self.fd).st_size
            except OSError:
                pass
        self.thread = threading.Thread(target=self._run, name="busbar-lines", daemon=True)
        self.thread.start()

    def _open(self):
        return os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def write(self, line: bytes):
        """Called on the loop: one append (a drop when MAX_BUFFERED bytes are pending)."""
        if not self.buf.append(line):
            self.drop()

    def drop(self):
        """A line not written: the buffer is full (a writer that does not keep up)."""
        self.dropped += 1
        if self.on_drop is not None:
            self.on_drop()

    def _run(self):
        while not self.stopping:
            self.wake.wait()                # idle: asleep until the loop has a line
            self.stop.wait(FLUSH_SECS)      # the batch: at 10k req/s ~1k lines, one write
            # Cleared before the buffer is taken: a line appended after the take finds the new
            # buffer empty and sets it again; one appended before goes out with this write.
            self.wake.clear()
            self.flush()
        self.flush()

    def flush(self):
        with self.lock:
            buf = self.buf
            view = buf.take()       # the loop appends to the other buffer meanwhile
            if view is None:
                return
            n = len(view)
            try:
                if self.rotate_bytes and self.fd != 2 and self.written + n > self.rotate_bytes \
                        and self.written > 0:
                    os.close(self.fd)
                    os.replace(self.target, self.target + ".1")
                    self.fd = self._open()
                    self.written = 0
                rest = view
                while rest:
                    k = os.write(self.fd, rest)
                    rest = rest[k:]
                self.written += n
            except OSError:
                self.dropped += bytes(view).count(b"\n")
            finally:
                view.release()
                buf.done()

    def close(self, timeout: float = 2.0):
        """Flushes what is buffered (bounded: a stuck writer is abandoned after `timeout`)."""
        self.stopping = True
        self.stop.set()
        self.wake.set()
        self.thread.join(timeout)
        if self.fd != 2 and not self.thread.is_alive():
            os.close(self.fd)
