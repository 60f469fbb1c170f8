"""Governance's data: virtual keys, groups and their limits, windows, admission checks, cost.

Shared by every store (memory, SQLite, Redis) and by both sides of the gateway: the admin API in
the parent (mint, PATCH, usage) and the data plane in every worker (verify, admit, settle). Records
are plain slotted classes: they are pickled to workers and cached per worker.

Tokens are the Rust gateway's (GetBusbar/busbar `governance/signing.rs`), so a key minted by either
gateway verifies in the other under the same `auth.signing_key`:

    bbk_<b64url-no-pad(claims JSON)>.<b64url-no-pad(ed25519 signature over those JSON bytes)>
    claims: {"sub": "vk_<32 hex>", "exp": <unix seconds>, "kid": "k1", "g": "<generation>"}

`g` (the key's rotation generation, 32 hex) is left out by a token minted before generations
existed; such a token matches only a key whose stored generation is absent too. The signing key is
the ed25519 secret (its 32-byte seed) that `busbar --generate-signing-key` prints as 64 hex
characters; a file may also hold the 32 raw bytes. Verification checks the signature, then the
expiry; the store is consulted for the key (by `sub`), its generation, state and revocation. An
uncached verify costs 0.2 ms on this project's loaded 2-core machine, nearly all of it the
ed25519 check (bench/verify.py), so each worker keeps the tokens it verified
(busbar/governance/gate.py; 0.2 us a lookup); the store never holds a token.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import string
import time

import orjson

TOKEN_PREFIX = "bbk_"
KID = "k1"
KEY_ID_PREFIX = "vk_"
# Issued AWS access key ids have the shape AWS SDKs validate: AKIA + 16 of A-Z0-9 (20 chars).
AWS_KEY_PREFIX = "AKIA"
_AWS_ID_ALPHABET = string.ascii_uppercase + string.digits
SEED_BYTES = 32
# A token longer than this is not one of ours (a real one is ~190 bytes); refused before any work.
MAX_TOKEN_BYTES = 1024

STATES = ("active", "disabled", "revoked", "tombstoned")
LIMIT_KINDS = ("requests", "tokens", "budget_usd", "concurrent")
# How a limit's metric is written: `budget` (integer cents) is the `budget_usd` kind inside.
LIMIT_SPELLINGS = ("requests", "tokens", "budget", "concurrent")
LIMIT_EXTRA_KEYS = ("per", "pool", "on_exhaust", "downgrade_to")
PERIODS = ("minute", "hour", "day", "month", "total")
# Nano-dollars per USD: spend is integer arithmetic (SPEC §5: "integer nano-units").
NANO = 1_000_000_000
# A budget's cent (1e-2 of the rate card's unit) in nano-units.
NANO_PER_CENT = NANO // 100
# A group chain longer than this is refused (SPEC §5: acyclic, depth <= 8).
MAX_GROUP_DEPTH = 8


# ---------------------------------------------------------------------------- tokens
_B64URL = re.compile(r"[A-Za-z0-9_-]*\Z")


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def _unb64(s: str) -> bytes | None:
    """Base64url without padding, decoded as strictly as the Rust side does: the url-safe alphabet
    only, no `=`, and the unused bits of the last character zero (one encoding per byte string)."""
    if not _B64URL.match(s) or len(s) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except (ValueError, binascii.Error):
        return None
    return raw if _b64(raw) == s else None


def parse_signing_secret(raw: bytes) -> bytes | None:
    """The 32-byte ed25519 seed that `auth.signing_key` resolved to, read as the Rust gateway reads
    it: exactly 32 bytes are the seed itself; anything else is text whose trimmed form must be 64
    hex characters. None when it is neither."""
    if len(raw) == SEED_BYTES:
        return bytes(raw)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if len(text) != 2 * SEED_BYTES or any(c not in string.hexdigits for c in text):
        return None
    return bytes.fromhex(text)


def ed25519_key(seed: bytes):
    """An object with `sign(message)` and `verify(signature, message)` for this seed: OpenSSL's
    ed25519 through cbusbar/ed25519.pyx (the libcrypto the interpreter loaded, so the single-file
    executable has it too), or the `cryptography` package where that found no libcrypto."""
    from cbusbar import ed25519
    if ed25519.AVAILABLE:
        return ed25519.Ed25519Key(seed)
    return _CryptographyKey(seed)


class _CryptographyKey:
    __slots__ = ("_private", "_public")

    def __init__(self, seed: bytes):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        self._public = self._private.public_key()

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def verify(self, signature: bytes, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        try:
            self._public.verify(signature, message)
        except InvalidSignature:
            return False
        return True


class Signer:
    """`auth.signing_key`: an ed25519 key that mints tokens (the admin API) and verifies them (every
    worker). Pickles as its seed (the config travels to workers that way); never prints it."""

    __slots__ = ("seed", "kid", "_key")

    def __init__(self, seed: bytes, kid: str = KID):
        if len(seed) != SEED_BYTES:
            raise ValueError("an ed25519 seed is 32 bytes")
        self.seed = bytes(seed)
        self.kid = kid
        self._key = ed25519_key(self.seed)

    def mint(self, sub: str, exp: int, gen: str | None) -> str:
        """A token for key `sub`, expiring at `exp` (unix seconds), of rotation generation `gen`.
        The claims are serialized as the Rust side does (compact JSON, fields in this order, `g`
        left out when there is none), so both gateways produce the same bytes."""
        claims = {"sub": sub, "exp": int(exp), "kid": self.kid}
        if gen is not None:
            claims["g"] = gen
        payload = orjson.dumps(claims)
        return TOKEN_PREFIX + _b64(payload) + "." + _b64(self._key.sign(payload))

    def verify(self, token: str, now: float):
        """(sub, exp, gen) of a token this key signed that has not expired, else None. The order
        is the Rust side's: shape, claims, key id, signature, and only then expiry (the claims are
        trusted only once authenticated). Nothing here touches a store."""
        if len(token) > MAX_TOKEN_BYTES or not token.startswith(TOKEN_PREFIX):
            return None
        payload_b64, dot, sig_b64 = token[len(TOKEN_PREFIX):].partition(".")
        if not dot:
            return None
        payload = _unb64(payload_b64)
        sig = _unb64(sig_b64)
        if payload is None or sig is None or len(sig) != 64:
            return None
        try:
            claims = orjson.loads(payload)
            sub, exp, kid = claims["sub"], claims["exp"], claims["kid"]
            gen = claims.get("g")
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(sub, str) or not isinstance(kid, str) or (
                gen is not None and not isinstance(gen, str)) or isinstance(exp, bool) or (
                not isinstance(exp, int)) or not 0 <= exp < 1 << 64:
            return None
        if kid != self.kid:
            return None
        if not self._key.verify(sig, payload):
            return None
        if exp <= now:
            return None
        return sub, exp, gen

    def __reduce__(self):
        return (Signer, (self.seed, self.kid))

    def __eq__(self, other):
        return isinstance(other, Signer) and other.seed == self.seed and other.kid == self.kid

    def __hash__(self):
        return hash((self.seed, self.kid))

    def __repr__(self):
        return "Signer(kid=%r, key=<redacted>)" % self.kid


def new_key_id() -> str:
    """A fresh key id: `vk_` + 32 hex characters of the OS random source (the Rust shape)."""
    return KEY_ID_PREFIX + os.urandom(16).hex()


def new_generation() -> str:
    """A fresh rotation generation: 128 random bits as 32 hex characters (the Rust shape)."""
    return os.urandom(16).hex()


def new_aws_access_key_id() -> str:
    return AWS_KEY_PREFIX + "".join(_AWS_ID_ALPHABET[b % 36] for b in os.urandom(16))


def new_credential_id() -> str:
    return "cred_" + os.urandom(16).hex()


def mint_token(signer: Signer, key_id: str, exp: int, gen: str | None) -> str:
    return signer.mint(key_id, exp, gen)


def verify_token(signer: Signer, token: str, now: float | None = None):
    """(key_id, exp, gen) when `signer` signed the token and it has not expired; else None."""
    return signer.verify(token, time.time() if now is None else now)


# The stored form of a key's rotation generation (`keys.generation_hash` of the Rust store): not a
# hash, a marker read after the key is found by id and compared with the token's `g`.
BINDING_PREFIX = "binding:"


def generation_marker(key_id: str, gen: str | None) -> str:
    return BINDING_PREFIX + key_id if gen is None else "%s%s:%s" % (BINDING_PREFIX, key_id, gen)


def marker_generation(marker: str) -> str | None:
    """The generation a stored marker carries; None for a marker without one (only a token without
    `g` matches it) and for any other shape."""
    if not marker.startswith(BINDING_PREFIX):
        return None
    _, sep, gen = marker[len(BINDING_PREFIX):].partition(":")
    return gen if sep else None


class StoreError(RuntimeError):
    """A store refused a write (e.g. reviving a tombstoned key) or a schema it does not read."""


class KeyRecord:
    """A virtual key as busbar handles it; the stores map it to the Rust store's rows (a `keys` row,
    a `credentials` row of kind sigv4, a `denylist` entry). `state` is derived there, as the Rust
    admin API derives it: tombstoned (deleted_at set), revoked (the id is on the denylist),
    disabled (enabled = 0), else active. `gen` is the rotation generation (tokens carry it as `g`);
    `expires` is the key's own expiry (None for a key minted today: its token carries the expiry).
    `aws_secret` is kept only to verify SigV4 signatures (HMAC needs the secret itself) and is never
    returned by a read. The token is never stored."""

    __slots__ = ("id", "name", "group", "allowed_pools", "state", "created", "expires", "gen",
                 "aws_access_key_id", "aws_secret", "aws_cred_id", "labels", "deleted", "revision")

    def __init__(self, id, name, group=None, allowed_pools=None, state="active", created=0,
                 expires=None, gen=None, aws_access_key_id=None, aws_secret=None, aws_cred_id=None,
                 labels=None, deleted=None, revision=0):
        self.id = id
        self.name = name
        self.group = group
        self.allowed_pools = allowed_pools      # None = every pool; [] = none
        self.state = state
        self.created = created
        self.expires = expires                  # epoch seconds or None
        self.gen = gen
        self.aws_access_key_id = aws_access_key_id
        self.aws_secret = aws_secret
        self.aws_cred_id = aws_cred_id
        self.labels = labels or {}
        self.deleted = deleted                  # when it was tombstoned, epoch seconds
        self.revision = revision                # the store's change counter when it was written

    def usable(self, now: float) -> bool:
        return self.state == "active" and (self.expires is None or self.expires > now)

    def public(self) -> dict:
        """What the admin API shows: never a token, a generation or the AWS secret."""
        return {"id": self.id, "name": self.name, "group": self.group,
                "allowed_pools": self.allowed_pools, "state": self.state,
                "enabled": self.state == "active", "created_at": iso_utc(self.created),
                "expires_at": iso_utc(self.expires) if self.expires else None,
                "aws_access_key_id": self.aws_access_key_id, "labels": self.labels}

    def to_dict(self) -> dict:
        return {s: getattr(self, s) for s in self.__slots__}

    @classmethod
    def from_dict(cls, d: dict) -> "KeyRecord":
        return cls(**{k: d.get(k) for k in cls.__slots__ if k in d})

    def __repr__(self):
        return "<KeyRecord %s %s group=%s %s>" % (self.id, self.name, self.group, self.state)


# The Rust store's key and credential records (api/src/store.rs VirtualKey, CredentialSecret): the
# fields of a `keys` / `credentials` row, and the JSON the valkey store keeps.
PLAIN_SECRET = "v1:plain:"          # a recoverable secret's envelope: version 1, no encryption


def virtual_key(rec: KeyRecord, now: int, enabled: bool | None = None) -> dict:
    """The Rust VirtualKey of a KeyRecord (its serde field names)."""
    return {"id": rec.id, "generation_hash": generation_marker(rec.id, rec.gen), "name": rec.name,
            "allowed_pools": rec.allowed_pools,
            "enabled": rec.state == "active" if enabled is None else enabled,
            "created_at": int(rec.created or 0), "group": rec.group, "labels": rec.labels or {},
            "expires_at": int(rec.expires) if rec.expires else None,
            "deleted_at": int(rec.deleted or now) if rec.state == "tombstoned" else None,
            "revision": int(rec.revision or 0)}


def sigv4_credential(rec: KeyRecord, now: int, revoked_at=None, reason=None) -> dict:
    """The Rust CredentialSecret of a key's AWS pair (kind sigv4, slot 0, a recoverable secret)."""
    created = int(rec.created or now)
    return {"meta": {"id": rec.aws_cred_id or new_credential_id(), "key_id": rec.id,
                     "kind": "sigv4", "slot": 0, "public_id": rec.aws_access_key_id,
                     "secret_form": "Recoverable", "created_at": created, "updated_at": now,
                     "expires_at": None, "revoked_at": revoked_at, "revoke_reason": reason,
                     "revision": int(rec.revision or 0)},
            "secret": PLAIN_SECRET + (rec.aws_secret or "")}


