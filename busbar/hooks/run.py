"""When a pool's hooks fire, and what their answers change (docs/hooks.md).

A request to a pool with hooks, once admitted, goes through `HookRun` before its first attempt:

1. request stage: the `prompt: rw` gates one after another in `priority` order (each sees the
   last one's rewrite), op `transform`: reject > rewrite > abstain. A rewrite replaces the
   conversation's messages and the body is written again in the caller's own protocol, so the
   routing decision, every lane and every failover hop see it. Then the request-stage taps.
2. candidate stage: every other gate at once, op `decide`, against the same candidates; when all
   have answered (or timed out) the answers reconcile in `priority` order (ties: `pools.hooks`
   first, then the pool's own, each as written): any reject wins (the first one's status and
   message); restricts intersect, and one that leaves no lane applies its `on_empty`; the last
   order wins, kept to the lanes left. Added latency is the slowest gate's, not the sum. Then
   the candidate-stage taps.
3. routing stage: a tap per attempt (which lane, which attempt, why the last one failed).
4. response stage: a tap with the outcome (ok, failed, rejected_by_gate, rejected_by_auth).

A gate that times out, cannot be reached, answers a non-2xx status or something that is not a
reply follows its `on_error`: `nothing`/`weighted` (it does not take part), `first` (member
order), `reject` (503, fail closed), or `{hook: name}`: that hook fires in its place with its own
grants and deadline, and its own on_error continues the chain (a ranking strategy at the end of a
chain orders by that strategy). Taps fire and forget: the request never waits for one; at most
`TAPS_INFLIGHT_MAX` per worker are under way, and past that they are dropped (and counted).
"""
from __future__ import annotations

import logging
import os

from cbusbar import ir
from cbusbar.clock import now_ns
from cbusbar.framing import scan_top

from busbar.engine.records import O_CLIENT_ERROR, O_EXHAUSTED, O_OK
from busbar.hooks import wire
from busbar.hooks.config import STRATEGIES
from busbar.hooks.sidecar import T_TIMEOUT, Call
from busbar.routing.plan import Run, usage_headroom

log = logging.getLogger("busbar.hooks")

# Tap messages under way in one worker. A tap never delays a request, so under a sidecar that
# stalls its messages would pile up: past this many the next ones are dropped (and counted in
# busbar_hook_calls_total{outcome="dropped"}). 1024 is seconds of a busy worker's requests with
# one response tap each at loopback speed, and bounds what a stalled sidecar holds (a connection
# and a ~2 KiB message each).
TAPS_INFLIGHT_MAX = 1024

# A gate that keeps failing is logged once per this many seconds (busbar_hook_calls_total counts
# every failure): a dead sidecar under load must not turn into a log line per request.
WARN_EVERY_SECS = 10.0

# What the caller is told when a gate that must answer could not (on_error: reject), and when a
# restrict left no lane (on_empty: reject): the Rust gateway's words, as a 503 overloaded.
GATE_FAILED = "A required gate could not complete. Please retry shortly."
RESTRICT_EMPTY = "No upstream satisfies a required gate's restriction. Please retry shortly."

# Request ids on the wire are integers (the Rust gateway's u64 join key between a decision and
# its response tap): a per-worker random prefix and a counter, never repeated across workers.
_ID_PREFIX = (int.from_bytes(os.urandom(3), "little") & 0x7FFFFF) << 40
_id_counter = [0]


def _request_id() -> int:
    _id_counter[0] += 1
    return _ID_PREFIX | (_id_counter[0] & 0xFFFFFFFFFF)


