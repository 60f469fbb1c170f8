"""Governance endpoints on the admin API (issue 10; SPEC §5, §6): keys, groups and usage under
/api/v1/admin. Mutations need the `full` scope (the admin site derives it from the method).

A token is shown once, in the 201 of a mint or the 200 of a rotate, and never stored: it is the
Rust gateway's signed token (busbar/governance/model.py), so either gateway verifies it. The AWS
secret issued with a key is shown once too and never returned by a read.
"""
from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime

import orjson

from busbar.admin.site import AdminError, json_response
from busbar.config.checks import Problems, problem_list
from busbar.server.channel import broadcast

from .config import group_from_body
from .model import (USAGE_FIELDS, KeyRecord, iso_utc, mint_token, new_aws_access_key_id,
                    new_credential_id, new_generation, new_key_id, spend_nano, usd)

# Keys are minted for auth.key_ttl (90 days by default, SPEC §5) unless the body says otherwise.
# A key may live at most ten years; a longer expiry is almost surely a unit mistake. A token always
# carries an expiry (the Rust format's `exp` is required), so `expires_in_days: null` is that most.
MAX_KEY_DAYS = 3650
# A key's labels as JSON: the Rust store's keys.labels CHECK allows at most this.
MAX_LABELS_BYTES = 4096
NAME_MAX = 200
ACK_TIMEOUT_SECS = 5.0


