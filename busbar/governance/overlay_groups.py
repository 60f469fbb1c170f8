"""Groups made over the admin API, in the config overlay as the Rust gateway keeps them (issue 38).

The Rust gateway keeps an API group in its overlay file (`groups: {name: GroupCfg}`, and a
deleted one's name in `deleted_groups`) and loads it at boot as an overlay group: mutable over the
API, where a group of config.yaml is file-owned (409). busbar's live home for an API group is the
governance store (shared by every instance of a fleet on Valkey or Postgres); the overlay mirrors
it, so either gateway reads what the other wrote:

- every API group write (create, replace, patch, delete, a mint's auto-provisioned leaf) updates
  the overlay's `groups` / `deleted_groups` too (busbar/governance/admin.py);
- at boot the overlay's groups are imported into the store (`to_import`), never merged into
  config.yaml's groups, so they stay API groups. With a local store (memory, SQLite: this
  instance's alone) the overlay is the truth for the names it holds: its groups are written over
  the store's and its tombstones remove the store's. With a shared store another instance may have
  changed a group since this overlay was written, so only the groups the store lacks are imported
  and tombstones are left alone (the store is the fleet's truth);
- `DELETE overlay/groups` clears the section and every API group in the store.

An overlay group that does not validate (a limit on a pool the config no longer has, a parent that
is gone) is left out at boot with a warning, as every other overlay entry is: a bad overlay never
bricks a start. One that names a config.yaml group is left out too (the file's wins).
"""
from __future__ import annotations

from busbar.config.checks import Problems, problem_list

from .config import GROUP_KEYS, check_chains, child_default, group_from_body


def entry_of(g) -> dict:
    """A group as its `groups:` block in config.yaml (the Rust GroupCfg): what the overlay holds."""
    out = {}
    if g.parent is not None:
        out["parent"] = g.parent
    if not g.enabled:
        out["enabled"] = False
    out["limits"] = [lim.public() for lim in g.limits]
    if g.child_default is not None:
        out["child_default"] = {"limits": [lim.public() for lim in g.child_default]}
    return out


def put(ov: dict, g) -> dict:
    """The overlay with API group `g` in it (re-creating a deleted name clears its tombstone)."""
    ov = dict(ov, groups=dict(ov["groups"]))
    ov["groups"][g.name] = entry_of(g)
    ov["deleted_groups"] = [n for n in ov["deleted_groups"] if n != g.name]
    return ov


def drop(ov: dict, name: str) -> dict:
    """The overlay with API group `name` deleted: gone from `groups`, its name tombstoned."""
    ov = dict(ov, groups=dict(ov["groups"]))
    ov["groups"].pop(name, None)
    if name not in ov["deleted_groups"]:
        ov["deleted_groups"] = list(ov["deleted_groups"]) + [name]
    return ov


def compile_groups(config, known: dict, warn) -> dict:
    """The overlay's groups of `config` (as the loader read them) as GroupRecords, each checked as
    an admin write is (limits, pools, child_default, a parent among config.yaml's groups, `known`
    (the store's) or the overlay's own, no cycle); the ones that fail are left out with `warn(msg)`."""
    sec = config.overlay_groups or {}
    raw = sec.get("groups") or {}
    gov = config.governance
    if not raw or gov is None:
        if raw:
            warn("config.overlay: groups: %d group(s) left out: governance is off in this config "
                 "(no keys, groups, rate_card or store)" % len(raw))
        return {}
    pools = set(config.pools) | set(config.models)
    pool_names = set(config.pools)
    out = {}
    for name, entry in raw.items():
        where = "groups.%s" % name
        if name in gov.groups:
            warn("config.overlay: %s: left out: config.yaml defines a group of that name (a "
                 "file's group is never shadowed)" % where)
            continue
        if not isinstance(entry, dict) or any(k not in GROUP_KEYS for k in entry):
            warn("config.overlay: %s: left out: expected a group block {%s}" % (
                where, ", ".join(GROUP_KEYS)))
            continue
        p = Problems()
        g = group_from_body(name, entry, where, p, pools=pools, pool_names=pool_names)
        cd = child_default(entry.get("child_default"), where + ".child_default", pools, p,
                           pool_names)
        if g is None or p.errors:
            warn("config.overlay: %s: left out: it does not validate (%s)" % (where, "; ".join(
                "%s: %s" % (e["path"], e["message"]) for e in problem_list(p.errors))))
            continue
        g.child_default = cd
        out[name] = g
    # Chains over config.yaml's, the store's and these; a group whose chain breaks goes, and with
    # it any group that parents on it (a few rounds: each removal can break another chain).
    for _ in range(len(out) + 1):
        p = Problems()
        every = dict(known)
        every.update(out)
        every.update(gov.groups)
        check_chains(out, p, every.get)
        errs = problem_list(p.errors)
        bad = {n: [e["message"] for e in errs if e["path"].startswith("groups.%s." % n)]
               for n in out}
        bad = {n: m for n, m in bad.items() if m}
        if not bad:
            break
        for name in sorted(bad):
            warn("config.overlay: groups.%s: left out: %s" % (name, "; ".join(bad[name])))
            out.pop(name)
    return out


def to_import(config, stored: dict, shared: bool, warn):
    """(groups to write into the store, names to remove from it) at boot. `stored`: the store's
    groups by name; `shared`: a store other instances write too (Valkey, Postgres)."""
    groups = compile_groups(config, stored, warn)
    if shared:
        return [g for n, g in sorted(groups.items()) if n not in stored], []
    puts = [g for n, g in sorted(groups.items()) if stored.get(n) != g]
    base = config.governance.groups if config.governance is not None else {}
    gone = [n for n in (config.overlay_groups or {}).get("deleted_groups") or ()
            if isinstance(n, str) and n in stored and n not in groups and n not in base]
    return puts, gone
