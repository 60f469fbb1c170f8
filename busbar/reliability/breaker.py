"""The circuit breaker: one `Cell` per (pool, lane); Closed → Open → HalfOpen → Closed (SPEC §4.2).

A cell's state lives in slots of a counter array: `LocalSlots` in a single process, or the gateway's
`cbusbar.shared.SharedCounters` (a MAP_SHARED mapping made before the workers fork) with several
workers. So what one worker learns is every worker's state: a lane it tripped is open for all, its
cooldown is one cooldown, and the half-open probe is one probe for the whole gateway, taken by a
compare-and-swap on the cooldown slot. The ok/err/client_fault counters are gateway-wide sums.
Only the error-rate window is per process (a worker trips a lane from the outcomes it saw itself,
then the trip is shared): keeping 1024 timestamps per cell in shared memory would cost a lock.

Times are CLOCK_MONOTONIC milliseconds (`time.monotonic`, one clock for every process on the host);
the clock is injectable for tests, as is the jitter's random source.

Happy-path cost: `enter()` (usable() and claim() in one call for a closed, uncooled cell) reads
one slot and takes the lane's in-flight count; `ok()` (that count back and `record_ok()` in one
call) adds to two counters and one window bucket, and reads two slots to see there is nothing to
reset. Both are C (cbusbar/cellcore.pyx), as are one process's slots (cbusbar.shared.
LocalCounters) and the window. Measured with callgrind, a small same-protocol request through the
whole server (bench/ab/no-breaker.patch is the control): 12.3k instructions of breaker work with
the slots in a Python list and separate Python calls; see cellcore.pyx for the figure now.
"""
from __future__ import annotations

import logging
import random
import time

from busbar.engine.classify import D_CLIENT_FAULT, D_CONTEXT, D_HARD_DOWN
from cbusbar.cellcore import LAYOUT, CellCore, LaneCore, Window  # noqa: F401 (Window: state.py)
from cbusbar.shared import LocalCounters

log = logging.getLogger("busbar")
# The breaker's state changes go where busbar/observability/events.py writes operational events.
events = logging.getLogger("busbar.events")


def _v(v) -> str:
    s = str(v)
    return '"%s"' % s.replace('"', "'") if (" " in s or not s) else s

CLOSED = 0
OPEN = 1
HALF_OPEN = 2
STATE_NAMES = ("closed", "open", "half_open")

# Slot layout of one cell.
S_STATE = 0
S_UNTIL = 1         # monotonic ms when the cooldown (or the probe's lease) ends; 0 = none
S_STREAK = 2        # failures in a row
S_OK = 3
S_ERR = 4
S_CLIENT_FAULT = 5
S_HARD = 6          # 1 while benched as hard_down (sticky cooldown)
S_TRIPS = 7
CELL_SLOTS = 8


# The SharedCounters interface over one process's memory (C: the breaker touches these on every
# attempt); a reload that adds cells grows it.
LocalSlots = LocalCounters


