"""One grammar (issue #36): busbar's own earlier spellings are refused at boot and by --validate,
one line apiece naming the key's path, where it went (busbar/config/legacy.py, the table the
migrator works from) and `busbar --migrate-config <file>`; nothing else is said about such a file.
With no `store:` the store is `memory`, the Rust default; the SQLite file busbar's earlier default
wrote beside the config is named at boot with the line that keeps it."""
from __future__ import annotations

import os

import json
import subprocess
import textwrap

import pytest
import yaml

from busbar.config import build, legacy, load
from tests.conftest import PY, ROOT, env, free_port, start_gateway, stop

ENV = {"ANTHROPIC_KEY": "sk-ant-x", "ADMIN": "a" * 32, "SIGN": "ab" * 32,
       "REDIS": "redis://127.0.0.1:6379/0", "HOOK": "Bearer h"}
BASE = """
providers:
  anthropic: {api_key: {env: ANTHROPIC_KEY}}
models:
  claude: {provider: anthropic}
"""
HINT = "(`busbar --migrate-config FILE` converts the file)"


def _problems(text):
    config, out = build(text=BASE + textwrap.dedent(text), env=ENV)
    assert config is None
    return out.errors


def _line(path, home):
    return "%s: retired; write %s instead %s" % (path, home, HINT)


# Each of busbar's earlier spellings, the path it is refused at and its home in legacy.py's table.
OWN = [
    ("observability: {metrics: true}", "observability", legacy.RETIRED_TOP["observability"]),
    ("auth: {admin_tokens: [{name: ops, token: {env: ADMIN}}]}", "auth.admin_tokens",
     legacy.RETIRED_IN[("auth", "admin_tokens")]),
    ("auth: {admin_open: true}", "auth.admin_open", legacy.RETIRED_IN[("auth", "admin_open")]),
    ("store: {kind: memory}", "store.kind", legacy.RETIRED_IN[("store", "kind")]),
    ("store: {path: busbar.db}", "store.path", legacy.RETIRED_IN[("store", "path")]),
    ("store: {module: valkey, url: {env: REDIS}}", "store.url",
     legacy.RETIRED_IN[("store", "url")]),
    ("store: {module: memory, flush_interval_ms: 100}", "store.flush_interval_ms",
     legacy.RETIRED_IN[("store", "flush_interval_ms")]),
    ("groups: {g: {limits: [{budget_usd: 5, per: day}]}}", "groups.g.limits[0].budget_usd",
     legacy.RETIRED_LIMIT["budget_usd"]),
    ("rate_card: {claude: {input: 3.0, output_utok: 15.0}}", "rate_card.claude.input",
     legacy.RETIRED_RATE["input"]),
    ("limits: {upstream_pool_max_idle_per_host: 8}", "limits.upstream_pool_max_idle_per_host",
     "limits.pool_max_idle_per_host"),
    ("limits: {upstream_pool_idle_timeout_secs: 8}", "limits.upstream_pool_idle_timeout_secs",
     "limits.pool_idle_timeout_secs"),
    ("limits: {error_body_max_bytes: 8}", "limits.error_body_max_bytes",
     "limits.upstream_error_body_max_bytes"),
]


@pytest.mark.parametrize("snippet, path, home", OWN, ids=[o[1] for o in OWN])
def test_each_earlier_spelling_is_refused_naming_its_new_home(snippet, path, home):
    assert _problems(snippet + "\n") == [_line(path, home)]


@pytest.mark.parametrize("snippet, path, home", OWN, ids=[o[1] for o in OWN])
def test_what_is_refused_the_migrator_converts_to_a_config_that_loads(snippet, path, home):
    from busbar.config import migrate
    out, _ = migrate.migrate_text(BASE + snippet + "\n")
    doc = yaml.safe_load(out)
    assert legacy.markers(doc) == []
    config, problems = build(text=out, env=ENV)
    assert config is not None, problems.errors


def test_the_rates_new_home_says_the_number_is_the_same():
    assert legacy.RETIRED_RATE["cache_write"] == ("cache_write_utok (the same number: per million "
                                                  "tokens = micro-units per token)")


