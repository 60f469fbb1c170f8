"""A line writer that never blocks the event loop: the loop appends bytes to a list, a daemon
thread swaps the list out and writes it (the write(2) releases the GIL), every FLUSH_SECS or sooner
when a batch grows large. A writer that cannot keep up (a full stderr pipe, a stalled disk) makes
the buffer grow to MAX_BUFFERED bytes; past that, new lines are dropped and counted.

Used by the access log and the file request-log sink; rotation by size for files (`rotate_mb`):
`path` → `path.1` (one generation kept, as logrotate's `rotate 1`)."""
from __future__ import annotations

import os
import threading

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
        self.buf = []
        self.size = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
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
        """Called on the loop: an append (the GIL makes list.append atomic)."""
        if self.size > MAX_BUFFERED:
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop()
            return
        self.buf.append(line)
        self.size += len(line)

    def _run(self):
        while not self.stopping:
            self.wake.wait(FLUSH_SECS)
            self.wake.clear()
            self.flush()
        self.flush()

    def flush(self):
        with self.lock:
            if not self.buf:
                return
            buf, self.buf = self.buf, []
            self.size = 0
            data = b"".join(buf)
            try:
                if self.rotate_bytes and self.fd != 2 and self.written + len(data) > self.rotate_bytes \
                        and self.written > 0:
                    os.close(self.fd)
                    os.replace(self.target, self.target + ".1")
                    self.fd = self._open()
                    self.written = 0
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
                self.written += len(data)
            except OSError:
                self.dropped += len(buf)

    def close(self, timeout: float = 2.0):
        """Flushes what is buffered (bounded: a stuck writer is abandoned after `timeout`)."""
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout)
        if self.fd != 2 and not self.thread.is_alive():
            os.close(self.fd)
