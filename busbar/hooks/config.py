"""The top-level `hooks:` definitions and the names pools attach, checked at boot (docs/hooks.md).

    hooks:
      pii:
        module: busbar-webrequest-hook          # the one hook module busbar has built in
        settings: {url: "http://127.0.0.1:8787/pii", timeout_ms: 50}
        kind: gate                              # gate (default) | tap
        phase: [request, response]              # a tap's stages; omitted = all four
        groups: [engineering]                   # callers it fires for; omitted = everyone
        timeout_ms: 20                          # a gate's deadline (default routing.default_policy_timeout_ms)
        on_error: reject                        # nothing (default) | weighted | reject | first | {hook: name}
        on_empty: reject                        # a restrict that leaves no lane: reject | weighted
        prompt: ro                              # no | ro | rw: the prompt text it sees (rw: may rewrite)
        user: no                                # no | ro: the caller's key id/name and end-user field
        priority: 0                             # orders rewrites and breaks reconcile ties
    pools:
      hooks: [audit]                            # fires for every pool (gates and taps)
      chat: {hooks: [cheapest, pii], members: [...]}   # one strategy and any gates

The grammar and its rules are the Rust gateway's (1.5.3); its hooks are signed plugins, and
`busbar-webrequest-hook` is the one that forwards to a sidecar, so that is the module busbar runs:
any other `module:` is refused with one line. Every `on_error` chain is followed here and must end
on a terminal or a ranking strategy (no unknown name, no tap, no cycle), so a failing gate always
lands somewhere that cannot fail.
"""
from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import unquote, urlsplit

from busbar.config.checks import Problems, check_keys, describe, join, suggest
from busbar.config.secrets import resolve_secret
from busbar.config.urls import HostPolicy, parse_base_url

# The module names a hook definition may give: the forwarder's documented name, its signed
# manifest's name and its alias (the Rust plugin is packed as busbar-webrequest-hook-plugin,
# alias webrequest).
MODULES = ("busbar-webrequest-hook", "busbar-webrequest-hook-plugin", "webrequest")
HOOK_KEYS = ("module", "settings", "groups", "phase", "kind", "timeout_ms", "on_error", "on_empty",
             "prompt", "user", "priority")
SETTINGS_KEYS = ("url", "timeout_ms")
PHASES = ("request", "candidate", "routing", "response")
# 1.5.3 renamed three stages; the old words are refused naming the new one.
RENAMED_PHASES = {"route": "candidate", "attempt": "routing", "completion": "response"}
KINDS = ("gate", "tap")
TERMINALS = ("nothing", "weighted", "reject", "first")
ON_EMPTY = ("reject", "weighted", "first")
PROMPT = ("no", "ro", "rw")
USER = ("no", "ro")
# The ordering strategies a pool's `hooks:` list may name (at most one); weighted is the default.
STRATEGIES = ("weighted", "cheapest", "fastest", "least_busy", "usage")
# Words that can never name a hook (a pool's `hooks:` and `on_error:` share one word space).
RESERVED = ("weighted", "reject", "first", "nothing", "cheapest", "fastest", "least_busy", "usage",
            "tokens", "admin-tokens")
# The forwarder's own per-message bound: its default, and the cap an operator value is clamped to
# (the Rust plugin's: a hook call on the request path never outlives the engine's hook budget).
SIDECAR_TIMEOUT_MS = 5000
# `priority` is a u16 in the Rust grammar.
PRIORITY_MAX = 65535
# The loopback-sidecar rule's refusals (the Rust forwarder's): private, shared (CGNAT), link-local,
# unique-local and site-local ranges, and the unspecified addresses. Loopback is the one internal
# target allowed, and the only one plain http:// may reach.
_INTERNAL = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
    "0.0.0.0/8", "255.255.255.255/32", "fc00::/7", "fe80::/10", "fec0::/10", "::/128"))


