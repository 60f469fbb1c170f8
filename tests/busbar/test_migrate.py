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
    assert export["traces"] == {"module": "otlp", "settings": {      # sample_ratio: busbar's own
        "url": "https://collector.example.com:4318/v1/traces", "sample_ratio": 1.0}}
    assert export["request-log-1"]["settings"]["auth_header"] == {"name": "authorization",
                                                                   "value": "${HOOK_AUTH}"}
    # access_log: stderr and log_level: info are the defaults; nothing stands for them
    assert {e["module"] for e in export.values()} == {
        "prometheus", "request-log-file", "request-log-webhook", "otlp"}
    # what needs a decision is said, with its path
    assert [t.split(":")[0] for t in m.todos] == ["export.metrics.settings.buffer_seconds"]
    assert any(w.startswith("observability.metrics: /metrics is now also served on the data "
                            "listener") for w in m.warnings)


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


# --- the corpus README's second assertion: the output validates ---------------------------------

def _refs(node, envs, files):
    if isinstance(node, dict):
        if set(node) == {"env"} and isinstance(node["env"], str):
            envs.add(node["env"])
        elif set(node) == {"file"} and isinstance(node["file"], str):
            files.append(node)
        else:
            for v in node.values():
                _refs(v, envs, files)
    elif isinstance(node, list):
        for v in node:
            _refs(v, envs, files)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """The corpus README's stand-ins: a file of 64 'a' for every file reference, and for the TLS
    references a real self-signed certificate and key (busbar's --validate loads TLS material, so
    a clean validate means a clean boot; 64 'a' is not PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import datetime
    d = tmp_path_factory.mktemp("stand-ins")
    (d / "a64").write_text("a" * 64)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return d


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_migrated_config_validates_with_only_the_two_decisions_supplied(path, stand_ins,
                                                                           tmp_path):
    import re
    import subprocess

    from tests.conftest import PY, ROOT, env
    m = subprocess.run([PY, "-m", "busbar.cli", "--migrate-config", str(path)], cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=60)
    assert m.returncode == 0, m.stderr
    doc = yaml.safe_load(m.stdout)
    auth = doc.get("auth") or {}
    if "keys" in (auth.get("chain") or []):      # the two decisions a migrator cannot make
        auth.setdefault("signing_key", {"env": "CORPUS_SIGNING_KEY"})
        auth.setdefault("admin_auth", ["admin-tokens"])
        doc["auth"] = auth
        doc.setdefault("identity-providers", {}).setdefault(
            "admin-tokens", {"module": "admin-tokens", "token": {"env": "CORPUS_ADMIN_TOKEN"}})
    envs, files = set(), []
    _refs(doc, envs, files)
    for section in ("tls", "admin_tls"):
        for k, f in (("cert", "cert.pem"), ("client_ca", "cert.pem"), ("key", "key.pem")):
            ref = (doc.get(section) or {}).get(k)
            if isinstance(ref, dict) and "file" in ref:
                ref["file"] = str(stand_ins / f)
    for ref in files:
        if not ref["file"].startswith(str(stand_ins)):
            ref["file"] = str(stand_ins / "a64")
    text = yaml.safe_dump(doc, sort_keys=False)
    e = env()
    e.update({name: "a" * 64 for name in envs | set(re.findall(r"\$\{(\w+)\}", text))})
    for name, p in (doc.get("providers") or {}).items():
        key = p.get("api_key") if isinstance(p, dict) else None
        if "bedrock" in name and isinstance(key, dict) and "env" in key:
            # a Bedrock credential's shape is ACCESS_KEY_ID:SECRET, checked at validate
            e[key["env"]] = "AKIDSTANDIN:" + "a" * 40
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    v = subprocess.run([PY, "-m", "busbar.cli", "--validate", "--config", str(cfg)], cwd=ROOT,
                       env=e, capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stderr
    assert v.stdout.startswith("ok: config valid")


# --- busbar's own earlier grammar: what it converts to validates, and keeps the store -----------

OWN_ENV = {"ANTHROPIC_API_KEY": "sk-ant-x", "OPENAI_API_KEY": "sk-oai-x", "HOOK_AUTH": "Bearer h",
           "BUSBAR_SIGNING_KEY": "ab" * 32, "BUSBAR_ADMIN_TOKEN": "a" * 32,
           "BUSBAR_VIEWER_TOKEN": "v" * 32, "BUSBAR_REDIS_URL": "redis://127.0.0.1:6379/0"}


def _migrate_and_validate(tmp_path, text):
    """`busbar --migrate-config` on `text` as tmp_path/config.yaml, its output written over it (the
    same folder: relative paths mean the same files), then `busbar --validate` on that; the old
    file is refused first, naming each of its old shapes."""
    import subprocess

    from tests.conftest import PY, ROOT, env
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    e = dict(env(), **OWN_ENV)
    old = subprocess.run([PY, "-m", "busbar.cli", "--validate", "--config", str(cfg)], cwd=ROOT,
                         env=e, capture_output=True, text=True, timeout=60)
    assert old.returncode == 1 and "busbar --migrate-config %s" % cfg in old.stderr, old.stderr
    m = subprocess.run([PY, "-m", "busbar.cli", "--migrate-config", str(cfg)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=60)
    assert m.returncode == 0, m.stderr
    cfg.write_text(m.stdout)
    v = subprocess.run([PY, "-m", "busbar.cli", "--validate", "--config", str(cfg)], cwd=ROOT,
                       env=e, capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("ok: config valid"), v.stderr
    return yaml.safe_load(m.stdout), m.stderr


def test_busbars_own_config_migrates_to_one_that_validates(tmp_path):
    doc, _ = _migrate_and_validate(tmp_path, OWN.read_text())
    assert doc["store"]["module"] == "valkey"


@pytest.mark.parametrize("store, db", [
    (None, "busbar.db"),                              # no store: busbar's default file
    ("store: {kind: sqlite}", "busbar.db"),          # sqlite without a path: the same file
    ("store: {path: gov/keys.db}", "gov/keys.db"),   # a path alone: sqlite was the default kind
])
def test_the_store_file_busbar_used_is_kept(tmp_path, store, db):
    text = "\n".join(line for line in OWN.read_text().splitlines() if not line.startswith("store:"))
    if store is not None:
        text += "\n" + store + "\n"
    doc, report = _migrate_and_validate(tmp_path, text)
    # written absolute: busbar read it beside the config, a relative one is the working directory's
    assert doc["store"] == {"module": "sqlite", "settings": {"db_path": str(tmp_path / db)}}
    assert "store.settings.db_path: %s made absolute" % db in report
    if store is None:
        assert "store: busbar's earlier default made explicit: SQLite in busbar.db" in report
    from busbar.config import load
    c = load(str(tmp_path / "config.yaml"), env=OWN_ENV)
    assert c.governance.store.path == str(tmp_path / db)


def test_a_config_with_nothing_to_count_gets_no_store():
    out, m = migrate.migrate_text("providers:\n  openai: {api_key: {env: K}}\nmodels:\n"
                                  "  gpt: {provider: openai}\nauth: {admin_open: true}\n")
    assert "store" not in yaml.safe_load(out)
    # a Rust 1.x config counting keys had the memory store there: it keeps it
    out, _ = migrate.migrate_text((CORPUS / "v0.9.0_single-token-auth.yaml").read_text())
    doc = yaml.safe_load(out)
    assert doc["auth"]["chain"] == ["keys"] and "store" not in doc


def test_busbars_observability_leaves_nothing_behind():
    out, m = migrate.migrate_text("""