def credential_live(meta: dict, now: float) -> bool:
    """A credential admits: not revoked, not past its own expiry (Rust CredentialMeta::is_live)."""
    exp = meta.get("expires_at")
    return meta.get("revoked_at") is None and (exp is None or now < exp)


def record_of(vk: dict, revoked: bool, cred: dict | None, now: float) -> KeyRecord:
    """A KeyRecord from a Rust VirtualKey, whether its id is on the denylist, and its sigv4
    credential (None, or one that does not admit: the key then has no AWS pair)."""
    if vk.get("deleted_at") is not None:
        state = "tombstoned"
    elif revoked:
        state = "revoked"
    elif not vk.get("enabled"):
        state = "disabled"
    else:
        state = "active"
    akid = secret = cred_id = None
    if cred is not None and credential_live(cred["meta"], now):
        akid = cred["meta"]["public_id"]
        cred_id = cred["meta"]["id"]
        raw = cred.get("secret") or ""
        # Only the plain envelope is a usable HMAC key; another scheme (a future encrypted one)
        # leaves the pair unusable here rather than signing with ciphertext.
        secret = raw[len(PLAIN_SECRET):] if raw.startswith(PLAIN_SECRET) else None
    pools = vk.get("allowed_pools")
    return KeyRecord(vk["id"], vk.get("name") or "", vk.get("group"),
                     list(pools) if pools is not None else None, state, vk.get("created_at") or 0,
                     vk.get("expires_at"), marker_generation(vk.get("generation_hash") or ""),
                     akid, secret, cred_id, dict(vk.get("labels") or {}), vk.get("deleted_at"),
                     vk.get("revision") or 0)


