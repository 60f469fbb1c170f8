"""`busbar --migrate-config` (busbar/config/migrate.py) on the migration corpus
(tests/fixtures/migration-corpus/: one era-shaped config per grammar change of the Rust gateway,
0.9 -> 1.5.2) and on busbar's own earlier grammar (tests/fixtures/busbar-0.1-config.yaml).

What the corpus README asks of a migration, as far as it holds before the 1.5.3 grammar is busbar's
own (issue #36): every file migrates; the output holds no retired shape (busbar/config/legacy.py,
the same table the loader's refusals use); a second migration changes nothing; the output opens
with a comment exactly when a decision was deferred (TODO/WARNING), and at least one file needs
none. The corpus README's second assertion (`busbar --validate` passes on the output with only the
signing key and an admin credential supplied) joins here when the loader reads the 1.5.3 grammar.
"""
from __future__ import annotations

import pathlib

import pytest
import yaml

from busbar.config import legacy, migrate

CORPUS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "migration-corpus"
OWN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "busbar-0.1-config.yaml"
FILES = sorted(CORPUS.glob("*.yaml"))
NEEDS_MODULE = sorted((CORPUS / "needs-module").glob("*.yaml"))


def test_the_corpus_is_not_emptied():
    assert len(FILES) >= 20
    assert len(NEEDS_MODULE) >= 5


def _decision_expected(path):
    """The file's own header says whether a migration must decide something ("nothing" = no)."""
    head = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        head.append(line)
    text = " ".join(head)
    decide = text.split("Migration must decide", 1)[1] if "Migration must decide" in text else ""
    return not decide.lstrip(": #").startswith("nothing")


@pytest.mark.parametrize("path", FILES + NEEDS_MODULE, ids=lambda p: p.name)
def test_each_config_migrates_to_the_current_grammar(path, capsys):
    assert migrate.main(str(path)) == 0
    captured = capsys.readouterr()
    out = captured.out
    doc = yaml.safe_load(out)
    assert isinstance(doc, dict) and "providers" in doc and "models" in doc
    assert legacy.markers(doc) == [], out
    # the banner exactly when something was deferred, and each deferred line names a path
    decided = "TODO(migrate)" in out or "WARNING(migrate)" in out
    assert out.startswith("#") == decided
    for line in out.splitlines():
        if line.startswith(("# TODO(migrate): ", "# WARNING(migrate): ")):
            assert ": " in line.split("(migrate): ", 1)[1], line
    assert captured.err.startswith("migrated '%s': " % path)
    # a second migration finds nothing left to change
    again, m = migrate.migrate_text(out)
    assert yaml.safe_load(again) == doc
    assert m.changes == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_decision_is_deferred_exactly_where_the_file_says_one_is_needed(path):
    _, m = migrate.migrate_text(path.read_text())
    assert bool(m.todos or m.warnings) == _decision_expected(path), (m.todos, m.warnings)


def test_at_least_one_file_needs_no_decision_and_reads_like_a_hand_written_one():
    clean = [p for p in FILES if not migrate.migrate_text(p.read_text())[1].todos
             and not migrate.migrate_text(p.read_text())[1].warnings]
    assert clean
    for p in clean:
        assert not migrate.migrate_text(p.read_text())[0].startswith("#")


@pytest.mark.parametrize("path", NEEDS_MODULE, ids=lambda p: p.name)
def test_a_config_needing_a_module_names_it(path):
    out, m = migrate.migrate_text(path.read_text())
    doc = yaml.safe_load(out)
    modules = {d.get("module") for section in ("hooks", "identity-providers")
               for d in (doc.get(section) or {}).values() if isinstance(d, dict)}
    assert modules - {"keys", "admin-tokens"}, out
    assert m.todos


