"""The governance sections of a config (SPEC §5; issues 10 and 36): `auth.chain`,
`auth.signing_key`, `auth.role_bindings`, `auth.key_ttl`, `groups`, `rate_card` and `store`, in the
Rust gateway's 1.5.3 grammar (busbar's earlier spellings are refused by the loader, naming their
new home: busbar/config/legacy.py). Called from busbar/config/loader.py; the result is
`Config.governance` (a Governance, or None when the data plane is an open relay with nothing to
count).

    auth:
      chain: [keys]                       # [] (or absent) = open relay, with a WARNING at boot
      signing_key: {env: BUSBAR_SIGNING_KEY}
      key_ttl: 90d                        # what a minted key lives unless its mint says otherwise
    groups:
      org:    {limits: [{budget: 10000, per: month}]}        # integer cents of the rate's unit
      team-a: {parent: org, limits: [{requests: 60, per: minute}, {concurrent: 4}], enabled: true}
    rate_card:                            # micro-units per token (= units per million tokens)
      gpt-4o-mini: {input_utok: 0.15, output_utok: 0.60, cache_read_utok: 0.075}
    store: {module: sqlite, settings: {db_path: busbar.db}}   # memory (the default) | sqlite | valkey
"""
from __future__ import annotations

from busbar.config.checks import Problems, check_keys, describe, get_mapping, join
from busbar.config.modules import require
from busbar.config.secrets import resolve_secret

from .model import (MAX_GROUP_DEPTH, NANO_PER_CENT, SEED_BYTES, GroupRecord, Rate, Signer, parse_limit,
                    parse_signing_secret)

CHAINS = ("keys",)
# `store: {module, settings}`: the module names and aliases busbar has built in, each to busbar's
# store kind; the settings each reads (`fail_mode` and `socket_timeout_ms` are busbar's own).
STORE_MODULES = {"memory": "memory", "sqlite": "sqlite", "busbar-store-sqlite": "sqlite",
                 "valkey": "redis", "busbar-store-valkey-plugin": "redis",
                 "postgres": "postgres", "busbar-store-postgres": "postgres",
                 "busbar-store-postgres-plugin": "postgres"}
STORE_SETTINGS = {"memory": (), "sqlite": ("db_path", "busy_timeout_ms"),
                  "redis": ("url", "fail_mode", "socket_timeout_ms"),
                  "postgres": ("url", "timeout_ms", "pool_size")}
FAIL_MODES = ("closed", "open")
GROUP_KEYS = ("parent", "limits", "enabled", "child_default")
# Rates: micro-units per token (= units per million tokens), each optional (0).
RATE_UTOK_KEYS = ("input_utok", "output_utok", "cache_read_utok", "cache_write_utok")
# A minted key's default lifetime (the Rust default) and the longest `auth.key_ttl` (ten years).
DEFAULT_KEY_TTL_SECS = 90 * 86400
MAX_KEY_TTL_SECS = 10 * 365 * 86400
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The SQLite store's file when its settings name none: the Rust SQLite store's default name,
# beside config.yaml as every relative path of a config.
DEFAULT_DB = "busbar-governance.db"
# Usage is written to the store in batches this often: the most a crash (kill -9) can lose.
# 200 ms keeps the write rate to 5 small transactions a second at any load.
DEFAULT_FLUSH_MS = 200
# SQLite: how long a write waits for a lock another process holds (the sqlite3 shell, a backup);
# the Rust store's settings.busy_timeout_ms default.
DEFAULT_BUSY_TIMEOUT_MS = 5000
# A Redis round trip on loopback or in a cluster takes < 1 ms; 500 ms marks it unreachable
# without holding requests for long.
DEFAULT_REDIS_TIMEOUT_MS = 500
# Shared-memory buckets for group limits on one node (24 bytes each): one per (group, limit);
# 16384 is 384 KiB and more limits than any config we have seen.
DEFAULT_BUCKETS = 16384