class Limit:
    """One limit of a group: exactly one metric. `amount` is requests, tokens, nano-units of cost
    (a budget, converted at parse) or concurrent requests; `per` is None for concurrent. A budget
    is written and read back as `budget: N`, integer cents of the rate card's unit.
    `downgrade_to`: a pool-scoped budget's `on_exhaust: downgrade` target (None: block), the pool
    its exhausted pool's requests are re-admitted through instead of refused."""

    __slots__ = ("kind", "amount", "per", "pool", "downgrade_to")

    def __init__(self, kind, amount, per=None, pool=None, downgrade_to=None):
        self.kind = kind
        self.amount = amount
        self.per = per
        self.pool = pool
        self.downgrade_to = downgrade_to

    def public(self) -> dict:
        if self.kind == "budget_usd":
            d = {"budget": self.amount // NANO_PER_CENT}
        else:
            d = {self.kind: self.amount}
        if self.per is not None:
            d["per"] = self.per
        if self.pool is not None:
            d["pool"] = self.pool
        if self.downgrade_to is not None:
            d["on_exhaust"] = "downgrade"
            d["downgrade_to"] = self.downgrade_to
        return d

    def __eq__(self, other):
        return isinstance(other, Limit) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self):
        return "Limit(%r)" % self.public()


class GroupRecord:
    __slots__ = ("name", "parent", "enabled", "limits", "source", "child_default")

    def __init__(self, name, parent=None, enabled=True, limits=(), source="api",
                 child_default=None):
        self.name = name
        self.parent = parent
        self.enabled = enabled
        self.limits = tuple(limits)
        self.source = source                    # "config" (file-owned) or "api"
        # the limits a group auto-provisioned under this one starts with (None: it inherits only)
        self.child_default = None if child_default is None else tuple(child_default)

    def public(self) -> dict:
        return {"name": self.name, "parent": self.parent, "enabled": self.enabled,
                "limits": [lim.public() for lim in self.limits], "source": self.source}

    def __eq__(self, other):
        return isinstance(other, GroupRecord) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__)