class HookPlan:
    """One pool's hooks for one snapshot: the rewrite gates and the decision gates, each in
    reconcile order, and the taps of each stage."""

    __slots__ = ("pool", "plan", "rewrites", "gates", "taps", "defs")

    def __init__(self, pool, plan, hooks, defs):
        self.pool = pool
        self.plan = plan
        self.defs = defs
        # A stable sort keeps, within one priority, pools.hooks first and then the pool's own.
        self.rewrites = tuple(sorted((h for h in hooks if h.rewrites), key=lambda h: h.priority))
        self.gates = tuple(sorted((h for h in hooks if h.gate and not h.rewrites),
                                  key=lambda h: h.priority))
        self.taps = {phase: tuple(h for h in hooks if not h.gate and phase in h.phases)
                     for phase in ("request", "candidate", "routing", "response")}

    @classmethod
    def of(cls, config, pool, plan):
        hooks = [config.hooks[n] for n in pool.hooks if n not in STRATEGIES and n in config.hooks]
        if not hooks:
            return None
        return cls(pool.name, plan, hooks, config.hooks)

    def start(self, ex):
        """The hooks of `ex` (its pool has this plan): admission first, then the hook run."""
        run = HookRun(ex.snap.routing.hooks, self, ex)
        gov = ex.snap.governance
        if ex.principal is not None:
            ex.site.gate.admit(ex, gov, run.begin)
            return
        run.begin()

    def denied(self, ex):
        """The response taps of a request refused before its hooks ran: its key (outcome
        rejected_by_auth), or its admission (a limit, the pool's ACL: failed)."""
        taps = self.taps["response"]
        if not taps:
            return
        runner = ex.snap.routing.hooks
        shape = wire.Shape(_request_id(), self.pool, ex.proto, None, ex.stream, {})
        stage = {"at": "response", "outcome": "rejected_by_auth" if ex.denied == "auth" else
                 "failed", "status": ex.client_status}
        for h in taps:
            if not h.groups:
                runner.notify(h, wire.envelope(wire.OP_NOTIFY, shape.request(h), [], stage))


