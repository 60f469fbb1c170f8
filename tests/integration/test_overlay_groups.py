"""API groups in the config overlay, as the Rust gateway keeps them (issue 38;
busbar/governance/overlay_groups.py): a Rust-written overlay's groups are API groups here (mutable,
not file-owned), every API group write lands in the overlay's `groups`/`deleted_groups` in the
GroupCfg form, they survive a restart on the memory store, and `DELETE overlay/groups` clears them
from the store too. Through the real server over HTTP."""
from __future__ import annotations

import json

from tests.conftest import free_port, start_gateway, stop
from tests.integration.gov_helpers import Admin, gov_config, gov_env
from tests.integration.test_governance import chat

GROUPS = """
groups:
  team: {limits: [{requests: 1000, per: minute}]}
store: {module: memory}
"""


def _overlay(tmp_path):
    return json.loads((tmp_path / "busbar-overlay.json").read_text())


def _write_overlay(tmp_path, doc):
    base = {"version": 1, "root": {}, "hooks": {}, "global_hooks": [], "deleted": [],
            "groups": {}, "deleted_groups": [], "named_maps": {}, "plugin_versions": {}}
    base.update(doc)
    (tmp_path / "busbar-overlay.json").write_text(json.dumps(base))


def _boot(tmp_path, mock_port, text, admin, port):
    g = start_gateway(tmp_path, text, 1, gov_env(), port=port, stderr=open(
        tmp_path / ("stderr-%d.log" % port), "ab"))
    g.admin = Admin(admin)
    return g


def _names(admin):
    s, d = admin.call("GET", "/groups")
    assert s == 200, d
    return {g["name"]: g for g in d["items"]}


def test_a_rust_written_overlays_groups_are_api_groups(mock_port, tmp_path):
    # what the Rust gateway writes after POST /groups + DELETE /groups/{name}
    _write_overlay(tmp_path, {
        "groups": {"rustmade": {"parent": "team", "limits": [{"requests": 2, "per": "minute"}]},
                   "team": {"limits": [{"requests": 1, "per": "minute"}]},          # shadows
                   "badpool": {"limits": [{"requests": 1, "per": "minute", "pool": "nope"}]},
                   "orphan": {"parent": "gone-parent"}},
        "deleted_groups": ["was-here"]})
    text, admin = gov_config(mock_port, GROUPS)
    g = _boot(tmp_path, mock_port, text, admin, free_port())
    try:
        groups = _names(g.admin)
        assert groups["rustmade"]["parent"] == "team"
        assert groups["rustmade"]["limits"] == [{"metric": "requests", "amount": 2,
                                                 "per": "minute"}]
        # config.yaml's group is the file's, never the overlay's; bad entries are left out
        assert groups["team"]["limits"][0]["amount"] == 1000
        assert "badpool" not in groups and "orphan" not in groups
        log = (tmp_path / ("stderr-%d.log" % g.port)).read_text()
        assert "groups.badpool: left out" in log and "groups.orphan: left out" in log
        assert "groups.team: left out" in log
        # its limits are enforced: a key bound to it gets 2 a minute
        k = g.admin.mint(name="r", group="rustmade")
        assert [chat(g, k["token"])[0] for _ in range(3)] == [200, 200, 429]
        # mutable, not file-owned: PATCH answers 200 (a file group answers 409)
        s, d = g.admin.call("PATCH", "/groups/rustmade", {"limits": [{"requests": 5,
                                                                      "per": "minute"}]})
        assert s == 200, d
        assert g.admin.call("PATCH", "/groups/team", {"enabled": False})[0] == 409
        ov = _overlay(tmp_path)
        assert ov["groups"]["rustmade"] == {"parent": "team",
                                            "limits": [{"requests": 5, "per": "minute"}]}
        # the entries this busbar left out stay in the file (it is not its to prune)
        assert "badpool" in ov["groups"] and ov["deleted_groups"] == ["was-here"]
        s, d = g.admin.call("PATCH", "/keys/%s" % k["id"], {"group": None})
        assert s == 200, d
        s, _ = g.admin.call("DELETE", "/groups/rustmade")
        assert s == 204
        ov = _overlay(tmp_path)
        assert "rustmade" not in ov["groups"] and "rustmade" in ov["deleted_groups"]
        assert "rustmade" not in _names(g.admin)
    finally:
        stop(g.proc)


