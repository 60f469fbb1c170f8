# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""The config snapshot: everything a request reads from configuration, built once per config and
captured by each request when it starts.

A request never reads the gateway's current config again after it started, so a reload that swaps
`site.snapshot` for a new one cannot make one request mix two configs (its router, its egress heads,
its limits and the caches keyed by config all come from the snapshot it captured). Snapshots are
never mutated after construction, apart from the caches below, which are keyed by config values.
"""
from __future__ import annotations

import orjson

from cbusbar import reasoning

from busbar.engine.egress import BETA_HEADERS, Egress
from busbar.routing.swrr import Router

# A request tries at most this many lanes (the reference's failover max_hops default is 3 hops
# after the first attempt; the reliability issue makes it a per-pool setting).
MAX_ATTEMPTS = 4


class SecretMask:
    """Masks configured secret values in bytes and text that came from an upstream (error bodies
    and messages), so a provider that echoes the key it was sent never shows it to a client.

    Each secret is searched for as written and as JSON writes it (escaped `/` and `+`-safe forms
    included), and replaced by its masked form (`sk-...2f9a` for keys of 20+ characters, `***`
    below that, so a short secret does not leak half of itself)."""

    __slots__ = ("_pairs", "_str_pairs")

    # Shorter values are not treated as secrets: masking every occurrence of a 3-byte string would
    # mangle ordinary text, and no real credential is that short.
    MIN_LEN = 8

    def __init__(self, values):
        pairs = {}
        for v in values:
            if not v or len(v) < self.MIN_LEN:
                continue
            masked = (v[:3] + "..." + v[-4:]) if len(v) >= 20 else "***"
            mb = masked.encode()
            raw = v.encode("utf-8")
            pairs[raw] = mb
            js = orjson.dumps(v)[1:-1]
            pairs[js] = mb
            pairs[js.replace(b"/", b"\\/")] = mb
        # Longest first, so a secret that contains another is replaced whole.
        self._pairs = tuple(sorted(pairs.items(), key=lambda kv: -len(kv[0])))
        self._str_pairs = tuple((k.decode("utf-8", "replace"), m.decode()) for k, m in self._pairs)

    def __bool__(self):
        return bool(self._pairs)

    def mask(self, data: bytes) -> bytes:
        for raw, masked in self._pairs:
            if raw in data:
                data = data.replace(raw, masked)
        return data

    def mask_text(self, text: str) -> str:
        for raw, masked in self._str_pairs:
            if raw in text:
                text = text.replace(raw, masked)
        return text


def secret_values(config) -> list[str]:
    """Every configured secret value: provider keys (and the parts of a Bedrock key pair) and the
    values of configured extra headers."""
    out = []
    for p in config.providers.values():
        key = p.api_key
        if key:
            out.append(key)
            if p.auth == "sigv4":
                out.extend(part for part in key.split(":") if part)
            elif p.auth == "oauth-client-credentials":
                out.append(key.partition(":")[2])      # the client secret alone
        for _, value in p.headers:
            out.append(value)
    return out


class Snapshot:
    """One immutable view of a config for the requests that start while it is current."""

    def __init__(self, config, shared=None, version=1, router=None, egress=None):
        """router, egress: built by a reload (busbar/admin/live.py), reusing the previous
        snapshot's surviving Lane and Egress objects so their state carries over by identity."""
        self.config = config
        # busbar/governance/config.py: Governance or None (open relay, nothing counted)
        self.governance = config.governance
        self.version = version
        self.limits = config.limits
        # The effort <-> thinking budget table the codecs translate with: the process's, set
        # here, where a worker takes a config (at boot and at every reload).
        reasoning.configure(config.limits.reasoning_effort_budgets)
        self.router = router if router is not None else Router(config, shared)
        self.egress = egress if egress is not None else {
            name: Egress(p) for name, p in config.providers.items()}
        self.server_timing = bool(config.server_timing)
        self.max_attempts = MAX_ATTEMPTS
        self.max_inbound = config.limits.max_inbound_concurrent
        self.beta_headers = BETA_HEADERS
        self.mask = SecretMask(secret_values(config))
        # upstream model name → its JSON string, for the same-protocol splice. Names come from this
        # config, so the cache is bounded by it and dies with the snapshot.
        self.wire_json = {}
        # The worker's routing state (busbar/routing/plan.py RoutingState: lane signals, session
        # pins, the hook runner), the same object in every snapshot of the process: its `attach`
        # gives each snapshot's pools their plans and sets this.
        self.routing = None

    def wire(self, name):
        wj = self.wire_json.get(name)
        if wj is None:
            wj = self.wire_json[name] = orjson.dumps(name)
        return wj
