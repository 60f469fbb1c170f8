"""The control plane's processes: the admin listener in the parent (worker 0), one control channel
per other worker, SIGHUP.

Why a channel and not a shared config version every worker polls: polling puts a check on every
request (or a timer in every worker) and still needs the config itself shipped somewhere; a push
costs the data plane nothing between reloads, and the acknowledgement is what lets the admin call
answer 200 only once every worker serves the new config (measured: a swap with 2 workers takes
about a millisecond, see docs/architecture.md). Each channel is a socketpair made before the fork;
messages are busbar/server/channel.py's (a 4-byte length and a pickle).
"""
from __future__ import annotations

import logging
import signal
import socket

from busbar.config.control import Control
from busbar.server import runtime
from busbar.server.channel import recv_msg, send_msg
from busbar.server.listen import ListenError, probe, protocol_factory, tls_options

log = logging.getLogger("busbar.admin")

class ControlPlane:
    """Made by supervisor.serve() before it forks: checks both addresses are free (one busbar per
    address), binds the admin listener, and makes the channels."""

    def __init__(self, config, workers: int):
        self.config = config
        ctl = config.control or Control()
        self.control = ctl
        self.workers = []           # [(pid, parent end)]
        self.restart = False        # POST restart: start again after the drain (supervisor.py)
        probe(config.listen_host, config.listen_port, "listen")
        if (ctl.admin_host, ctl.admin_port) == (config.listen_host, config.listen_port):
            raise ListenError("admin_listen %s:%d: the same address as listen" % (
                ctl.admin_host, ctl.admin_port))
        probe(ctl.admin_host, ctl.admin_port, "admin_listen")
        from busbar.server.listen import bind
        try:
            self.admin_sock = bind(ctl.admin_host, ctl.admin_port, reuse_port=False)
        except OSError as exc:
            from busbar.server.listen import _reason
            raise ListenError("admin_listen %s:%d: %s" % (ctl.admin_host, ctl.admin_port,
                                                          _reason(exc))) from None

    def slot_capacity(self, config) -> int:
        # Room for models added by later reloads: slots are 8 bytes each.
        return max(256, 4 * len(config.models))

    def channel(self):
        return socket.socketpair()

    def forked(self, pid, pair):
        parent_end, child_end = pair
        child_end.close()
        parent_end.setblocking(False)
        self.workers.append((pid, parent_end))

    def child(self, pair):
        """In a forked worker: drop what belongs to the parent; the worker's agent."""
        parent_end, child_end = pair
        parent_end.close()
        self.admin_sock.close()
        for _, s in self.workers:
            s.close()
        child_end.setblocking(False)
        return WorkerAgent(child_end)

    def parent(self, path):
        return ParentAgent(self, path)


class WorkerAgent:
    """A worker other than the parent: swaps its snapshot when told, then acknowledges."""

    def __init__(self, sock):
        self.sock = sock
        self.task = None

    async def start(self, gw):
        loop = gw.loop
        # SIGHUP is the parent's to act on; a group-wide HUP must not kill a worker.
        runtime.on_signals(loop, runtime.current(), (getattr(signal, "SIGHUP", None),), lambda s: None)
        self.task = loop.create_task(self._serve(gw))

    async def _serve(self, gw):
        from busbar.admin.live import swap_in_worker
        loop = gw.loop
        while True:
            try:
                msg = await recv_msg(loop, self.sock)
            except (EOFError, OSError):
                return
            if msg.get("op") == "gov":
                # governance: a key or group changed (busbar/governance/admin.py)
                try:
                    gw.gate.directory.apply(msg)
                    reply = {"ok": True}
                except Exception as exc:
                    log.exception("governance change failed")
                    reply = {"error": repr(exc)}
                await send_msg(loop, self.sock, reply)
                continue
            if msg.get("op") == "auth_flush":
                # POST /auth/cache/flush: this worker's verified-credential cache
                gate = gw.gate
                await send_msg(loop, self.sock, {"ok": True, "flushed": gate.flush_credentials()
                                                 if gate is not None else 0})
                continue
            if msg.get("op") == "swap":
                try:
                    await swap_in_worker(gw, msg["config"], msg["version"], msg["slots"],
                                         msg.get("plans"))
                    reply = {"version": msg["version"]}
                except Exception as exc:  # reported to the parent, which fails the admin call
                    log.exception("config swap failed")
                    reply = {"error": repr(exc)}
                await send_msg(loop, self.sock, reply)

    def close(self):
        if self.task is not None:
            self.task.cancel()
        self.sock.close()


class ParentAgent:
    """Worker 0: the admin listener, the live config, SIGHUP."""

    def __init__(self, plane, path):
        self.plane = plane
        self.path = path
        self.server = None
        self.site = None

    async def start(self, gw):
        from busbar.admin.live import LiveConfig
        from busbar.admin.views import TripClock
        from busbar.server.http import HttpConnection
        loop = gw.loop
        ctl = self.plane.control
        self.gw = gw
        self.live = live = LiveConfig(gw, self.path, self.plane.workers)
        gw.live = live      # governance pushes key changes over the same channels
        # Pools' last_trip_at counts from boot, whether or not anyone has asked the admin API yet.
        live.trips = TripClock(gw)
        live.trips.start()
        # The admin site (its handlers, the OpenAPI document, the audit log, governance's
        # endpoints, the plugin catalog) is built when the first admin connection arrives, not at
        # boot: a gateway nobody administers never loads it (admin_site below).
        self.server = await loop.create_server(
            protocol_factory(lambda: HttpConnection(self.admin_site()), ctl.admin_tls),
            sock=self.plane.admin_sock, backlog=128,
            **tls_options(ctl.admin_tls, gw.snapshot.limits))
        if ctl.admin_open and not ctl.admin_tokens:
            log.warning("the admin API on %s:%d is open (auth.admin_auth: [])",
                        ctl.admin_host, ctl.admin_port)
        # SIGHUP reloads (Windows has none: the admin API's config/reload does the same).
        runtime.on_signals(loop, runtime.current(), (getattr(signal, "SIGHUP", None),),
                           lambda s: loop.create_task(self._sighup()))

    def admin_site(self):
        """The admin listener's site, built (and its routes mounted) on first use."""
        site = self.site
        if site is None:
            from busbar.admin.api import mount
            from busbar.admin.audit import AuditLog
            from busbar.admin.audit import mount as mount_audit
            from busbar.admin.site import AdminSite
            from busbar.governance.admin import mount as mount_governance
            gw, live = self.gw, self.live
            # The control in force now: a SIGHUP reload may have changed the tokens since boot.
            site = AdminSite(gw, live.control)
            # The audit log and GET audit, then governance's endpoints, which answer whether or
            # not governance is on (off: a read finds nothing, a write is a 409 that says how to
            # turn it on); mounted here, not by the site, so site.py imports neither (no import
            # circle).
            site.audit_log = AuditLog(gw)
            mount_audit(site)
            mount_governance(site.routes, gw)
            mount(site, live, self.plane)
            self.site = site
        return site

    async def _sighup(self):
        from busbar.config import ConfigError
        try:
            await self.live.reload()     # logs the `reload` event itself
        except ConfigError as e:
            for line in e.problems:
                log.error("SIGHUP: reload refused, the old config keeps serving: %s", line)
        except Exception:
            log.exception("SIGHUP: reload failed")

    def close(self):
        if self.server is not None:
            self.server.close()
        if self.site is not None:
            self.site.close()
        trips = getattr(getattr(self, "live", None), "trips", None)
        if trips is not None:
            trips.close()