class Cell(CellCore):
    """One (pool, lane) breaker cell. `pool` is "" for the lane-default cell of direct routes.
    The happy path (`enter`, `ok`) and the fields it reads (slots, base, budget, window, clock,
    policy) are cbusbar.cellcore.CellCore's."""

    __slots__ = ("pool", "lane", "rand", "context_max", "attempt_timeout_ms", "limits",
                 "on_change")

    def __init__(self, pool, lane, policy, slots, base, limits, clock=time.monotonic, rand=None,
                 budget=None, context_max=None, attempt_timeout_ms=None):
        self.pool = pool
        self.lane = lane
        self.policy = policy
        self.slots = slots
        self.base = base
        self.limits = limits
        self.window = Window(policy.window_secs)
        self.clock = clock
        self.rand = rand or random.Random()
        self.budget = budget            # the lane's LaneState (budget, inflight)
        self.context_max = context_max
        self.attempt_timeout_ms = attempt_timeout_ms
        self.on_change = None           # called with (cell, event) on trip / recover / bench

    # ------------------------------------------------------------------ reading (side-effect free)
    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def usable(self) -> bool:
        """Whether a selection may take this cell now: closed and not cooling down, or due for its
        half-open probe. Reads; never takes the probe slot (so /healthz and /stats may call it)."""
        b = self.budget
        if b.limit is not None and not b.left():
            return False
        until = self.slots.value(self.base + S_UNTIL)
        return until == 0 or until <= self.now_ms()

    def state(self) -> int:
        return self.slots.value(self.base + S_STATE)

    def cooldown_remaining(self) -> float:
        until = self.slots.value(self.base + S_UNTIL)
        if until == 0:
            return 0.0
        return max(0.0, (until - self.now_ms()) / 1000.0)

    def until_ms(self) -> int:
        return self.slots.value(self.base + S_UNTIL)

    # ------------------------------------------------------------------ taking
    def claim(self) -> bool:
        """Called once for the lane a selection chose. A closed cell admits; an open one whose
        cooldown passed admits exactly one probe, whichever worker wins the compare-and-swap.
        False: someone else took the probe (or the cooldown is back): choose another lane."""
        slots = self.slots
        b = self.base
        until = slots.value(b + S_UNTIL)
        if until == 0:
            return self._take_budget()
        now = self.now_ms()
        if until > now:
            return False
        if slots.value(b + S_STATE) == CLOSED:
            # A closed cell's cooldown after a failure that did not trip: over, admit freely.
            slots.cas(b + S_UNTIL, until, 0)
            return self._take_budget()
        # Open (or a half-open whose probe never reported: its lease ran out). The probe's lease
        # is the longest a live attempt may take, so a probe in flight is never doubled.
        lease = now + int(self.limits.upstream_request_timeout_secs * 1000) + 1
        if not slots.cas(b + S_UNTIL, until, lease):
            return False
        slots.store(b + S_STATE, HALF_OPEN)
        if not self._take_budget():
            slots.store(b + S_STATE, OPEN)
            slots.store(b + S_UNTIL, until)
            return False
        return True

    def _take_budget(self) -> bool:
        return self.budget.take()

    # ------------------------------------------------------------------ outcomes
    def record_ok(self):
        slots = self.slots
        b = self.base
        slots.add(b + S_OK, 1)
        if self.policy.mode == "error_rate":
            self.window.add(self.clock(), False)
        if slots.value(b + S_STREAK) or slots.value(b + S_UNTIL):
            self._reset_ok()

    def _reset_ok(self):
        """A success after failures: the streak and any cooldown end; an open cell recovers."""
        slots = self.slots
        b = self.base
        was = slots.value(b + S_STATE)
        slots.store(b + S_STATE, CLOSED)
        slots.store(b + S_UNTIL, 0)
        slots.store(b + S_STREAK, 0)
        slots.store(b + S_HARD, 0)
        if was != CLOSED:
            self.window.clear()
            self._event("recovered", 0.0, None)

    def record_client_fault(self):
        self.slots.add(self.base + S_CLIENT_FAULT, 1)

    def record_failure(self, disposition, retry_after=None, reason=None, counted=True):
        """A penalised outcome (transient, attempt timeout, hard down). `counted` False: a health
        probe's, which moves the state machine but is not an attempt in the err counter."""
        slots = self.slots
        b = self.base
        pol = self.policy
        lim = self.limits
        now_s = self.clock()
        now = int(now_s * 1000)
        if counted:
            slots.add(b + S_ERR, 1)
        streak = slots.add(b + S_STREAK, 1)
        state = slots.value(b + S_STATE)
        if disposition == D_HARD_DOWN:
            secs = lim.hard_down_cooldown_secs
            was_benched = state == OPEN and slots.value(b + S_HARD)
            slots.store(b + S_HARD, 1)
            self._open(now, secs, state)
            if state == CLOSED:
                slots.add(b + S_TRIPS, 1)   # benched from closed is a trip too (busbar_breaker_trips_total)
            if not was_benched:             # a late 401 of an attempt admitted before: no new line
                self._event("benched", secs, reason, disposition)
            return
        secs = self.cooldown(streak)
        if retry_after is not None:
            # Retry-After is a floor, capped (SPEC §4.2).
            secs = max(secs, min(retry_after, lim.max_honored_retry_after_secs))
        if state == HALF_OPEN:
            self._open(now, secs, state)        # the probe failed: open again, longer
            self._event("probe_failed", secs, reason, disposition)
            return
        if state == OPEN:
            # A late failure of an attempt admitted before the trip: extends, never shortens.
            self._extend(now + int(secs * 1000))
            return
        trip = False
        if pol.mode == "consecutive":
            trip = streak >= pol.consecutive_n
        else:
            self.window.add(now_s, True)
            ok, err = self.window.counts(now_s)
            total = ok + err
            trip = total >= pol.min_requests and err >= pol.threshold * total
        if trip:
            self._open(now, secs, state)
            slots.add(b + S_TRIPS, 1)
            self._event("tripped", secs, reason, disposition)
        else:
            # A failure that does not trip still cools this cell down (SPEC §4.2).
            self._extend(now + int(secs * 1000))

    def cooldown(self, streak: int) -> float:
        """min(base * 2^streak, max), +-10 % jitter, clamped to [target/2, max]."""
        pol = self.policy
        target = min(pol.base_cooldown_secs * (2.0 ** min(streak, 32)), pol.max_cooldown_secs)
        x = target * self.rand.uniform(0.9, 1.1)
        return min(max(x, target / 2.0), pol.max_cooldown_secs)

    def _open(self, now, secs, state):
        slots = self.slots
        b = self.base
        slots.store(b + S_UNTIL, now + max(1, int(secs * 1000)))
        slots.store(b + S_STATE, OPEN)

    def _extend(self, until):
        slots = self.slots
        i = self.base + S_UNTIL
        while True:
            cur = slots.value(i)
            if cur >= until or slots.cas(i, cur, until):
                return

    def _event(self, what, secs, reason, disposition=None):
        """One operational line per state change, in busbar/observability/events.py's shape:
        `lane_<what> pool=.. lane=.. [disposition=..] [cooldown_s=..] [reason=".."]`, WARNING
        except `lane_recovered` (INFO). `pool` is the direct route's model name for its cell, as in
        the metrics' labels. The reason is busbar's own words or the provider's error message,
        which never holds a prompt or a secret (keys are masked before it is kept)."""
        level = logging.INFO if what == "recovered" else logging.WARNING
        if events.isEnabledFor(level):
            parts = ["lane_" + what, "pool=" + _v(self.pool or self.lane.name),
                     "lane=" + _v(self.lane.name)]
            if disposition:
                parts.append("disposition=" + disposition)
            if secs:
                parts.append("cooldown_s=%.1f" % secs)
            if reason:
                parts.append("reason=" + _v(reason))
            events.log(level, "%s", " ".join(parts))
        if self.on_change is not None:
            self.on_change(self, what)

    def reset(self):
        """Closed, no cooldown, no streak (a successful active probe)."""
        slots = self.slots
        b = self.base
        for k in (S_STATE, S_UNTIL, S_STREAK, S_HARD):
            slots.store(b + k, CLOSED if k == S_STATE else 0)
        self.window.clear()

    # ------------------------------------------------------------------ health probes
    # A health probe (busbar/reliability/health.py) never takes the half-open slot: it only reads
    # the cell before it is sent, and writes its outcome after. Live traffic is never held back by
    # a probe in flight, and a probe never waits behind a live one.
    def tripped(self) -> bool:
        """Open or half-open (a dead-mode probe's condition)."""
        return self.slots.value(self.base + S_STATE) != CLOSED

    def probe_ok(self):
        """The lane answered a health probe: every trace of failure goes (SPEC §4.2: a successful
        active probe clears every cell of the lane). Not counted as an ok attempt."""
        slots = self.slots
        b = self.base
        was = slots.value(b + S_STATE)
        if was == CLOSED and not slots.value(b + S_UNTIL) and not slots.value(b + S_STREAK):
            return
        self.reset()
        if was != CLOSED:
            self._event("recovered (health probe)", 0.0, None)

    def probe_failed(self, disposition, retry_after=None, reason=None):
        """A health probe failed: a tripped cell's cooldown is re-armed, longer (never shortened),
        so live traffic does not probe a lane the prober just found down; a closed cell counts it
        toward tripping, as an attempt's failure would. Not counted as an err attempt."""
        if disposition == D_HARD_DOWN and self.slots.value(self.base + S_HARD):
            # Still benched: re-armed without a WARNING per probe (one when it was benched).
            self.slots.add(self.base + S_STREAK, 1)
            self._extend(self.now_ms() + int(self.limits.hard_down_cooldown_secs * 1000))
            return
        self.record_failure(disposition, retry_after, reason, counted=False)

    def record(self, disposition, retry_after=None, reason=None):
        """The outcome of one attempt through this cell; None = ok."""
        if disposition is None:
            self.record_ok()
        elif disposition == D_CLIENT_FAULT or disposition == D_CONTEXT:
            self.record_client_fault()
            if self.state() == HALF_OPEN:
                # The probe reached a lane that answered for itself: it is up, whatever the
                # caller's request was; without this the cell would wait out the probe's lease.
                self.reset()
                self._event("recovered", 0.0, None)
        else:
            self.record_failure(disposition, retry_after, reason)

    def snapshot(self) -> dict:
        s = self.slots
        b = self.base
        return {"state": STATE_NAMES[s.value(b + S_STATE)], "streak": s.value(b + S_STREAK),
                "ok": s.value(b + S_OK), "err": s.value(b + S_ERR),
                "client_fault": s.value(b + S_CLIENT_FAULT), "hard_down": bool(s.value(b + S_HARD)),
                "trips": s.value(b + S_TRIPS), "cooldown_remaining_s": round(self.cooldown_remaining(), 3)}


