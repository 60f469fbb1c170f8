"""The config overlay in the Rust gateway's format (docs/admin-api.md, "Persistence"): what the
admin API changed, kept beside config.yaml (which is never written) and reapplied over it at boot.

    {"version": 1,
     "root": {<section>: value},             # PUT config/settings (rate_card, limits, listen, ...)
     "hooks": {<name>: def}, "global_hooks": [names], "deleted": [hook names],
     "groups": {<name>: def}, "deleted_groups": [group names],
     "named_maps": {"identity-providers"|"export": {<name>: def}},
     "plugin_versions": {<plugin>: version}}

`groups` mirrors the groups made over the admin API (whose live home is the governance store,
shared by a fleet): every API group write updates it, and boot imports it into the store, so a
Rust gateway reading this file and busbar reading the Rust gateway's both see the same API groups.

Sections are independent: a write to one is a read-modify-write of the whole file that keeps the
others as they are, and `DELETE overlay/{section}` clears one. The file is replaced atomically
(temporary file in the same folder, fsync, rename).

An overlay an earlier busbar wrote (`{"format": 1, "config": <a whole applied config>}`) is read and
carried over: the sections the new format has (root settings, hooks, groups, identity providers,
exporters) move into it; providers, models and pools do not (a `config/apply` is live only, until
the next reload or restart, as in the Rust gateway), and a warning says so. The next write stores
the new format.
"""
from __future__ import annotations

import json
import os

OVERLAY_VERSION = 1
SECTIONS = ("groups", "hooks", "root", "plugin_versions")
NAMED_SECTIONS = ("identity-providers", "export")
# The single-value top-level sections PUT config/settings may set (the Rust RootSettings).
ROOT_KEYS = ("rate_card", "per_request_fee", "security", "limits", "advanced", "health", "routing",
             "listen", "admin_listen", "tls", "admin_tls", "admin_require_mtls", "store")
# Of those, the ones a PUT merges field by field (the Rust *Patch sections); the rest replace.
PATCH_KEYS = ("security", "limits", "advanced", "health", "routing")
# Restart-to-apply: bound or opened once at process start (sockets, TLS acceptors, the store).
RESTART_KEYS = ("listen", "tls", "admin_listen", "admin_tls", "admin_require_mtls", "store")
RESTART_FIELDS = {"limits": ("upstream_request_timeout_secs", "pool_max_idle_per_host",
                             "pool_idle_timeout_secs", "max_inbound_concurrent"),
                  "advanced": ("response_headers", "worker_threads")}


class OverlayError(Exception):
    pass


def empty() -> dict:
    return {"version": OVERLAY_VERSION, "root": {}, "hooks": {}, "global_hooks": [],
            "deleted": [], "groups": {}, "deleted_groups": [], "named_maps": {},
            "plugin_versions": {}}


def _from_old(data: dict, warn) -> dict:
    """An overlay of the earlier format, carried into this one."""
    cfg = data.get("config") if isinstance(data.get("config"), dict) else {}
    doc = empty()
    doc["root"] = {k: cfg[k] for k in ROOT_KEYS if k in cfg}
    if isinstance(cfg.get("hooks"), dict):
        doc["hooks"] = dict(cfg["hooks"])
    pools = cfg.get("pools") if isinstance(cfg.get("pools"), dict) else {}
    if isinstance(pools.get("hooks"), list):
        doc["global_hooks"] = [h for h in pools["hooks"] if isinstance(h, str)]
    if isinstance(cfg.get("groups"), dict):
        doc["groups"] = dict(cfg["groups"])
    for s in NAMED_SECTIONS:
        if isinstance(cfg.get(s), dict):
            doc["named_maps"][s] = dict(cfg[s])
    carried = set(ROOT_KEYS) | {"hooks", "groups", "config"} | set(NAMED_SECTIONS)
    dropped = sorted(k for k in cfg if k not in carried)
    if dropped and warn is not None:
        warn("an overlay of the earlier format holds an applied config: config/apply is live "
             "only now (until the next reload or restart), so only its settings, hooks, groups, "
             "identity providers and exporters are carried over, not %s" % ", ".join(dropped))
    return doc


def parse(data, warn=None) -> dict:
    """A loaded overlay document (either format) as this format; OverlayError when it is neither."""
    if not isinstance(data, dict):
        raise OverlayError("not a busbar overlay (expected a JSON object)")
    if "config" in data and "format" in data:
        if data.get("format") != 1:
            raise OverlayError("written by another busbar version (format %r)" % data.get("format"))
        return _from_old(data, warn)
    v = data.get("version", 1)
    if not isinstance(v, int) or isinstance(v, bool):
        raise OverlayError("its version is not a number")
    if v > OVERLAY_VERSION:
        raise OverlayTooNew(v)
    doc = empty()
    for k, default in list(doc.items()):
        if k == "version" or k not in data:
            continue
        if not isinstance(data[k], type(default)):
            raise OverlayError("its '%s' is not a %s" % (k, type(default).__name__))
        doc[k] = data[k]
    return doc


class OverlayTooNew(OverlayError):
    def __init__(self, v):
        super().__init__("written by a newer busbar (overlay version %d; this busbar reads %d): "
                         "upgrade, or boot --safe-mode to run on config.yaml alone" % (
                             v, OVERLAY_VERSION))


