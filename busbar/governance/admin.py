"""Governance endpoints on the admin API (issue 10, issue 38): keys, groups, usage, the signing-key
report and the credential-cache flush under /api/v1/admin, in the Rust gateway's request and
response shapes, status codes and error messages (its openapi.json and keys error wire). The admin
site (busbar/admin/site.py) has already authenticated the call, checked its scope and spent its
mutation budget; every mutation here is audited, applied or rejected (busbar/admin/audit.py).

Governance off (no keys, groups, rate card or store in the running config): a list answers an empty
page, a single read 404 "(governance is not enabled on this server)", a write 409 saying how to turn
it on. The routes exist either way.

A token is shown once, in the 201 of a mint or the 200 of a rotate, and never stored: it is the
Rust gateway's signed token (busbar/governance/model.py), so either gateway verifies it. The AWS
secret issued with a key is shown once too and never returned by a read. A mint or rotate with an
`Idempotency-Key` header answers a retry within IDEMPOTENCY_TTL_SECS with the first answer.

ETags: a key's is the first 16 hex characters of the SHA-256 of its metadata as compact JSON with
sorted keys (the Rust gateway's digest, so an ETag read from either verifies on the other); groups
carry the config-plane version (busbar/admin/site.py config_plane_version), which every group
mutation here bumps.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time

import orjson

from busbar.admin.audit import APPLIED, REJECTED
from busbar.admin.site import (AdminError, Response, bump_plane, check_version, compact_response,
                               config_if_match, config_plane_version, etag, if_match, page,
                               page_params)
from busbar.config.checks import Problems, problem_list
from busbar.server.channel import broadcast

from . import overlay_groups
from .config import check_chains, child_default, group_from_body
from .model import (NANO, NANO_PER_CENT, TOKEN_PREFIX, USAGE_FIELDS, GroupRecord, KeyRecord,
                    limit_value, mint_token, new_aws_access_key_id, new_credential_id,
                    new_generation, new_key_id, rust_bucket, window_start)

log = logging.getLogger("busbar.governance")

P = "/api/v1/admin"
ACK_TIMEOUT_SECS = 5.0
# Length caps on ids and names (the Rust gateway's): a real key id is ~35 characters.
MAX_KEY_ID_LEN = 64
MAX_KEY_NAME_LEN = 256
MAX_GROUP_NAME_LEN = 128
# Mint-time labels become Prometheus label names on the key's series: names busbar attaches itself
# are reserved, and count and lengths are bounded (a bad label would break every scrape).
RESERVED_LABELS = ("key", "bucket", "model", "tier")
MAX_LABELS = 16
MAX_LABEL_NAME_LEN = 64
MAX_LABEL_VALUE_LEN = 256
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# A token lives at most ten years (expires_in / expires_at): beyond is surely a unit mistake.
MAX_TTL_SECS = 10 * 365 * 86400
# A retried mint or rotate with the same Idempotency-Key within this many seconds gets the first
# answer (with its once-shown token) instead of a second key: ten minutes covers a client's retry
# loop, and the cached answers are per principal, so no other admin can replay them.
IDEMPOTENCY_TTL_SECS = 600
# GET /usage: `by_key` holds at most this many keys (the top spenders); the rest sum in `others`.
USAGE_BY_KEY_MAX = 1000
# How long an admin call waits for the store to open at boot before it is refused (a Redis that
# answers at all opens in milliseconds; the socket timeout bounds each try).
STORE_READY_SECS = 10.0

GOV_OFF = ("governance is not enabled on this server; enable `governance:` in config.yaml to "
           "manage virtual keys")
KEY_NOT_FOUND = "key not found"
STALE_KEY = "If-Match ETag is stale: the key changed since you read it (re-read and retry)"
SIGNING_KEY_MESSAGE = (
    "rotating the signing key REVOKES ALL outstanding keys (every token must be re-minted). "
    "busbar is single-key: replace auth.signing_key with fresh material and reload or restart "
    "every node in lockstep, then re-mint keys.")


class _Body:
    """A JSON object body checked as the Rust gateway's typed parse checks it: an object, known
    fields only, each of its type; anything else is 400 "invalid JSON"."""

    @staticmethod
    def parse(req, fields: dict, required=()):
        try:
            body = orjson.loads(req.body or b"")
        except orjson.JSONDecodeError:
            raise AdminError(400, "invalid JSON") from None
        if not isinstance(body, dict) or any(k not in fields for k in body) or any(
                k not in body for k in required):
            raise AdminError(400, "invalid JSON")
        for k, v in body.items():
            if not fields[k](v):
                raise AdminError(400, "invalid JSON")
        return body


def _str(v):
    return isinstance(v, str)


def _opt_str(v):
    return v is None or isinstance(v, str)


def _opt_bool(v):
    return v is None or isinstance(v, bool)


def _opt_str_list(v):
    return v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _labels(v):
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _opt_uint(v):
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _bool(v):
    return isinstance(v, bool)


MINT_FIELDS = {"name": _str, "group": _opt_str, "parent": _opt_str, "allowed_pools": _opt_str_list,
               "labels": _labels, "expires_in": _opt_str, "expires_at": _opt_uint,
               "issue_aws_credential": _bool}
PATCH_FIELDS = {"enabled": _opt_bool, "group": _opt_str}


def parse_duration(text: str) -> int:
    """`<n><s|m|h|d>` in seconds, at most ten years (the Rust gateway's grammar and messages)."""
    s = text.strip()
    i = 0
    while i < len(s) and s[i].isdigit():
        i += 1
    if i == len(s):
        raise ValueError("duration needs a unit (s|m|h|d), e.g. 7d")
    if i == 0:
        raise ValueError("invalid duration '%s': expected <number><s|m|h|d>" % s)
    unit = s[i:]
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(unit)
    if mult is None:
        raise ValueError("invalid duration unit '%s': use s|m|h|d" % unit)
    secs = int(s[:i]) * mult
    if secs > MAX_TTL_SECS:
        raise ValueError("duration is too large (max 10 years)")
    return secs


def check_labels(labels: dict):
    if len(labels) > MAX_LABELS:
        raise AdminError(400, "too many labels: %d (max %d)" % (len(labels), MAX_LABELS))
    for name in sorted(labels):
        value = labels[name]
        if name in RESERVED_LABELS:
            raise AdminError(400, "label name '%s' is reserved (busbar attaches it to metric "
                             "series); reserved names are [%s]" % (
                                 name, ", ".join('"%s"' % r for r in RESERVED_LABELS)))
        if len(name) > MAX_LABEL_NAME_LEN:
            raise AdminError(400, "label name is %d chars; must be <= %d" % (
                len(name), MAX_LABEL_NAME_LEN))
        if not _LABEL_NAME.match(name):
            raise AdminError(400, "label name '%s' is not a valid Prometheus label name (must "
                             "match ^[a-zA-Z_][a-zA-Z0-9_]*$)" % name)
        if len(value) > MAX_LABEL_VALUE_LEN:
            raise AdminError(400, "label '%s' value is %d chars; must be <= %d" % (
                name, len(value), MAX_LABEL_VALUE_LEN))


def key_meta(rec: KeyRecord) -> dict:
    """The Rust key metadata (never a token, generation or secret)."""
    return {"id": rec.id, "name": rec.name, "allowed_pools": rec.allowed_pools,
            "group": rec.group, "enabled": rec.state == "active",
            "created_at": int(rec.created or 0), "labels": dict(rec.labels or {})}


def key_view(rec: KeyRecord) -> dict:
    out = key_meta(rec)
    out["state"] = rec.state
    return out


def key_etag(rec: KeyRecord) -> str:
    """16 hex characters of SHA-256 over the metadata as compact, key-sorted JSON."""
    raw = orjson.dumps(key_meta(rec), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()[:16]


def limit_view(lim) -> dict:
    if lim.kind == "budget_usd":
        out = {"metric": "budget", "amount": lim.amount // NANO_PER_CENT}
    else:
        out = {"metric": lim.kind, "amount": lim.amount}
    if lim.per is not None:
        out["per"] = lim.per
    if lim.pool is not None:
        out["pool"] = lim.pool
    if lim.downgrade_to is not None:
        out["on_exhaust"] = "downgrade"
        out["downgrade_to"] = lim.downgrade_to
    return out


def group_view(g: GroupRecord) -> dict:
    out = {"name": g.name}
    if g.parent is not None:
        out["parent"] = g.parent
    out["enabled"] = g.enabled
    out["limits"] = [limit_view(lim) for lim in g.limits]
    if g.child_default is not None:
        out["child_default"] = [limit_view(lim) for lim in g.child_default]
    return out


def child_template(groups: dict, parent: str | None):
    """The nearest `child_default` up the chain from `parent` (the Rust resolution), or ()."""
    name, depth = parent, 0
    while name is not None and depth < 9:
        g = groups.get(name)
        if g is None:
            break
        if g.child_default is not None:
            return g.child_default
        name, depth = g.parent, depth + 1
    return ()


def _usage(d: dict, nano: int) -> dict:
    """The Rust UsageBreakdown of summed usage counts and their priced nano-units."""
    return {"tokens_input": d["input_tokens"], "tokens_output": d["output_tokens"],
            "tokens_cache_read": d["cache_read_tokens"],
            "tokens_cache_creation": d["cache_write_tokens"], "requests": d["requests"],
            "spend_micros": nano // 1000}


def _nano(card, model, tokens) -> int:
    rate = (card or {}).get(model)
    return 0 if rate is None else rate.nano(*tokens)


def mount(r, gw):
    """Governance's endpoints into `r`, the admin listener's route table (gw.admin_routes)."""
    # (principal, scope, Idempotency-Key) -> (time, Response or None while in flight); at most
    # IDEMPOTENCY_TTL_SECS of a principal's mints and rotates, which its CRUD budget bounds
    idempotent = {}

    def gov():
        return gw.snapshot.governance

    async def store():
        boot = gw.gov_boot
        ready = boot.ready
        if ready is not None and not ready.is_set():
            try:
                await asyncio.wait_for(ready.wait(), STORE_READY_SECS)
            except asyncio.TimeoutError:
                raise AdminError(503, "the governance store is not open yet") from None
        return boot.store

    async def push(msg):
        """A key or group change, in every worker before the call answers (local stores)."""
        gate = gw.gate
        if gate is None or gate.directory.remote:
            return          # the Redis store published the invalidation itself
        gate.directory.apply(msg)
        live = gw.live
        if live is None or not live.workers:
            return
        async with live.lock:
            failed = await broadcast(gw.loop, live.workers, dict(msg, op="gov"), ACK_TIMEOUT_SECS,
                                     lambda ack: ack.get("ok"))
        if failed:
            raise AdminError(500, "internal error")

    async def mirror(st, name, old, mutate):
        """An API group change (already in the store and every worker) into the config overlay's
        `groups` too (busbar/governance/overlay_groups.py); one the overlay cannot take is undone
        (`old`: the group before it, None when there was none) and the call fails."""
        live = gw.live
        if live is None or not hasattr(live, "persist_overlay"):
            return
        try:
            await live.persist_overlay(mutate)
        except Exception as exc:
            if old is None:
                await st.delete_group(name)
                await push({"drop_groups": [name]})
            else:
                await st.put_group(old)
                await push({"groups": [old]})
            log.error("governance: group %s: the config overlay was not written, so the change "
                      "was undone: %s", name, exc)
            raise AdminError(500, "the group change could not be written to the config overlay, "
                             "so it was undone: %s" % exc) from None

    async def reset_api_groups() -> bool:
        """DELETE overlay/groups, the store's half: every group made over the API leaves the store
        and every worker (config.yaml's groups are what is left). True when there was one."""
        if gov() is None:
            return False
        st = await store()
        names = [g.name for g in await st.list_groups() if g.name not in gov().groups]
        for n in names:
            await st.delete_group(n)
        if names:
            await push({"drop_groups": names})
        return bool(names)
    gw.reset_api_groups = reset_api_groups

    async def all_groups(st) -> dict:
        out = {g.name: g for g in await st.list_groups()}
        out.update(gov().groups)
        return out

    def self_service_cap(name) -> int:
        """limits.max_keys_per_principal / max_auto_provisioned_groups of the running config
        (checked >= 0 by the loader; 0, the default, is unlimited)."""
        raw = ((gw.snapshot.config.document or {}).get("limits") or {}).get(name) or 0
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0

    async def check_key_cap(st, group, exclude, doing):
        """limits.max_keys_per_principal: the live keys (enabled, not revoked or deleted) one
        group holds, the unbound ones counting as a group of their own; a user:<sub> leaf is not
        capped (as the Rust gateway counts)."""
        cap = self_service_cap("max_keys_per_principal")
        if not cap or (group or "").startswith("user:"):
            return
        n = sum(1 for k in await st.list_keys()
                if k.group == group and k.id != exclude and k.state == "active")
        if n >= cap:
            raise AdminError(409, "group '%s' already has %d live key(s), at the "
                             "`limits.max_keys_per_principal` cap of %d; revoke or delete %s "
                             "before %s" % (group or "(no group)", n, cap,
                                            "an existing key" if exclude is None else
                                            "one of its keys", doing))

    def overlong(key_id):
        if len(key_id) > MAX_KEY_ID_LEN:
            raise AdminError(400, "id must be <= %d characters" % MAX_KEY_ID_LEN)

    def audited(action, resource_of, write=True):
        """A handler whose every refusal is audited `rejected` under `action` (its success audits
        itself `applied`); `resource_of(req)` names what it acts on."""
        def wrap(handler):
            async def call(req):
                try:
                    return await _guard(handler, req)
                except AdminError:
                    if write:
                        req.audit(action, resource_of(req), REJECTED)
                    raise
            return call
        return wrap

    def key_res(req):
        # An id that cannot be one (too long, or a token pasted where the id goes) is not
        # written to the log: it may be a credential.
        kid = req.params.get("id", "-")
        if len(kid) > MAX_KEY_ID_LEN or kid.startswith(TOKEN_PREFIX):
            kid = "-"
        return "key:%s" % kid

    def group_res(req):
        name = req.params.get("name")
        if name is None:
            try:
                name = orjson.loads(req.body or b"{}").get("name")
            except (orjson.JSONDecodeError, AttributeError):
                name = None
        if not isinstance(name, str) or not name or len(name) > MAX_GROUP_NAME_LEN:
            name = "-"
        return "group:%s" % name

    # ------------------------------------------------------------------ idempotency
    def idem_begin(req, scope):
        raw = req.header(b"idempotency-key")
        if not raw:
            return None
        now = time.time()
        for k in [k for k, (t, _) in idempotent.items() if now - t >= IDEMPOTENCY_TTL_SECS]:
            del idempotent[k]
        ck = (req.principal, scope, raw)
        hit = idempotent.get(ck)
        if hit is not None:
            if hit[1] is None:
                raise AdminError(409, "a request with this Idempotency-Key is already in flight")
            return ("replay", hit[1])
        idempotent[ck] = (now, None)
        return ("new", ck)

    def idem_end(state, resp):
        if state is not None and state[0] == "new":
            if resp is None:
                idempotent.pop(state[1], None)
            else:
                idempotent[state[1]] = (time.time(), resp)

    def replay(resp):
        return Response(resp.status, resp.body, resp.ctype, resp.headers)

    # ------------------------------------------------------------------ keys
    async def create_key(req):
        state = idem_begin(req, "mint")
        if state is not None and state[0] == "replay":
            return replay(state[1])
        resp = None
        try:
            resp = await _mint(req)
            return resp
        finally:
            idem_end(state, resp)

    async def _mint(req):
        g = gov()
        if g is None:
            raise AdminError(409, GOV_OFF)
        body = _Body.parse(req, MINT_FIELDS, ("name",))
        name = body["name"]
        if len(name) > MAX_KEY_NAME_LEN:
            raise AdminError(400, "name must be <= %d characters" % MAX_KEY_NAME_LEN)
        labels = body.get("labels") or {}
        check_labels(labels)
        if g.signing_key is None:
            raise AdminError(409, "signed-token minting is unavailable: no signing key is "
                             "configured (set auth.signing_key - busbar no longer auto-generates "
                             "one; run `busbar --generate-signing-key`)")
        now = int(time.time())
        exp_in, exp_at = body.get("expires_in"), body.get("expires_at")
        if exp_in is not None and exp_at is not None:
            raise AdminError(400, "expires_in and expires_at are mutually exclusive; set at most one")
        if exp_in is not None:
            try:
                exp = now + parse_duration(exp_in)
            except ValueError as e:
                raise AdminError(400, str(e)) from None
        elif exp_at is not None:
            if exp_at <= now:
                raise AdminError(400, "expires_at is in the past")
            exp = exp_at
        else:
            exp = now + g.key_ttl_secs
        pools = body.get("allowed_pools")
        unknown = [p for p in pools or () if p not in gw.snapshot.router.names()]
        if unknown:
            # As the Rust gateway: kept (the pool may be configured later), said in the log.
            log.warning("POST /keys: allowed_pools names no configured pool: %s (key still "
                        "created)", ", ".join(unknown))
        group, parent = body.get("group"), body.get("parent")
        if group is None and parent is not None:
            raise AdminError(400, "`parent` was given without `group`; `parent` names the group to "
                             "auto-provision `group` under, so `group` is required with it")
        st = await store()
        provisioned = False
        if group is not None:
            groups = await all_groups(st)
            have = groups.get(group)
            if have is None and parent is None:
                raise AdminError(400, "group '%s' does not exist in the top-level groups block; "
                                 "either configure it first, or pass `parent: <existing-group>` to "
                                 "auto-provision it as a leaf (e.g. `parent: team-payments` creates "
                                 "%s under team-payments and binds the key)" % (group, group))
            if have is None:
                if len(parent) > MAX_GROUP_NAME_LEN:
                    raise AdminError(400, "parent name is %d chars; must be <= %d" % (
                        len(parent), MAX_GROUP_NAME_LEN))
                if parent not in groups:
                    raise AdminError(400, "cannot auto-provision `%s`: its `parent: %s` does not "
                                     "exist in the top-level groups block; name an existing "
                                     "team/org group" % (group, parent))
                if len(group) > MAX_GROUP_NAME_LEN:
                    raise AdminError(400, "name must be <= %d characters" % MAX_GROUP_NAME_LEN)
                ceiling = self_service_cap("max_auto_provisioned_groups")
                if ceiling and len(groups) >= ceiling:
                    raise AdminError(409, "cannot auto-provision `%s`: this server already has %d "
                                     "group(s), at the `limits.max_auto_provisioned_groups` ceiling "
                                     "of %d. Delete an unused group, raise the ceiling, or bind the "
                                     "key to an existing group" % (group, len(groups), ceiling))
                # its limits: the nearest child_default up the chain (none: inherit-only)
                leaf = GroupRecord(group, parent, True, child_template(groups, parent))
                chk = Problems()
                check_chains({group: leaf}, chk, dict(groups, **{group: leaf}).get)
                if chk.errors:
                    raise AdminError(400, "; ".join(problem_list(chk.errors)[0].values()))
                await st.put_group(leaf)
                await push({"groups": [leaf]})
                await mirror(st, group, None, lambda ov: overlay_groups.put(ov, leaf))
                bump_plane(gw, req.principal, "group.provision group:%s (auto, parent %s)" % (
                    group, parent))
                req.audit("group.provision", "group:%s" % group, APPLIED)
                provisioned = True
            elif parent is not None and have.parent != parent:
                raise AdminError(409, "group `%s` already exists with parent %s; the mint named "
                                 "parent `%s` — a mint cannot re-home an existing group (PATCH the "
                                 "group to re-parent it, or drop `parent` to bind as-is)" % (
                                     group, "`%s`" % have.parent if have.parent else "<root>",
                                     parent))
        await check_key_cap(st, group, None, "minting another")
        rec = KeyRecord(new_key_id(), name, group, pools, "active", now, None, new_generation(),
                        labels=labels)
        token = mint_token(g.signing_key, rec.id, exp, rec.gen)
        secret = None
        if body.get("issue_aws_credential"):
            rec.aws_access_key_id = new_aws_access_key_id()
            rec.aws_cred_id = new_credential_id()
            rec.aws_secret = secret = _aws_secret()
        await st.put_key(rec)
        await push({"keys": [rec]})
        req.audit("key.create", "key:%s" % rec.id, APPLIED)
        out = key_view(rec)
        out.update(token=token, expires_at=exp, group_provisioned=provisioned)
        if secret is not None:
            out.update(aws_access_key_id=rec.aws_access_key_id, aws_secret_access_key=secret)
        return compact_response(out, 201)

    async def list_keys(req):
        enabled = req.query_param("enabled")
        if enabled is not None and enabled not in ("true", "false"):
            raise AdminError(400, "invalid `enabled` filter: expected true|false")
        start_limit = page_params(req)
        include = req.query_param("include")
        if include is not None and include != "tombstoned":
            raise AdminError(400, "invalid `include` filter: expected `tombstoned`")
        if gov() is None:
            return compact_response({"items": [], "next_cursor": None})
        prefix = req.query_param("prefix")
        group = req.query_param("group")
        st = await store()
        rows = sorted((k for k in await st.list_keys()
                       if (include or k.state != "tombstoned")
                       and (enabled is None or (k.state == "active") == (enabled == "true"))
                       and (prefix is None or k.id.startswith(prefix))
                       and (group is None or k.group == group)), key=lambda k: k.id)
        return compact_response(page(req, [key_view(k) for k in rows], start_limit=start_limit))

    async def find_key(req, live_only=False):
        """The key of the path, or 404 (a tombstoned one too when `live_only`)."""
        st = await store()
        rec = await st.get_key(req.params["id"])
        if rec is None or (live_only and rec.state == "tombstoned"):
            raise AdminError(404, KEY_NOT_FOUND)
        return st, rec

    async def show_key(req):
        if gov() is None:
            raise AdminError(404, "key not found (governance is not enabled on this server)")
        overlong(req.params["id"])
        _, rec = await find_key(req)
        return etag(compact_response(key_view(rec)), key_etag(rec))

    def key_guard(req):
        """If-Match for a key: its 16-hex ETag, or None (absent or `*`)."""
        tag = if_match(req)
        if tag is not None and not (len(tag) == 16 and all(c in "0123456789abcdefABCDEF" for c in tag)):
            raise AdminError(400, "malformed If-Match: expected the key's ETag (16 hex chars, "
                             "quoted) or *")
        return tag

    async def patch_key(req):
        if gov() is None:
            raise AdminError(409, GOV_OFF)
        overlong(req.params["id"])
        tag = key_guard(req)
        body = _Body.parse(req, PATCH_FIELDS)
        st = await store()
        group = body.get("group")
        if group is not None and group not in await all_groups(st):
            raise AdminError(400, "group '%s' does not exist in the top-level groups block; "
                             "configure it first (e.g. %s: { limits: [ { budget: 0, per: month } "
                             "] })" % (group, group))
        _, rec = await find_key(req, live_only=True)
        if tag is not None and tag.lower() != key_etag(rec):
            raise AdminError(409, STALE_KEY, code="version_conflict")
        dest = group if "group" in body else rec.group
        enabled_after = body["enabled"] if body.get("enabled") is not None else (
            rec.state == "active")
        will_count = enabled_after and rec.state in ("active", "disabled")
        if will_count and (rec.state != "active" or dest != rec.group):
            await check_key_cap(st, dest, rec.id, "rebinding or re-enabling another into it")
        rec = KeyRecord.from_dict(rec.to_dict())
        if body.get("enabled") is not None and rec.state in ("active", "disabled"):
            rec.state = "active" if body["enabled"] else "disabled"
        if "group" in body:
            rec.group = group       # null unbinds: authed and unlimited
        await st.put_key(rec)
        await push({"keys": [rec]})
        req.audit("key.patch", key_res(req), APPLIED)
        return compact_response(key_view(rec))

    async def delete_key(req):
        if gov() is None:
            raise AdminError(409, GOV_OFF)
        overlong(req.params["id"])
        tag = key_guard(req)
        st, rec = await find_key(req, live_only=True)
        if tag is not None and tag.lower() != key_etag(rec):
            raise AdminError(409, STALE_KEY, code="version_conflict")
        # A tombstone: the row stays (usage and audit refer to it), the id is denylisted, its
        # credentials are destroyed; the token fails everywhere.
        await st.delete_key(rec.id)
        await push({"keys": [await st.get_key(rec.id)]})
        req.audit("key.delete", key_res(req), APPLIED)
        return Response(204, b"")

    async def revoke_key(req):
        if gov() is None:
            raise AdminError(409, GOV_OFF)
        overlong(req.params["id"])
        st, rec = await find_key(req)
        if rec.state not in ("revoked", "tombstoned"):
            # Denylisted for good (the store does it for state "revoked") and a new generation,
            # so a token in flight anywhere fails on that too. There is no un-revoke.
            rec = KeyRecord.from_dict(rec.to_dict())
            rec.state = "revoked"
            rec.gen = new_generation()
            await st.put_key(rec)
            await push({"keys": [rec]})
        req.audit("key.revoke", key_res(req), APPLIED)
        return compact_response({"revoked": rec.id})

    async def rotate_key(req):
        state = idem_begin(req, "rotate:%s" % req.params["id"])
        if state is not None and state[0] == "replay":
            return replay(state[1])
        resp = None
        try:
            resp = await _rotate(req)
            return resp
        finally:
            idem_end(state, resp)

    async def _rotate(req):
        g = gov()
        if g is None:
            raise AdminError(409, GOV_OFF)
        st, rec = await find_key(req, live_only=True)
        if g.signing_key is None:
            raise AdminError(409, "signed-token minting is unavailable: no signing key is "
                             "configured (set auth.signing_key)")
        # A new generation: every token minted before carries the old one and stops verifying in
        # every instance reading this store. The state is left as it was (a revoked key stays
        # revoked); the AWS pair is a credential of its own and stays.
        rec = KeyRecord.from_dict(rec.to_dict())
        rec.gen = new_generation()
        exp = int(time.time()) + g.key_ttl_secs
        token = mint_token(g.signing_key, rec.id, exp, rec.gen)
        await st.put_key(rec)
        await push({"keys": [rec]})
        req.audit("key.rotate", key_res(req), APPLIED)
        out = key_view(rec)
        out.update(token=token, expires_at=exp)
        return compact_response(out)

    async def key_usage(req):
        g = gov()
        if g is None:
            raise AdminError(404, "key not found (governance is not enabled on this server)")
        overlong(req.params["id"])
        st, rec = await find_key(req, live_only=True)
        await _flush()
        now = int(time.time())
        requests = tokens = nano = 0
        for row in await st.usage_rows():
            if row["key_id"] != rec.id:
                continue
            requests += row["requests"]
            t = (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"],
                 row["cache_write_tokens"])
            tokens += sum(t)
            nano += _nano(g.rate_card, row["model"], t) + g.fee * row["billable_requests"]
        groups = await all_groups(st)
        return compact_response({
            "id": rec.id, "budget_period": "total", "window_start": 0, "as_of": now,
            "group": rec.group, "spend_cents": nano // NANO_PER_CENT, "tokens": tokens,
            "requests": requests,
            "rate_headroom": await _headroom(st, g, groups, rec.group, now)})

    async def _headroom(st, g, groups, group, now):
        """The fraction [0, 1] left of the tightest requests/tokens limit up the key's group
        chain, each in its own current window; None without such a limit."""
        best = None
        name, depth = group, 0
        while name is not None and depth < 9:
            grp = groups.get(name)
            if grp is None:
                break
            for lim in grp.limits:
                if lim.kind not in ("requests", "tokens") or lim.per is None or lim.amount <= 0:
                    continue
                ledger = await _window(st, rust_bucket(name, lim.per, lim.pool),
                                       window_start(lim.per, now))
                used = limit_value(lim.kind, ledger, g.rate_card)
                left = max(0.0, 1.0 - used / lim.amount)
                best = left if best is None else min(best, left)
            name = grp.parent
            depth += 1
        return best

    async def _flush():
        gate = gw.gate
        if gate is not None and gate.batcher is not None:
            gate.batcher.flush()
            await asyncio.sleep(0)

    async def rotate_signing_key(req):
        g = gov()
        if g is None:
            raise AdminError(409, GOV_OFF)
        if g.signing_key is None:
            raise AdminError(409, "no signing key is configured; nothing to rotate")
        req.audit("signing_key.report", "signing-key", APPLIED)
        return compact_response({"current_kid": g.signing_key.kid, "revoke_all": True,
                                 "message": SIGNING_KEY_MESSAGE})

    async def flush_cache(req):
        body = {}
        if req.body:
            try:
                body = orjson.loads(req.body)
            except orjson.JSONDecodeError:
                body = None
            if not isinstance(body, dict) or not _opt_str(body.get("module")):
                raise AdminError(400, "body must be JSON with an optional string `module` (the "
                                 "auth module whose partition to flush)")
        module = body.get("module")
        flushed = 0
        # busbar's one cache of credential decisions is the verified virtual-key tokens (the
        # `keys` identity provider); another module has nothing cached.
        if module in (None, "keys"):
            flushed = gw.gate.flush_credentials() if gw.gate is not None else 0
            live = gw.live
            if live is not None and live.workers:
                acks = {}

                def ok(ack):
                    acks[id(ack)] = ack
                    return ack.get("ok")
                async with live.lock:
                    failed = await broadcast(gw.loop, live.workers, {"op": "auth_flush"},
                                             ACK_TIMEOUT_SECS, ok)
                if failed:
                    raise AdminError(500, "internal error")
                flushed += sum(a.get("flushed", 0) for a in acks.values())
        req.audit("auth.cache_flush", module or "*", APPLIED)
        return compact_response({"flushed": flushed})

    # ------------------------------------------------------------------ groups
    def plane_etag(resp):
        return etag(resp, config_plane_version(gw))

    async def list_groups(req):
        start_limit = page_params(req)
        if gov() is None:
            return plane_etag(compact_response({"items": [], "next_cursor": None}))
        groups = await all_groups(await store())
        rows = [group_view(groups[n]) for n in sorted(groups)]
        return plane_etag(compact_response(page(req, rows, start_limit=start_limit)))

    async def show_group(req):
        name = req.params["name"]
        g = gov()
        groups = await all_groups(await store()) if g is not None else {}
        if name not in groups:
            raise AdminError(404, "group `%s` not found" % name)
        return plane_etag(compact_response(group_view(groups[name])))

    def base_owned(name):
        if name in gov().groups:
            raise AdminError(409, "group '%s' is defined in config.yaml (base config): the API "
                             "never shadows file config; edit config.yaml and reload" % name)

    def governance_on():
        if gov() is None:
            raise AdminError(409, "governance is not enabled on this server; enable `governance:` "
                             "in config.yaml to manage groups")

    async def save_group(req, st, name, entry, where, action):
        if not isinstance(entry, dict):
            raise AdminError(400, "invalid JSON")
        out = Problems()
        from .config import GROUP_KEYS
        unknown = [k for k in entry if k not in GROUP_KEYS]
        if unknown:
            raise AdminError(400, "%s: unknown field `%s` (expected one of %s)" % (
                where, unknown[0], ", ".join(GROUP_KEYS)))
        cfg = gw.snapshot.config
        pools = set(cfg.pools) | set(cfg.models)    # what a limit's pool: may scope to
        g = group_from_body(name, entry, where, out, pools=pools, pool_names=set(cfg.pools))
        cd = child_default(entry.get("child_default"), where + ".child_default", pools, out,
                           set(cfg.pools))
        if g is not None:
            g.child_default = cd
        if g is None or out.errors:
            raise AdminError(400, "invalid group: " + "; ".join(
                "%s: %s" % (p["path"], p["message"]) for p in problem_list(out.errors)))
        groups = await all_groups(st)
        groups[name] = g
        chk = Problems()
        check_chains({name: g}, chk, groups.get)
        if chk.errors:
            raise AdminError(400, "invalid tree: " + "; ".join(
                "%s: %s" % (p["path"], p["message"]) for p in problem_list(chk.errors)))
        old = await st.get_group(name)
        await st.put_group(g)
        await push({"groups": [g]})
        await mirror(st, name, old, lambda ov: overlay_groups.put(ov, g))
        bump_plane(gw, req.principal, "%s group:%s" % (action, name))
        return g

    async def create_group(req):
        governance_on()
        expected = config_if_match(req)
        body = _Body.parse(req, {"name": _str, "config": lambda v: isinstance(v, dict)},
                           ("name", "config"))
        name = body["name"]
        if not name or len(name) > MAX_GROUP_NAME_LEN:
            raise AdminError(400, "name: expected a group name of at most %d characters"
                             % MAX_GROUP_NAME_LEN)
        check_version(expected, config_plane_version(gw))
        base_owned(name)
        st = await store()
        existed = await st.get_group(name) is not None
        g = await save_group(req, st, name, body["config"], "groups.%s" % name, "group.create")
        req.audit("group.create", "group:%s" % name, APPLIED)
        return plane_etag(compact_response(group_view(g), 200 if existed else 201))

    async def replace_group(req):
        governance_on()
        name = req.params["name"]
        expected = config_if_match(req)
        body = _Body.parse(req, {"config": lambda v: isinstance(v, dict)}, ("config",))
        check_version(expected, config_plane_version(gw))
        base_owned(name)
        st = await store()
        if await st.get_group(name) is None:
            raise AdminError(404, "group `%s` not found" % name)
        g = await save_group(req, st, name, body["config"], "groups.%s" % name, "group.replace")
        req.audit("group.replace", "group:%s" % name, APPLIED)
        return plane_etag(compact_response(group_view(g)))

    async def patch_group(req):
        governance_on()
        name = req.params["name"]
        expected = config_if_match(req)
        try:
            body = orjson.loads(req.body or b"")
        except orjson.JSONDecodeError:
            raise AdminError(400, "invalid JSON") from None
        if not isinstance(body, dict):
            raise AdminError(400, "invalid JSON")
        for k in body:
            if k not in ("parent", "enabled", "limits", "child_default"):
                raise AdminError(400, "unknown field `%s` (expected parent, enabled, limits, "
                                 "child_default)" % k)
        check_version(expected, config_plane_version(gw))
        base_owned(name)
        st = await store()
        old = await st.get_group(name)
        if old is None:
            raise AdminError(404, "group `%s` not found" % name)
        entry = {"parent": old.parent, "enabled": old.enabled,
                 "limits": [lim.public() for lim in old.limits]}
        if old.child_default is not None:
            entry["child_default"] = {"limits": [lim.public() for lim in old.child_default]}
        entry.update({k: v for k, v in body.items() if v is not None or k == "limits"})
        g = await save_group(req, st, name, entry, "groups.%s" % name, "group.patch")
        req.audit("group.patch", "group:%s" % name, APPLIED)
        return plane_etag(compact_response(group_view(g)))

    async def delete_group(req):
        governance_on()
        name = req.params["name"]
        expected = config_if_match(req)
        check_version(expected, config_plane_version(gw))
        base_owned(name)
        st = await store()
        if await st.get_group(name) is None:
            raise AdminError(404, "group `%s` not found" % name)
        groups = await all_groups(st)
        children = sorted(g.name for g in groups.values() if g.parent == name)
        if children:
            raise AdminError(409, "group '%s' is still the parent of %s; re-parent or remove them "
                             "first" % (name, ", ".join(children)))
        bound = [k.id for k in await st.list_keys() if k.group == name and k.state != "tombstoned"]
        if bound:
            raise AdminError(409, "group '%s' still has %d key(s) bound; rebind or delete them "
                             "first" % (name, len(bound)))
        old = await st.get_group(name)
        await st.delete_group(name)
        await push({"drop_groups": [name]})
        await mirror(st, name, old, lambda ov: overlay_groups.drop(ov, name))
        bump_plane(gw, req.principal, "group.delete group:%s" % name)
        req.audit("group.delete", "group:%s" % name, APPLIED)
        return plane_etag(Response(204, b""))

    async def group_usage(req):
        name = req.params["name"]
        g = gov()
        st = await store() if g is not None else None
        groups = await all_groups(st) if g is not None else {}
        grp = groups.get(name)
        if grp is None:
            raise AdminError(404, "group `%s` not found" % name)
        await _flush()
        now = int(time.time())
        buckets = {}
        for lim in grp.limits:
            if lim.per is None:
                continue            # a concurrent limit has no windowed ledger
            b = buckets.get((lim.per, lim.pool))
            if b is None:
                ledger = await _window(st, rust_bucket(name, lim.per, lim.pool),
                                       window_start(lim.per, now))
                requests, _billable, models = ledger
                nano = limit_value("budget_usd", ledger, g.rate_card, g.fee)
                b = buckets[(lim.per, lim.pool)] = {"window": lim.per}
                if lim.pool is not None:
                    b["pool"] = lim.pool
                b.update(requests=requests, tokens=sum(sum(t) for t in models.values()),
                         spend_cents=nano // NANO_PER_CENT)
            if lim.kind == "requests":
                b["requests_cap"] = lim.amount
            elif lim.kind == "tokens":
                b["tokens_cap"] = lim.amount
            elif lim.kind == "budget_usd":
                cap = lim.amount // NANO_PER_CENT
                b["budget_cap"] = cap
                b["budget_remaining_cents"] = max(0, cap - b["spend_cents"])
        return compact_response({"group": name, "enabled": grp.enabled,
                                 "buckets": list(buckets.values()), "as_of": now})

    # ------------------------------------------------------------------ usage
    async def usage(req):
        now = int(time.time())
        today = now - now % 86400
        raw = req.query_param("window")
        if raw is None:
            start = today
        else:
            if not raw.isdigit() or int(raw) % 86400 or int(raw) > today:
                raise AdminError(400, "invalid `window`: expected the start (epoch seconds) of a "
                                 "UTC-day metering bucket, not in the future")
            start = int(raw)
        g = gov()
        zero = dict.fromkeys(USAGE_FIELDS, 0)
        total, tnano = dict(zero), 0
        by_model, by_key = {}, {}
        names = {}
        if g is not None:
            st = await store()
            await _flush()
            names = {k.id: (k.name if k.state != "tombstoned" else None)
                     for k in await st.list_keys()}
            day = time.strftime("%Y-%m-%d", time.gmtime(start))
            for row in await st.usage_rows(day):
                t = (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"],
                     row["cache_write_tokens"])
                nano = _nano(g.rate_card, row["model"], t) + g.fee * row["billable_requests"]
                tnano += nano
                for bucket, k in ((by_model, (row["model"], row["provider"] or "")),
                                  (by_key, row["key_id"])):
                    cell = bucket.setdefault(k, [dict(zero), 0])
                    for f in USAGE_FIELDS:
                        cell[0][f] += row[f]
                    cell[1] += nano
                for f in USAGE_FIELDS:
                    total[f] += row[f]
        models = [{"model": m, "provider": p, **_usage(c, n)}
                  for (m, p), (c, n) in sorted(by_model.items(), key=lambda kv: (-kv[1][1], kv[0]))]
        ranked = sorted(by_key.items(), key=lambda kv: (-kv[1][1], kv[0]))
        keys = [{"id": k, "name": names.get(k), **_usage(c, n)}
                for k, (c, n) in ranked[:USAGE_BY_KEY_MAX]]
        out = {"window": {"start": start, "end": start + 86400}, "as_of": now, "currency": "USD",
               "total": _usage(total, tnano), "by_model": models, "by_key": keys,
               "by_key_truncated": len(ranked) > USAGE_BY_KEY_MAX}
        if out["by_key_truncated"]:
            rest, rnano = dict(zero), 0
            for _, (c, n) in ranked[USAGE_BY_KEY_MAX:]:
                for f in USAGE_FIELDS:
                    rest[f] += c[f]
                rnano += n
            out["others"] = _usage(rest, rnano)
        return compact_response(out)

    for method, path, handler, summary, action, res in (
        ("POST", "/keys", create_key, "mint a virtual key (the token is shown once)", "key.create",
         lambda req: "key:-"),
        ("GET", "/keys", list_keys, "list virtual keys (?enabled= ?prefix= ?group= ?include= "
         "?limit= ?cursor=)", None, None),
        ("GET", "/keys/{id}", show_key, "one virtual key, with its ETag", None, None),
        ("PATCH", "/keys/{id}", patch_key, "enable/disable a key or rebind its group (If-Match)",
         "key.patch", key_res),
        ("DELETE", "/keys/{id}", delete_key, "tombstone a key (If-Match)", "key.delete", key_res),
        ("POST", "/keys/{id}/revoke", revoke_key, "revoke a key for good", "key.revoke", key_res),
        ("POST", "/keys/{id}/rotate", rotate_key, "a new token for the same key; the old one fails",
         "key.rotate", key_res),
        ("GET", "/keys/{id}/usage", key_usage, "a key's all-time attribution counters", None, None),
        ("POST", "/signing-key/rotate", rotate_signing_key, "the signing key's id and the "
         "revoke-all warning", "signing_key.report", lambda req: "signing-key"),
        ("POST", "/auth/cache/flush", flush_cache, "drop every worker's verified-credential cache",
         "auth.cache_flush", lambda req: "*"),
        ("GET", "/groups", list_groups, "every group, name-sorted (config-plane ETag)", None, None),
        ("POST", "/groups", create_group, "create or replace an API group (If-Match)",
         "group.create", group_res),
        ("GET", "/groups/{name}", show_group, "one group (config-plane ETag)", None, None),
        ("PUT", "/groups/{name}", replace_group, "replace an API group (If-Match)",
         "group.replace", group_res),
        ("PATCH", "/groups/{name}", patch_group, "change some fields of an API group (If-Match)",
         "group.patch", group_res),
        ("DELETE", "/groups/{name}", delete_group, "delete an API group (If-Match)",
         "group.delete", group_res),
        ("GET", "/groups/{name}/usage", group_usage, "a group's current-window usage per bucket",
         None, None),
        ("GET", "/usage", usage, "one UTC day's usage by model and by key (?window=)", None, None),
    ):
        h = audited(action, res)(handler) if action else _reads(handler)
        r.add(method, P + path, h, summary="governance: " + summary)


async def _window(st, bucket, start):
    """A bucket's ledger (requests, billable, {model: [4 tiers]}) from a local store (a call) or
    Redis (a coroutine, whose fourth item, busbar's reservations in flight, is not usage)."""
    ledger = st.window(bucket, start)
    if asyncio.iscoroutine(ledger):
        ledger = await ledger
    return ledger[:3]


def _reads(handler):
    async def call(req):
        return await _guard(handler, req)
    return call


async def _guard(handler, req):
    """Redis not answering is the store's state, not busbar's fault: a 503 that says so (the URL
    without its password), no traceback. A store that refuses (a schema it does not read, a
    deleted key written back) is a 409 saying why."""
    from .model import StoreError
    try:
        return await handler(req)
    except StoreError as exc:
        raise AdminError(409, str(exc)) from None
    except AdminError:
        raise
    except Exception as exc:
        from .redis_store import StoreUnavailable
        if isinstance(exc, StoreUnavailable):
            raise AdminError(503, "the governance store is unreachable: %s" % exc) from None
        raise


def _aws_secret() -> str:
    """40 characters of base64 over 30 random bytes (240 bits): the shape of an AWS secret key."""
    import base64
    return base64.b64encode(os.urandom(30)).decode("ascii")


__all__ = ["mount", "key_etag", "key_meta", "parse_duration", "NANO"]