def test_a_file_of_the_earlier_grammar_gets_one_line_per_old_shape_and_nothing_else(tmp_path):
    """tests/fixtures/busbar-0.1-config.yaml through `busbar --validate`: every line is a refusal
    of one shape legacy.markers finds (the migrator's own list), naming this very file."""
    src = ROOT / "tests" / "fixtures" / "busbar-0.1-config.yaml"
    cfg = tmp_path / "old.yaml"
    cfg.write_text(src.read_text())
    e = dict(env(), ANTHROPIC_API_KEY="k", OPENAI_API_KEY="k", BUSBAR_SIGNING_KEY="ab" * 32,
             BUSBAR_ADMIN_TOKEN="a" * 32, BUSBAR_VIEWER_TOKEN="v" * 32,
             BUSBAR_REDIS_URL="redis://127.0.0.1:6379/0")
    r = subprocess.run([PY, "-m", "busbar.cli", "--validate", "--config", str(cfg)], cwd=ROOT,
                       env=e, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    found = legacy.markers(yaml.safe_load(src.read_text()))
    assert len(found) >= 12
    assert r.stderr.splitlines() == [
        "[error] %s: retired; write %s instead (`busbar --migrate-config %s` converts the file)"
        % (path, home, cfg) for path, home in found]


def test_serve_refuses_it_the_same_way(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "auth: {admin_open: true}\n")
    r = subprocess.run([PY, "-m", "busbar.cli", "serve", "--config", str(cfg)], cwd=ROOT,
                       env=dict(env(), **ENV), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "error: auth.admin_open: retired; write auth.admin_auth: [] (an open admin API) instead "
        "(`busbar --migrate-config %s` converts the file)" % cfg)


def test_an_overlay_an_earlier_busbar_wrote_is_carried_over(tmp_path):
    """An earlier busbar's overlay (a whole applied config) is read: the sections the Rust overlay
    format has are carried over; the others (a retired section among them) are left out, and a
    warning names them."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "config: {overlay: {file: ov.json}}\n")
    applied = yaml.safe_load(BASE)
    applied["observability"] = {"metrics": True}
    applied["routing"] = {"default_policy_timeout_ms": 9}
    (tmp_path / "ov.json").write_text(json.dumps({"format": 1, "config": applied}))
    config, out = build(str(cfg), env=ENV)
    assert config is not None and not out.errors, out.errors
    assert config.document["routing"] == {"default_policy_timeout_ms": 9}
    assert "observability" not in config.document
    assert any("not models, observability, providers" in w for w in out.warnings), out.warnings
    # --safe-mode (no overlay) boots the file alone
    config, out = build(str(cfg), env=ENV, overlay=False)
    assert config is not None and not out.errors and "routing" not in config.document


def test_a_budget_in_usd_over_the_admin_api_is_refused_naming_cents():
    from busbar.governance.model import parse_limit
    problems = []
    assert parse_limit({"budget_usd": 5, "per": "day"}, "body.limits[0]", problems) is None
    assert problems == ["body.limits[0].budget_usd: retired; write budget: N, integer cents "
                        "(100 per USD)"]


# --- the store: memory by default -----------------------------------------------------------

KEYS = "auth: {chain: [keys], signing_key: {env: SIGN}}\n"


def test_no_store_is_memory_and_says_keys_go_at_a_restart():
    c = load(text=BASE + KEYS, env=ENV)
    assert c.governance.store.kind == "memory"
    assert [w for w in c.warnings if w.startswith("store:")] == [
        "store: memory: minted keys, usage and revocations are lost at a restart; choose a durable "
        "store.module (sqlite, valkey) to keep them"]
    # sqlite with no db_path: the Rust store's own default name, in the working directory (as the
    # Rust SQLite store resolves every relative db_path: not beside the config)
    c = load(text=BASE + KEYS + "store: {module: sqlite}\n", env=ENV)
    assert c.governance.store.path == os.path.join(os.getcwd(), "busbar-governance.db")
    c = load(text=BASE + KEYS + "store: {module: sqlite, settings: {db_path: ':memory:'}}\n",
             env=ENV)
    assert c.governance.store.path == ":memory:"
    assert not any(w.startswith("store:") for w in c.warnings)
    # nothing counted: no store at all, nothing said
    c = load(text=BASE, env=ENV)
    assert c.governance is None and not c.warnings


def test_busbars_earlier_store_file_beside_the_config_is_named_once(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(BASE + KEYS)
    (tmp_path / "busbar.db").write_bytes(b"")
    c = load(str(cfg), env=ENV)
    assert c.governance.store.kind == "memory"
    assert [w for w in c.warnings if w.startswith("store:")] == [
        "store: none is configured, so keys, groups and spend live in memory (the default) and "
        "%s, busbar's earlier default store, is not read; to keep using it add: store: {module: "
        "sqlite, settings: {db_path: %s}}" % (tmp_path / "busbar.db", tmp_path / "busbar.db")]
    # written as the warning says, it is the store
    cfg.write_text(BASE + KEYS + "store: {module: sqlite, settings: {db_path: %s}}\n"
                   % (tmp_path / "busbar.db"))
    c = load(str(cfg), env=ENV)
    assert c.governance.store.path == str(tmp_path / "busbar.db")
    assert not any(w.startswith("store:") for w in c.warnings)


def test_the_warning_at_boot(tmp_path):
    (tmp_path / "busbar.db").write_bytes(b"")
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        gw = start_gateway(tmp_path, 'listen: "127.0.0.1:{port}"\nadmin_listen: "127.0.0.1:%d"\n'
                           % free_port() + BASE + KEYS, extra_env=ENV, stderr=err)
        stop(gw.proc)
    text = log.read_text()
    assert text.count("busbar's earlier default store, is not read") == 1, text
    assert "store: {module: sqlite, settings: {db_path: %s}}" % (tmp_path / "busbar.db") in text