def mount(r, gw):
    """Governance's endpoints into `r`, the admin listener's route table (gw.admin_routes)."""
    P = "/api/v1/admin"
    boot = _Boot(gw)

    def gov():
        g = gw.snapshot.governance
        if g is None:
            raise AdminError(409, "governance is off in the running config")
        return g

    store = lambda: boot.store          # noqa: E731

    async def push(msg):
        """A key or group change, in every worker before the call answers (local stores)."""
        gate = gw.gate
        if gate.directory.remote:
            return          # the Redis store published the invalidation itself
        gate.directory.apply(msg)
        live = gw.live
        if live is None or not live.workers:
            return
        async with live.lock:
            failed = await broadcast(gw.loop, live.workers, dict(msg, op="gov"), ACK_TIMEOUT_SECS,
                                     lambda ack: ack.get("ok"))
        if failed:
            raise AdminError(500, "worker(s) %s did not take the change" % ", ".join(map(str, failed)),
                             code="internal")

    async def find_group(name):
        g = gov().groups.get(name)
        if g is not None:
            return g
        return await store().get_group(name)

    async def get_key(key_id):
        rec = await store().get_key(key_id)
        if rec is None or rec.state == "tombstoned":
            raise AdminError(404, "no key '%s'" % key_id)
        return rec

    def check_pools(pools):
        if pools is None:
            return None
        if not isinstance(pools, list) or any(not isinstance(p, str) for p in pools):
            raise AdminError(400, "allowed_pools: expected a list of pool names")
        names = gw.snapshot.router.names()
        unknown = [p for p in pools if p not in names]
        if unknown:
            raise AdminError(400, "allowed_pools: unknown pool(s) %s" % ", ".join(unknown))
        return list(pools)

    async def shown_once(rec, token, exp, secret, status):
        """Store and push a key, and answer with its token (and AWS secret): the only time
        either is shown. `expires_at` is the token's expiry."""
        await store().put_key(rec)
        await push({"keys": [rec]})
        out = rec.public()
        out["token"] = token
        out["expires_at"] = iso_utc(exp)
        if secret is not None:
            out["aws_secret_access_key"] = secret
        return json_response(out, status)

    # ------------------------------------------------------------------ keys
    async def create_key(req):
        g = gov()
        if g.signing_key is None:
            raise AdminError(409, "no auth.signing_key configured: keys cannot be minted")
        body = req.json()
        if not isinstance(body, dict):
            raise AdminError(400, "expected a JSON object {name, group, ...}")
        name = body.get("name")
        if not isinstance(name, str) or not name or len(name) > NAME_MAX:
            raise AdminError(400, "name: expected a non-empty string of at most %d characters" % NAME_MAX)
        group = body.get("group")
        if group is not None:
            if not isinstance(group, str) or await find_group(group) is None:
                raise AdminError(400, "group: unknown group '%s'" % group)
        pools = check_pools(body.get("allowed_pools"))
        days = body.get("expires_in_days", g.key_ttl_secs / 86400)
        if days is not None and (isinstance(days, bool) or not isinstance(days, (int, float))
                                 or not 0 < days <= MAX_KEY_DAYS):
            raise AdminError(400, "expires_in_days: expected a number of days in (0, %d], or null "
                             "for a key that does not expire" % MAX_KEY_DAYS)
        labels = body.get("labels") or {}
        if not isinstance(labels, dict) or any(not isinstance(v, str) for v in labels.values()):
            raise AdminError(400, "labels: expected an object of strings, like {\"team\": \"growth\"}")
        if len(orjson.dumps(labels)) > MAX_LABELS_BYTES:
            raise AdminError(400, "labels: at most %d bytes of JSON" % MAX_LABELS_BYTES)
        now = int(time.time())
        exp = now + int((MAX_KEY_DAYS if days is None else days) * 86400)
        kid = new_key_id()
        gen = new_generation()
        token = mint_token(g.signing_key, kid, exp, gen)
        rec = KeyRecord(kid, name, group, pools, "active", now, None, gen, labels=labels)
        secret = None
        if body.get("issue_aws_credential"):
            rec.aws_access_key_id = new_aws_access_key_id()
            rec.aws_cred_id = new_credential_id()
            secret = _aws_secret()
            rec.aws_secret = secret
        return await shown_once(rec, token, exp, secret, 201)

    async def list_keys(req):
        keys = [k.public() for k in await store().list_keys() if k.state != "tombstoned"]
        keys.sort(key=lambda k: k["created_at"] or "")
        return json_response({"items": keys})

    async def show_key(req):
        return json_response((await get_key(req.params["id"])).public())

    async def patch_key(req):
        rec = await get_key(req.params["id"])
        body = req.json()
        if not isinstance(body, dict):
            raise AdminError(400, "expected a JSON object {enabled?, group?, allowed_pools?}")
        unknown = [k for k in body if k not in ("enabled", "group", "allowed_pools", "name", "labels")]
        if unknown:
            raise AdminError(400, "unknown field(s): %s" % ", ".join(unknown))
        if rec.state == "revoked":
            raise AdminError(409, "key '%s' is revoked; a revoked key cannot be changed" % rec.id)
        if "enabled" in body:
            if not isinstance(body["enabled"], bool):
                raise AdminError(400, "enabled: expected true or false")
            rec.state = "active" if body["enabled"] else "disabled"
        if "group" in body:
            group = body["group"]
            if group is not None and (not isinstance(group, str) or await find_group(group) is None):
                raise AdminError(400, "group: unknown group '%s'" % group)
            rec.group = group
        if "allowed_pools" in body:
            rec.allowed_pools = check_pools(body["allowed_pools"])
        if "name" in body:
            if not isinstance(body["name"], str) or not body["name"]:
                raise AdminError(400, "name: expected a non-empty string")
            rec.name = body["name"]
        await store().put_key(rec)
        await push({"keys": [rec]})
        return json_response(rec.public())

    async def revoke_key(req):
        rec = await get_key(req.params["id"])
        # As the Rust gateway revokes: the id on the denylist and its AWS pair revoked (the store
        # does both for state "revoked"), a new generation (a token in flight anywhere fails on
        # that too), disabled. There is no way back.
        rec.state = "revoked"
        rec.gen = new_generation()
        await store().put_key(rec)
        await push({"keys": [rec]})
        return json_response(rec.public())

    async def rotate_key(req):
        g = gov()
        rec = await get_key(req.params["id"])
        if rec.state == "revoked":
            raise AdminError(409, "key '%s' is revoked; it cannot be rotated" % rec.id)
        if g.signing_key is None:
            raise AdminError(409, "no auth.signing_key configured")
        # A new generation: every token minted before carries the old one and stops verifying,
        # in every instance reading this store. The AWS pair is a credential of its own and stays
        # (as the Rust gateway's rotate leaves it).
        rec.gen = new_generation()
        exp = int(time.time()) + g.key_ttl_secs
        token = mint_token(g.signing_key, rec.id, exp, rec.gen)
        return await shown_once(rec, token, exp, None, 200)

    async def delete_key(req):
        rec = await get_key(req.params["id"])
        # A tombstone: the row stays (usage refers to it), the id is denylisted, its credentials
        # are destroyed; the token fails everywhere.
        await store().delete_key(rec.id)
        rec = await store().get_key(rec.id)
        await push({"keys": [rec]})
        return json_response({"id": rec.id, "deleted": True})

    # ------------------------------------------------------------------ groups
    async def all_groups():
        out = dict((g.name, g) for g in await store().list_groups())
        out.update(gov().groups)
        return out

    async def list_groups(req):
        return json_response({"items": [g.public() for g in (await all_groups()).values()]})

    async def show_group(req):
        g = await find_group(req.params["name"])
        if g is None:
            raise AdminError(404, "no group '%s'" % req.params["name"])
        return json_response(g.public())

    async def save_group(name, body, old=None):
        if not isinstance(body, dict):
            raise AdminError(400, "expected a JSON object {parent?, limits?, enabled?}")
        unknown = [k for k in body if k not in ("name", "parent", "limits", "enabled")]
        if unknown:
            raise AdminError(400, "unknown field(s): %s" % ", ".join(unknown))
        merged = {"parent": old.parent, "enabled": old.enabled,
                  "limits": [lim.public() for lim in old.limits]} if old is not None else {}
        merged.update({k: v for k, v in body.items() if k != "name"})
        out = Problems()
        g = group_from_body(name, merged, "groups.%s" % name, out,
                            pools=set(gw.snapshot.router.names()))
        if g is None or out.errors:
            raise AdminError(400, "invalid group", problems=problem_list(out.errors))
        groups = await all_groups()
        groups[name] = g
        from .config import check_chains
        chk = Problems()
        check_chains({name: g}, chk, groups.get)
        if chk.errors:
            raise AdminError(400, "invalid group", problems=problem_list(chk.errors))
        await store().put_group(g)
        await push({"groups": [g]})
        return g

    async def create_group(req):
        body = req.json()
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name or len(name) > 128:
            raise AdminError(400, "name: expected a group name (at most 128 characters)")
        if await find_group(name) is not None:
            raise AdminError(409, "group '%s' exists" % name)
        g = await save_group(name, body)
        return json_response(g.public(), 201)

    def file_owned(name):
        if name in gov().groups:
            raise AdminError(409, "group '%s' is defined in the config file; change it there" % name)

    async def patch_group(req):
        name = req.params["name"]
        file_owned(name)
        old = await store().get_group(name)
        if old is None:
            raise AdminError(404, "no group '%s'" % name)
        g = await save_group(name, req.json(), old)
        return json_response(g.public())

    async def delete_group(req):
        name = req.params["name"]
        file_owned(name)
        if await store().get_group(name) is None:
            raise AdminError(404, "no group '%s'" % name)
        groups = await all_groups()
        children = [g.name for g in groups.values() if g.parent == name]
        if children:
            raise AdminError(409, "group '%s' is the parent of %s" % (name, ", ".join(children)))
        users = [k.id for k in await store().list_keys() if k.group == name and k.state != "tombstoned"]
        if users:
            raise AdminError(409, "group '%s' has %d key(s); move them first" % (name, len(users)))
        await store().delete_group(name)
        await push({"drop_groups": [name]})
        return json_response({"name": name, "deleted": True})

    # ------------------------------------------------------------------ usage
    async def rows(day=None):
        gate = gw.gate
        if gate.batcher is not None:
            gate.batcher.flush()
            await asyncio.sleep(0)
        return await store().usage_rows(day)

    def summarize(rs):
        g = gov()
        total = dict.fromkeys(USAGE_FIELDS, 0)
        days = {}
        nano_total = 0
        for row in rs:
            d = days.setdefault(row["day"], dict.fromkeys(USAGE_FIELDS, 0) | {"_nano": 0})
            nano = spend_nano(g, row)
            for f in USAGE_FIELDS:
                d[f] += row[f]
                total[f] += row[f]
            d["_nano"] += nano
            nano_total += nano
        out_days = []
        for day in sorted(days):
            d = days[day]
            nano = d.pop("_nano")
            out_days.append(_public_usage(d, nano) | {"day": day})
        return {"total": _public_usage(total, nano_total), "days": out_days}

    async def key_usage(req):
        rec = await get_key(req.params["id"])
        return json_response({"id": rec.id, **summarize(
            [x for x in await rows() if x["key_id"] == rec.id])})

    async def group_usage(req):
        name = req.params["name"]
        if await find_group(name) is None:
            raise AdminError(404, "no group '%s'" % name)
        groups = await all_groups()

        def under(grp):
            seen = 0
            while grp is not None and seen < 9:
                if grp == name:
                    return True
                g = groups.get(grp)
                grp = g.parent if g is not None else None
                seen += 1
            return False
        return json_response({"name": name, **summarize(
            [x for x in await rows() if under(x["group"])])})

    async def usage(req):
        day = None
        for part in (req.query or "").split("&"):
            if part.startswith("day="):
                day = part[4:]
        if day is None:
            day = time.strftime("%Y-%m-%d", time.gmtime())
        try:
            datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise AdminError(400, "day: expected YYYY-MM-DD") from None
        g = gov()
        by_model, by_key = {}, {}
        total = dict.fromkeys(USAGE_FIELDS, 0)
        nano_total = 0
        for row in await rows(day):
            nano = spend_nano(g, row)
            nano_total += nano
            for bucket, k in ((by_model, row["model"]), (by_key, row["key_id"])):
                b = bucket.setdefault(k, dict.fromkeys(USAGE_FIELDS, 0) | {"_nano": 0})
                for f in USAGE_FIELDS:
                    b[f] += row[f]
                b["_nano"] += nano
            for f in USAGE_FIELDS:
                total[f] += row[f]

        def items(bucket, label):
            out = []
            for k, v in sorted(bucket.items(), key=lambda kv: -kv[1]["_nano"]):
                nano = v.pop("_nano")
                out.append({label: k, **_public_usage(v, nano)})
            return out
        return json_response({"day": day, "currency": "USD", "total": _public_usage(total, nano_total),
                              "by_model": items(by_model, "model"),
                              "by_key": items(by_key, "key_id")[:1000]})

    for method, path, handler, summary in (
        ("POST", "/keys", create_key, "mint a virtual key (the token is shown once)"),
        ("GET", "/keys", list_keys, "list virtual keys"),
        ("GET", "/keys/{id}", show_key, "one virtual key"),
        ("PATCH", "/keys/{id}", patch_key, "change a key's enabled, group, allowed_pools"),
        ("DELETE", "/keys/{id}", delete_key, "delete a key (its token fails everywhere)"),
        ("POST", "/keys/{id}/revoke", revoke_key, "revoke a key for good"),
        ("POST", "/keys/{id}/rotate", rotate_key, "a new token for the same key; the old one fails"),
        ("GET", "/keys/{id}/usage", key_usage, "a key's usage per day and in total"),
        ("GET", "/groups", list_groups, "list groups"),
        ("POST", "/groups", create_group, "create a group"),
        ("GET", "/groups/{name}", show_group, "one group"),
        ("PATCH", "/groups/{name}", patch_group, "change a group's parent, limits, enabled"),
        ("DELETE", "/groups/{name}", delete_group, "delete a group made through the API"),
        ("GET", "/groups/{name}/usage", group_usage, "a group's usage (its subgroups included)"),
        ("GET", "/usage", usage, "one UTC day's usage by model and by key (?day=YYYY-MM-DD)"),
    ):
        r.add(method, P + path, _when_ready(boot, handler), summary="governance: " + summary)


