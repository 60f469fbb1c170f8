"""The first five minutes, as a new user meets them (issue 9): the README's example config
validates, `validate --offline` lints without the environment, `busbar --help` lists every
command (`busbar` alone serves: tests/integration/test_cli.py), `validate` without a config says
where it looked, a config needing a package this install lacks is refused in one line, `busbar
mock --help` says its port, and every command the demo banner prints runs as printed, whichever
Python (or none) busbar runs on."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import PY, ROOT, env, free_port, stop, wait_http


def _cli(*args, e=None):
    return subprocess.run([PY, "-m", "busbar.cli", *args], cwd=ROOT, env=e or env(),
                          capture_output=True, text=True, timeout=60)


def readme_config():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_readme_config_validates_offline_in_an_empty_environment(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(readme_config())
    bare = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    r = _cli("validate", "--offline", "--config", str(p), e=bare)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: config valid")
    # Online, the same file fails only for what is really missing here (secrets), never region.
    r = _cli("validate", "--config", str(p), e=bare)
    assert r.returncode == 1 and "region" not in r.stderr


def test_region_alone_on_a_catalog_bedrock_provider_derives_the_host(tmp_path):
    from busbar import config
    c = config.load(text="providers:\n  bedrock: {api_key: {env: K}, region: eu-west-1}\n"
                         "models:\n  m: {provider: bedrock}\n", env={"K": "AKID:SECRET"})
    p = c.providers["bedrock"]
    assert (p.host, p.region) == ("bedrock-runtime.eu-west-1.amazonaws.com", "eu-west-1")


def test_validate_offline_needs_no_secrets_but_online_does(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("listen: \"127.0.0.1:${PORT}\"\nproviders:\n  openai: {api_key: {env: NOPE_KEY}}\n"
                 "  g: {catalog: groq, api_key: {file: /nonexistent/groq}}\nmodels:\n  m: {provider: openai}\n")
    e = env()
    e["PORT"] = "8080"
    r = _cli("validate", "--config", str(p), e=e)
    assert r.returncode == 1 and "NOPE_KEY" in r.stderr and "/nonexistent/groq" in r.stderr
    r = _cli("validate", "--offline", "--config", str(p), e=e)
    assert r.returncode == 0, r.stderr
    # the shape of references is still checked offline
    p.write_text("providers:\n  openai: {api_key: sk-inline}\nmodels:\n  m: {provider: openai}\n")
    r = _cli("validate", "--offline", "--config", str(p))
    assert r.returncode == 1 and "inline secrets are not allowed" in r.stderr


def test_busbar_help_lists_the_commands():
    r = _cli("--help")
    assert r.returncode == 0 and r.stdout.startswith("busbar ") and r.stderr == ""
    for command in ("busbar --validate", "busbar serve", "busbar validate", "busbar mock"):
        assert command in r.stdout, command


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_every_command_the_demo_banner_prints_runs_as_printed(tmp_path):
    port, admin = free_port(), free_port()
    e = env()
    e["BUSBAR_ADMIN_LISTEN"] = "127.0.0.1:%d" % admin
    out = tmp_path / "banner.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen([PY, "-m", "busbar.cli", "serve", "--demo", "--listen",
                                 "127.0.0.1:%d" % port], cwd=ROOT, env=e, stdout=fh,
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_http(port, proc)
        deadline = time.monotonic() + 10
        while "admin API" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        banner = out.read_text()
        assert "models: gpt-4o-mini, gpt-4.1-mini, claude-haiku-4-5" in banner
        assert "pools:  default" in banner
        commands = []
        lines = banner.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith(("curl ", "/", "'/")):
                while line.endswith("\\"):
                    i += 1
                    line = line[:-1] + lines[i].strip()
                commands.append(line)
            i += 1
        # The status page and /stats are named, and the demo has the metrics the page shows.
        assert "status: http://127.0.0.1:%d/ " % admin in banner
        assert "stats:  http://127.0.0.1:%d/stats " % port in banner
        assert len(commands) == 6, commands
        # This interpreter has the SDKs (the `make` venv): the Python lines name it.
        assert sum(c.startswith(shlex.quote(PY) + " -c ") for c in commands) == 3, commands
        clean = {k: v for k, v in e.items() if not k.startswith(("OPENAI", "ANTHROPIC", "AWS"))}
        _run_all(commands, clean, tmp_path)
        # The single-file executable's banner (and a pip install's, whose venv has no SDK): the
        # Python lines say `python3`, which the note asks to give the SDKs; with such a python3
        # first on PATH they run as printed.
        frozen = _frozen_banner(port)
        sdk = [line.strip() for line in frozen.splitlines() if line.strip().startswith("python3 -c ")]
        assert len(sdk) == 3 and "/tmp/staticx" not in frozen, frozen
        assert "# (they are not installed with busbar; first: python3 -m pip install openai " \
               "anthropic boto3)" in frozen
        shim = tmp_path / "bin"
        shim.mkdir()
        # a script, not a symlink: a venv's python finds its pyvenv.cfg beside the path it runs as
        (shim / "python3").write_text('#!/bin/sh\nexec %s "$@"\n' % shlex.quote(PY))
        (shim / "python3").chmod(0o755)
        _run_all(sdk, dict(clean, PATH="%s:%s" % (shim, clean["PATH"])), tmp_path)
        status = json.loads(subprocess.run(
            ["curl", "-s", "http://127.0.0.1:%d/status.json" % admin], capture_output=True,
            text=True, timeout=30).stdout)
        assert status["metrics"] is True and status["totals"]["requests"] >= 6, status
    finally:
        stop(proc)


def _run_all(commands, e, cwd):
    for cmd in commands:
        r = subprocess.run(["bash", "-c", cmd], env=e, capture_output=True, text=True,
                           timeout=60, cwd=cwd)
        assert r.returncode == 0 and r.stdout.strip(), (cmd, r.stdout, r.stderr)
        assert "error" not in r.stdout.lower()[:200], (cmd, r.stdout)


def _frozen_banner(port):
    """banner() as the single-file executable prints it: sys.frozen set (PyInstaller's mark) and
    sys.executable the unpacked executable, which is no Python."""
    from unittest import mock

    from busbar import config
    from busbar.demo import banner, demo_yaml
    cfg = config.load(text=demo_yaml("127.0.0.1:%d" % port, 1))
    with mock.patch.object(sys, "frozen", True, create=True), \
            mock.patch.object(sys, "executable", "/tmp/staticx-AbCdEf/busbar"):
        return banner(cfg)


def test_banner_names_this_python_only_when_it_has_the_sdks(monkeypatch):
    import importlib.util

    from busbar import config
    from busbar.demo import banner, demo_yaml
    cfg = config.load(text=demo_yaml("127.0.0.1:8080", 1))
    assert "\n  %s -c \"import openai;" % shlex.quote(sys.executable) in banner(cfg)
    assert "pip install" not in banner(cfg)
    # a pip install: busbar's venv has no SDK
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "anthropic" else real(name, *a))
    text = banner(cfg)
    assert sys.executable not in text and "\n  python3 -c \"import anthropic;" in text
    assert "first: python3 -m pip install openai anthropic boto3" in text


def test_validate_without_a_config_says_where_it_looked_and_how_to_point_it(tmp_path):
    e = {k: v for k, v in env().items() if k != "BUSBAR_CONFIG"}
    for cmd in (["validate"], ["serve"]):
        r = subprocess.run([PY, "-m", "busbar.cli", *cmd], cwd=tmp_path, env=e,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == [
            "error: no config file: --config was not given, $BUSBAR_CONFIG is not set, and there "
            "is no %s; point busbar at one with --config PATH or $BUSBAR_CONFIG=PATH (or try "
            "`busbar serve --demo`, which needs none)" % (tmp_path / "config.yaml")], r.stderr
    e["BUSBAR_CONFIG"] = str(tmp_path / "nowhere.yaml")
    r = subprocess.run([PY, "-m", "busbar.cli", "validate"], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: $BUSBAR_CONFIG names %s, which does not exist; point busbar "
                               "at one with --config PATH" % (tmp_path / "nowhere.yaml")), r.stderr


# A Python without redis-py, as a pip install from before redis was a dependency (or a trimmed
# venv): the module is blocked before busbar starts.
WITHOUT_REDIS = "import sys; sys.modules['redis'] = None; from busbar.cli import main; sys.exit(main())"


def test_a_config_needing_a_package_this_install_lacks_is_refused_in_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text('listen: "127.0.0.1:%d"\nproviders:\n  m: {protocol: openai, base_url: '
                 '"http://127.0.0.1:9"}\nmodels:\n  x: {provider: m}\n'
                 'store: {module: valkey, settings: {url: {env: BB_REDIS}}}\n' % free_port())
    from busbar.config.modules import requirement
    want = ["error: store.module: store valkey needs the Python package `redis`; this install lacks "
            "it (pip install '%s')" % requirement("redis")]
    assert requirement("redis").startswith("redis==")
    e = dict(env(), BB_REDIS="redis://127.0.0.1:9/0")
    for cmd in (["validate"], ["serve", "--workers", "1"]):
        r = subprocess.run([PY, "-c", WITHOUT_REDIS, *cmd, "--config", str(p)], cwd=ROOT, env=e,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == want, r.stderr
    # where redis-py is installed, the same config is valid
    assert _cli("validate", "--config", str(p), e=e).returncode == 0


def test_readme_provider_on_the_mock_answers(tmp_path):
    """The README's provider pointed at `busbar mock` validates and, on a running mock (started
    as the README says, without a key), answers."""
    import http.client
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "127.0.0.1:8089" in b)
    mock_port, port = free_port(), free_port()
    p = tmp_path / "c.yaml"
    p.write_text('listen: "127.0.0.1:%d"\n' % port + block.replace("8089", str(mock_port)))
    assert _cli("validate", "--config", str(p)).returncode == 0
    mock = subprocess.Popen([PY, "-m", "busbar.cli", "mock", "--port", str(mock_port)], cwd=ROOT,
                            env=env())
    proc = None
    try:
        wait_http(mock_port, mock)
        proc = subprocess.Popen([PY, "-m", "busbar.cli", "serve", "--config", str(p), "--workers",
                                 "1"], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL)
        wait_http(port, proc)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "gpt-mock", "messages": [{"role": "user", "content": "hi"}]}),
            {"content-type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        assert body["choices"][0]["message"]["content"].startswith("mock: hi")
    finally:
        if proc is not None:
            stop(proc)
        stop(mock)


def test_mock_help_says_its_port_and_flags():
    r = _cli("mock", "--help")
    assert r.returncode == 0
    out = " ".join(r.stdout.split())
    for want in ("--port PORT", "(default: 8089)", "--host HOST", "--require-auth",
                 'base_url: "http://127.0.0.1:8089"'):
        assert want in out, (want, r.stdout)
    assert "mock provider alone (http://127.0.0.1:8089)" in " ".join(_cli("--help").stdout.split())