class HookRun:
    """One request's way through its pool's hooks (the module docstring)."""

    __slots__ = ("runner", "plan", "ex", "shape", "req", "groups", "outcomes", "pending",
                 "t_start", "ns", "summary", "rejected", "cands")

    def __init__(self, runner, plan, ex):
        self.runner = runner
        self.plan = plan
        self.ex = ex
        self.shape = None
        self.req = None
        self.groups = None
        self.outcomes = None
        self.pending = 0
        self.t_start = 0
        self.ns = 0             # the time the request waited for its gates
        self.summary = []       # (hook, outcome) of every gate: the access log's `hooks`
        self.rejected = False
        self.cands = None

    # ------------------------------------------------------------------ scope
    def applies(self, h) -> bool:
        if not h.groups:
            return True
        if self.groups is None:
            self.groups = _ancestry(self.ex)
        return any(g in self.groups for g in h.groups)

    def candidates(self) -> list:
        """The candidate projection: the pool's members that may still serve the request."""
        if self.cands is None:
            ex = self.ex
            p = self.plan.plan
            target = p.target
            out = []
            hr = self._headroom() if ex.principal is not None else None
            for i, lane in enumerate(target.lanes):
                if lane in ex.tried or lane in target.excluded:
                    continue
                m = lane.model
                c = {"idx": i, "model": lane.name, "provider": m.provider.name,
                     "weight": target.weights[i]}
                cm = target.cells[i].context_max if target.cells is not None else None
                if cm is not None:
                    c["context_max"] = cm
                if p.tier_names[i] is not None:
                    c["tier"] = p.tier_names[i]
                if p.cost[i] is not None:
                    c["cost_per_mtok"] = p.cost[i]
                lat = p.signals.latency_ms(lane)
                if lat is not None:
                    c["latency_ms"] = lat
                c["available_concurrency"] = p.available(i, lane)
                left = p.budget_left(i)
                if left is not None:
                    c["budget_remaining"] = left
                if hr is not None:
                    c["rate_headroom"] = hr
                if p.tags[i]:
                    c["tags"] = list(p.tags[i])
                out.append(c)
            self.cands = out
        return self.cands

    def _headroom(self):
        return usage_headroom(self.ex, self.plan.pool)

    # ------------------------------------------------------------------ 1. request stage
    def begin(self):
        ex = self.ex
        r = ex.routing
        if r is None:
            r = ex.routing = Run(self.plan.plan)
        r.hooks = self
        self.t_start = now_ns()
        req = None
        if ex.op is None:
            try:
                req = ex.ingress.read_request(ex.req.body)
            except ir.CodecError:
                req = None      # the lane's codec will say what is wrong with it
        self.req = req
        self.shape = wire.Shape(_request_id(), self.plan.pool, ex.proto, req, ex.stream,
                                wire.user_of(ex.principal, req))
        self._rewrite(0)

    def _rewrite(self, k):
        rws = self.plan.rewrites
        while k < len(rws) and not self.applies(rws[k]):
            k += 1
        if k >= len(rws) or self.req is None:
            self._request_taps()
            self._decide()
            return
        h = rws[k]
        self._call(h, wire.OP_TRANSFORM, lambda out: self._rewritten(k, out))

    def _rewritten(self, k, out):
        ex = self.ex
        if ex.closed:
            return
        kind = out[0]
        if kind == "reject":
            self._reject(out[1], out[2])
            return
        if kind == "error":
            self._gate_failed()
            return
        if kind == "rewrite":
            self._apply(*out[1])
        self._rewrite(k + 1)

    def _written(self, messages):
        """A rewrite's new body: the conversation's messages replaced, the request written again by
        the caller's own codec (the system prompt stays; so do the request's parameters), and read
        back as the later hooks will see it. Raises ir.CodecError when the caller's protocol cannot
        carry it (a malformed rewrite: the gate's on_error decides)."""
        ex = self.ex
        req = self.req
        kept = req.messages
        req.messages = messages
        try:
            body = ex.ingress.write_request(req)
        finally:
            req.messages = kept
        return body, ex.ingress.read_request(body)

    def _apply(self, body, req):
        ex = self.ex
        ex.req.body = body
        ex.spans = scan_top(body, ex.ingress.SCAN_KEYS)
        ex.model_span = ex.spans.get(b"model")
        ex.cr = None
        self.req = req
        self.shape = wire.Shape(self.shape.request_id, self.plan.pool, ex.proto, req, ex.stream,
                                self.shape.user)

    def _request_taps(self):
        self._taps("request", None, [])

    # ------------------------------------------------------------------ 2. candidate stage
    def _decide(self):
        gates = [h for h in self.plan.gates if self.applies(h)]
        if not gates:
            self._routed()
            return
        self.outcomes = [None] * len(gates)
        self.pending = len(gates)
        for k, h in enumerate(gates):
            self._call(h, wire.OP_DECIDE, lambda out, k=k, h=h: self._decided(k, h, out))

    def _decided(self, k, h, out):
        self.outcomes[k] = (h, out)
        self.pending -= 1
        if self.pending == 0 and not self.ex.closed:
            self._reconcile()

    def _reconcile(self):
        ex = self.ex
        outs = self.outcomes
        self.outcomes = None
        for _h, out in outs:
            if out[0] == "reject":
                self._reject(out[1], out[2])
                return
            if out[0] == "error":
                self._gate_failed()
                return
        target = self.plan.plan.target
        pool_tags = self.plan.plan.tags
        allowed = None
        restricts = []
        for h, out in outs:
            if out[0] != "restrict":
                continue
            tags = frozenset(out[1])
            restricts.append((tags, h.on_empty))
            base = allowed if allowed is not None else frozenset(
                lane for lane in target.lanes if lane not in ex.tried)
            narrowed = frozenset(lane for i, lane in enumerate(target.lanes)
                                 if lane in base and tags.intersection(pool_tags[i]))
            if not narrowed:
                if h.on_empty == "weighted":
                    continue        # an advisory restrict: this one is skipped
                self._answer(503, "overloaded", RESTRICT_EMPTY, O_EXHAUSTED)
                return
            allowed = narrowed
        order = None
        for _h, out in outs:
            if out[0] == "order":
                kept = [i for i in out[1] if allowed is None or target.lanes[i] in allowed]
                order = kept or None
        r = ex.routing
        r.restricts = tuple(restricts)
        r.order = order
        r.allowed_in(ex, target)        # the lanes restricted out are never tried
        self._routed()

    def _routed(self):
        self.ns = now_ns() - self.t_start
        ex = self.ex
        taps = self.plan.taps["candidate"]
        if taps:
            cands = self.candidates()
            allowed = ex.routing.allowed_in(ex, self.plan.plan.target)
            n = len(cands) if allowed is None else sum(
                1 for c in cands if self.plan.plan.target.lanes[c["idx"]] in allowed)
            self._taps("candidate", {"at": "candidate", "remaining_candidates": n}, [])
        ex.attempt()

    def decisions(self):
        """The gates' answers for the access log, "name:outcome,..." in the order they came
        (an error is followed by its fallback's answer); None when no gate fired."""
        return ",".join("%s:%s" % d for d in self.summary) if self.summary else None

    # ------------------------------------------------------------------ 3, 4: later stages
    def routing(self, ex, lane):
        """An attempt is about to go to `lane` (Exchange.attempt)."""
        taps = self.plan.taps["routing"]
        if not taps:
            return
        target = ex.target
        stage = {"at": "routing", "model": lane.name, "attempt_number": len(ex.attempts) + 1,
                 "remaining_candidates": sum(1 for x in target.lanes
                                             if x not in ex.tried and x not in target.excluded)}
        atts = ex.attempts
        if atts and atts[-1].fault is not None:
            # The Rust gateway's words: connect (no connection), else the failure's disposition
            # (transient_upstream, attempt_timeout, hard_down, context_length).
            a = atts[-1]
            stage["previous_failure"] = "connect" if a.fault == "connect" else (
                a.disposition or a.fault)
        self._taps("routing", stage, [])

    def response(self, ex, outcome):
        """The request ended (Exchange.finish)."""
        if not self.plan.taps["response"] or self.shape is None:
            return
        word = "ok" if outcome == O_OK else "rejected_by_gate" if self.rejected else "failed"
        self._taps("response", {"at": "response", "outcome": word,
                                "status": ex.client_status}, [])

    # ------------------------------------------------------------------ answers
    def _reject(self, status, message):
        self.rejected = True
        self.ns = now_ns() - self.t_start
        self._answer(status, ir.kind_of_status(status), message, O_CLIENT_ERROR)

    def _gate_failed(self):
        self.rejected = True
        self._answer(503, "overloaded", GATE_FAILED, O_EXHAUSTED)

    def _answer(self, status, kind, message, outcome):
        self.ns = now_ns() - self.t_start
        ex = self.ex
        if not ex.closed:
            ex.error(status, kind, message, retry_after=1 if status == 503 else None,
                     outcome=outcome)

    # ------------------------------------------------------------------ sending
    def _taps(self, phase, stage, cands):
        runner = self.runner
        for h in self.plan.taps[phase]:
            if self.applies(h):
                runner.notify(h, wire.envelope(wire.OP_NOTIFY, self.shape.request(h), cands, stage))

    def _call(self, h, op, then, chain=None):
        """Sends `op` to gate `h`; `then(outcome)` gets ("reject", status, message) |
        ("restrict", tags) | ("order", [idx]) | ("rewrite", messages) | ("abstain",) |
        ("error",) (on_error: reject at the end of the chain), after on_error ran its course."""
        cands = self.candidates() if op == wire.OP_DECIDE else []
        body = wire.envelope(op, self.shape.request(h), cands)
        runner = self.runner

        def done(reply, error, call):
            try:
                self._answered(h, op, then, chain, reply, error, call.elapsed_ns())
            except Exception as e:      # busbar's own bug costs this request (a 500), not a hang
                self.ex.crash(e)

        runner.call(h, body, h.deadline_ms() / 1000.0, done)

    def _answered(self, h, op, then, chain, reply, error, ns):
        runner = self.runner
        if error is None:
            try:
                out = wire.decision(reply, len(self.plan.plan.target.lanes)) \
                    if op == wire.OP_DECIDE else wire.transformed(reply)
                if out[0] == "rewrite":
                    if h.prompt != "rw":
                        out = ("abstain",)      # a rewrite is honoured for prompt: rw only
                    else:
                        out = ("rewrite", self._written(out[1]))
            except ValueError as e:             # ir.CodecError included
                error = ("error", str(e))
        if error is not None:
            runner.count(h, error[0] if error[0] == T_TIMEOUT else "error", ns)
            runner.warn(h, "hook %s (%s) failed: %s; on_error: %s" % (
                h.name, op, error[1], h.fallback or h.on_error))
            self._on_error(h, op, then, chain)
            return
        runner.count(h, out[0], ns)
        self.summary.append((h.name, out[0]))
        then(out)

    def _on_error(self, h, op, then, chain):
        """A gate could not answer: its on_error, followed down the chain."""
        self.summary.append((h.name, "error"))
        if h.fallback is None:
            if h.on_error == "reject":
                then(("error",))
            elif h.on_error == "first" and op == wire.OP_DECIDE:
                then(("order", [c["idx"] for c in self.candidates()]))
            else:
                then(("abstain",))
            return
        name = h.fallback
        if name in STRATEGIES:
            # A ranking strategy cannot fail: it orders the candidates itself.
            then(self._strategy_order(name) if op == wire.OP_DECIDE else ("abstain",))
            return
        chain = (chain or ()) + (h.name,)
        nxt = self.plan.defs.get(name)
        if nxt is None or name in chain:        # refused at boot; a reload cannot bring one back
            then(("abstain",))
            return
        self._call(nxt, op, then, chain)

    def _strategy_order(self, name):
        plan = self.plan.plan
        target = plan.target
        headroom = self._headroom() if name == "usage" else None
        saved = plan.strategy
        keyed = []
        for c in self.candidates():
            i = c["idx"]
            plan.strategy = name
            try:
                k = plan.key(i, target.lanes[i], headroom)
            finally:
                plan.strategy = saved
            keyed.append((k, i))
        if all(k is None for k, _ in keyed):
            return ("abstain",)
        keyed.sort(key=lambda t: (t[0] is None, t[0] if t[0] is not None else 0, t[1]))
        return ("order", [i for _, i in keyed])


