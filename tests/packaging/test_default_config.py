"""The container image's default config (packaging/config.default.yaml), run as the image runs it:
`busbar` with no argument, $BUSBAR_CONFIG naming config.yaml in a folder that holds the shipped
providers.yaml beside it (the image's /etc/busbar), the two variables the file names set or not.
Python in place of the executable, so this needs no build; tests/packaging/test_executable.py runs
the built image tree itself."""
from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess

from tests.conftest import PY, ROOT, env, free_port, stop, wait_http

CONFIG_DEFAULT = os.path.join(ROOT, "packaging", "config.default.yaml")
PROVIDERS = os.path.join(ROOT, "busbar", "data", "providers.yaml")
LISTEN = 'listen: "0.0.0.0:8080"'
ADMIN_TOKEN = "admin-token-for-the-test"
IMAGE_ENV = {"ANTHROPIC_KEY": "sk-ant-placeholder", "BUSBAR_ADMIN_TOKEN": ADMIN_TOKEN}


def image_etc(tmp_path, port: int | None = None):
    """/etc/busbar as the image lays it out: config.yaml and providers.yaml side by side. `port`:
    the data listener moved from 0.0.0.0:8080 to that loopback port (the test's only change)."""
    text = open(CONFIG_DEFAULT, encoding="utf-8").read()
    assert text.count(LISTEN) == 1
    if port is not None:
        text = text.replace(LISTEN, 'listen: "127.0.0.1:%d"' % port)
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    shutil.copy(PROVIDERS, tmp_path / "providers.yaml")
    return tmp_path / "config.yaml"


def busbar_env(config, **extra):
    """The test environment without anything busbar reads on its own, plus `extra`."""
    e = {k: v for k, v in env().items()
         if k not in ("BUSBAR_CONFIG", "BUSBAR_PROVIDERS", "BUSBAR_LOG", "RUST_LOG",
                      "ANTHROPIC_KEY", "BUSBAR_ADMIN_TOKEN")}
    e["BUSBAR_CONFIG"] = str(config)
    e.update(extra)
    return e


def request(port: int, path: str, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_the_file_is_the_rust_images_posture():
    """What the image's config says, read as a document: the Rust image's default (one Anthropic
    provider keyed by ANTHROPIC_KEY, one model, one pool, the admin API behind an admin-tokens
    provider reading BUSBAR_ADMIN_TOKEN, an open data plane), one worker, and no providers_file
    (the catalog beside it is read by default)."""
    import yaml
    doc = yaml.safe_load(open(CONFIG_DEFAULT, encoding="utf-8"))
    assert doc["listen"] == "0.0.0.0:8080"
    assert doc["identity-providers"] == {
        "admin-tokens": {"module": "admin-tokens", "token": {"env": "BUSBAR_ADMIN_TOKEN"}}}
    assert doc["auth"] == {"chain": [], "admin_auth": ["admin-tokens"]}
    assert doc["providers"] == {"anthropic": {"api_key": {"env": "ANTHROPIC_KEY"}}}
    assert doc["models"] == {"claude": {"provider": "anthropic"}}
    assert doc["pools"] == {"default": {"members": [{"model": "claude"}]}}
    assert doc["advanced"] == {"worker_threads": 1}
    assert "providers_file" not in doc and "admin_listen" not in doc


def test_the_catalog_beside_it_is_the_one_read(tmp_path):
    """No providers_file: and no $BUSBAR_PROVIDERS: the loader reads providers.yaml from the
    config's folder (/etc/busbar/providers.yaml in the image), not the copy inside busbar. A
    catalog there without `anthropic` makes the provider unknown."""
    from busbar.config.loader import build
    config = image_etc(tmp_path)
    cfg, out = build(str(config), env=dict(IMAGE_ENV), overlay=False)
    assert out.errors == [] and cfg is not None
    assert set(cfg.providers) == {"anthropic"}
    assert cfg.providers["anthropic"].base_url.startswith("https://api.anthropic.com")
    assert cfg.workers == 1
    (tmp_path / "providers.yaml").write_text(
        "openai: {protocol: openai, base_url: 'https://api.openai.com'}\n")
    cfg, out = build(str(config), env=dict(IMAGE_ENV), overlay=False)
    assert cfg is None and any(e.startswith("providers.anthropic") for e in out.errors), out.errors


def test_busbar_alone_serves_it(tmp_path):
    """`busbar` with no argument, ANTHROPIC_KEY and BUSBAR_ADMIN_TOKEN set: /healthz answers 200;
    the admin API refuses a call without the token or with another one (401) and answers it with
    the token, as a bearer token or x-admin-token (200); the boot warns that the data plane is an
    open relay; SIGTERM stops it with exit 0. Nothing is sent to Anthropic."""
    port, admin_port = free_port(), free_port()
    config = image_etc(tmp_path, port)
    proc = subprocess.Popen([PY, "-m", "busbar.cli"], cwd=tmp_path,
                            env=busbar_env(config, BUSBAR_ADMIN_LISTEN="127.0.0.1:%d" % admin_port,
                                           **IMAGE_ENV),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(port, proc)
        assert request(port, "/healthz")[0] == 200
        info = "/api/v1/admin/info"
        assert request(admin_port, info)[0] == 401
        assert request(admin_port, info, {"x-admin-token": "not-the-token"})[0] == 401
        assert request(admin_port, info, {"authorization": "Bearer " + ADMIN_TOKEN})[0] == 200
        assert request(admin_port, info, {"x-admin-token": ADMIN_TOKEN})[0] == 200
    finally:
        stop(proc)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert re.search(r"^busbar \S+ listening on 127\.0\.0\.1:%d \(1 provider\(s\), 1 model\(s\), "
                     r"1 pool\(s\)\)$" % port, out, re.M), out
    assert re.search(r"WARNING busbar: auth\.chain is empty: the data plane is an open relay",
                     err), err
    assert "Traceback" not in err and ADMIN_TOKEN not in out + err


def test_without_the_admin_token_busbar_does_not_start(tmp_path):
    """The Rust gateway refuses to boot when the admin-tokens token does not resolve (an admin API
    whose credential is missing would look guarded while it is not). busbar refuses too: one line
    on stderr naming the variable, exit 1, nothing on stdout."""
    port = free_port()
    config = image_etc(tmp_path, port)
    r = subprocess.run([PY, "-m", "busbar.cli"], cwd=tmp_path,
                       env=busbar_env(config, ANTHROPIC_KEY=IMAGE_ENV["ANTHROPIC_KEY"]),
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == ("[error] identity-providers.admin-tokens.token: environment variable "
                        "BUSBAR_ADMIN_TOKEN is not set\n")
