"""The breaker cell's state machine with injected time (SPEC §4.2)."""
from __future__ import annotations

import os
import random

import pytest

from busbar.config.schema import Limits
from busbar.reliability.breaker import (CELL_SLOTS, CLOSED, HALF_OPEN, LANE_SLOTS, OPEN, Cell,
                                        LaneState, LocalSlots)
from busbar.engine.classify import (D_ATTEMPT_TIMEOUT, D_CLIENT_FAULT, D_HARD_DOWN,
                                    D_TRANSIENT)
from busbar.reliability.policy import BreakerPolicy


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


class FakeLane:
    name = "lane-a"


DEFAULT_POLICY = BreakerPolicy()
DEFAULT_LIMITS = Limits()


def cell(policy=DEFAULT_POLICY, limits=DEFAULT_LIMITS, slots=None, clock=None, budget=None, seed=1):
    slots = slots or LocalSlots(LANE_SLOTS + CELL_SLOTS)
    clock = clock or Clock()
    lane_state = LaneState(slots, 0, budget)
    return Cell("p", FakeLane(), policy, slots, LANE_SLOTS, limits, clock, random.Random(seed),
                lane_state), clock


def fail(c, n=1, d=D_TRANSIENT, ra=None):
    for _ in range(n):
        c.claim()   # refused once the cell is open; the failure is recorded either way
        c.budget.done(True)
        c.record(d, ra)


def ok(c, n=1):
    for _ in range(n):
        assert c.claim()
        c.budget.done(False)
        c.record(None)


def test_error_rate_trips_at_threshold_with_min_requests():
    pol = BreakerPolicy(mode="error_rate", threshold=0.5, window_secs=30, min_requests=5,
                        base_cooldown_secs=1, max_cooldown_secs=8)
    c, clock = cell(pol)
    ok(c, 3)
    c.record(D_TRANSIENT)            # 1 of 4: not enough outcomes
    assert c.state() == CLOSED
    clock.t += 10                    # past the non-tripping failure's cooldown
    c.record(D_TRANSIENT)            # 2 of 5 < 0.5
    assert c.state() == CLOSED
    clock.t += 10
    c.record(D_TRANSIENT)            # 3 of 6 = 0.5: trips
    assert c.state() == OPEN and not c.usable()


def test_error_rate_window_forgets_old_outcomes():
    pol = BreakerPolicy(threshold=0.5, window_secs=5, min_requests=4, base_cooldown_secs=0.1,
                        max_cooldown_secs=0.5)
    c, clock = cell(pol)
    c.record(D_TRANSIENT)
    c.record(D_TRANSIENT)
    c.record(D_TRANSIENT)
    assert c.state() == CLOSED       # only 3 outcomes
    clock.t += 10                    # the window is empty again
    c.record(D_TRANSIENT)
    assert c.state() == CLOSED


def test_consecutive_trips_at_n_and_success_resets_the_streak():
    pol = BreakerPolicy(mode="consecutive", consecutive_n=3, base_cooldown_secs=1, max_cooldown_secs=4)
    c, clock = cell(pol)
    c.record(D_TRANSIENT)
    c.record(D_TRANSIENT)
    clock.t += 100
    ok(c)
    c.record(D_TRANSIENT)
    c.record(D_TRANSIENT)
    assert c.state() == CLOSED
    c.record(D_ATTEMPT_TIMEOUT)
    assert c.state() == OPEN


def test_a_failure_that_does_not_trip_still_cools_the_cell_down():
    c, clock = cell(BreakerPolicy())
    c.record(D_TRANSIENT)
    assert c.state() == CLOSED and not c.usable()
    # base 15 * 2^1 = 30 s, +-10 %
    assert 27 <= c.cooldown_remaining() <= 33
    clock.t += 34
    assert c.usable() and c.claim()


@pytest.mark.parametrize("streak", [0, 1, 2, 3, 5, 10])
def test_cooldown_is_base_times_two_to_the_streak_capped_with_bounded_jitter(streak):
    pol = BreakerPolicy(base_cooldown_secs=15, max_cooldown_secs=120)
    c, _ = cell(pol)
    target = min(15 * 2 ** streak, 120)
    xs = [c.cooldown(streak) for _ in range(500)]
    assert all(max(target * 0.9, target / 2) <= x <= min(target * 1.1, 120) for x in xs)
    assert max(xs) - min(xs) > 0 or target == 120   # jitter is there


