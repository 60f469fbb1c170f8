"""The gateway's processes: binding the listen address, forking the workers, signals, draining.

`serve()` runs N worker processes (default: one per core). On Linux each binds the listen address
with SO_REUSEPORT, so the kernel spreads connections across them; where SO_REUSEPORT does not
balance (macOS) the workers accept on the one socket bound before the fork; on the standard
library's loop (Windows) busbar runs one process (busbar/server/runtime.py: the table, and the
BUSBAR_LOOP / BUSBAR_LISTENER switches that run those paths on Linux too). SIGTERM/SIGINT (and
Ctrl+Break on Windows) stop accepting, let in-flight requests finish (bounded by
limits.drain_timeout_secs), then exit 0. This is the composition root:
it wires the data plane (busbar/server/gateway.py), the control plane (busbar/admin/plane.py),
governance (busbar/governance/plane.py) and observability into each worker; nothing imports it but
the command line.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys

from busbar import observability
from busbar.engine.translate import CODECS
from busbar.server import runtime
from busbar.server.gateway import Gateway
from busbar.server.listen import bind

log = logging.getLogger("busbar")


# Allocations from this size up get their own mapping, returned to the system when freed. 128 KiB
# is glibc's own initial value; fixing it turns off glibc's adaptive threshold, which after the
# first large free (a 31 MB request body) raises itself to that size (up to 32 MiB), so later large
# bodies come from the heap, and a heap whose top is in use cannot shrink: measured, six 31-33 MB
# requests left a worker at 93 MiB RSS for good, against 32 MiB (baseline 30) with the threshold
# fixed. Small requests never allocate that much, so the hot path does not change.
MMAP_THRESHOLD = 128 * 1024


_threshold_set = False


def _return_large_allocations():
    """Once per process tree: set before the fork, the setting is inherited; set again in a forked
    worker, mallopt's consolidation of the heap's free chunks wrote to ~1 MiB of pages the worker
    shared with the parent (measured)."""
    global _threshold_set
    if not _threshold_set:
        from cbusbar.sysmem import set_mmap_threshold
        set_mmap_threshold(MMAP_THRESHOLD)
        _threshold_set = True


def _trim():
    """Returns what loading the config and importing freed to the system (glibc keeps freed heap
    pages mapped): ~1 MiB of idle RSS (measured, 26.0 -> 24.9 MiB PSS for one worker)."""
    from cbusbar.sysmem import trim
    trim()


# Idle heap trimming: glibc gives freed heap memory back only from the heap's top, so after a burst
# of large requests a worker kept ~190 MiB of free heap resident for good (bench/soak_memory.py,
# 150 KB bodies at 1000 connections: 197 MiB heap RSS per worker, 5-8 MiB of it in use). Every
# TRIM_SECS a worker with nothing in flight and more than TRIM_FREE_BYTES free in its heap trims
# it; under load it never trims (the memory is about to be reused, and a trim walks the heap).
TRIM_SECS = 5.0
TRIM_FREE_BYTES = 8 << 20


def _trim_when_idle(gw):
    from cbusbar.sysmem import heap_free, trim

    def tick():
        if gw.draining:
            return
        if gw.inflight == 0:
            c = gc.get_count()
            if c[1] or c[2]:
                # Garbage cycles left by the load (closed upstream connections: connection,
                # parser and transport refer to each other) wait for a collection that an idle
                # worker, allocating nothing, never triggers; scattered over pymalloc's arenas
                # and the heap they keep both mapped. The counts say a young collection ran since
                # the last one here, i.e. the worker served something; a collection walks only
                # what is not frozen (~1 ms). Measured: see the commit.
                gc.collect()
            if heap_free() > TRIM_FREE_BYTES:
                trim()
        gw.loop.call_later(TRIM_SECS, tick)
    gw.loop.call_later(TRIM_SECS, tick)


def _import_serving(config):
    """Every codec is imported before the first request (~16 ms, ~2 MiB once): imported on first
    use, each protocol's first request paid ~4 ms, which showed as the p99.9 of the bench. Called
    in the parent before the workers fork too, with every module a worker's setup imports
    (run_worker, Gateway.start, the control plane's live config, observability.install), so the
    modules' pages are shared, not one copy per worker: an import in a forked worker walks the
    import machinery's shared objects and dirties their pages (measured, the second worker's
    private memory was 7.7 MiB with ten modules imported after the fork, 4.6 MiB without)."""
    for name in ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock", "bedrock-invoke"):
        CODECS[name]
    import cbusbar.embed  # noqa: F401 (embeddings: the same first-request cost otherwise)
    if runtime.current().loop == "uvloop":
        import uvloop  # noqa: F401
    import cbusbar.sysmem  # noqa: F401
    import busbar.admin.live  # noqa: F401
    import busbar.reliability.health  # noqa: F401
    import busbar.upstream.refresh  # noqa: F401
    import busbar.upstream.sigv4  # noqa: F401
    import busbar.server.listen  # noqa: F401
    import busbar.hooks.run  # noqa: F401 (the gateway's hook runner and plans)
    observability.preload(config)


def run_worker(config, sock, on_ready=None, extra=None, children=(), shared=None, plane=None,
               gov=None):
    """Runs one gateway process on `sock` until SIGTERM/SIGINT; returns the exit code. A parent
    process forwards the signal to its `children` (the other workers). `plane`: this process's
    part of the control plane (busbar/admin/plane.py: the admin listener, or a config channel)."""
    _return_large_allocations()
    rt = runtime.current()
    loop = rt.new_event_loop()
    asyncio.set_event_loop(loop)
    gw = Gateway(config, loop, shared)
    observability.install(gw)   # observe: hooks, access log, metrics, sinks, traces
    if gov is not None:         # governance (busbar/governance/plane.py)
        gov.install(gw)
    _import_serving(config)
    # What exists now lives as long as the process: freezing it keeps the collector's full passes
    # (which would otherwise walk every module and config object) off the request path.
    gc.collect()
    gc.freeze()
    _trim()
    stop = asyncio.Event()

    def _signal(signum):
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        stop.set()

    runtime.on_signals(loop, rt, runtime.stop_signals(), _signal)

    async def main():
        # The admin listener and governance come up before the data listener, so once the data
        # port answers, every admin route (keys, groups) and the policy stores are ready too.
        if plane is not None:
            await plane.start(gw)
        if gov is not None:
            await gov.start(gw)
        await gw.start(sock)
        _trim_when_idle(gw)
        if extra is not None:
            await extra(loop)
        if on_ready is not None:
            on_ready(gw)
        await stop.wait()
        if plane is not None:
            plane.close()
        await gw.drain()
        if gov is not None:
            await gov.close(gw)
        await observability.shutdown(gw)    # observe: flush logs, sinks, spans

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return 0


# cgroup v2's CPU bandwidth limit of this process's container ("max" or "<quota> <period>").
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cpus(cpu_max_path: str = CGROUP_CPU_MAX) -> int:
    """The workers a default config runs: the CPUs this process may run on (its affinity, which
    `taskset` and Kubernetes' static CPU manager set), at most its container's CPU limit rounded
    up (cgroup v2 cpu.max, which a pod's resources.limits.cpu sets). os.cpu_count() alone counts
    the node's cores: a pod limited to 1 CPU on a 64-core node would start 64 workers of ~25 MiB
    each and be killed for memory. Tokio, which the Rust gateway sizes itself with, reads the same
    two."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open(cpu_max_path) as f:
            quota, _, period = f.read().strip().partition(" ")
        if quota != "max" and period:
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def serve(config, workers: int | None = None, on_ready=None, extra=None, path=None) -> int:
    """Binds and serves with N worker processes sharing the port (busbar/server/runtime.py says
    how, per platform). `path`: the config file (re-read by a reload). Raises
    busbar.server.listen.ListenError when an address is taken (one busbar per address), and
    busbar.server.runtime.RuntimeChoiceError for a BUSBAR_LOOP / BUSBAR_LISTENER this platform
    cannot run."""
    rt = runtime.choose()
    runtime.use(rt)
    n = workers or config.workers or usable_cpus()
    if n > 1 and not rt.fork:
        log.warning("one process: busbar runs no worker processes on the standard library's "
                    "event loop (%d asked for; %s)", n,
                    "Windows" if sys.platform == "win32" else "%s=asyncio" % runtime.LOOP_ENV)
        n = 1
    host, port = config.listen_host, config.listen_port
    # control hook: one instance per address, the admin listener, the workers' config channels.
    from busbar.admin.plane import ControlPlane
    control = ControlPlane(config, n)
    observability.prepare(config, n)    # observe: metrics counters shared by every worker
    observability.boot(config, n, control.admin_sock.getsockname())
    gov = None
    if config.governance is None or not config.governance.keys:
        log.warning("auth.chain is empty: the data plane is an open relay; anyone who reaches "
                    "%s:%d spends the provider keys", host, port)
    if config.governance is not None:
        from busbar.governance.plane import GovBoot
        gov = GovBoot(config, n)
    if n <= 1:
        sock = bind(host, port, reuse_port=False)
        code = run_worker(config, sock, on_ready, extra, plane=control.parent(path), gov=gov)
        return _restart_if_asked(control, code)
    # What every worker serves with is imported once, here, and frozen before the fork: the
    # workers share those pages (copy-on-write) instead of each importing its own copy, and the
    # collector never writes to the frozen objects' headers (which would copy their pages).
    _return_large_allocations()
    _import_serving(config)
    # The control channel's pickle (busbar/server/channel.py loads it on first use, so that one
    # worker never does): with several, before the fork, shared like the rest.
    import pickle  # noqa: F401
    if gov is not None:
        gov.preload()
    gc.collect()
    gc.freeze()
    _trim()
    # Linux: every worker binds its own SO_REUSEPORT socket, and the kernel balances new
    # connections. Elsewhere: one socket, bound here, that every forked worker accepts on.
    reuse = rt.listener == "reuseport"
    first = bind(host, port, reuse_port=reuse)
    port = first.getsockname()[1]
    # Lane permits shared by all workers, so max_concurrent is one limit for the whole gateway.
    from cbusbar.shared import SharedCounters
    # reliability: breaker cells and lane budgets in the same mapping, after the permits (the
    # control plane's table, with room for models added by reloads), so a lane one worker found
    # dead is open for every worker (busbar/reliability/breaker.py).
    from busbar.reliability.state import capacity
    shared = SharedCounters(control.slot_capacity(config) + capacity(config))
    # routing: lane latency and session pins, every worker's (busbar/routing/signals.py).
    from busbar.routing.signals import prepare as prepare_signals
    prepare_signals(config, n)
    from busbar.hooks.stats import prepare as prepare_hook_stats    # busbar_hook_* counters
    prepare_hook_stats(config, n)
    children = []
    for _ in range(n - 1):
        channel = control.channel()
        gov_channel = gov.channel() if gov is not None else None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if reuse:
                    first.close()
                    sock = bind(host, port, reuse_port=True)
                else:
                    sock = first
                agent = control.child(channel)
                if gov is not None:
                    gov.child(gov_channel)
                code = run_worker(config, sock, None, None, (), shared, agent, gov)
            finally:
                os._exit(code)
        children.append(pid)
        control.forked(pid, channel)
        if gov is not None:
            gov.forked(gov_channel)

    code = run_worker(config, first, on_ready, extra, children, shared, control.parent(path), gov)
    for pid in children:
        try:
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                code = 1
        except ChildProcessError:
            pass
    sys.stdout.flush()
    return _restart_if_asked(control, code)


def _restart_if_asked(control, code: int) -> int:
    """After the drain POST /api/v1/admin/restart began (busbar/admin/api.py): busbar starts again
    in the same process (same pid, so a supervisor sees no exit), with the same command line,
    reading the config file and its overlay afresh. Listening sockets are close-on-exec."""
    if not getattr(control, "restart", False) or code != 0:
        return code
    log.warning("restarting: %s", " ".join([sys.executable, "-m", "busbar.cli", *sys.argv[1:]]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "busbar.cli", *sys.argv[1:]])
    return code     # not reached