# The base-URL checks name the host they refused; a sidecar URL is never echoed (it may come from
# a secret), so the host becomes "the host".
_HOST_NAMED = re.compile(r"host \S+ ")


@dataclass(frozen=True, slots=True)
class Sidecar:
    """Where a hook's messages go: the pool key of the connection (scheme, host, port), and the
    request head every message starts with (request target, Host, the Basic credential of a URL
    that carries one). `shown` is the URL safe to print: no credential, no query."""

    key: tuple
    head: bytes
    shown: str

    def __repr__(self) -> str:
        return "Sidecar(%r)" % self.shown


@dataclass(frozen=True, slots=True)
class HookDef:
    name: str
    module: str
    sidecar: Sidecar
    sidecar_timeout_ms: int
    kind: str = "gate"
    phases: frozenset = frozenset(PHASES)
    groups: tuple = ()
    timeout_ms: int = 1
    on_error: str = "nothing"           # a terminal, or "hook" (see fallback)
    fallback: str | None = None         # on_error: {hook: name}
    on_empty: str = "reject"
    prompt: str = "no"
    user: str = "no"
    priority: int = 0

    @property
    def gate(self) -> bool:
        return self.kind == "gate"

    @property
    def rewrites(self) -> bool:
        """A gate with `prompt: rw` is a rewrite pass (before routing), not a decision gate."""
        return self.kind == "gate" and self.prompt == "rw"

    def deadline_ms(self) -> int:
        """How long busbar waits for this gate's answer: its own timeout, within the forwarder's."""
        return min(self.timeout_ms, self.sidecar_timeout_ms)


