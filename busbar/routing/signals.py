"""What the routing strategies read that one request cannot see: each lane's latency (a rolling
average over every worker) and the table of sessions pinned to a lane (`affinity`).

Both live in one counter array: a `cbusbar.shared.SharedCounters` mapping made before the workers
fork (`prepare`, from busbar/supervisor.py), so a lane one worker measured is fast or slow for all,
and a session pinned by one worker stays pinned when its next request lands on another; in a
single process, the same layout in local memory.

Latency: the time from sending an attempt to its 2xx response head (what the Rust gateway
measures), folded into an exponentially weighted average, ewma = 0.2·sample + 0.8·ewma (its
smoothing: the last ~5 answers weigh most, so a lane that slows down is noticed within a few
requests and one slow outlier does not reorder a pool). Stored as whole microseconds; 0 = no sample
yet. Recorded only while some pool reads it (`fastest`, or a hook's candidate projection).

Sessions: a set-associative table, `limits.affinity_max_sessions` entries in sets of `WAYS`. An
entry is two slots: the session's 63-bit fingerprint (of the pool, its member list and the
session key, so a reload that changes a pool's members starts its sessions afresh) and a value
packing a 15-bit check of the fingerprint, the member index and the second it was last used. A set
that is full forgets its least recently used entry. Two workers writing one entry at once can at
worst make a reader miss (the check no longer matches): a pin is a preference, and a miss routes
the session afresh.
"""
from __future__ import annotations

import hashlib
import time

from cbusbar.shared import LocalCounters

# The Rust gateway's smoothing factor for the latency average (store/in_memory: LATENCY_EWMA_ALPHA).
EWMA_ALPHA = 0.2
# Entries per set of the session table: a new session evicts the least recently used of four.
WAYS = 4
# Latency slots when there is no shared mapping to size them by: lanes are numbered on first
# sight in one process, and the array grows.
_LOCAL_LANES = 64
_MASK63 = (1 << 63) - 1

_prepared = None        # (config, SharedCounters) made by prepare() before the workers fork


def lanes_capacity(config) -> int:
    """Latency slots: one per lane permit slot (busbar/admin/plane.py slot_capacity, whose numbers
    Lane._slot holds, reloads included)."""
    return max(256, 4 * len(config.models))


def _sets(config) -> int:
    n = config.limits.affinity_max_sessions
    return max(1, -(-n // WAYS))


def prepare(config, workers: int):
    """Before the fork: the mapping every worker's Signals shares (None for one worker)."""
    global _prepared
    if workers <= 1:
        _prepared = None
        return None
    from cbusbar.shared import SharedCounters
    _prepared = (config, SharedCounters(lanes_capacity(config) + 2 * WAYS * _sets(config)))
    return _prepared[1]


def shared_for(config):
    """The mapping `prepare` made for this config's process tree, or None."""
    if _prepared is not None and _prepared[0] is config:
        return _prepared[1]
    return None


class Signals:
    """One worker's view of the lane signals and session pins (see the module docstring)."""

    def __init__(self, config, shared=None, clock=time.monotonic):
        self.clock = clock
        self.sets = _sets(config)
        if shared is not None:
            self.slots = shared
            self.lanes_cap = lanes_capacity(config)
            self.by_name = None         # lane._slot numbers the latency slots
        else:
            self.lanes_cap = _LOCAL_LANES
            self.slots = LocalCounters(self.lanes_cap + 2 * WAYS * self.sets)
            self.by_name = {}           # lane name -> its slot in this process
        self.session_base = self.lanes_cap
        self.recording = False          # set while a pool reads latency (RoutingState.attach)

    # ------------------------------------------------------------------ latency
    def _lane_slot(self, lane) -> int:
        if self.by_name is None:
            s = lane._slot
            return s if 0 <= s < self.lanes_cap else -1
        s = self.by_name.get(lane.name)
        if s is None:
            s = len(self.by_name)
            if s >= self.lanes_cap:
                # Grow the latency region: sessions move up with it (they are forgotten, once;
                # only a process whose reloads added this many lanes gets here).
                grown = LocalCounters(2 * self.lanes_cap + 2 * WAYS * self.sets)
                for i in self.by_name.values():
                    grown.store(i, self.slots.value(i))
                self.lanes_cap *= 2
                self.session_base = self.lanes_cap
                self.slots = grown
            self.by_name[lane.name] = s
        return s

    def latency_ms(self, lane):
        """The lane's latency average in milliseconds, or None before its first 2xx."""
        s = self._lane_slot(lane)
        if s < 0:
            return None
        v = self.slots.value(s)
        return v / 1000.0 if v > 0 else None

    def record(self, lane, ns: int) -> None:
        """One 2xx head `ns` nanoseconds after the attempt was sent, folded into the average."""
        s = self._lane_slot(lane)
        if s < 0 or ns <= 0:
            return
        sample = max(1, ns // 1000)
        slots = self.slots
        for _ in range(8):      # a compare-and-swap lost to another worker is retried
            cur = slots.value(s)
            new = sample if cur <= 0 else max(1, round(EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * cur))
            if slots.cas(s, cur, new):
                return

    def forget(self, lane) -> None:
        """A lane new to this snapshot: a reused slot must not carry another model's average."""
        s = self._lane_slot(lane)
        if s >= 0:
            self.slots.store(s, 0)

    # ------------------------------------------------------------------ sessions
    @staticmethod
    def fingerprint(scope: bytes, session: bytes) -> int:
        h = hashlib.blake2b(session, digest_size=8, key=scope[:64]).digest()
        fp = int.from_bytes(h, "little") & _MASK63
        return fp or 1

    def _set_base(self, fp: int) -> int:
        return self.session_base + 2 * WAYS * (fp % self.sets)

    def pinned(self, fp: int):
        """The member index the session `fp` is pinned to, or None."""
        slots = self.slots
        base = self._set_base(fp)
        for k in range(WAYS):
            i = base + 2 * k
            if slots.value(i) == fp:
                v = slots.value(i + 1)
                if v >> 48 != fp & 0x7FFF:
                    return None         # torn by a concurrent writer: a miss
                now = int(self.clock())
                if now != v & 0xFFFFFFFF:
                    slots.store(i + 1, (v & ~0xFFFFFFFF) | (now & 0xFFFFFFFF))
                return ((v >> 32) & 0xFFFF) - 1
        return None

    def pin(self, fp: int, member: int) -> None:
        """Pins session `fp` to `member` (a new pin, or a re-pin after failover)."""
        slots = self.slots
        base = self._set_base(fp)
        now = int(self.clock()) & 0xFFFFFFFF
        value = ((fp & 0x7FFF) << 48) | (((member + 1) & 0xFFFF) << 32) | now
        victim = -1
        oldest = None
        for k in range(WAYS):
            i = base + 2 * k
            tag = slots.value(i)
            if tag == fp or tag == 0:
                victim = i
                break
            t = slots.value(i + 1) & 0xFFFFFFFF
            if oldest is None or t < oldest:
                oldest = t
                victim = i
        slots.store(victim + 1, value)
        slots.store(victim, fp)

    def sessions(self) -> int:
        """Entries in use (for /stats and tests)."""
        base = self.session_base
        return sum(1 for i in range(base, base + 2 * WAYS * self.sets, 2) if self.slots.value(i))