def read(path: str | None, warn=None) -> dict:
    """The overlay at `path` (an empty one when there is no file). OverlayError when unreadable:
    a writer must not overwrite it (its tombstones would be lost)."""
    if path is None or not os.path.exists(path):
        return empty()
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise OverlayError("unreadable: %s" % exc) from None
    return parse(data, warn)


def write(path: str, doc: dict) -> None:
    """Atomically (temp file in the same folder + fsync + rename): a crash leaves the old overlay
    or the new one, never half of one. config.yaml is never written."""
    doc = dict(doc)
    doc["version"] = OVERLAY_VERSION
    folder = os.path.dirname(path) or "."
    import tempfile     # (not at boot: it brings shutil, bz2, lzma and random)
    fd, tmp = tempfile.mkstemp(prefix=".busbar-overlay-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def merge_root(base: dict, root: dict) -> dict:
    """`root` settings over a config document: patch sections field by field, others whole."""
    out = dict(base)
    for k, v in root.items():
        if k in PATCH_KEYS and isinstance(v, dict) and isinstance(out.get(k), dict):
            merged = dict(out[k])
            merged.update(v)
            out[k] = merged
        else:
            out[k] = v
    return out


def apply(base: dict, ov: dict) -> dict:
    """config.yaml's document with the overlay applied (what boot and every rebuild serve). The
    overlay's groups are not merged into config.yaml's: they are groups made over the admin API,
    which boot imports into the governance store (busbar/governance/overlay_groups.py), so they
    stay mutable there as the Rust gateway's overlay groups are, and config.yaml's stay file-owned."""
    doc = merge_root(base, ov.get("root") or {})
    hooks = dict(doc.get("hooks") or {}) if isinstance(doc.get("hooks"), dict) else {}
    deleted = set(ov.get("deleted") or ())
    hooks.update(ov.get("hooks") or {})
    for n in deleted:
        hooks.pop(n, None)
    if hooks or "hooks" in doc:
        doc["hooks"] = hooks
    glob = list(ov.get("global_hooks") or ())
    if glob or deleted:
        pools = dict(doc.get("pools") or {}) if isinstance(doc.get("pools"), dict) else {}
        base_glob = pools.get("hooks") if isinstance(pools.get("hooks"), list) else []
        wired = [h for h in base_glob if h not in deleted]
        wired += [h for h in glob if h not in wired and h not in deleted]
        if wired or "hooks" in pools:
            pools["hooks"] = wired
        doc["pools"] = pools
        for name, p in list(pools.items()):
            if isinstance(p, dict) and isinstance(p.get("hooks"), list) and deleted:
                pools[name] = dict(p, hooks=[h for h in p["hooks"] if h not in deleted])
    for section, entries in (ov.get("named_maps") or {}).items():
        m = dict(doc.get(section) or {}) if isinstance(doc.get(section), dict) else {}
        for name, d in (entries or {}).items():
            if d is None:           # a tombstone: deleted over the API
                m.pop(name, None)
            else:
                m[name] = d
        doc[section] = m
    return doc


def has_state(ov: dict, section: str) -> bool:
    if section == "hooks":
        return bool(ov["hooks"] or ov["global_hooks"] or ov["deleted"])
    if section == "groups":
        return bool(ov["groups"] or ov["deleted_groups"])
    return bool(ov[section])


def clear(ov: dict, section: str) -> dict:
    ov = dict(ov)
    if section == "hooks":
        ov.update(hooks={}, global_hooks=[], deleted=[])
    elif section == "groups":
        ov.update(groups={}, deleted_groups=[])
    elif section == "root":
        ov["root"] = {}
    else:
        ov["plugin_versions"] = {}
    return ov


def reload_to_apply(settings: dict) -> list:
    """The fields of a PUT config/settings body that are stored but take effect on restart."""
    out = [k for k in RESTART_KEYS if k in settings]
    for section, fields in RESTART_FIELDS.items():
        sub = settings.get(section)
        if isinstance(sub, dict):
            out += ["%s.%s" % (section, f) for f in fields if f in sub]
    return out


def implicated(ov: dict, errors: list) -> set | None:
    """The overlay entries that the config problems `errors` ("<path>: <message>") are about, as
    (section, name) pairs: ("hooks", n), ("root", key), (<named section>, n) (groups are not merged,
    so no config problem is theirs). None
    when a problem is not about an overlay entry (config.yaml's own: the config stays invalid)."""
    out = set()
    for e in errors:
        path = e.split(":", 1)[0]
        head, _, rest = path.partition(".")
        name = rest.split(".", 1)[0].split("[", 1)[0]
        if head == "hooks" and name in ov["hooks"]:
            out.add(("hooks", name))
        elif head in (ov.get("named_maps") or {}) and name in ov["named_maps"][head]:
            out.add((head, name))
        elif head.split("[", 1)[0] in ov["root"]:
            out.add(("root", head.split("[", 1)[0]))
        else:
            return None
    return out


def without(ov: dict, entries: set) -> dict:
    """The overlay less `entries` (a dropped hook leaves the all-pools list too)."""
    ov = dict(ov, hooks=dict(ov["hooks"]), groups=dict(ov["groups"]), root=dict(ov["root"]),
              named_maps={k: dict(v) for k, v in (ov.get("named_maps") or {}).items()})
    for section, name in entries:
        if section == "hooks":
            ov["hooks"].pop(name, None)
            ov["global_hooks"] = [n for n in ov["global_hooks"] if n != name]
        elif section in ("groups", "root"):
            ov[section].pop(name, None)
        else:
            ov["named_maps"][section].pop(name, None)
    return ov