def parse(raw: object, env: Mapping[str, str], base_dir: str, out: Problems,
          default_timeout_ms: int = 1) -> dict[str, HookDef]:
    """`hooks:` → {name: HookDef}; every problem reported. A definition that failed maps to None,
    so a pool naming it is not reported a second time."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        out.error("hooks", f"expected a mapping of hook names to definitions, got {describe(raw)}")
        return {}
    hooks: dict = {}
    for name, entry in raw.items():
        hooks[name] = _hook(name, entry, env, base_dir, out, default_timeout_ms)
    _check_chains(hooks, out)
    return hooks


def _hook(name, entry, env, base_dir, out: Problems, default_timeout_ms):
    where = join("hooks", name)
    if not isinstance(name, str) or not name:
        out.error("hooks", "a hook name must be a non-empty string")
        return None
    if name in RESERVED:
        out.error(where, f"'{name}' is a reserved name (an on_error terminal, a ranking strategy "
                  "or a built-in auth module) and cannot name a hook")
        return None
    if not isinstance(entry, dict):
        out.error(where, f"expected a mapping with module:, got {describe(entry)}")
        return None
    before = len(out.errors)
    check_keys(entry, where, HOOK_KEYS, out)
    module = entry.get("module")
    if not isinstance(module, str) or not module.strip():
        out.error(join(where, "module"), "required: busbar-webrequest-hook (a sidecar over HTTP); "
                  "an entry without module: is the 1.x hooks registry, which busbar "
                  "--migrate-config converts")
        return None
    if module not in MODULES:
        out.error(join(where, "module"), f"'{module}' is not a hook module busbar has: busbar runs "
                  "hooks through its built-in busbar-webrequest-hook (a sidecar over HTTP)")
        return None
    sidecar, sidecar_timeout = _settings(entry.get("settings"), join(where, "settings"), env,
                                         base_dir, out)
    kind = _word(entry, "kind", where, KINDS, "gate", out)
    phases = _phases(entry.get("phase"), join(where, "phase"), out)
    groups = _groups(entry.get("groups"), join(where, "groups"), out)
    timeout_ms = entry.get("timeout_ms")
    if timeout_ms is None or timeout_ms == 0:
        # The Rust gateway reads 0 as "the default" too.
        timeout_ms = default_timeout_ms
    elif isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        out.error(join(where, "timeout_ms"), f"expected an integer of milliseconds, got {describe(timeout_ms)}")
        timeout_ms = default_timeout_ms
    on_error, fallback = _on_error(entry.get("on_error"), join(where, "on_error"), out)
    on_empty = _word(entry, "on_empty", where, ON_EMPTY, "reject", out)
    prompt = _grant(entry, "prompt", where, PROMPT, out)
    user = _grant(entry, "user", where, USER, out)
    priority = entry.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= PRIORITY_MAX:
        out.error(join(where, "priority"), f"expected an integer 0-{PRIORITY_MAX}, got {describe(priority)}")
        priority = 0
    if kind == "tap" and prompt == "rw":
        out.error(join(where, "prompt"), "a tap never replies, so it cannot rewrite: prompt: rw is "
                  "for gates (a tap may have prompt: ro)")
    if len(out.errors) > before or sidecar is None:
        return None
    return HookDef(name, module, sidecar, sidecar_timeout, kind, phases, groups, timeout_ms,
                   on_error, fallback, on_empty, prompt, user, priority)


def _word(entry, key, where, allowed, default, out):
    v = entry.get(key)
    if v is None:
        return default
    if v not in allowed:
        out.error(join(where, key), f"expected one of {' | '.join(allowed)}, got "
                  + (repr(v) if isinstance(v, str) else describe(v)))
        return default
    return v


def _grant(entry, key, where, allowed, out):
    # YAML 1.1 reads a bare `no` as false: the Rust grammar's `prompt: no` is that boolean here.
    v = entry.get(key)
    if v is None or v is False:
        return "no"
    return _word(entry, key, where, allowed, "no", out)


def _phases(raw, where, out) -> frozenset:
    if raw is None:
        return frozenset(PHASES)
    if not isinstance(raw, list):
        out.error(where, f"expected a list of stages ({', '.join(PHASES)}), got {describe(raw)}")
        return frozenset(PHASES)
    got = set()
    for i, p in enumerate(raw):
        if p in PHASES:
            got.add(p)
        elif p in RENAMED_PHASES:
            out.error(f"{where}[{i}]", f"'{p}' was renamed to '{RENAMED_PHASES[p]}' "
                      "(busbar --migrate-config rewrites it)")
        else:
            out.error(f"{where}[{i}]", f"expected one of {', '.join(PHASES)}, got "
                      + (repr(p) if isinstance(p, str) else describe(p)))
    # An empty list means the same as none: all four stages.
    return frozenset(got) if raw else frozenset(PHASES)


def _groups(raw, where, out) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list) or any(not isinstance(g, str) or not g for g in raw):
        out.error(where, f"expected a list of group names, got {describe(raw)}")
        return ()
    return tuple(dict.fromkeys(raw))


def _on_error(raw, where, out):
    if raw is None:
        return "nothing", None
    if isinstance(raw, str):
        if raw in TERMINALS:
            return raw, None
        out.error(where, f"'{raw}' is not a terminal (nothing | weighted | reject | first); a "
                  f"fallback hook is named as {{hook: {raw}}}")
        return "nothing", None
    if isinstance(raw, dict):
        extra = [k for k in raw if k != "hook"]
        name = raw.get("hook")
        if extra or not isinstance(name, str) or not name.strip():
            out.error(where, "expected {hook: <name>} naming another hook (or a terminal: "
                      "nothing | weighted | reject | first)")
            return "nothing", None
        return "hook", name
    out.error(where, f"expected a terminal (nothing | weighted | reject | first) or {{hook: "
              f"<name>}}, got {describe(raw)}")
    return "nothing", None


def _check_chains(hooks: dict, out: Problems) -> None:
    """Every `on_error: {hook: X}` chain ends on a terminal or a ranking strategy: X is a defined
    gate, X's own on_error continues the chain, and no hook comes back (the Rust gateway's boot
    proof that a failing gate always lands somewhere that cannot fail)."""
    for name, h in hooks.items():
        if h is None or h.fallback is None:
            continue
        seen = [name]
        cur = h
        while cur.fallback is not None:
            nxt_name = cur.fallback
            if nxt_name in STRATEGIES:
                break       # a ranking strategy cannot fail: the chain ends there
            if nxt_name in seen:
                out.error(join(join("hooks", name), "on_error"), "the on_error chain does not "
                          "end: %s is a cycle; every chain ends on nothing, weighted, reject, "
                          "first or a ranking strategy" % " -> ".join(seen + [nxt_name]))
                break
            if nxt_name not in hooks:
                out.error(join(join("hooks", name), "on_error"), f"unknown fallback hook "
                          f"'{nxt_name}'{suggest(nxt_name, [k for k in hooks if isinstance(k, str)])}")
                break
            nxt = hooks[nxt_name]
            if nxt is None:
                break       # its own problem is reported already
            if not nxt.gate:
                out.error(join(join("hooks", name), "on_error"), f"the fallback '{nxt_name}' is "
                          "a tap; a fallback must be a gate (a tap never answers)")
                break
            seen.append(nxt_name)
            cur = nxt


def check_refs(names: tuple, where: str, hooks: dict, out: Problems, own: bool) -> None:
    """A pool's (or `pools.hooks`') bare names: each a strategy or a defined hook; a pool's own
    list takes gates only (a tap cannot steer a pool; `pools.hooks` may attach taps)."""
    for i, n in enumerate(names):
        if n in STRATEGIES:
            continue
        at = f"{where}[{i}]"
        if n not in hooks:
            out.error(at, f"unknown hook '{n}'{suggest(n, [k for k in hooks if isinstance(k, str)])}; "
                      "define it under the top-level hooks:")
            continue
        h = hooks[n]
        if h is not None and own and not h.gate:
            out.error(at, f"'{n}' is a tap: a pool's own hooks: list takes gates (a tap cannot "
                      "steer routing); attach taps with pools.hooks")


def _settings(raw, where, env, base_dir, out):
    if raw is None:
        out.error(where, "required: {url: <the sidecar's http(s) URL>}")
        return None, SIDECAR_TIMEOUT_MS
    if not isinstance(raw, dict):
        out.error(where, f"expected a mapping with url, got {describe(raw)}")
        return None, SIDECAR_TIMEOUT_MS
    for key in raw:
        if key not in SETTINGS_KEYS:
            out.warn(join(where, key), "busbar-webrequest-hook reads only url and timeout_ms; "
                     f"this setting is ignored{suggest(str(key), SETTINGS_KEYS)}")
    url = raw.get("url")
    if isinstance(url, dict) and "literal" not in url:
        # A whole secret reference ({env: NAME}, {file: PATH}) is resolved before the module
        # sees it; `{literal: X}` passes X through.
        url = resolve_secret(url, join(where, "url"), env, base_dir, out)
        if url is None:
            return None, SIDECAR_TIMEOUT_MS
    elif isinstance(url, dict):
        url = url["literal"]
    sidecar = sidecar_url(url, join(where, "url"), out)
    t = raw.get("timeout_ms", SIDECAR_TIMEOUT_MS)
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        out.error(join(where, "timeout_ms"), f"expected a non-negative integer of milliseconds, got {describe(t)}")
        t = SIDECAR_TIMEOUT_MS
    return sidecar, max(1, min(t, SIDECAR_TIMEOUT_MS))


def _embedded_v4(ip: ipaddress.IPv6Address):
    """The IPv4 address inside an IPv4-mapped/compatible, NAT64 (64:ff9b::/96, 64:ff9b:1::/48) or
    6to4 (2002::/16) address, which reaches the same internal targets as the address itself."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    n = int(ip)
    seg = [(n >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    if seg[0] == 0x64 and seg[1] == 0xFF9B and (seg[2] == 1 or seg[2:6] == [0, 0, 0, 0]):
        return ipaddress.IPv4Address(n & 0xFFFFFFFF)
    if seg[0] == 0x2002:
        return ipaddress.IPv4Address((seg[1] << 16) | seg[2])
    if seg[:6] == [0, 0, 0, 0, 0, 0] and n > 1:
        return ipaddress.IPv4Address(n & 0xFFFFFFFF)    # IPv4-compatible ::a.b.c.d
    return None


def sidecar_url(raw: object, where: str, out: Problems) -> Sidecar | None:
    """The sidecar URL through the SSRF guard of the Rust forwarder: http(s) only; cloud metadata,
    private, shared, link-local, unique-local and site-local hosts refused (IPv4 inside IPv6 and
    odd IPv4 spellings included); loopback allowed, and plain http:// only to loopback. A URL
    may carry a path and a query, and user:password@ (sent as Basic auth). Refusals never quote
    the URL: it may hold a credential or come from a secret."""
    if not isinstance(raw, str) or not raw:
        out.error(where, f"expected the sidecar's http(s) URL, got {describe(raw)}")
        return None
    try:
        parts = urlsplit(raw)
        user, password = parts.username, parts.password
        _ = parts.port
    except ValueError:
        out.error(where, "is not a valid URL")
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        out.error(where, "must be an http:// or https:// URL (plain http:// only to loopback)")
        return None
    hostport = parts.netloc.rpartition("@")[2]
    if parts.port is not None:
        hostport = hostport[:hostport.rfind(":")]
    port = parts.port or (443 if scheme == "https" else 80)
    # The host checks of a provider's base_url (odd IPv4 spellings reduced, metadata hosts
    # refused), with the port made explicit so they hold for either scheme; this guard's own
    # scheme rule follows.
    base = parse_base_url("https://%s:%d%s" % (hostport, port, parts.path), HostPolicy())
    if isinstance(base, str):
        out.error(where, _HOST_NAMED.sub("the host ", base))
        return None
    try:
        ip = ipaddress.ip_address(base.host)
    except ValueError:
        ip = None
    loopback = False
    if ip is None:
        loopback = base.host == "localhost" or base.host.endswith(".localhost")
    else:
        check = ip
        if isinstance(ip, ipaddress.IPv6Address):
            check = _embedded_v4(ip) or ip
        loopback = check.is_loopback
        if not loopback and any(check in net for net in _INTERNAL if net.version == check.version):
            out.error(where, "must not point at a private, shared, link-local or unique-local "
                      "address (the SSRF guard; a sidecar on loopback is allowed)")
            return None
    if scheme == "http" and not loopback:
        out.error(where, "must use https:// for a sidecar that is not on loopback (plain http:// "
                  "would carry the request's projection in clear)")
        return None
    target = base.path_prefix or "/"
    if parts.path.endswith("/") and not target.endswith("/"):
        target += "/"
    if parts.query:
        target += "?" + parts.query
    default_port = 443 if scheme == "https" else 80
    bracketed = "[%s]" % base.host if ":" in base.host else base.host
    authority = bracketed if base.port == default_port else "%s:%d" % (bracketed, base.port)
    head = b"POST %s HTTP/1.1\r\nHost: %s\r\n" % (target.encode("ascii"), authority.encode("ascii"))
    if user is not None or password is not None:
        cred = ("%s:%s" % (unquote(user or ""), unquote(password or ""))).encode("utf-8")
        head += b"Authorization: Basic " + base64.b64encode(cred) + b"\r\n"
    head += b"Content-Type: application/json\r\nAccept: */*\r\n"
    shown = "%s://%s%s" % (scheme, authority, base.path_prefix or "/") + (
        "?<redacted>" if parts.query else "")
    return Sidecar((scheme, base.host, base.port), head, shown)
