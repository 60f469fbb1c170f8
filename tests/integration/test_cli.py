"""busbar's command line as the Rust gateway's (issue 36): each flag run as a process, its exit
code and what goes to stdout and what to stderr checked, as a script or an operator meets them."""
import json
import os
import re
import subprocess

import pytest

from tests.conftest import PY, ROOT, env, free_port, stop, wait_http

USAGE = "busbar: unrecognized argument '%s'. Try 'busbar --help'.\n"

CONFIG = """\
listen: "127.0.0.1:{port}"
config: {{overlay: {{file: overlay.json}}}}
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:9"}}
models:
  x: {{provider: m, upstream_model: gpt-x}}
pools:
  p:
    members:
      - {{model: x}}
advanced: {{worker_threads: 1}}
"""


def _env(**extra):
    """The test environment without BUSBAR_CONFIG / BUSBAR_LOG / RUST_LOG, plus `extra`."""
    e = {k: v for k, v in env().items() if k not in ("BUSBAR_CONFIG", "BUSBAR_LOG", "RUST_LOG")}
    e.update(extra)
    return e


def _busbar(*args, e=None, cwd=ROOT):
    return subprocess.run([PY, "-m", "busbar.cli", *args], cwd=cwd, env=e or _env(),
                          capture_output=True, text=True, timeout=60)


def _config(tmp_path, port=None, text=CONFIG):
    p = tmp_path / "config.yaml"
    p.write_text(text.format(port=port or free_port()))
    return p


def _overlay(tmp_path, root: dict, version=None):
    """An overlay as the admin API leaves it (busbar/admin/overlay.py), with `root` settings."""
    from busbar.admin import overlay
    doc = overlay.empty()
    doc["root"] = root
    path = tmp_path / "overlay.json"
    overlay.write(str(path), doc)
    if version is not None:
        data = json.loads(path.read_text())
        data["version"] = version
        path.write_text(json.dumps(data))
    return path


# --- busbar alone ------------------------------------------------------------------------------


