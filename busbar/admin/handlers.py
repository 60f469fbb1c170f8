"""What the admin API's handlers share (busbar/admin/api.py, named.py, plugins.py): the request's
query and principal, the config-plane ETag and If-Match, the JSON body and its field check, the
mapping of a config-plane change's failures onto the error envelope, and the audit wrapper. Its own
module so the three handler modules import it and not one another."""
from __future__ import annotations

import asyncio
import logging

import orjson

from busbar.admin import overlay as fmt
from busbar.admin.live import Locked, NoFiles, NoSlot, WorkersFailed
from busbar.admin.site import AdminError, Response, check_version, config_if_match
from busbar.config import ConfigError

log = logging.getLogger("busbar.admin")


# ---------------------------------------------------------------------- shared helpers
def query(req) -> dict:
    return req.query_params()


def principal(req) -> str:
    """Who made a change, for the history: the Rust gateway's principal ids (busbar/admin/site.py:
    every static admin token is the one principal "admin"; an open admin plane is "anonymous")."""
    return req.principal


def with_etag(resp: Response, live) -> Response:
    resp.headers += b"ETag: " + live.etag + b"\r\n"
    return resp


def check_if_match(req, live) -> None:
    """RFC 7232 If-Match against the config-plane ETag (busbar/admin/site.py): absent or `*` is
    unguarded; a stale tag is 409 version_conflict; a malformed one is 400."""
    check_version(config_if_match(req), live.current)


def json_body(req, required=True):
    if not req.body:
        if required:
            raise AdminError(400, "malformed body: expected a JSON object")
        return {}
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError as exc:
        raise AdminError(400, "malformed body: not JSON: %s" % exc) from None
    if not isinstance(body, dict):
        raise AdminError(400, "malformed body: expected a JSON object")
    return body


def no_unknown(body, allowed, what="body"):
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise AdminError(400, "malformed %s: unknown field `%s` (expected %s)" % (
            what, extra[0], ", ".join("`%s`" % a for a in allowed)))


async def mutation(live, coro):
    """Runs a config-plane change, mapping its failures to the error envelope."""
    try:
        return await coro
    except ConfigError as e:
        raise AdminError(400, "invalid config; nothing changed: " + "; ".join(e.problems[:20])) \
            from None
    except Locked:
        raise AdminError(400, "config mutation refused: the config is immutable "
                         "(config.locked: true); change config.yaml and POST config/reload") \
            from None
    except NoFiles:
        raise AdminError(400, "ephemeral busbar: no disk config to read, merge onto, or revert "
                         "to") from None
    except fmt.OverlayError as e:
        raise AdminError(500, "the config overlay cannot be read, so it is not overwritten: %s"
                         % e) from None
    except NoSlot as e:
        raise AdminError(409, str(e)) from None
    except WorkersFailed as e:
        raise AdminError(500, str(e)) from None
    except OSError as e:
        # The overlay could not be written (a read-only config folder): fail closed, nothing
        # changed; the path and reason go to the log, not to the caller.
        log.error("admin: the config overlay %s could not be written: %s", live.control.overlay, e)
        raise AdminError(500, "internal error: the config overlay could not be written; nothing "
                         "changed") from None


# ---------------------------------------------------------------------- audit
def audited(action, resource):
    """A handler whose every attempt is a row of the audit log (busbar/admin/site.py req.audit):
    `applied` when it answers below 400, `rejected` otherwise (a stale If-Match, an invalid
    config, an unknown name: probing leaves a trail). `action` and `resource` are the Rust
    gateway's words (hook.register, hook:<name>); `resource` may be a function of the request."""
    def wrap(handler):
        async def run(req):
            res = resource(req) if callable(resource) else resource
            try:
                out = handler(req)
                if asyncio.iscoroutine(out):
                    out = await out
            except AdminError:
                req.audit(action, res, "rejected")
                raise
            req.audit(action, res, "applied" if out.status < 400 else "rejected")
            return out
        return run
    return wrap


def param(prefix, name):
    """A resource named by a path parameter: `hook:<name>`."""
    return lambda req: "%s:%s" % (prefix, req.params.get(name, "?"))


def body_field(fmt, field):
    """A resource named by a field of the JSON body (`hook:%s` of POST hooks' name, `config:v%s` of
    a rollback's version), `?` when the body does not have it."""
    def name(req):
        try:
            v = orjson.loads(req.body or b"{}").get(field)
        except (orjson.JSONDecodeError, AttributeError):
            v = None
        return fmt % (v if isinstance(v, (str, int)) and not isinstance(v, bool) else "?")
    return name