class StoreConfig:
    __slots__ = ("kind", "path", "url", "fail_mode", "flush_secs", "socket_timeout_secs",
                 "busy_timeout_ms", "pool_size")

    def __init__(self, kind="memory", path=None, url=None, fail_mode="closed",
                 flush_secs=DEFAULT_FLUSH_MS / 1000, socket_timeout_secs=DEFAULT_REDIS_TIMEOUT_MS / 1000,
                 busy_timeout_ms=None, pool_size=None):
        self.kind = kind
        self.path = path
        self.url = url
        self.fail_mode = fail_mode
        self.flush_secs = flush_secs
        self.socket_timeout_secs = socket_timeout_secs
        # sqlite: how long a write waits for a lock another process holds
        self.busy_timeout_ms = DEFAULT_BUSY_TIMEOUT_MS if busy_timeout_ms is None else busy_timeout_ms
        # postgres: connections per worker (busbar/governance/postgres_store.py DEFAULT_POOL_SIZE)
        self.pool_size = pool_size

    def __eq__(self, other):
        return isinstance(other, StoreConfig) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self):
        return "StoreConfig(kind=%r, path=%r, url=%s)" % (
            self.kind, self.path, "<redacted>" if self.url else None)


class Governance:
    """What the data plane enforces. `keys` is True when a signed virtual key is required."""

    __slots__ = ("keys", "signing_key", "groups", "rate_card", "store", "key_ttl_secs", "fee")

    def __init__(self, keys, signing_key, groups, rate_card, store, key_ttl_secs=DEFAULT_KEY_TTL_SECS,
                 fee=0):
        self.keys = keys
        self.signing_key = signing_key      # a model.Signer, or None
        self.groups = groups                # {name: GroupRecord} owned by the config file
        self.rate_card = rate_card          # {model: Rate} or None (tokens cost 0)
        self.store = store
        self.key_ttl_secs = key_ttl_secs    # a minted key's default lifetime
        # `per_request_fee` in nano-units: what every 2xx request adds to each budget it counts
        # in, beside its tokens at the rate card (a non-2xx one is refunded).
        self.fee = fee

    def __eq__(self, other):
        return isinstance(other, Governance) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self):
        return "Governance(keys=%r, groups=%d, rate_card=%s, store=%r, signing_key=<redacted>)" % (
            self.keys, len(self.groups), None if self.rate_card is None else len(self.rate_card),
            self.store)


