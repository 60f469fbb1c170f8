"""What the hooks report on /metrics, over every worker (docs/hooks.md, docs/operations.md):

    busbar_hook_calls_total{hook, outcome}   every message to a hook, by how it ended: a gate's
        abstain | order | restrict | reject | rewrite, its error | timeout (then on_error ran),
        a tap's delivered | error | timeout, and dropped (a tap not sent: too many under way)
    busbar_hook_duration_seconds{hook}       how long a gate took to answer (or to fail)
    busbar_tap_notifications_dropped_total   the taps' dropped, summed: the Rust gateway's
        counter of tap notifications not sent for its in-flight cap

Counters in shared memory like the rest of busbar's metrics (a mapping made before the workers
fork, `prepare`; local memory in one process), with a fixed slot per (hook, outcome): every hook
name is known from the boot config. A hook a reload adds counts under hook="unresolved" (restart to
give it its own series).
"""
from __future__ import annotations

from cbusbar.shared import LocalCounters

OUTCOMES = ("abstain", "order", "restrict", "reject", "rewrite", "error", "timeout", "delivered",
            "dropped")
# A gate on loopback answers in a fraction of a millisecond; one across a network in tens; past a
# second it is a gate nobody should wait for (a hook's timeout_ms cuts it well before).
BUCKETS_S = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
UNRESOLVED = "unresolved"
_PER_HOOK = len(OUTCOMES) + len(BUCKETS_S) + 2      # outcomes, buckets + the rest, the sum (ns)

_prepared = None        # (config, SharedCounters) made by prepare() before the fork


def _names(config) -> tuple:
    return tuple(sorted(config.hooks)) + (UNRESOLVED,)


def prepare(config, workers: int):
    """Before the fork: the counters every worker's HookStats shares (None for one worker)."""
    global _prepared
    if workers <= 1 or not config.hooks:
        _prepared = None
        return None
    from cbusbar.shared import SharedCounters
    _prepared = (config, SharedCounters(len(_names(config)) * _PER_HOOK))
    return _prepared[1]


class HookStats:
    def __init__(self, config):
        self.names = _names(config)
        self.index = {n: i for i, n in enumerate(self.names)}
        shared = _prepared[1] if _prepared is not None and _prepared[0] is config else None
        self.slots = shared if shared is not None else LocalCounters(len(self.names) * _PER_HOOK)
        self.outcome = {o: i for i, o in enumerate(OUTCOMES)}

    def add(self, hook: str, outcome: str, ns: int) -> None:
        base = self.index.get(hook, self.index[UNRESOLVED]) * _PER_HOOK
        self.slots.add(base + self.outcome[outcome], 1)
        if outcome in ("delivered", "dropped") or ns <= 0:
            return          # taps: counted, not timed (nobody waits for them)
        s = ns / 1e9
        b = len(BUCKETS_S)
        for i, le in enumerate(BUCKETS_S):
            if s <= le:
                b = i
                break
        h = base + len(OUTCOMES)
        self.slots.add(h + b, 1)
        self.slots.add(h + len(BUCKETS_S) + 1, ns)

    def prometheus(self) -> bytes:
        """Text format 0.0.4 of the hook series, appended to /metrics (nothing at all for a
        gateway whose config never had a hook)."""
        v = self.slots.values(0, len(self.names) * _PER_HOOK)
        if len(self.names) == 1 and not any(v):
            return b""
        out = ["# HELP busbar_hook_calls_total Messages to each hook, by how they ended.",
               "# TYPE busbar_hook_calls_total counter"]
        for k, name in enumerate(self.names):
            base = k * _PER_HOOK
            for i, o in enumerate(OUTCOMES):
                if v[base + i]:
                    out.append('busbar_hook_calls_total{hook="%s",outcome="%s"} %d'
                               % (_esc(name), o, v[base + i]))
        dropped = OUTCOMES.index("dropped")
        out.append("# HELP busbar_tap_notifications_dropped_total Tap notifications not sent: too "
                   "many under way.")
        out.append("# TYPE busbar_tap_notifications_dropped_total counter")
        out.append("busbar_tap_notifications_dropped_total %d" % sum(
            v[k * _PER_HOOK + dropped] for k in range(len(self.names))))
        out.append("# HELP busbar_hook_duration_seconds How long each gate took to answer (or fail).")
        out.append("# TYPE busbar_hook_duration_seconds histogram")
        for k, name in enumerate(self.names):
            h = k * _PER_HOOK + len(OUTCOMES)
            counts = v[h:h + len(BUCKETS_S) + 1]
            total = sum(counts)
            if not total:
                continue
            cum = 0
            lab = 'hook="%s"' % _esc(name)
            for i, le in enumerate(BUCKETS_S):
                cum += counts[i]
                out.append('busbar_hook_duration_seconds_bucket{%s,le="%s"} %d' % (lab, repr(le), cum))
            out.append('busbar_hook_duration_seconds_bucket{%s,le="+Inf"} %d' % (lab, total))
            out.append("busbar_hook_duration_seconds_sum{%s} %.9f" % (lab, v[h + len(BUCKETS_S) + 1] / 1e9))
            out.append("busbar_hook_duration_seconds_count{%s} %d" % (lab, total))
        return ("\n".join(out) + "\n").encode()


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