def test_api_groups_persist_in_the_overlay_and_a_reset_clears_them(mock_port, tmp_path):
    text, admin = gov_config(mock_port, GROUPS)
    port = free_port()
    g = _boot(tmp_path, mock_port, text, admin, port)
    try:
        s, d = g.admin.call("POST", "/groups", {"name": "growth", "config": {
            "parent": "team", "enabled": False, "limits": [{"budget": 500, "per": "month"}],
            "child_default": {"limits": [{"requests": 3, "per": "minute"}]}}})
        assert s == 201, d
        # a mint's auto-provisioned leaf is an overlay row too
        k = g.admin.mint(name="ann", group="user:ann", parent="growth")
        assert k["group_provisioned"] is True
        ov = _overlay(tmp_path)
        assert ov["groups"]["growth"] == {
            "parent": "team", "enabled": False, "limits": [{"budget": 500, "per": "month"}],
            "child_default": {"limits": [{"requests": 3, "per": "minute"}]}}
        assert ov["groups"]["user:ann"] == {"parent": "growth",
                                            "limits": [{"requests": 3, "per": "minute"}]}
        # re-creating a deleted name clears its tombstone
        assert g.admin.call("POST", "/groups", {"name": "tmp", "config": {}})[0] == 201
        assert g.admin.call("DELETE", "/groups/tmp")[0] == 204
        assert _overlay(tmp_path)["deleted_groups"] == ["tmp"]
        assert g.admin.call("POST", "/groups", {"name": "tmp", "config": {}})[0] == 201
        assert _overlay(tmp_path)["deleted_groups"] == []
    finally:
        stop(g.proc)
    # the memory store starts empty: the groups come back from the overlay
    g = _boot(tmp_path, mock_port, text, admin, port)
    try:
        groups = _names(g.admin)
        assert groups["growth"]["enabled"] is False and groups["user:ann"]["parent"] == "growth"
        assert groups["growth"]["child_default"] == [{"metric": "requests", "amount": 3,
                                                      "per": "minute"}]
        s, d = g.admin.call("DELETE", "/overlay/groups")
        assert s == 200 and d["changed"] is True, d
        assert set(_names(g.admin)) == {"team"}
        ov = _overlay(tmp_path)
        assert ov["groups"] == {} and ov["deleted_groups"] == []
        # nothing left: a no-op
        s, d = g.admin.call("DELETE", "/overlay/groups")
        assert s == 200 and d["changed"] is False
    finally:
        stop(g.proc)
    g = _boot(tmp_path, mock_port, text, admin, port)
    try:
        assert set(_names(g.admin)) == {"team"}
    finally:
        stop(g.proc)


def test_a_locked_config_keeps_api_groups_in_the_store_alone(mock_port, tmp_path):
    text, admin = gov_config(mock_port, GROUPS + "config: {locked: true}\n")
    g = _boot(tmp_path, mock_port, text, admin, free_port())
    try:
        assert g.admin.call("POST", "/groups", {"name": "x", "config": {}})[0] == 201
        assert "x" in _names(g.admin)
        assert not (tmp_path / "busbar-overlay.json").exists()
        s, d = g.admin.call("DELETE", "/overlay/groups")
        assert s == 400 and "locked" in d["error"]["message"], d
    finally:
        stop(g.proc)


def test_an_unwritable_overlay_undoes_the_group_change(mock_port, tmp_path):
    text, admin = gov_config(mock_port, GROUPS)
    g = _boot(tmp_path, mock_port, text, admin, free_port())
    try:
        (tmp_path / "busbar-overlay.json").write_text("{not json")
        s, d = g.admin.call("POST", "/groups", {"name": "y", "config": {}})
        assert s == 500 and "undone" in d["error"]["message"], d
        assert "y" not in _names(g.admin)
        assert (tmp_path / "busbar-overlay.json").read_text() == "{not json"
    finally:
        stop(g.proc)


def test_a_shared_store_keeps_its_own_and_takes_what_it_lacks(mock_port, tmp_path):
    from tests.busbar.governance.conftest import _need_redis
    from tests.redis_server import RedisServer
    _need_redis()
    redis = RedisServer().start()
    tail = GROUPS.replace("store: {module: memory}",
                          "store: {module: valkey, settings: {url: {env: BB_REDIS}}}")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    _write_overlay(one, {"groups": {"ov1": {"limits": [{"requests": 2, "per": "minute"}]}}})
    _write_overlay(two, {"groups": {"ov1": {"limits": [{"requests": 2, "per": "minute"}]},
                                    "ov2": {"parent": "ov1"}},
                         "deleted_groups": ["ov9"]})
    text, admin = gov_config(mock_port, tail)
    text2, admin2 = gov_config(mock_port, tail)
    env = gov_env({"BB_REDIS": redis.url})
    a = b = None
    try:
        a = start_gateway(one, text, 1, env)
        a.admin = Admin(admin)
        assert _names(a.admin)["ov1"]["limits"][0]["amount"] == 2      # imported
        assert a.admin.call("PATCH", "/groups/ov1", {"limits": [{"requests": 7,
                                                                "per": "minute"}]})[0] == 200
        assert a.admin.call("POST", "/groups", {"name": "ov9", "config": {}})[0] == 201
        # another instance whose overlay is older: the store's ov1 stands, ov2 is taken, and its
        # tombstone does not remove the group another instance made
        b = start_gateway(two, text2, 1, env)
        b.admin = Admin(admin2)
        groups = _names(b.admin)
        assert groups["ov1"]["limits"][0]["amount"] == 7
        assert groups["ov2"]["parent"] == "ov1" and "ov9" in groups
        assert "ov2" in _names(a.admin)                     # the fleet shares it
    finally:
        for g in (a, b):
            if g is not None:
                stop(g.proc)
        redis.close()