class _Boot:
    """gw.gov_boot, looked up when a call needs it (None while governance is off)."""

    def __init__(self, gw):
        self.gw = gw

    def __getattr__(self, name):
        return getattr(self.gw.gov_boot, name)


# How long an admin call waits for the store to open at boot before it is refused (a Redis that
# answers at all opens in milliseconds; the socket timeout bounds each try).
STORE_READY_SECS = 10.0


def _when_ready(boot, handler):
    async def call(req):
        ready = boot.gw.gov_boot.ready if boot.gw.gov_boot is not None else None
        if ready is not None and not ready.is_set():
            try:
                await asyncio.wait_for(ready.wait(), STORE_READY_SECS)
            except asyncio.TimeoutError:
                raise AdminError(503, "the governance store is not open yet") from None
        try:
            return await handler(req)
        except Exception as exc:
            # Redis not answering is the store's state, not busbar's fault: a 503 that says so
            # (the reason names the URL without its password), and no traceback in the log. A
            # store that refuses (a schema it does not read, a deleted key written back) says why.
            from .model import StoreError
            if isinstance(exc, StoreError):
                raise AdminError(409, str(exc), code="conflict") from None
            if not boot.local:
                from .redis_store import StoreUnavailable
                if isinstance(exc, StoreUnavailable):
                    raise AdminError(503, "the governance store is unreachable: %s" % exc) from None
            raise
    return call


def _public_usage(d: dict, nano: int) -> dict:
    out = {f: d[f] for f in USAGE_FIELDS}
    out["spend_usd"] = usd(nano)
    return out


def _aws_secret() -> str:
    """40 characters of base64 over 30 random bytes (240 bits): the shape of an AWS secret key."""
    import base64
    return base64.b64encode(os.urandom(30)).decode("ascii")