def test_rules_that_need_no_decision():
    out, m = migrate.migrate_text("""
admin_insecure: true
tls: {cert_file: /etc/tls/c.pem, key_file: /etc/tls/k.pem}
auth: {mode: passthrough}
providers:
  openai: {api_key_env: OAI}
models:
  gpt: {provider: openai}
pools:
  p:
    members: [{target: gpt, weight: 2}]
    breaker: {trip: {window_s: 30, n: 4}}
    failover: {deadline_secs: 40, cap: 2}
    on_exhausted: {action: "fallback_pool: q"}
  q: {members: [{model: gpt}], route: least_busy}
store: {module: redis, settings: {url: "redis://127.0.0.1:6379"}}
""")
    doc = yaml.safe_load(out)
    assert m.todos == [] and m.warnings == [] and not out.startswith("#")
    assert doc["admin_require_mtls"] is False
    assert doc["tls"] == {"cert": {"file": "/etc/tls/c.pem"}, "key": {"file": "/etc/tls/k.pem"}}
    assert "auth" not in doc and doc["pools"]["upstream_credentials"] == "passthrough"
    assert doc["providers"]["openai"] == {"api_key": {"env": "OAI"}}
    p = doc["pools"]["p"]
    assert p["members"] == [{"model": "gpt", "weight": 2}]      # same place, same value
    assert p["breaker"]["trip"] == {"window_secs": 30, "consecutive_n": 4}
    assert p["failover"] == {"timeout_secs": 40, "max_hops": 2}
    assert p["on_exhausted"] == {"fallback_pool": "q"}
    assert doc["pools"]["q"]["hooks"] == ["least_busy"] and "route" not in doc["pools"]["q"]
    assert doc["store"]["module"] == "valkey"


def test_busbars_own_earlier_grammar():
    out, m = migrate.migrate_text(OWN.read_text())
    doc = yaml.safe_load(out)
    assert legacy.markers(doc) == []
    assert doc["groups"]["org"]["limits"] == [{"budget": 50000, "per": "month"}]   # 500 USD in cents
    assert doc["groups"]["team-a"]["limits"][1] == {"budget": 500, "per": "day"}
    assert doc["rate_card"]["claude"] == {"input_utok": 3.0, "output_utok": 15.0,
                                          "cache_read_utok": 0.3, "cache_write_utok": 3.75}
    assert doc["store"] == {"module": "valkey", "settings": {"url": {"env": "BUSBAR_REDIS_URL"},
                                                             "fail_mode": "closed"}}
    assert doc["advanced"]["usage_flush_interval_ms"] == 200
    assert doc["limits"] == {"request_body_max_bytes": 33554432, "pool_max_idle_per_host": 128,
                             "upstream_error_body_max_bytes": 65536}
    assert doc["auth"]["admin_auth"] == ["admin-tokens", "viewer"]
    assert doc["identity-providers"]["admin-tokens"] == {
        "module": "admin-tokens", "token": {"env": "BUSBAR_ADMIN_TOKEN"}}
    assert doc["identity-providers"]["viewer"]["max_admin_scope"] == "read-only"
    export = doc["export"]
    assert export["metrics"]["module"] == "prometheus"
    assert export["traces"] == {"module": "otlp", "settings": {
        "url": "https://collector.example.com:4318/v1/traces"}}
    assert {e["module"] for e in export.values()} == {
        "prometheus", "request-log-file", "request-log-webhook", "otlp", "access-log"}
    # what has no home is said, with its path, not dropped silently
    said = " ".join(m.todos)
    for path in ("observability.otlp.sample_ratio", "observability.log_level",
                 "export.metrics.settings.buffer_seconds"):
        assert path in said


def test_interpolation_is_left_as_written():
    out, _ = migrate.migrate_text('listen: "${HOST}:8080"\nproviders:\n  openai: {api_key_env: K}\n'
                                  'models:\n  m: {provider: openai}\n')
    assert 'listen: "${HOST}:8080"' in out


def test_a_literal_secret_is_replaced_by_a_reference_with_a_todo():
    _, m = migrate.migrate_text("governance: {admin_token: hunter2}\nproviders: {}\nmodels: {}\n")
    out, _ = migrate.migrate_text("governance: {admin_token: hunter2}\nproviders: {}\nmodels: {}\n")
    assert "hunter2" not in out
    assert yaml.safe_load(out)["identity-providers"]["admin-tokens"]["token"] == {
        "env": migrate.ADMIN_TOKEN_ENV}
    assert any(t.startswith("governance.admin_token: ") for t in m.todos)


@pytest.mark.parametrize("text, why", [("a: [1, 2\n", "not YAML (line"),
                                       ("- a\n- b\n", "top level must be a mapping")])
def test_what_is_not_a_config_is_refused_in_one_line(tmp_path, capsys, text, why):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    assert migrate.main(str(p)) == 1
    err = capsys.readouterr()
    assert err.out == "" and why in err.err and len(err.err.strip().splitlines()) == 1
    assert migrate.main(str(tmp_path / "absent.yaml")) == 1