def test_half_open_admits_exactly_one_probe_then_closes_on_success():
    pol = BreakerPolicy(mode="consecutive", consecutive_n=1, base_cooldown_secs=1, max_cooldown_secs=2)
    c, clock = cell(pol)
    c.record(D_TRANSIENT)
    assert c.state() == OPEN
    clock.t += 5
    assert c.usable()                        # due for a probe: reading takes nothing
    assert c.usable()
    assert c.claim()                         # the probe
    assert c.state() == HALF_OPEN
    assert not c.usable() and not c.claim()  # nobody else
    c.budget.done(False)
    c.record(None)
    assert c.state() == CLOSED and c.usable() and c.snapshot()["streak"] == 0


def test_a_failed_probe_opens_again_for_longer():
    pol = BreakerPolicy(mode="consecutive", consecutive_n=1, base_cooldown_secs=1, max_cooldown_secs=100)
    c, clock = cell(pol)
    c.record(D_TRANSIENT)
    first = c.cooldown_remaining()
    clock.t += first + 0.01
    assert c.claim()
    c.record(D_TRANSIENT)
    assert c.state() == OPEN
    assert c.cooldown_remaining() > first * 1.5


def test_one_probe_across_processes():
    """Workers share the cell through cbusbar.shared: of 8 processes racing for the probe slot,
    exactly one wins."""
    from cbusbar.shared import SharedCounters
    slots = SharedCounters(LANE_SLOTS + CELL_SLOTS)
    pol = BreakerPolicy(mode="consecutive", consecutive_n=1, base_cooldown_secs=1, max_cooldown_secs=2)
    clock = Clock()
    c, _ = cell(pol, slots=slots, clock=clock)
    c.record(D_TRANSIENT)
    clock.t += 5
    r, w = os.pipe()
    pids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            won = c.claim()
            os.write(w, b"1" if won else b"0")
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(w)
    got = os.read(r, 64)
    os.close(r)
    assert sorted(got) == sorted(b"10000000")
    assert c.state() == HALF_OPEN


def test_retry_after_is_a_floor_capped_by_the_limit():
    pol = BreakerPolicy(base_cooldown_secs=1, max_cooldown_secs=2)
    c, _ = cell(pol)
    c.record(D_TRANSIENT, retry_after=60)
    assert 59.9 <= c.cooldown_remaining() <= 60
    c2, _ = cell(pol, limits=Limits(max_honored_retry_after_secs=10))
    c2.record(D_TRANSIENT, retry_after=10 ** 6)
    assert 9.9 <= c2.cooldown_remaining() <= 10
    c3, _ = cell(pol)
    c3.record(D_TRANSIENT, retry_after=0)
    assert 1 <= c3.cooldown_remaining() <= 2.2     # the computed cooldown when it is longer


def test_hard_down_is_sticky_until_its_cooldown_and_clears_on_a_good_probe():
    c, clock = cell(BreakerPolicy(base_cooldown_secs=1, max_cooldown_secs=2),
                    limits=Limits(hard_down_cooldown_secs=1800))
    c.record(D_HARD_DOWN)
    assert c.state() == OPEN and c.snapshot()["hard_down"]
    clock.t += 1799
    assert not c.usable()
    ok_before = c.snapshot()["ok"]
    clock.t += 2
    assert c.claim()
    c.record(None)
    assert c.state() == CLOSED and not c.snapshot()["hard_down"] and c.snapshot()["ok"] == ok_before + 1


def test_client_faults_are_counted_without_penalty():
    c, _ = cell(BreakerPolicy(mode="consecutive", consecutive_n=1))
    for _ in range(10):
        c.record(D_CLIENT_FAULT)
    assert c.state() == CLOSED and c.usable() and c.snapshot()["client_fault"] == 10


def test_lifetime_budget_is_taken_on_claim_and_refunded_on_failure():
    c, _ = cell(budget=2)
    assert c.claim() and c.claim()
    assert not c.claim() and not c.usable()
    c.budget.done(True)          # a failed body: refunded
    assert c.usable() and c.claim()
    c.budget.done(False)
    c.budget.done(False)
    assert not c.usable() and c.budget.inflight() == 0


def test_a_probe_answered_with_a_client_error_closes_the_cell():
    pol = BreakerPolicy(mode="consecutive", consecutive_n=1, base_cooldown_secs=1, max_cooldown_secs=2)
    c, clock = cell(pol)
    c.record(D_TRANSIENT)
    clock.t += 5
    assert c.claim() and c.state() == HALF_OPEN
    c.record(D_CLIENT_FAULT)
    assert c.state() == CLOSED and c.usable()
