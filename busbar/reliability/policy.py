"""The reliability settings as validated values (SPEC §4): breaker, failover, on_exhausted, health.

Plain frozen dataclasses with no imports from the rest of busbar, so `busbar/config/schema.py` can
hold them; `busbar/reliability/config.py` reads them from YAML.
"""
from __future__ import annotations

from dataclasses import dataclass

# Error classes of stage 1b (SPEC §4.1) and the `error_map:` values a provider may name.
ERROR_CLASSES: tuple[str, ...] = ("rate_limit", "overloaded", "server_error", "timeout", "auth",
                                  "billing", "client_error", "context_length")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """`breaker:` of a pool. Defaults are the reference's (SPEC §4.2)."""

    # error_rate: trip when errors/total >= threshold over window_secs with >= min_requests
    # outcomes; consecutive: trip at consecutive_n failures in a row.
    mode: str = "error_rate"
    threshold: float = 0.5
    window_secs: float = 30.0
    min_requests: int = 5
    consecutive_n: int = 3
    # Cooldown = min(base * 2^streak, max), +-10 % jitter, so lanes tripped together do not all
    # come back in the same instant (the thundering herd a fixed cooldown would cause).
    base_cooldown_secs: float = 15.0
    max_cooldown_secs: float = 120.0


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    """`failover:` of a pool (SPEC §4.3)."""

    # The whole request's time budget across every hop: the reference's 120 s covers a long
    # non-streaming generation plus a couple of failed hops.
    timeout_secs: float = 120.0
    # Hops after the first attempt: 3 → at most 4 attempts (the reference's default).
    max_hops: int = 3
    # Members never selected through this pool (still reachable directly by model name).
    exclusions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OnExhausted:
    """`on_exhausted:` of a pool: reject | least_bad | {fallback_pool: X} | {queue: {max_ms}}."""

    kind: str = "reject"
    fallback_pool: str | None = None
    queue_max_ms: int | None = None


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """`health:` of a provider: none | dead (probe only tripped lanes) | active (probe all)."""

    mode: str = "none"
    interval_secs: float = 30.0
    timeout_secs: float = 5.0


DEFAULT_BREAKER = BreakerPolicy()
DEFAULT_FAILOVER = FailoverPolicy()
DEFAULT_ON_EXHAUSTED = OnExhausted()
DEFAULT_HEALTH = HealthPolicy()