def parse_limit(raw, where: str, problems: list) -> Limit | None:
    """A limit from config or an admin body: `{requests: 60, per: minute, pool?: p}`,
    `{tokens: N, per}`, `{budget: 500, per}` (integer cents), `{concurrent: 4}`. `on_exhaust: block`
    is a budget's default; `on_exhaust: downgrade, downgrade_to: q` (a budget scoped to a pool:
    another pool) re-admits the pool's requests through q once the budget is spent. Problems are
    appended as 'path: message' lines."""
    if not isinstance(raw, dict):
        problems.append("%s: expected a mapping like {requests: 60, per: minute}" % where)
        return None
    if "budget_usd" in raw:
        problems.append("%s.budget_usd: retired; write budget: N, integer cents (100 per USD)"
                        % where)
        return None
    kinds = [k for k in LIMIT_SPELLINGS if k in raw]
    unknown = [k for k in raw if k not in LIMIT_SPELLINGS and k not in LIMIT_EXTRA_KEYS]
    if unknown:
        problems.append("%s.%s: unknown key (expected one of %s, %s)" % (
            where, unknown[0], ", ".join(LIMIT_SPELLINGS), ", ".join(LIMIT_EXTRA_KEYS)))
        return None
    if len(kinds) != 1:
        problems.append("%s: a limit has exactly one of %s" % (where, ", ".join(LIMIT_SPELLINGS)))
        return None
    kind = kinds[0]
    value = raw[kind]
    on_exhaust = raw.get("on_exhaust", "block")
    if on_exhaust not in ("block", "downgrade"):
        problems.append("%s.on_exhaust: expected block or downgrade" % where)
        return None
    if kind != "budget" and "on_exhaust" in raw:
        problems.append("%s.on_exhaust: only a budget has one" % where)
        return None
    downgrade_to = raw.get("downgrade_to")
    if on_exhaust == "downgrade":
        if not isinstance(downgrade_to, str) or not downgrade_to:
            problems.append("%s.downgrade_to: on_exhaust: downgrade needs the pool to downgrade to"
                            % where)
            return None
        if raw.get("pool") is None:
            problems.append("%s.pool: on_exhaust: downgrade needs the budget scoped to a pool (the "
                            "one whose requests downgrade)" % where)
            return None
        if downgrade_to == raw.get("pool"):
            problems.append("%s.downgrade_to: must name another pool than pool: %s"
                            % (where, downgrade_to))
            return None
    elif "downgrade_to" in raw:
        problems.append("%s.downgrade_to: needs on_exhaust: downgrade" % where)
        return None
    if kind == "budget":
        # The Rust grammar: integer cents of the cost unit, > 0.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            problems.append("%s.budget: expected a positive integer (cents)" % where)
            return None
        amount = value * NANO_PER_CENT
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
            not float(value).is_integer()):
        problems.append("%s.%s: expected a non-negative integer" % (where, kind))
        return None
    else:
        amount = int(value)
    per = raw.get("per")
    if kind == "concurrent":
        if per is not None:
            problems.append("%s.per: a concurrent limit has no period" % where)
            return None
    elif per not in PERIODS:
        problems.append("%s.per: expected one of %s" % (where, ", ".join(PERIODS)))
        return None
    pool = raw.get("pool")
    if pool is not None and (not isinstance(pool, str) or not pool):
        problems.append("%s.pool: expected a pool name" % where)
        return None
    if kind == "budget":
        return Limit("budget_usd", amount, per, pool, downgrade_to)
    return Limit(kind, amount, per, pool)


