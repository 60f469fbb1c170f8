"""The admin API v1's plugin endpoints (docs/admin-api.md, "Dynamic plugins"), answered as the Rust
gateway answers them with plugins disabled: busbar loads no dynamic libraries, so its catalog is
its built-in modules (stores, identity providers, ranking policies, the configured hooks), nothing
is ever installed or loaded from `plugins.dir`, and an upload is refused by the trust policy (it
could never load). Removing a file from `plugins.dir` works as it does there (the folder is the
operator's).

Every plugin row has the Rust PluginView shape: {name, type, loader, active, target, has_schema,
file, version, publisher, interface_version, trust, valid, error, schema_url, schema_error}.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
import tarfile

from busbar.admin import views
from busbar.admin.handlers import audited, body_field, json_body, no_unknown, param, query
from busbar.admin.site import PREFIX, AdminError, Response
from busbar.admin.site import compact_response as json_response
from busbar.governance.config import STORE_MODULES

TYPES = ("auth", "hooks", "store", "secret")
# The Rust gateway's bound on an admin-supplied plugin filename.
MAX_PLUGIN_FILENAME_LEN = 256
# An inspected upload is read in memory: past this it is refused unread (the Rust endpoint bounds
# its in-memory unpack the same way; a real plugin tarball is a few MiB).
MAX_TARBALL_BYTES = 64 * 1024 * 1024
DEFAULT_PLUGINS_DIR = "plugins"
REFUSAL = ("plugin rejected by the trust policy: this busbar loads no dynamic plugins (its stores, "
           "identity providers and hook modules are built in), so no tarball can be trusted to "
           "load; nothing was written")
_FILENAME = re.compile(r"[A-Za-z0-9._+-]+\Z")


def row(name, type_, loader="compiled-in", active=None, target=None):
    return {"name": name, "type": type_, "loader": loader, "active": active, "target": target,
            "has_schema": False, "file": None, "version": None, "publisher": None,
            "interface_version": None, "trust": None, "valid": None, "error": None,
            "schema_url": None, "schema_error": None}


def catalog(snap, ptype) -> list:
    doc = views.doc_of(snap)
    if ptype == "auth":
        auth = doc.get("auth") if isinstance(doc.get("auth"), dict) else {}
        chain = set(auth.get("chain") or ())
        admin = set(views.admin_chain(snap))
        idps = views.named_map(doc, "identity-providers")
        in_chain = {(d or {}).get("module", n) for n, d in idps.items() if n in chain} | (
            {"keys"} & chain)
        in_admin = {(d or {}).get("module", n) for n, d in idps.items() if n in admin} | (
            {"admin-tokens"} & admin)
        return [row("keys", "auth", active="keys" in in_chain),
                row("admin-tokens", "auth", active="admin-tokens" in in_admin)]
    if ptype == "hooks":
        out = [row("weighted", "hooks")] + [row(n, "hooks") for n in views.HOOK_PLUGINS]
        for name, h in sorted(views.hooks_of(doc).items()):
            out.append(row(name, "hooks", "external", True,
                           (h or {}).get("module") if isinstance(h, dict) else None))
        return out
    if ptype == "store":
        store = doc.get("store") if isinstance(doc.get("store"), dict) else {}
        module = STORE_MODULES.get(store.get("module", "memory"))
        kinds = {"memory": "memory", "sqlite": "sqlite", "valkey": "redis", "postgres": "postgres"}
        return [row(n, "store", active=(module == k) if store else None)
                for n, k in kinds.items()]
    return []      # secret: env and file are handled inline, not as plugins


def filename(file) -> str:
    if not isinstance(file, str) or not file or len(file) > MAX_PLUGIN_FILENAME_LEN:
        raise AdminError(400, "invalid plugin filename: it must be 1..=%d chars"
                         % MAX_PLUGIN_FILENAME_LEN)
    if not _FILENAME.match(file) or file in (".", "..") or ".." in file:
        raise AdminError(400, "invalid plugin filename `%s`: a bare file name (no path)" % file)
    if not (file.endswith(".tar.gz") or file.endswith(".tgz")):
        raise AdminError(400, "invalid plugin filename `%s`: expected a .tar.gz or .tgz" % file)
    return file


def plugins_dir(live) -> str:
    p = views.doc_of(live.gw.snapshot).get("plugins")
    d = p.get("dir") if isinstance(p, dict) and isinstance(p.get("dir"), str) else \
        DEFAULT_PLUGINS_DIR
    return os.path.join(live.base_dir, os.path.expanduser(d))


def tarball(body) -> bytes:
    b64 = body.get("tarball_b64")
    if not isinstance(body.get("file"), str) or not isinstance(b64, str):
        raise AdminError(400, "malformed plugin body: expected {\"file\": \"<name>.tar.gz\", "
                         "\"tarball_b64\": \"...\"}")
    if len(b64) > MAX_TARBALL_BYTES * 4 // 3 + 4:
        raise AdminError(400, "invalid plugin tarball: larger than %d bytes" % MAX_TARBALL_BYTES)
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AdminError(400, "tarball_b64 is not valid base64: %s" % exc) from None


def manifest(data: bytes) -> dict:
    """The manifest of a plugin tarball (exactly two members: the library and manifest.json),
    read in memory; nothing in it is executed."""
    import json
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            members = tf.getmembers()
            if len(members) != 2 or not all(m.isfile() for m in members):
                raise ValueError("expected exactly two files (the library and manifest.json)")
            found = [m for m in members if os.path.basename(m.name) == "manifest.json"]
            if not found or any(m.name.startswith("/") or ".." in m.name for m in members):
                raise ValueError("no manifest.json (or a member path escapes the archive)")
            raw = tf.extractfile(found[0]).read(1024 * 1024)
        m = json.loads(raw)
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise ValueError("the manifest has no name")
        return m
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise AdminError(400, "invalid plugin tarball: %s" % exc) from None


def mount(site, live):
    r = site.routes

    def listing(req):
        ptype = query(req).get("type", "")
        if ptype == "db":
            ptype = "store"
        if ptype not in TYPES:
            raise AdminError(400, "unknown plugin type `%s`: expected `auth`, `hooks`, `secret`, "
                             "or `store`" % ptype)
        return json_response(views.page(catalog(live.gw.snapshot, ptype)))

    def install(req):
        body = json_body(req)
        no_unknown(body, ("file", "tarball_b64"))
        data = tarball(body)
        filename(body["file"])
        manifest(data)
        raise AdminError(409, REFUSAL, code="conflict")

    def inspect(req):
        body = json_body(req)
        no_unknown(body, ("file", "tarball_b64"))
        m = manifest(tarball(body))
        kind = m.get("kind") if isinstance(m.get("kind"), str) else None
        schema = m.get("settings_schema")
        error = None
        if isinstance(schema, str):
            import json
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                schema, error = None, "settings_schema is not JSON: %s" % exc
        return json_response({
            "name": m["name"], "version": m.get("version") if isinstance(m.get("version"), str)
            else None, "kind": kind, "schema": schema if isinstance(schema, dict) else None,
            "schema_error": error, "trust": "rejected", "source": "manifest",
            "restart_required_default": None if kind is None else kind in ("store", "secret")})

    def reload(req):
        return json_response({
            "plugins": [],
            "note": "this busbar loads no dynamic plugins (its stores, identity providers and hook "
                    "modules are built in): there is no plugin layer to reload"})

    def rollback(req):
        body = json_body(req)
        no_unknown(body, ("file",))
        file = filename(body.get("file"))
        if not os.path.isfile(os.path.join(plugins_dir(live), file)):
            raise AdminError(404, "plugin `%s` not found in the plugins directory" % file)
        raise AdminError(409, REFUSAL.replace("; nothing was written", "; nothing was pinned"))

    def remove(req):
        file = filename(req.params["file"])
        path = os.path.join(plugins_dir(live), file)
        if not os.path.isfile(path):
            raise AdminError(404, "plugin `%s` not found" % file)
        try:
            os.remove(path)
        except OSError as exc:
            raise AdminError(400, "cannot remove plugin: %s" % exc.strerror) from None
        return Response(204, b"")

    def schema(req):
        raise AdminError(404, "plugin `%s` is not loaded (this busbar loads no dynamic plugins)"
                         % req.params["file"])

    r.add("GET", PREFIX + "/plugins", listing, summary="the plugin catalog for one type")
    r.add("POST", PREFIX + "/plugins", audited("plugin.install", body_field("plugin:%s", "file"))(install),
          summary="install a plugin tarball (refused)")
    r.add("POST", PREFIX + "/plugins/inspect", inspect, scope="read-only",
          summary="preview a plugin tarball's manifest")
    r.add("POST", PREFIX + "/plugins/reload", reload, summary="reload the plugin layer")
    r.add("POST", PREFIX + "/plugins/rollback",
          audited("plugin.rollback", body_field("plugin:%s", "file"))(rollback),
          summary="pin a plugin to a prior version")
    r.add("DELETE", PREFIX + "/plugins/{file}", audited("plugin.remove", param("plugin", "file"))(remove),
          summary="remove a tarball from plugins.dir")
    r.add("GET", PREFIX + "/plugins/{file}/schema", schema, summary="a plugin's settings schema")
