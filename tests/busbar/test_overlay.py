"""The config overlay in the Rust gateway's format (busbar/admin/overlay.py) as the loader applies
it: sections over config.yaml, tombstones, an earlier busbar's overlay carried over, a newer one
refused, and an entry that no longer validates left out rather than failing the start."""
import json

from busbar.admin import overlay as fmt
from busbar.config.loader import build

BASE = """
providers:
  m: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: KEY}}
models:
  a: {provider: m}
pools:
  p: {members: [{model: a}]}
hooks:
  filed: {module: busbar-webrequest-hook, settings: {url: "http://127.0.0.1:9/f"}, kind: tap}
routing: {default_policy_timeout_ms: 5}
"""
ENV = {"KEY": "k" * 20}


def _write(tmp_path, **sections):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(BASE)
    doc = fmt.empty()
    doc.update(sections)
    fmt.write(str(tmp_path / "busbar-overlay.json"), doc)
    return cfg


def test_sections_apply_over_the_config_file(tmp_path):
    cfg = _write(tmp_path, root={"routing": {"default_policy_timeout_ms": 9}, "listen": "127.0.0.1:1"},
                 hooks={"api": {"module": "busbar-webrequest-hook",
                                "settings": {"url": "http://127.0.0.1:9/a"}, "kind": "tap"}},
                 global_hooks=["api"],
                 named_maps={"export": {"f": {"module": "request-log-file",
                                              "settings": {"path": str(tmp_path / "r.log")}}}})
    config, out = build(str(cfg), env=ENV)
    assert config is not None, out.errors
    assert config.document["routing"] == {"default_policy_timeout_ms": 9}
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 1)
    assert set(config.hooks) == {"filed", "api"} and config.document["pools"]["hooks"] == ["api"]
    assert "f" in config.document["export"]
    # --safe-mode: the file alone
    config, out = build(str(cfg), env=ENV, overlay=False)
    assert set(config.hooks) == {"filed"} and "export" not in config.document


def test_a_tombstone_removes_a_file_hook(tmp_path):
    cfg = _write(tmp_path, deleted=["filed"])
    config, out = build(str(cfg), env=ENV)
    assert config is not None and config.hooks == {}


def test_an_entry_that_no_longer_validates_is_left_out_with_a_warning(tmp_path):
    cfg = _write(tmp_path, hooks={"gone": {"module": "busbar-webrequest-hook",
                                           "settings": {"url": {"env": "NOT_SET_ANYWHERE"}}}},
                 global_hooks=["gone"],
                 named_maps={"export": {"odd": {"module": "no-such-exporter"}}})
    config, out = build(str(cfg), env=ENV)
    assert config is not None, out.errors
    assert "gone" not in config.hooks and "odd" not in config.document.get("export", {})
    assert config.document["pools"].get("hooks", []) == []
    assert any(w.startswith("config.overlay: hooks.gone: left out") for w in out.warnings), out.warnings
    assert any(w.startswith("config.overlay: export.odd: left out") for w in out.warnings)
    # the admin API's own writes are strict: the same overlay is an error there
    config, out = build(str(cfg), env=ENV, overlay_strict=True)
    assert config is None and any(e.startswith("hooks.gone") for e in out.errors)


def test_a_problem_of_the_config_file_itself_still_fails(tmp_path):
    cfg = _write(tmp_path, named_maps={"export": {"odd": {"module": "no-such-exporter"}}})
    cfg.write_text(BASE.replace("a: {provider: m}", "a: {provider: nope}"))
    config, out = build(str(cfg), env=ENV)
    assert config is None and any(e.startswith("models.a.provider") for e in out.errors)


def test_an_earlier_busbars_overlay_is_carried_over_and_a_newer_one_refused(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(BASE)
    ov = tmp_path / "busbar-overlay.json"
    ov.write_text(json.dumps({"format": 1, "config": {"routing": {"default_policy_timeout_ms": 7},
                                                       "models": {"z": {"provider": "m"}}}}))
    config, out = build(str(cfg), env=ENV)
    assert config.document["routing"] == {"default_policy_timeout_ms": 7} and "z" not in config.models
    assert any("not models" in w for w in out.warnings)
    ov.write_text(json.dumps({"version": fmt.OVERLAY_VERSION + 1}))
    config, out = build(str(cfg), env=ENV)
    assert config is None and out.errors[0].startswith("config.overlay: ")
    ov.write_text("{not json")
    config, out = build(str(cfg), env=ENV)
    assert config is not None and any("ignoring unreadable overlay" in w for w in out.warnings)


def test_a_reset_clears_one_section_only():
    ov = fmt.empty()
    ov.update(root={"routing": {}}, hooks={"h": {}}, global_hooks=["h"], groups={"g": {}})
    assert fmt.has_state(ov, "root") and fmt.has_state(ov, "hooks")
    cleared = fmt.clear(ov, "hooks")
    assert cleared["hooks"] == {} and cleared["global_hooks"] == [] and cleared["root"] == {"routing": {}}
    assert cleared["groups"] == {"g": {}} and not fmt.has_state(cleared, "plugin_versions")
    assert fmt.reload_to_apply({"listen": "x", "limits": {"max_inbound_concurrent": 1,
                                                           "request_body_max_bytes": 2}}) == [
        "listen", "limits.max_inbound_concurrent"]