def _ancestry(ex) -> frozenset:
    """The caller's group and every ancestor (a hook's `groups:` matches any of them)."""
    key = ex.principal
    group = key.group if key is not None else None
    if group is None:
        return frozenset()
    gov = ex.snap.governance
    groups = gov.groups if gov is not None else {}
    gate = ex.site.gate
    directory = gate.directory if gate is not None else None
    out = []
    name = group
    while name is not None and name not in out and len(out) < 16:
        out.append(name)
        g = groups.get(name)
        if g is None and directory is not None and not directory.remote:
            g = directory.group(name)
        name = g.parent if g is not None else None
    return frozenset(out)


class HookRunner:
    """One worker's side of its hooks: the sidecar calls on the worker's upstream pool, the taps
    under way, and the counts busbar_hook_* report (busbar/hooks/stats.py)."""

    def __init__(self, site, stats=None, clock=None):
        self.site = site
        self.stats = stats
        self.taps_inflight = 0
        self.clock = clock or site.loop.time
        self.warned = {}        # hook name -> (when its last warning was logged, failures since)

    def call(self, h, body, timeout_s, done):
        holder = []

        def finished(reply, error):
            done(reply, error, holder[0])

        holder.append(Call(self.site, h.sidecar, body, timeout_s, finished))

    def notify(self, h, body):
        if self.taps_inflight >= TAPS_INFLIGHT_MAX:
            self.count(h, "dropped", 0)
            return
        self.taps_inflight += 1

        def finished(reply, error):
            self.taps_inflight -= 1
            self.count(h, "delivered" if error is None else error[0] if error[0] == T_TIMEOUT
                       else "error", 0)

        Call(self.site, h.sidecar, body, h.sidecar_timeout_ms / 1000.0, finished, parse=False)

    def warn(self, h, message):
        """A gate's failure, logged at most once per hook every WARN_EVERY_SECS (a dead sidecar
        under load fails every request; the metrics count each one)."""
        now = self.clock()
        last, n = self.warned.get(h.name, (None, 0))
        if last is not None and now - last < WARN_EVERY_SECS:
            self.warned[h.name] = (last, n + 1)
            return
        self.warned[h.name] = (now, 0)
        log.warning("%s%s", message, " (and %d more since the last warning)" % n if n else "")

    def count(self, h, outcome, ns):
        if self.stats is not None:
            self.stats.add(h.name, outcome, ns)
