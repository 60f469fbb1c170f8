"""An idle worker gives its free heap back (busbar/supervisor.py `_trim_when_idle`): glibc
returns freed heap memory only from the heap's top, so memory freed under a block still in use
stays resident until malloc_trim."""
import asyncio

from busbar import supervisor
from cbusbar.sysmem import heap_free, set_mmap_threshold


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 20)


class _Site:
    def __init__(self, loop, inflight):
        self.loop = loop
        self.inflight = inflight
        self.draining = False


def _run(inflight, monkeypatch):
    set_mmap_threshold(supervisor.MMAP_THRESHOLD)      # as a worker does: these come from the heap
    blocks = [bytearray(100_000) for _ in range(600)]
    pin = bytearray(100_000)                        # allocated last: the heap's top stays in use
    del blocks
    assert heap_free() > 40 << 20
    before = _rss_mib()
    monkeypatch.setattr(supervisor, "TRIM_SECS", 0.01)
    loop = asyncio.new_event_loop()
    try:
        site = _Site(loop, inflight)
        supervisor._trim_when_idle(site)
        loop.run_until_complete(asyncio.sleep(0.05))
        site.draining = True
        loop.run_until_complete(asyncio.sleep(0.02))
    finally:
        loop.close()
    after = _rss_mib()
    del pin
    return before, after


def test_an_idle_worker_trims(monkeypatch):
    before, after = _run(0, monkeypatch)
    assert after < before - 40, (before, after)


def test_a_busy_worker_does_not(monkeypatch):
    before, after = _run(3, monkeypatch)
    assert after > before - 5, (before, after)