# ---------------------------------------------------------------------------- windows
_SPAN = {"minute": 60, "hour": 3600, "day": 86400}


def window(per: str | None, now: float) -> tuple[int, float | None]:
    """(window id, seconds until it rolls) for a period at `now` (UTC). A `total` or concurrent
    limit has one window forever (id 0, no roll)."""
    if per is None or per == "total":
        return 0, None
    span = _SPAN.get(per)
    if span is not None:
        wid = int(now // span)
        return wid, (wid + 1) * span - now
    # month: id = year*12 + month-1, roll at the first of the next month, UTC
    t = time.gmtime(now)
    wid = t.tm_year * 12 + t.tm_mon - 1
    ny, nm = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    roll = _timegm(ny, nm, 1) - now
    return wid, roll


def _timegm(y, m, d) -> float:
    import calendar
    return float(calendar.timegm((y, m, d, 0, 0, 0, 0, 0, 0)))


def day_of(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def iso_utc(t) -> str | None:
    if not t:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---------------------------------------------------------------------------- admission
# A Check is one limit applied to one request: (bucket, kind, limit, charge, window id, roll secs,
# group, per). `bucket` names the counter across the fleet: "<group>#<limit index>" (+ "@<pool>"
# for a pool-scoped limit, which is already in the limit). What admission does per kind:
#   requests   : value + 1 <= limit, charge 1 (exact)
#   tokens     : value < limit (post-paid: blocks the next request), charge 0; settle adds tokens
#   budget_usd : value + reserve <= limit, charge the reservation; settle adds actual - reserve
#                (a network store's checks carry 0 and the reservation goes beside them: the
#                checks of a group chain are reused from request to request, gate.plan)
#   concurrent : value + 1 <= limit, charge 1; settle adds -1
# All checks of a request are taken atomically: all charged or none.
C_BUCKET, C_KIND, C_LIMIT, C_CHARGE, C_WINDOW, C_ROLL, C_GROUP, C_PER = range(8)


class Denial:
    """Why admission refused: the check that failed. `retry_after` in whole seconds or None."""

    __slots__ = ("kind", "group", "per", "retry_after", "reason")

    def __init__(self, kind, group, per, retry_after=None, reason=None):
        self.kind = kind
        self.group = group
        self.per = per
        self.retry_after = retry_after
        self.reason = reason        # "disabled", "missing", "unavailable" or None (a limit)

    def __repr__(self):
        return "<Denial %s group=%s per=%s %s>" % (self.kind, self.group, self.per, self.reason)


class Usage:
    """One request's billable usage, as a store records it: summed per UTC day, key, group, model
    (the serving lane) and pool; `billable_requests` counts the ones answered 2xx (the Rust
    ledger's fee base). `provider` (the lane's provider) is filled in by the parent before the row
    is stored (busbar/governance/plane.py): the Rust store's metering rows are keyed by it."""

    __slots__ = ("day", "key_id", "group", "model", "pool", "requests", "input_tokens",
                 "output_tokens", "cache_read_tokens", "cache_write_tokens", "billable_requests",
                 "provider")

    def __init__(self, day, key_id, group, model, pool, requests=1, input_tokens=0,
                 output_tokens=0, cache_read_tokens=0, cache_write_tokens=0,
                 billable_requests=None, provider=""):
        self.day = day
        self.key_id = key_id
        self.group = group
        self.model = model
        self.pool = pool
        self.requests = requests
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cache_read_tokens = cache_read_tokens
        self.cache_write_tokens = cache_write_tokens
        self.billable_requests = requests if billable_requests is None else billable_requests
        self.provider = provider


# The counts of a usage row, in the order cbusbar.ledger.UsageRows keeps them.
USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "cache_read_tokens",
                "cache_write_tokens", "billable_requests")
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


# ---------------------------------------------------------------------------- the Rust ledger
# The Rust gateway keeps, per enforcement BUCKET and window, a ledger of admitted requests,
# billable (2xx) requests and tokens per model and tier (store-sqlite `usage_windows`, the valkey
# store's `busbar:usage:<bucket>:<window start>` hashes); spend is derived from the tokens and the
# rate card when read. Buckets: a key's own (its id, window 0: attribution only, no cap) and one
# per (group, window, pool scope) that the group's windowed limits use. busbar writes the same
# ledger (so the Rust gateway reads busbar's usage and the reverse) and starts its own counters
# from it (busbar/governance/plane.py `seed`).
def rust_bucket(group: str, per: str, pool: str | None) -> str:
    """A group's ledger bucket for a window word and pool scope: `group:<name>@<per>`, with
    `#pool:<pool>` for a pool-scoped limit (the Rust cost.rs construction)."""
    bid = "group:%s@%s" % (group, per)
    return bid if pool is None else "%s#pool:%s" % (bid, pool)


def window_start(per: str | None, now: float) -> int:
    """The epoch second the window of `per` containing `now` starts (Rust `budget_window`): UTC
    minute, hour, day, the first of the month; 0 for total (one window forever)."""
    t = int(now)
    span = _SPAN.get(per) if per is not None else None
    if span is not None:
        return t - t % span
    if per == "month":
        g = time.gmtime(t)
        return int(_timegm(g.tm_year, g.tm_mon, 1))
    return 0


def day_epoch(day: str) -> int:
    """'YYYY-MM-DD' as the epoch second its UTC day starts: a Rust metering bucket."""
    y, m, d = day.split("-")
    return int(_timegm(int(y), int(m), int(d)))


def day_of_bucket(bucket: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(bucket))


def ledger_buckets(group: str | None, pool: str | None, lookup) -> list:
    """[(bucket id, window word)] a request of a key in `group` through `pool` is counted in, the
    whole chain up: one per (group, window, pool scope) of the groups' windowed limits that apply
    to `pool`. `lookup(name)` is a GroupRecord or None."""
    out = []
    name = group
    depth = 0
    while name is not None and depth <= MAX_GROUP_DEPTH:
        g = lookup(name)
        if g is None:
            break
        for lim in g.limits:
            if lim.per is None or (lim.pool is not None and lim.pool != pool):
                continue
            b = (rust_bucket(name, lim.per, lim.pool), lim.per)
            if b not in out:
                out.append(b)
        name = g.parent
        depth += 1
    return out


def _row_window(per: str, day: str, now: float) -> int:
    """The window a usage row of UTC day `day` belongs to. The row carries its day only: day, month
    and total windows follow from it; a minute or hour window is the one at `now` (when the parent
    stores the batch, at most two flush intervals after the requests) or, for a row of an earlier
    day, the day's last second."""
    if per in ("minute", "hour"):
        start = day_epoch(day)
        t = now if start <= now < start + 86400 else start + 86399
        return window_start(per, t)
    if per == "total":
        return 0
    return window_start(per, day_epoch(day))


def window_deltas(rows, buckets_of, now: float) -> dict:
    """What a batch of usage rows adds to the ledger: {(bucket id, window start): [requests,
    billable requests, {model: [input, output, cache read, cache write]}]}, the key buckets and the
    group buckets (`buckets_of(group, pool)`, see ledger_buckets)."""
    out = {}
    for u in rows:
        targets = [(u.key_id, 0)]
        if u.group is not None:
            targets += [(bid, _row_window(per, u.day, now)) for bid, per in buckets_of(u.group, u.pool)]
        for target in targets:
            cell = out.get(target)
            if cell is None:
                cell = out[target] = [0, 0, {}]
            cell[0] += u.requests
            cell[1] += u.billable_requests
            if u.model:
                t = cell[2].get(u.model)
                if t is None:
                    t = cell[2][u.model] = [0, 0, 0, 0]
                t[0] += u.input_tokens
                t[1] += u.output_tokens
                t[2] += u.cache_read_tokens
                t[3] += u.cache_write_tokens
    return out


def usage_totals(rows) -> list:
    """Usage rows summed over days and providers, per (key, group at use, model)."""
    acc = {}
    for r in rows:
        k = (r["key_id"], r["group"], r["model"])
        cur = acc.get(k)
        if cur is None:
            acc[k] = {"day": None, "key_id": k[0], "group": k[1], "model": k[2], "provider": None,
                      **{f: r[f] for f in USAGE_FIELDS}}
        else:
            for f in USAGE_FIELDS:
                cur[f] += r[f]
    return list(acc.values())


def limit_value(kind: str, ledger, card, fee: int = 0) -> int:
    """A limit's counter as the ledger (requests, billable, {model: [4 tiers]}) implies it:
    requests admitted; tokens (all four tiers: input, output, cache read and cache write, as the
    Rust ledger's total counts a tokens limit); the budget's spend in nano-units at the current
    rate card, plus `fee` (per_request_fee, nano-units) per billable request."""
    requests, billable, models = ledger
    if kind == "requests":
        return requests
    if kind == "tokens":
        return sum(t[0] + t[1] + t[2] + t[3] for t in models.values())
    if kind == "budget_usd":
        total = fee * billable
        for model, t in models.items():
            rate = (card or {}).get(model)
            if rate is not None:
                total += rate.nano(t[0], t[1], t[2], t[3])
        return total
    return 0


class Rate:
    """The rate card's micro-units per token (= units per million tokens), as configured;
    `nano(usage)` is the cost in nano-units (1 micro-unit per token = 1000 nano-units a token)."""

    __slots__ = ("input", "output", "cache_read", "cache_write")

    def __init__(self, input=0.0, output=0.0, cache_read=0.0, cache_write=0.0):
        self.input = input
        self.output = output
        self.cache_read = cache_read
        self.cache_write = cache_write

    def nano(self, input_tokens, output_tokens, cache_read=0, cache_write=0) -> int:
        return round(1000 * (input_tokens * self.input + output_tokens * self.output +
                             cache_read * self.cache_read + cache_write * self.cache_write))

    def public(self) -> dict:
        return {"input": self.input, "output": self.output, "cache_read": self.cache_read,
                "cache_write": self.cache_write}

    def __eq__(self, other):
        return isinstance(other, Rate) and self.public() == other.public()


def bucket_key(group: str, index: int, lim: Limit) -> str:
    """The counter of one limit of one group across the fleet. The limit's kind and period are
    part of it, so editing a group's limits never carries a count into a different limit."""
    return "%s#%d:%s:%s:%s" % (group, index, lim.kind, lim.per, lim.pool or "")


def _limits_to_dicts(limits) -> list:
    return [dict({"kind": x.kind, "amount": x.amount, "per": x.per, "pool": x.pool},
                 **({"downgrade_to": x.downgrade_to} if x.downgrade_to else {}))
            for x in limits]


def _limits_from_dicts(raw) -> list:
    return [Limit(x["kind"], x["amount"], x.get("per"), x.get("pool"), x.get("downgrade_to"))
            for x in raw]


def group_to_dict(g: GroupRecord) -> dict:
    d = {"name": g.name, "parent": g.parent, "enabled": g.enabled, "source": g.source,
         "limits": _limits_to_dicts(g.limits)}
    if g.child_default is not None:
        d["child_default"] = _limits_to_dicts(g.child_default)
    return d


def group_from_dict(d: dict) -> GroupRecord:
    cd = d.get("child_default")
    return GroupRecord(d["name"], d.get("parent"), d.get("enabled", True),
                       _limits_from_dicts(d.get("limits", ())), d.get("source", "api"),
                       None if cd is None else _limits_from_dicts(cd))


def spend_nano(gov, row) -> int:
    rate = (gov.rate_card or {}).get(row["model"])
    if rate is None:
        return 0
    return rate.nano(row["input_tokens"], row["output_tokens"], row["cache_read_tokens"],
                     row["cache_write_tokens"])


def usd(nano: int) -> float:
    return round(nano / NANO, 9)


# Rows of the stores' keys, credentials and usage tables (SQLite and Postgres read the same
# columns in the same order) as the records busbar works with.

def _usage_row(bucket, key_id, group, model, provider, counts) -> dict:
    row = {"day": day_of_bucket(int(bucket)), "key_id": key_id, "group": group or None,
           "model": model, "provider": provider}
    row.update(zip(USAGE_FIELDS, counts))
    return row


def _vk_of_row(row) -> dict:
    kid, marker, name, pools, enabled, created, group, labels, expires, deleted, rev = row
    try:
        pools = orjson.loads(pools) if pools is not None else None
        if pools is not None and not isinstance(pools, list):
            pools = []
    except orjson.JSONDecodeError:
        pools = []          # unreadable: the narrowest grant, never a wider one
    try:
        labels = orjson.loads(labels)
    except orjson.JSONDecodeError:
        labels = {}
    return {"id": kid, "generation_hash": marker, "name": name, "allowed_pools": pools,
            "enabled": bool(enabled), "created_at": created, "group": group,
            "labels": labels if isinstance(labels, dict) else {}, "expires_at": expires,
            "deleted_at": deleted, "revision": rev}


def _cred_of_row(row) -> dict:
    cid, key_id, kind, slot, public_id, secret, created, updated, expires, revoked, reason, rev = row
    return {"meta": {"id": cid, "key_id": key_id, "kind": kind, "slot": slot,
                     "public_id": public_id, "secret_form": "Recoverable", "created_at": created,
                     "updated_at": updated, "expires_at": expires, "revoked_at": revoked,
                     "revoke_reason": reason, "revision": rev},
            "secret": secret or ""}
