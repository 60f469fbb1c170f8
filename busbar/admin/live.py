"""Live config: validate, reload, apply and rollback, swapped in every worker before the call
returns (SPEC §2.4).

The parent process (worker 0, which also runs the admin listener) builds and validates the new
Config once, then sends it, pickled, to every other worker over its control channel
(busbar/admin/plane.py) and waits for each acknowledgement; then it swaps its own snapshot and
answers. A worker swaps `gw.snapshot` between two callbacks of its event loop: a request captures
the snapshot when it starts (busbar/engine/snapshot.py), so a request in flight finishes on the
config it started with and a new one sees the new config whole. The data plane does no per-request
check at all: the swap is pushed, not polled.

Lanes whose model (and provider) config did not change are carried into the new Router as the same
Lane objects, and providers whose config did not change keep their Egress objects (and with them
refreshed credentials), so state lives on by identity. Lane permits shared between workers live in
slots of one shared mapping; the parent assigns slots (a surviving lane keeps its own, a new lane
takes a free one) and sends the assignment with the config, so every worker agrees. The same goes
for the breaker cells' and lane budgets' blocks (busbar/reliability/state.py `plan`) and the metric
series (busbar/observability/metrics.py `Layout.plan`) of pools and models a reload adds: assigned
once by the parent, sent with the swap.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

import orjson

from busbar import observability
from busbar.config import ConfigError
from busbar.config.control import Control, restart_required
from busbar.config.loader import build
from busbar.engine.egress import Egress
from busbar.engine.snapshot import Snapshot
from busbar.observability.events import event
from busbar.routing import Lane, Router
from busbar.server.channel import broadcast

log = logging.getLogger("busbar.admin")

# How many past configs GET config/versions lists and rollback can reach (SPEC §6: versions are
# paginated at 100; a gateway's history past that is the config repository's job).
MAX_VERSIONS = 100
# A worker acknowledges a swap within this or the call fails: building a snapshot takes
# milliseconds, a first credential fetch for a new provider up to 10 s (refresh.INITIAL_TIMEOUT).
ACK_TIMEOUT_SECS = 15.0


class NoSlot(Exception):
    pass


def assign_slots(router, config, shared, limit=None) -> dict:
    """Shared permit slot per model: a surviving lane keeps its slot; a new lane takes a slot no
    current lane uses and that no request holds (its counter is 0), below `limit` (where the
    reliability blocks begin: busbar/reliability/state.py)."""
    if shared is None:
        return {}
    if limit is None:
        limit = shared.size
    slots = {}
    for name, model in config.models.items():
        lane = router.lanes.get(name)
        if lane is not None and lane.model == model:
            slots[name] = lane._slot
    used = set(slots.values())
    free = (i for i in range(shared.size if limit is None else limit)
            if i not in used and shared.value(i) == 0)
    for name in sorted(config.models):
        if name not in slots:
            slot = next(free, None)
            if slot is None:
                raise NoSlot("no free shared permit slot for model '%s' (restart to grow the table)" % name)
            slots[name] = slot
    return slots


def next_snapshot(old: Snapshot, config, version: int, shared, slots: dict):
    """The snapshot for `config`, reusing `old`'s surviving Lane and Egress objects; also returns
    the new Egress objects (their credentials must be started before the swap)."""
    lanes = {}
    for name, model in config.models.items():
        lane = old.router.lanes.get(name)
        if lane is None or lane.model != model:
            lane = Lane(model, shared, slots.get(name, -1))
        lanes[name] = lane
    egress = {}
    fresh = []
    for name, p in config.providers.items():
        eg = old.egress.get(name)
        if eg is None or eg.provider != p:
            eg = Egress(p)
            fresh.append(eg)
        egress[name] = eg
    router = Router(config, shared, lanes=lanes)
    return Snapshot(config, shared, version, router=router, egress=egress), fresh


async def swap_in_worker(gw, config, version, slots, plans=None):
    """Runs in every worker (the parent included): build, start new credentials, give the new
    targets their breaker cells and the new names their metric slots (where the parent's `plans`
    put them), swap, then stop refreshing credentials no provider of the config uses."""
    plans = plans or {}
    snap, fresh = next_snapshot(gw.snapshot, config, version, gw.shared, slots)
    if any(eg.source is not None for eg in fresh):
        from busbar.upstream.refresh import start_credentials
        r = await start_credentials(gw.loop, fresh)
        gw.live_refreshers = gw.live_refreshers + [r]
    # reliability: the new targets get their cells (blocks the parent assigned, the same in every
    # worker) before any request can see them.
    gw.reliability.attach(snap, plans.get("reliability"))
    # strategies, tiers, affinity, hooks (busbar/routing/plan.py): the worker's one RoutingState
    gw.snapshot.routing.attach(snap, gw)
    observability.adopt(gw, plans.get("metrics"))
    gw.snapshot = snap
    if gw.prober is not None:
        gw.prober.config_changed()     # health probing turned on by this config: the ticks start
    stop_unused_refreshers(gw)


def stop_unused_refreshers(gw) -> int:
    """Cancels the credential refresh of every Egress the current snapshot no longer has (its
    provider was removed or changed by a reload); returns how many stopped. Requests still in
    flight on the old snapshot keep the credentials already applied."""
    live = set(map(id, gw.snapshot.egress.values()))
    stopped = 0
    refreshers = [gw.credentials] if gw.credentials is not None else []
    for r in refreshers + gw.live_refreshers:
        stopped += r.retain(live)
    gw.live_refreshers = [r for r in gw.live_refreshers if r.tasks]
    return stopped


class Version:
    """One entry of the config history (GET config/versions): the document it served, who made it
    and why."""

    __slots__ = ("version", "ts", "principal", "summary", "document", "restart_required")

    def __init__(self, version, principal, summary, document, restart=()):
        self.version = version
        self.ts = int(time.time())
        self.principal = principal
        self.summary = summary
        self.document = document
        self.restart_required = list(restart)

    def meta(self):
        return {"version": self.version, "ts": self.ts, "principal": self.principal,
                "summary": self.summary}


class LiveConfig:
    """The parent's view of the config history and the one place a swap is started from. The
    config version (`current`) is the Rust gateway's: 0 at boot, +1 per change, process-local; the
    config plane's ETag is it, quoted."""

    def __init__(self, gw, path, workers):
        self.gw = gw
        self.path = path                    # the config file reload re-reads (None: embedded)
        self.base_dir = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
        self.workers = workers              # [(pid, socket)] of the other workers
        self.lock = asyncio.Lock()
        cfg = gw.snapshot.config
        self.current = 0
        self.versions = [Version(0, "system", "boot", cfg.document)]
        self.started = time.time()
        self.on_swap = []                   # called with the new Config after every swap
        self.trips = None                   # busbar/admin/views.py TripClock (GET pools)

    @property
    def control(self) -> Control:
        return self.gw.snapshot.config.control or Control()

    @property
    def etag(self) -> bytes:
        return b'"%d"' % self.current

    def version(self, v):
        for ver in self.versions:
            if ver.version == v:
                return ver
        return None

    def record(self, principal, summary, document=None, restart=()) -> int:
        """A new config version for a change that did not swap the snapshot (a governance change:
        groups), so every config-plane mutation moves the ETag."""
        self.current += 1
        self.versions.append(Version(self.current, principal, summary,
                                     document if document is not None
                                     else self.gw.snapshot.config.document, restart))
        del self.versions[:-MAX_VERSIONS]
        return self.current

    # ---------------------------------------------------------------- building
    def build_text(self, text: str, providers: dict | None = None):
        """Validates a config given as YAML or JSON text (and, when given, a providers.yaml
        catalog as a document): (config, problems, warnings)."""
        if providers is None:
            config, out = build(text=text, base_dir=self.base_dir, overlay=False)
            return config, out.errors, out.warnings
        import json
        import tempfile
        fd, cat = tempfile.mkstemp(prefix="busbar-catalog-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(providers, fh)
            doc = orjson.loads(text)
            doc["providers_file"] = cat
            config, out = build(text=orjson.dumps(doc).decode(), base_dir=self.base_dir,
                                overlay=False)
        finally:
            os.unlink(cat)
        if config is not None and config.document is not None:
            config.document.pop("providers_file", None)
        return config, out.errors, out.warnings

    def _apply_doc(self, doc: dict) -> str:
        # The running file owns `config:` (where overlays go, locked): an applied body cannot
        # move or unlock it.
        doc = dict(doc)
        own = (self.gw.snapshot.config.document or {}).get("config")
        doc.pop("config", None)
        if own is not None:
            doc["config"] = own
        return orjson.dumps(doc).decode()

    # ---------------------------------------------------------------- operations
    async def reload(self, principal="system"):
        if self.path is None:
            raise ConfigError(["config: this gateway runs an embedded config (--demo); there is "
                               "no file to reload"])
        config, out = build(self.path)
        if config is None:
            raise ConfigError(out.errors, out.warnings)
        return await self.swap(config, principal, "config.reload (from disk)")

    async def apply(self, doc: dict, providers=None, principal="system", summary="config.apply (request body)"):
        """A whole config from the body: live until the next reload or restart (config.yaml is
        the source of truth; the overlay holds only what the named admin calls change)."""
        if self.control.locked:
            raise Locked()
        config, errors, warnings = self.build_text(self._apply_doc(doc), providers)
        if config is None:
            raise ConfigError(errors, warnings)
        return await self.swap(config, principal, summary)

    async def rollback(self, version: int, principal="system"):
        if self.control.locked:
            raise Locked()
        v = self.version(version)
        if v is None:
            raise KeyError(version)
        config, errors, warnings = self.build_text(self._apply_doc(v.document))
        if config is None:
            raise ConfigError(errors, warnings)
        return await self.swap(config, principal, "config.rollback to v%d" % version)

    async def mutate_overlay(self, mutate, principal, summary, stored_if_restart=False):
        """A change to the overlay (settings, hooks, identity providers, exporters, a section
        reset): the new overlay is written, config.yaml re-read with it, validated and swapped in
        every worker. Refused on a locked config or one without files; an invalid result puts
        the old overlay back and changes nothing. `mutate(overlay) -> overlay or None` (None: no
        change, nothing is written or swapped). `stored_if_restart`: a valid change this process
        cannot take live (it turns governance on) stays stored for the next start, and the result
        says `needs_restart`. Returns (swap result or None, new overlay)."""
        from busbar.admin import overlay as fmt
        ctl = self.control
        if ctl.locked:
            raise Locked()
        if self.path is None:
            raise NoFiles()
        path = ctl.overlay
        if path is None:
            raise ConfigError(["config.overlay: this config has no overlay to persist API "
                               "changes in (config.overlay: false)"])
        async with self.lock:
            old = fmt.read(path)
            new = mutate(old)
            if new is None:
                return None, old
            previous = None
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    previous = fh.read()
            fmt.write(path, new)
            config, out = build(self.path, overlay_strict=True)
            if config is None:
                _restore(path, previous)
                raise ConfigError(out.errors, out.warnings)
        try:
            return await self.swap(config, principal, summary), new
        except NeedsRestart as e:
            if not stored_if_restart:
                _restore(path, previous)
                raise
            return {"needs_restart": e.problems[0]}, new
        except BaseException:
            _restore(path, previous)
            raise

    async def persist_overlay(self, mutate) -> bool:
        """A change to an overlay section that is not part of the config document (the API groups
        the governance store serves: busbar/governance/overlay_groups.py): the file is rewritten,
        nothing is rebuilt or swapped. False when there is nothing to persist in: a config without
        files, `config.overlay: false`, or a locked config (whose API groups live in the store
        alone: docs/kubernetes.md). OverlayError when the file cannot be read (it is not
        overwritten)."""
        from busbar.admin import overlay as fmt
        ctl = self.control
        path = ctl.overlay
        if ctl.locked or path is None or self.path is None:
            return False
        async with self.lock:
            fmt.write(path, mutate(fmt.read(path)))
        return True

    async def swap(self, config, principal: str, summary: str) -> dict:
        """Every worker on `config` before this returns; serialized, so two admin calls never
        interleave their swaps."""
        async with self.lock:
            gw = self.gw
            if config.governance is not None and gw.gate is None:
                raise NeedsRestart(["auth: governance (auth.chain, groups, rate_card, store) was "
                                    "off when busbar started; restart busbar to turn it on"])
            old = gw.snapshot
            version = self.current + 1
            rel = gw.reliability
            slots = assign_slots(old.router, config, gw.shared,
                                 rel.offset if rel.slots is gw.shared else None)
            # Where breaker cells, lane and pool blocks and new metric series go, decided here
            # once so every worker puts them in the same slots.
            plans = {"metrics": observability.plan(gw, config)}
            from busbar.reliability.state import NoRoom
            try:
                plans["reliability"] = rel.plan(config, old.router)
            except NoRoom as e:
                raise NoSlot(str(e)) from None
            t0 = time.perf_counter()
            failed = await broadcast(
                gw.loop, self.workers, {"op": "swap", "version": version, "config": config,
                                        "slots": slots, "plans": plans}, ACK_TIMEOUT_SECS,
                lambda ack: ack.get("version") == version)
            await swap_in_worker(gw, config, version, slots, plans)
            ms = (time.perf_counter() - t0) * 1000
            for f in self.on_swap:
                f(config)
            restart = restart_required(old.config.document, config.document)
            self.current = version
            self.versions.append(Version(version, principal, summary, config.document, restart))
            del self.versions[:-MAX_VERSIONS]
            what, _, to = summary.partition(" to v")
            event(logging.WARNING if failed else logging.INFO, "reload", version=version,
                  kind=_kind(what), **({"rollback_to": to} if to else {}),
                  workers=1 + len(self.workers) - len(failed), workers_failed=len(failed),
                  swap_ms="%.1f" % ms, restart_required=",".join(restart) or "none")
            if failed:
                raise WorkersFailed(version, failed)
            return {"version": version, "workers": 1 + len(self.workers),
                    "swap_ms": round(ms, 3), "restart_required": restart,
                    "warnings": list(config.warnings)}


def _kind(summary: str) -> str:
    """The `reload` event's kind: reload, apply or rollback for the config calls, else the
    change (hook.register, config.settings, identity-providers.put, ...)."""
    first = summary.split()[0]
    return first[len("config."):] if first in ("config.reload", "config.apply",
                                                "config.rollback") else first


def _restore(path, previous):
    """Puts the overlay file back as it was (bytes as they were; absent if it was absent)."""
    if previous is None:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    tmp = path + ".restore"
    with open(tmp, "wb") as fh:
        fh.write(previous)
    os.replace(tmp, path)


class NoFiles(Exception):
    pass


class NeedsRestart(ConfigError):
    """A valid config this process cannot swap in: it needs a start (governance turned on)."""


class Locked(Exception):
    pass


class WorkersFailed(Exception):
    def __init__(self, version, pids):
        super().__init__("config version %d: worker(s) %s did not acknowledge the swap" % (
            version, ", ".join(map(str, pids))))