def parse(doc: dict, auth: dict, models: dict, pools: dict, env, base_dir: str, out: Problems,
          offline: bool = False) -> Governance | None:
    chain_raw = auth.get("chain", [])
    keys = False
    if chain_raw is None:
        chain_raw = []
    if not isinstance(chain_raw, list) or any(not isinstance(c, str) for c in chain_raw):
        out.error("auth.chain", "expected a list like [keys] (or [] for an open relay), got %s"
                  % describe(chain_raw))
    else:
        idps = doc.get("identity-providers") if isinstance(doc.get("identity-providers"), dict) else {}
        keys = False
        for i, c in enumerate(chain_raw):
            module = (idps.get(c) or {}).get("module") if isinstance(idps.get(c), dict) else None
            if c in CHAINS or module == "keys":
                keys = True
            elif c in idps:
                if module == "admin-tokens":
                    out.error("auth.chain[%d]" % i, "'%s' (module admin-tokens) guards the admin "
                              "API; it belongs in auth.admin_auth" % c)
                # another module is refused where identity-providers is parsed
            else:
                out.error("auth.chain[%d]" % i, "unknown identity provider '%s' (built in: keys; "
                          "or a name under identity-providers)" % c)
    _role_bindings(auth.get("role_bindings"), out)
    key_ttl = _key_ttl(auth.get("key_ttl"), out)
    signing_key = None
    if "signing_key" in auth:
        n = len(out.errors)
        secret = resolve_secret(auth["signing_key"], "auth.signing_key", env, base_dir, out,
                                raw=True)
        if len(out.errors) == n and secret is not None:
            if offline or isinstance(secret, str):
                # `validate --offline`: the reference's shape was checked, not the key; a stand-in
                # (all zero, never used to sign) keeps the rest of the check going.
                signing_key = Signer(bytes(SEED_BYTES))
            else:
                seed = parse_signing_secret(secret)
                if seed is None:
                    # Never quotes the value: it may be a real secret of another shape.
                    out.error("auth.signing_key", "must be an ed25519 signing key: 64 hex "
                              "characters (or the 32 raw bytes), the Rust gateway's format; this "
                              "one is %d bytes of another shape (an HMAC secret of an earlier "
                              "busbar?). Make one with `busbar --generate-signing-key`; keys "
                              "minted under the old secret must then be rotated" % len(secret))
                else:
                    signing_key = Signer(seed)
    elif keys:
        out.error("auth.signing_key", "required when auth.chain has 'keys' (a secret reference, "
                  "the same on every instance; e.g. {env: BUSBAR_SIGNING_KEY})")

    groups = _groups(get_mapping(doc, "groups", "", out) or {}, set(pools) | set(models), out,
                     set(pools))
    rate_card = _rate_card(doc.get("rate_card"), models, out)
    store = _store(doc.get("store"), env, base_dir, out)
    flush = (doc.get("advanced") or {}).get("usage_flush_interval_ms") if isinstance(
        doc.get("advanced"), dict) else None
    if flush is not None:
        if isinstance(flush, bool) or not isinstance(flush, int) or not 10 <= flush <= 60000:
            out.error("advanced.usage_flush_interval_ms", "expected an integer between 10 and 60000")
        else:
            store.flush_secs = flush / 1000
    fee = _per_request_fee(doc, out)
    if not keys and not groups and rate_card is None and "store" not in doc:
        return None
    return Governance(keys, signing_key, groups, rate_card, store, key_ttl, fee)


def _per_request_fee(doc: dict, out: Problems) -> int:
    """`per_request_fee`: integer cents of the rate card's unit (the Rust grammar), >= 0, as
    nano-units."""
    raw = doc.get("per_request_fee", 0)
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        out.error("per_request_fee", "expected a non-negative integer (cents of the rate card's "
                  "unit, charged per request to every budget), got %s" % (
                      describe(raw) if not isinstance(raw, int) or isinstance(raw, bool)
                      else raw))
        return 0
    return raw * NANO_PER_CENT


def _role_bindings(raw, out: Problems) -> None:
    """Roles an identity provider asserts, bound to pools and groups. busbar's built-in providers
    (signed keys, the operator's admin token) assert no roles, so only an empty map has meaning."""
    if raw is None or raw == {}:
        return
    if not isinstance(raw, dict):
        out.error("auth.role_bindings", "expected a mapping of provider: {role: binding}, got %s"
                  % describe(raw))
        return
    for name in raw:
        out.error(join("auth.role_bindings", name), "busbar's identity providers (keys, "
                  "admin-tokens) assert no roles; role bindings need a provider module busbar "
                  "does not have")


def _key_ttl(raw, out: Problems) -> int:
    """`auth.key_ttl`: `<n>s|m|h|d`, at most ten years; a minted key's default lifetime."""
    if raw is None:
        return DEFAULT_KEY_TTL_SECS
    text = raw if isinstance(raw, str) else ""
    unit = _TTL_UNITS.get(text[-1:]) if text else None
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        out.error("auth.key_ttl", "expected a duration like 90d, 12h, 30m or 3600s, got %s"
                  % describe(raw))
        return DEFAULT_KEY_TTL_SECS
    secs = int(text[:-1]) * unit
    if secs > MAX_KEY_TTL_SECS:
        out.error("auth.key_ttl", "at most ten years")
        return DEFAULT_KEY_TTL_SECS
    return secs