def test_busbar_alone_serves_busbar_config_and_stops_cleanly(tmp_path):
    """`busbar` with no argument serves $BUSBAR_CONFIG: /healthz answers, the listening line is on
    stdout, SIGTERM stops it with exit 0."""
    port = free_port()
    cfg = _config(tmp_path, port)
    proc = subprocess.Popen([PY, "-m", "busbar.cli"], cwd=tmp_path,
                            env=_env(BUSBAR_CONFIG=str(cfg), PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(port, proc)
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/healthz")
        assert c.getresponse().status == 200
    finally:
        stop(proc)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert re.search(r"^busbar \S+ listening on 127\.0\.0\.1:%d \(1 provider\(s\), 1 model\(s\), "
                     r"1 pool\(s\)\)$" % port, out, re.M), out
    assert "Traceback" not in err


@pytest.mark.skipif(os.path.exists("/etc/busbar/config.yaml"), reason="this host has one")
def test_busbar_alone_without_a_config_says_where_it_looked(tmp_path):
    """No $BUSBAR_CONFIG and no /etc/busbar/config.yaml: one line naming that path and how to
    point busbar elsewhere, exit 1, nothing on stdout; the same for --validate. A $BUSBAR_CONFIG
    naming no file is named."""
    want = ("[error] no config file: $BUSBAR_CONFIG is not set and there is no "
            "/etc/busbar/config.yaml; point busbar at one with $BUSBAR_CONFIG=PATH or --config "
            "PATH (or try `busbar serve --demo`, which needs none)\n")
    for args in ((), ("--validate",), ("--safe-mode",)):
        r = _busbar(*args, cwd=tmp_path)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", want), (args, r.stderr)
    nowhere = tmp_path / "nowhere.yaml"
    r = _busbar(e=_env(BUSBAR_CONFIG=str(nowhere)))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("[error] $BUSBAR_CONFIG names %s, which does not exist; point busbar at "
                        "one with $BUSBAR_CONFIG=PATH or --config PATH (or try `busbar serve "
                        "--demo`, which needs none)\n" % nowhere)


def test_a_config_busbar_refuses_fails_boot_with_its_errors_on_stderr(tmp_path):
    cfg = _config(tmp_path, text=CONFIG.replace("upstream_model", "upstream_modle"))
    r = _busbar(e=_env(BUSBAR_CONFIG=str(cfg)))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and all(line.startswith("[error] ") for line in lines), r.stderr
    assert any(line.startswith("[error] models.x.upstream_modle: ") for line in lines), r.stderr


# --- --validate --------------------------------------------------------------------------------


def test_validate_reads_busbar_config_or_config_and_prints_the_rust_summary(tmp_path):
    cfg = _config(tmp_path)
    want = ("ok: config valid — 1 provider(s), 1 model(s), 1 pool(s)\n"
            "  config:    %s\n"
            "  plugins:   disabled (plugins.enabled is false; no plugin will load)\n" % cfg)
    r = _busbar("--validate", e=_env(BUSBAR_CONFIG=str(cfg)))
    assert (r.returncode, r.stdout) == (0, want), r.stderr
    r = _busbar("--validate", "--config", str(cfg))
    assert (r.returncode, r.stdout) == (0, want), r.stderr
    # --config wins over $BUSBAR_CONFIG; the option may come first
    r = _busbar("--config=%s" % cfg, "--validate", e=_env(BUSBAR_CONFIG="/nonexistent.yaml"))
    assert (r.returncode, r.stdout) == (0, want), r.stderr


def test_validate_errors_are_one_bracketed_line_each_on_stderr(tmp_path):
    cfg = _config(tmp_path, text=CONFIG.replace("upstream_model", "upstream_modle")
                  .replace("{{model: x}}", "{{model: nope}}"))
    r = _busbar("--validate", e=_env(BUSBAR_CONFIG=str(cfg)))
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("[error] ") for line in lines), r.stderr
    assert any("models.x.upstream_modle" in line for line in lines)
    assert any("pools.p" in line and "nope" in line for line in lines)


def test_validate_resolves_secrets_but_reads_an_unset_var_as_its_name(tmp_path):
    """A clean --validate is a clean boot for secrets: an unset {env: NAME} is an error naming it
    (its value never printed). An unset ${VAR} is read as its bare name and listed in a note on
    stdout, as the Rust gateway does; `busbar validate` (busbar's) still refuses it."""
    text = CONFIG.replace('base_url: "http://127.0.0.1:9"',
                          'base_url: "http://127.0.0.1:9", api_key: {{env: CLI_TEST_KEY}}')
    cfg = _config(tmp_path, text=text)
    r = _busbar("--validate", "--config", str(cfg))
    assert r.returncode == 1 and "CLI_TEST_KEY" in r.stderr and r.stdout == ""
    secret = "sk-cli-test-secret-value"
    r = _busbar("--validate", "--config", str(cfg), e=_env(CLI_TEST_KEY=secret))
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    cfg.write_text(text.format(port=free_port()).replace("gpt-x", "gpt-${CLI_TEST_MODEL}"))
    r = _busbar("--validate", "--config", str(cfg), e=_env(CLI_TEST_KEY=secret))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == ("  note: 1 env var(s) referenced but unset here — "
                                         "required at runtime: CLI_TEST_MODEL")
    r = _busbar("validate", "--config", str(cfg), e=_env(CLI_TEST_KEY=secret))
    assert r.returncode == 1 and "${CLI_TEST_MODEL}: environment variable is not set" in r.stderr
    # --offline (busbar's): no secret read, the unset variable a note on stderr
    r = _busbar("--validate", "--offline", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "note: ${CLI_TEST_MODEL} is not set" in r.stderr


def test_validate_has_no_side_effects(tmp_path):
    cfg = _config(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert _busbar("--validate", "--config", str(cfg), cwd=tmp_path).returncode == 0
    assert sorted(os.listdir(tmp_path)) == before


# --- --safe-mode -------------------------------------------------------------------------------


def test_safe_mode_validates_the_config_file_without_its_overlay(tmp_path):
    cfg = _config(tmp_path)
    _overlay(tmp_path, {"routing": {"default_policy_timeout_ms": 0}})
    # an overlay entry that does not validate is left out, with a warning (never a failed start)
    r = _busbar("--validate", "--config", str(cfg))
    assert r.returncode == 0 and "[warn] config.overlay: root.routing: left out" in r.stderr, r.stderr
    for args in (("--validate", "--safe-mode"), ("--safe-mode", "--validate"),
                 ("validate", "--safe-mode")):
        r = _busbar(*args, "--config", str(cfg))
        assert r.returncode == 0 and "1 model(s)" in r.stdout, (args, r.stdout + r.stderr)
        assert "config.overlay" not in r.stderr, (args, r.stderr)


def test_safe_mode_boots_past_an_overlay_busbar_cannot_read(tmp_path):
    """An overlay written by another busbar version refuses the boot (exit 1, one [error] line
    naming it); `busbar --safe-mode` serves the config file alone and says so."""
    from busbar.admin.overlay import OVERLAY_VERSION
    port = free_port()
    cfg = _config(tmp_path, port)
    overlay = _overlay(tmp_path, {}, version=OVERLAY_VERSION + 1)
    e = _env(BUSBAR_CONFIG=str(cfg))
    r = _busbar(e=e)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("[error] config.overlay: "), r.stderr
    r = _busbar("--validate", e=e)
    assert r.returncode == 1 and r.stderr.startswith("[error] config.overlay: "), r.stderr
    proc = subprocess.Popen([PY, "-m", "busbar.cli", "--safe-mode"], cwd=tmp_path, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(port, proc)
    finally:
        stop(proc)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "listening on" in out, err
    assert "safe mode: the config overlay is not applied" in err
    assert json.loads(overlay.read_text())["version"] == OVERLAY_VERSION + 1    # left as it is


# --- --generate-signing-key --------------------------------------------------------------------


def test_generate_signing_key_prints_the_key_on_stdout_only():
    """64 lowercase hex characters and a newline on stdout, nothing else; a new key each run; an
    ed25519 seed; the guidance on stderr, which never contains it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    keys = []
    for _ in range(2):
        r = _busbar("--generate-signing-key")
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(r"[0-9a-f]{64}\n", r.stdout), r.stdout
        key = r.stdout.strip()
        assert key not in r.stderr and key.upper() not in r.stderr
        assert "auth:" in r.stderr and "signing_key: {file: " in r.stderr
        Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key))
        keys.append(key)
    assert keys[0] != keys[1]


def test_a_generated_key_is_what_busbar_reads_from_a_file(tmp_path):
    """`busbar --generate-signing-key > FILE` leaves a file whose secret (as busbar's secret
    reference reads it) is exactly the 64 hex characters."""
    from busbar.config.checks import Problems
    from busbar.config.secrets import resolve_secret
    key_file = tmp_path / "signing.key"
    with open(key_file, "w") as fh:
        subprocess.run([PY, "-m", "busbar.cli", "--generate-signing-key"], cwd=ROOT, env=_env(),
                       stdout=fh, stderr=subprocess.DEVNULL, timeout=60, check=True)
    out = Problems()
    secret = resolve_secret({"file": str(key_file)}, "auth.signing_key", {}, str(tmp_path), out)
    assert not out.errors and re.fullmatch(r"[0-9a-f]{64}", secret)


# --- --print-metadata-blocklist ----------------------------------------------------------------

# The Rust gateway's built-in list (crates/busbar/src/config_validate/mod.rs,
# metadata_denylist_entries, at 1a74c3b6): busbar's must be the same set.
RUST_BLOCKLIST = {
    "169.254.0.0/16", "100.100.100.200", "168.63.129.16", "192.0.0.192", "fd00:ec2::254",
    "metadata.google.internal", "metadata.internal", "metadata.tencentyun.com",
    "metadata.platformequinix.com", "instance-data", "instance-data.ec2.internal",
}


def test_print_metadata_blocklist_without_a_config(tmp_path):
    r = _busbar("--print-metadata-blocklist", e=_env(BUSBAR_CONFIG=str(tmp_path / "none.yaml")))
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert set(lines) == RUST_BLOCKLIST and len(lines) == len(RUST_BLOCKLIST)
    assert lines[0] == "169.254.0.0/16"


def test_print_metadata_blocklist_adds_the_configs_own_and_warns_when_it_cannot(tmp_path):
    cfg = _config(tmp_path, text=CONFIG + "security:\n  blocked_metadata_hosts: "
                  "[\"10.99.99.99\", \"meta.corp.example\"]\n")
    for args, e in ((("--print-metadata-blocklist",), _env(BUSBAR_CONFIG=str(cfg))),
                    (("--print-metadata-blocklist", "--config", str(cfg)), _env())):
        r = _busbar(*args, e=e)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        lines = r.stdout.splitlines()
        assert set(lines[:-2]) == RUST_BLOCKLIST
        assert lines[-2:] == ["10.99.99.99", "meta.corp.example"]
    cfg.write_text(cfg.read_text() + "no_such_key: 1\n")
    r = _busbar("--print-metadata-blocklist", e=_env(BUSBAR_CONFIG=str(cfg)))
    assert r.returncode == 0 and set(r.stdout.splitlines()) == RUST_BLOCKLIST
    assert r.stderr.startswith("warning: config at %s did not load; printing the built-in "
                               "metadata blocklist only" % cfg), r.stderr


# --- --list-plugins, --migrate-config ----------------------------------------------------------


def test_list_plugins_is_the_empty_inventory(tmp_path):
    cfg = _config(tmp_path)
    r = _busbar("--list-plugins", e=_env(BUSBAR_CONFIG=str(cfg)), cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == "plugins dir: plugins (plugins.enabled: false)\nno plugin tarballs found\n"
    # no config: a warning, and the default plugins block
    r = _busbar("--list-plugins", e=_env(BUSBAR_CONFIG=str(tmp_path / "none.yaml")), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("plugins dir: plugins (plugins.enabled: false)")
    assert r.stderr.startswith("[warn] ")
    # a tarball there is listed, never loaded
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "valkey-store.tar.gz").write_bytes(b"not read")
    r = _busbar("--list-plugins", "--config", str(cfg), cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.splitlines()[-1].startswith("valkey-store.tar.gz")
    assert "not loaded" in r.stdout.splitlines()[-1]


def test_migrate_config_needs_a_path():
    r = _busbar("--migrate-config")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("busbar: --migrate-config requires a path: busbar --migrate-config "
                        "<old-config.yaml>\n")


def test_migrate_config_runs_the_migrator_with_the_path(tmp_path):
    """The flag hands FILE to busbar.config.migrate.main and exits with what it returns."""
    fake = ("import sys, types; m = types.ModuleType('busbar.config.migrate'); "
            "m.main = lambda path: print('migrating', path) or 3; "
            "sys.modules['busbar.config.migrate'] = m; "
            "from busbar.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([PY, "-c", fake, "--migrate-config", "old.yaml"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (3, "migrating old.yaml\n"), r.stderr


# --- version, help, usage errors ---------------------------------------------------------------


def test_version_and_help():
    from busbar import __version__
    for flag in ("-V", "--version"):
        r = _busbar(flag)
        assert (r.returncode, r.stdout, r.stderr) == (0, "busbar %s\n" % __version__, "")
    for flag in ("-h", "--help"):
        r = _busbar(flag)
        assert r.returncode == 0 and r.stderr == ""
        for word in ("--validate", "--migrate-config FILE", "--generate-signing-key",
                     "--print-metadata-blocklist", "--list-plugins", "--safe-mode", "--config PATH",
                     "BUSBAR_CONFIG", "/etc/busbar/config.yaml", "RUST_LOG", "BUSBAR_LOG",
                     "64", "busbar serve", "busbar validate", "busbar mock"):
            assert word in r.stdout, word


def test_an_unknown_argument_is_a_usage_error():
    """Exit 2, one line on stderr naming it, nothing started: as the first argument, after a
    flag, or an option the flag does not take."""
    for args, bad in ((("--bogus",), "--bogus"), (("frobnicate",), "frobnicate"),
                      (("--validate", "--bogus"), "--bogus"), (("--version", "x"), "x"),
                      (("--generate-signing-key", "--safe-mode"), "--safe-mode"),
                      (("--offline",), "--offline"), (("--demo",), "--demo")):
        r = _busbar(*args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", USAGE % bad), args
    r = _busbar("--validate", "--config")
    assert r.returncode == 2 and "--config requires a path" in r.stderr


# --- log level ---------------------------------------------------------------------------------


def test_log_level_from_busbar_log_or_rust_log():
    from busbar.cli import log_level, rust_log_level
    assert rust_log_level("debug") == "DEBUG"
    assert rust_log_level("WARN") == "WARNING"
    assert rust_log_level("trace") == "DEBUG"
    assert rust_log_level("hyper=warn,busbar=debug") == "DEBUG"
    assert rust_log_level("error,busbar=info") == "INFO"
    assert rust_log_level("busbar=debug,warn") == "DEBUG"
    assert rust_log_level("hyper=debug") is None
    assert rust_log_level("nonsense") is None and rust_log_level("") is None
    assert log_level({"RUST_LOG": "debug"}) == ("DEBUG", None)
    assert log_level({"BUSBAR_LOG": "error", "RUST_LOG": "debug"}) == ("ERROR", None)
    assert log_level({"BUSBAR_LOG": "warn"}) == ("WARNING", None)
    assert log_level({}) == (None, None)
    level, warning = log_level({"BUSBAR_LOG": "loud"})
    assert level is None and "BUSBAR_LOG='loud' is not a log level" in warning


def test_rust_log_reaches_the_gateways_loggers(tmp_path):
    """The level RUST_LOG names is the process's (the root logger) and is handed to the gateway's
    own loggers as BUSBAR_LOG (what busbar/observability reads over the config's log_level);
    BUSBAR_LOG beside it wins. A BUSBAR_LOG that names no level is a warning, not a crash."""
    cfg = _config(tmp_path)
    code = ("import logging, os, sys; from busbar import cli; cli._setup_logging(); "
            "print(os.environ.get('BUSBAR_LOG'), logging.getLevelName(logging.getLogger().level))")
    for extra, want in (({"RUST_LOG": "warn"}, "WARNING WARNING"),
                        ({"RUST_LOG": "hyper=info,busbar=debug"}, "DEBUG DEBUG"),
                        ({"RUST_LOG": "warn", "BUSBAR_LOG": "info"}, "INFO INFO"),
                        ({}, "None INFO")):
        r = subprocess.run([PY, "-c", code], cwd=ROOT, env=_env(BUSBAR_CONFIG=str(cfg), **extra),
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == want, (extra, r.stdout, r.stderr)
    r = _busbar("--validate", e=_env(BUSBAR_CONFIG=str(cfg), BUSBAR_LOG="loud"))
    assert r.returncode == 0 and "BUSBAR_LOG='loud' is not a log level" in r.stderr