providers: {openai: {api_key: {env: K}}}
models: {gpt: {provider: openai}}
observability:
  access_log: "off"
  log_level: debug
  metrics: true
  metrics_public: true
  request_logs:
    - {kind: file, path: /tmp/r.jsonl, fields: [time, pool, outcome]}
    - {kind: webhook, url: "https://logs.example.org/in", auth_header: {file: /run/secrets/hook}}
  otlp: {url: "https://collector.example.org/v1/traces", sample_ratio: 0.25,
         headers: {x-token: {env: OTLP_TOKEN}}}
""")
    export = yaml.safe_load(out)["export"]
    assert export["access-log"] == {"module": "access-log", "settings": {"path": "off"}}
    assert export["request-log-0"] == {"module": "request-log-file",
                                       "settings": {"path": "/tmp/r.jsonl"},
                                       "fields": ["time", "pool", "outcome"]}
    assert export["traces"]["settings"] == {"url": "https://collector.example.org/v1/traces",
                                            "sample_ratio": 0.25,
                                            "headers": {"x-token": {"env": "OTLP_TOKEN"}}}
    todos = dict(t.split(": ", 1) for t in m.todos)
    assert todos["observability.log_level"] == ("the level is the environment's now: set "
                                                "RUST_LOG=debug (or BUSBAR_LOG)")
    assert "observability.request_logs[1].auth_header" in todos      # a file reference: a decision
    # chain [] before and after: /metrics on the data listener stays open, no meaning changed
    assert not any(w.startswith("observability.metrics") for w in m.warnings)


def test_a_webhook_transport_becomes_the_sidecar_forwarder_busbar_runs():
    """1.x `webhook:` hooks (registry entries, inline hooks, `route: webhook` policies) become
    `busbar-webrequest-hook` definitions (issue #40), which busbar runs: no decision left for them;
    a socket keeps its path beside the entry's own settings."""
    out, m = migrate.migrate_text("""
hooks:
  pii: {kind: gate, webhook: "https://pii.example.net/check", prompt: ro, on_error: reject}
  rank: {kind: gate, socket: /run/rank.sock, settings: {prefer: cost}}
providers:
  openai: {api_key: {env: OAI}}
models:
  gpt: {provider: openai}
pools:
  p:
    route: webhook
    policy: {url: "https://router.example.net/", timeout_ms: 5}
    members: [{model: gpt}]
""")
    doc = yaml.safe_load(out)
    assert doc["hooks"]["pii"]["module"] == "busbar-webrequest-hook"
    assert doc["hooks"]["pii"]["settings"] == {"url": "https://pii.example.net/check"}
    assert doc["hooks"]["rank"]["settings"] == {"prefer": "cost", "path": "/run/rank.sock"}
    assert doc["hooks"]["p-policy"]["module"] == "busbar-webrequest-hook"
    assert doc["hooks"]["p-policy"]["settings"] == {"url": "https://router.example.net/"}
    assert [t for t in m.todos if "pii" in t or "p-policy" in t] == []
    assert any("hooks.rank" in t and "'socket'" in t for t in m.todos)