def _groups(raw: dict, pools: dict, out: Problems, pool_names=None) -> dict:
    groups = {}
    for name, entry in raw.items():
        where = join("groups", name)
        if not isinstance(name, str) or not name or len(name) > 128:
            out.error(where, "a group name is a non-empty string of at most 128 characters")
            continue
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            out.error(where, "expected a mapping {parent?, limits?, enabled?}, got %s" % describe(entry))
            continue
        check_keys(entry, where, GROUP_KEYS, out)
        cd = child_default(entry.get("child_default"), join(where, "child_default"), pools, out,
                           pool_names)
        g = group_from_body(name, entry, where, out, pools, source="config", pool_names=pool_names)
        if g is not None:
            g.child_default = cd
            groups[name] = g
    check_chains(groups, out)
    return groups


def child_default(raw, where: str, pools, out: Problems, pool_names=None):
    """`child_default: {limits}`: the limits a group auto-provisioned under this one starts with
    (a key minted with `group` new and `parent` naming a group under which the nearest
    `child_default` up the chain is this one). The limits are checked as any group's. Returns them
    (a tuple), or None when there is no template."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        out.error(where, "expected {limits: [...]}, got %s" % describe(raw))
        return None
    check_keys(raw, where, ("limits",), out)
    g = group_from_body("child", {"limits": raw.get("limits")}, where, out, pools,
                        source="config", pool_names=pool_names)
    return None if g is None else g.limits


def group_from_body(name, entry: dict, where: str, out: Problems, pools=None, source="api",
                    pool_names=None):
    """A group from config or an admin body. `pools`: the names a limit's `pool:` may scope to
    (pools and models); `pool_names`: the pools a budget may downgrade to (None: not checked)."""
    problems = []
    limits = []
    raw = entry.get("limits") or []
    if not isinstance(raw, list):
        out.error(join(where, "limits"), "expected a list of limits, got %s" % describe(raw))
        return None
    for i, item in enumerate(raw):
        lim = parse_limit(item, "%s.limits[%d]" % (where, i), problems)
        if lim is not None:
            if pools is not None and lim.pool is not None and lim.pool not in pools:
                problems.append("%s.limits[%d].pool: unknown pool or model '%s'" % (where, i, lim.pool))
            if pool_names is not None and lim.downgrade_to is not None and \
                    lim.downgrade_to not in pool_names:
                problems.append("%s.limits[%d].downgrade_to: unknown pool '%s'" % (
                    where, i, lim.downgrade_to))
            limits.append(lim)
    for p in problems:
        path, _, msg = p.partition(": ")
        out.error(path, msg)
    parent = entry.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        out.error(join(where, "parent"), "expected a group name")
        return None
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        out.error(join(where, "enabled"), "expected true or false, got %s" % describe(enabled))
        return None
    if problems:
        return None
    return GroupRecord(name, parent, enabled, limits, source)


def check_chains(groups: dict, out: Problems, lookup=None):
    """Every parent exists; chains are acyclic and at most MAX_GROUP_DEPTH deep."""
    get = lookup or groups.get
    for name, g in groups.items():
        seen = [name]
        cur = g
        while cur.parent is not None:
            parent = get(cur.parent)
            if parent is None:
                out.error(join(join("groups", cur.name), "parent"), "unknown group '%s'" % cur.parent)
                break
            if parent.name in seen:
                out.error(join(join("groups", name), "parent"), "groups form a cycle: %s" %
                          " -> ".join(seen + [parent.name]))
                break
            seen.append(parent.name)
            if len(seen) > MAX_GROUP_DEPTH:
                out.error(join(join("groups", name), "parent"), "a group chain is at most %d deep"
                          % MAX_GROUP_DEPTH)
                break
            cur = parent


def _rate_card(raw, models: dict, out: Problems):
    if raw is None:
        return None
    if not isinstance(raw, dict):
        out.error("rate_card", "expected a mapping of model -> {input_utok, output_utok, "
                  "cache_read_utok, cache_write_utok} (micro-units per token), got %s" % describe(raw))
        return None
    card = {}
    for model, entry in raw.items():
        where = join("rate_card", model)
        if model not in models:
            out.error(where, "unknown model '%s'" % model)
            continue
        if not isinstance(entry, dict):
            out.error(where, "expected {input_utok, output_utok, cache_read_utok?, "
                      "cache_write_utok?} (micro-units per token), got %s" % describe(entry))
            continue
        check_keys(entry, where, RATE_UTOK_KEYS, out)
        vals = {}
        for k in RATE_UTOK_KEYS:
            v = entry.get(k, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v \
                    or v == float("inf"):
                out.error(join(where, k), "expected a finite non-negative number (micro-units "
                          "per token)")
                continue
            vals[k[:-len("_utok")]] = float(v)
        if len(vals) == len(RATE_UTOK_KEYS):
            card[model] = Rate(**vals)
    missing = sorted(m for m in models if m not in raw)
    if missing:
        # All or nothing (SPEC §5): a model without a rate would be free.
        stub = "; ".join("%s: {input_utok: 0.0, output_utok: 0.0}" % m for m in missing)
        out.error("rate_card", "covers no rate for model(s) %s; add them (stub: %s)"
                  % (", ".join(missing), stub))
    return card


def _ms(settings: dict, key: str, default: int, out: Problems) -> float:
    """A store setting in milliseconds (10 ms to a minute), as seconds."""
    ms = settings.get(key, default)
    if isinstance(ms, bool) or not isinstance(ms, int) or not 10 <= ms <= 60000:
        out.error("store.settings.%s" % key, "expected an integer between 10 and 60000")
        ms = default
    return ms / 1000


def _store(raw, env, base_dir: str, out: Problems) -> StoreConfig:
    """`store: {module, settings}`; absent, the ephemeral `memory` store (the Rust default)."""
    import os
    if raw is None:
        return StoreConfig()
    if not isinstance(raw, dict):
        out.error("store", "expected {module: memory|sqlite|valkey|postgres, settings}, got %s" % describe(raw))
        return StoreConfig()
    check_keys(raw, "store", ("module", "settings"), out)
    module = raw.get("module")
    if module is None:
        out.error("store", "missing required key 'module' (memory, sqlite, valkey or postgres)")
        return StoreConfig()
    kind = STORE_MODULES.get(module) if isinstance(module, str) else None
    if kind is None:
        out.error("store.module", "store module %s is not built into busbar (built in: memory, "
                  "sqlite, valkey, postgres); busbar loads no plugins" % (
                      "'%s'" % module if isinstance(module, str) else describe(module)))
        return StoreConfig()
    settings = raw.get("settings") or {}
    if not isinstance(settings, dict):
        out.error("store.settings", "expected a mapping, got %s" % describe(settings))
        return StoreConfig()
    check_keys(settings, "store.settings", STORE_SETTINGS[kind], out)
    sc = StoreConfig(kind=kind)
    if kind == "sqlite":
        path = settings.get("db_path", DEFAULT_DB)
        if not isinstance(path, str) or not path:
            out.error("store.settings.db_path", "expected a file path")
        elif path == ":memory:":
            sc.path = path              # SQLite's own in-process database, as the Rust store opens it
        else:
            # Relative to the process's working directory, as the Rust SQLite store opens it (its
            # README: not relative to the config file): both gateways find the same file.
            sc.path = os.path.abspath(path)
        ms = settings.get("busy_timeout_ms")
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int) or ms < 0):
            out.error("store.settings.busy_timeout_ms", "expected an integer >= 0")
        elif ms is not None:
            sc.busy_timeout_ms = ms
    elif kind == "redis":
        require(out, "store.module", "store valkey", "redis", getattr(env, "offline", False))
        fm = settings.get("fail_mode", "closed")
        if fm not in FAIL_MODES:
            out.error("store.settings.fail_mode", "expected closed or open")
        else:
            sc.fail_mode = fm
        sc.socket_timeout_secs = _ms(settings, "socket_timeout_ms", DEFAULT_REDIS_TIMEOUT_MS, out)
        if "url" not in settings:
            out.error("store.settings", "module valkey needs url (redis:// or rediss://)")
        else:
            if isinstance(settings["url"], str):
                url = _inline_redis_url(settings["url"], out)
            else:
                url = resolve_secret(settings["url"], "store.settings.url", env, base_dir, out)
            offline = getattr(env, "offline", False)
            if url is not None and not offline and not url.startswith(("redis://", "rediss://",
                                                                        "unix://")):
                out.error("store.settings.url", "expected a redis://, rediss:// or unix:// URL")
            sc.url = url
    elif kind == "postgres":
        _postgres(settings, sc, env, base_dir, out)
    return sc


# Postgres store defaults (busbar/governance/postgres_store.py says why): a statement's deadline
# and the connections each worker keeps.
DEFAULT_POSTGRES_TIMEOUT_MS = 5000
DEFAULT_POSTGRES_POOL = 4


def _postgres(settings: dict, sc: StoreConfig, env, base_dir: str, out: Problems) -> None:
    """`store: {module: postgres, settings: {url, timeout_ms?, pool_size?}}`: `url` a libpq URL
    (postgres:// or postgresql://), from a reference when it carries a password."""
    offline = getattr(env, "offline", False)
    require(out, "store.module", "store postgres", "asyncpg", offline)
    sc.socket_timeout_secs = _ms(settings, "timeout_ms", DEFAULT_POSTGRES_TIMEOUT_MS, out)
    pool = settings.get("pool_size", DEFAULT_POSTGRES_POOL)
    if isinstance(pool, bool) or not isinstance(pool, int) or not 1 <= pool <= 64:
        out.error("store.settings.pool_size", "expected an integer between 1 and 64")
        pool = DEFAULT_POSTGRES_POOL
    sc.pool_size = pool
    if "url" not in settings:
        out.error("store.settings", "module postgres needs url (postgres://user@host:5432/db)")
        return
    raw = settings["url"]
    if isinstance(raw, str):
        url = _inline_postgres_url(raw, out)
    else:
        url = resolve_secret(raw, "store.settings.url", env, base_dir, out)
    if url is not None and not offline and not url.startswith(("postgres://", "postgresql://")):
        out.error("store.settings.url", "expected a postgres:// or postgresql:// URL")
    sc.url = url


def _inline_postgres_url(url: str, out: Problems) -> str | None:
    """A Postgres URL written in the config itself: the address is not a secret, a password
    (user info `user:pass@`, or a `password=` parameter) must come from a reference."""
    from urllib.parse import parse_qsl, urlsplit
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
    except ValueError:
        out.error("store.settings.url", "expected a postgres:// or postgresql:// URL")
        return None
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if ":" in userinfo or any(k.lower() in ("password", "passfile") for k, _ in query):
        # The message never quotes the URL: it holds the password.
        out.error("store.settings.url", "this URL carries a password, and inline secrets are not "
                  "allowed; put the whole URL in a reference, e.g. url: {env: BUSBAR_POSTGRES_URL}")
        return None
    return url


def _inline_redis_url(url: str, out: Problems) -> str | None:
    """A Redis URL written in the config itself: an address is not a secret, a password is. A URL
    with user info (`redis://user:pass@host`, `redis://:pass@host`, and a lone `name@`, which
    some clients send as the password) or a `password=`/`username=` parameter (redis-py reads
    both) must come from a reference, as every secret."""
    from urllib.parse import parse_qsl, urlsplit
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
    except ValueError:
        out.error("store.settings.url", "expected a redis://, rediss:// or unix:// URL")
        return None
    if "@" in parts.netloc or any(k.lower() in ("password", "username") for k, _ in query):
        # The message never quotes the URL: it holds the password.
        out.error("store.settings.url", "this URL carries credentials, and inline secrets are not allowed; "
                  "put the whole URL in a reference, e.g. url: {env: BUSBAR_REDIS_URL}")
        return None
    return url