class LaneState(LaneCore):
    """What is lane-global across pools and workers (SPEC §3), in one block of slots: the lifetime
    budget used (`max_requests`) and the attempts in flight; the health prober's claim on the
    lane and its outcome counts (busbar/reliability/health.py); the lane's wait queue's
    gateway-wide waiter count and oldest waiter (busbar/reliability/queue.py); and the hold a
    provider's Retry-After put on the lane (`hold`, busbar/reliability/state.py). The budget is taken
    when a selection claims the lane and given back when the attempt does not end in a whole
    answer, so a body that fails is refunded and concurrent requests never overshoot. Slots start
    at zero in a fresh mapping, so no worker has to initialise them. Its fields are
    cbusbar.cellcore.LaneCore's (read by the cells' happy path in C)."""

    __slots__ = ()

    def __init__(self, slots, i, limit):
        self.slots = slots
        self.i = i
        self.limit = limit      # None = unlimited

    def left(self):
        """Requests left in the budget; True when unlimited."""
        if self.limit is None:
            return True
        return max(0, self.limit - self.slots.value(self.i))

    def take(self) -> bool:
        slots = self.slots
        i = self.i
        slots.add(i + L_INFLIGHT, 1)
        if self.limit is None:
            return True
        if slots.add(i, 1) <= self.limit:
            return True
        slots.add(i, -1)
        slots.add(i + L_INFLIGHT, -1)
        return False

    def done(self, refund: bool):
        slots = self.slots
        slots.add(self.i + L_INFLIGHT, -1)
        if refund and self.limit is not None:
            slots.add(self.i, -1)

    def inflight(self) -> int:
        return self.slots.value(self.i + L_INFLIGHT)

    def hold(self, until_ms: int, rate_limit: bool):
        """The provider asked for no call to this lane before `until_ms` (its Retry-After): kept
        unless a hold already there ends later. Lane-global, as the provider's limit is (its
        key and model, whatever pool the call came through), and every worker's."""
        v = until_ms * 2 + (1 if rate_limit else 0)
        slots = self.slots
        i = self.i + L_HOLD
        while True:
            cur = slots.value(i)
            if (cur >> 1) >= until_ms or slots.cas(i, cur, v):
                return

    def held(self, now_ms: int):
        """(milliseconds left, whether it was a rate limit) of the provider's hold, or None."""
        v = self.slots.value(self.i + L_HOLD)
        left = (v >> 1) - now_ms
        if left <= 0:
            return None
        return left, bool(v & 1)


# Slot layout of a lane's block.
L_USED = 0          # lifetime budget used
L_INFLIGHT = 1      # attempts in flight, every worker
L_PROBE_AT = 2      # monotonic ms of the lane's last health-probe claim (CAS'd: one prober)
L_PROBE_OK = 3      # health probes answered
L_PROBE_FAIL = 4    # health probes failed
L_WAITING = 5       # requests queued for a permit of this lane, every worker
L_OLDEST = 6        # monotonic ms the oldest of them was queued (0: none)
L_HOLD = 7          # monotonic ms before which the provider asked not to be called (Retry-After),
                    # times 2, plus 1 when it was a rate limit (0: none)
LANE_SLOTS = 8

# cbusbar/cellcore.pyx reads these slots in C: its copy of the layout must be this one.
assert LAYOUT == (S_UNTIL, S_STREAK, S_OK, CELL_SLOTS, L_INFLIGHT, LANE_SLOTS), LAYOUT
