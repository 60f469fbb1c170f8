"""packaging/install.sh against a fake release on a loopback HTTP server (GitHub's layout: the
latest release's assets behind a redirect from releases/latest/download/, a version's under
releases/download/vX.Y.Z/), run by sh in an empty environment; and packaging/homebrew.py's formula
from a release's SHA256SUMS."""
from __future__ import annotations

import hashlib
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading

import pytest

from tests.packaging.conftest import ROOT

INSTALL = os.path.join(ROOT, "packaging", "install.sh")
VERSION = "9.9.9"
TARGETS = ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu", "x86_64-apple-darwin",
           "aarch64-apple-darwin")
PATH = "/usr/local/bin:/usr/bin:/bin"


def archive(target: str) -> bytes:
    """A release archive whose `busbar` is a script naming its target (what --version prints)."""
    files = {"busbar": ("#!/bin/sh\necho 'busbar %s %s'\n" % (VERSION, target)).encode(),
             "providers.yaml": b"providers: {}\n# %s\n" % target.encode()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name == "busbar" else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Release:
    """GitHub's release download URLs on 127.0.0.1: /releases/download/v9.9.9/<asset>, and
    /releases/latest/download/<asset> redirecting there. Every request path is recorded."""

    def __init__(self, assets: dict[str, bytes]):
        self.assets = assets
        self.paths = []
        release = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                release.paths.append(self.path)
                latest = "/releases/latest/download/"
                if self.path.startswith(latest):
                    self.send_response(302)
                    self.send_header("Location", "/releases/download/v%s/%s" % (VERSION, self.path[len(latest):]))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                prefix = "/releases/download/v%s/" % VERSION
                data = release.assets.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base = "http://127.0.0.1:%d/releases" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def sums(assets: dict[str, bytes]) -> bytes:
    return "".join("%s  %s\n" % (hashlib.sha256(d).hexdigest(), n) for n, d in sorted(assets.items())).encode()


@pytest.fixture()
def release():
    assets = {"busbar-%s.tar.gz" % t: archive(t) for t in TARGETS}
    assets["SHA256SUMS"] = sums(assets)
    r = Release(assets)
    yield r
    r.close()


def fake_uname(tmp_path, system: str, machine: str) -> str:
    """A PATH entry whose `uname` says `system` and `machine`."""
    bin_ = tmp_path / "fakebin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "uname").write_text('#!/bin/sh\ncase "$1" in -s) echo %s ;; -m) echo %s ;; *) exit 1 ;; esac\n'
                                % (system, machine))
    (bin_ / "uname").chmod(0o755)
    return str(bin_)


def install(tmp_path, env_extra: dict, path: str = PATH, script: str = INSTALL):
    env = {"PATH": path, "HOME": str(tmp_path / "home"), **env_extra}
    return subprocess.run(["sh", script], env=env, capture_output=True, text=True, timeout=60)


def host_target() -> str:
    arch = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}[os.uname().machine]
    return arch + "-unknown-linux-gnu"


def test_installs_the_latest_release_checked(release, tmp_path):
    dest = tmp_path / "bin"
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base, "BUSBAR_INSTALL_DIR": str(dest)})
    assert r.returncode == 0, r.stderr
    target = host_target()
    assert release.paths == ["/releases/latest/download/busbar-%s.tar.gz" % target,
                             "/releases/download/v%s/busbar-%s.tar.gz" % (VERSION, target),
                             "/releases/latest/download/SHA256SUMS",
                             "/releases/download/v%s/SHA256SUMS" % VERSION]
    assert sorted(os.listdir(dest)) == ["busbar", "providers.yaml"]
    assert (dest / "busbar").stat().st_mode & 0o777 == 0o755
    assert (dest / "providers.yaml").stat().st_mode & 0o777 == 0o644
    assert subprocess.run([str(dest / "busbar"), "--version"], capture_output=True, text=True).stdout \
        == "busbar %s %s\n" % (VERSION, target)
    assert "installed busbar %s %s" % (VERSION, target) in r.stderr
    assert "is not on PATH" in r.stderr
    # the default directory: ~/.local/bin
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "home" / ".local" / "bin" / "busbar").exists()


def test_a_download_that_does_not_match_is_not_installed(release, tmp_path):
    target = host_target()
    name = "busbar-%s.tar.gz" % target
    release.assets[name] = release.assets[name][:-1] + bytes([release.assets[name][-1] ^ 1])
    dest = tmp_path / "bin"
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base, "BUSBAR_INSTALL_DIR": str(dest)})
    assert r.returncode == 1
    assert "%s does not match SHA256SUMS" % name in r.stderr and "nothing installed" in r.stderr
    assert not dest.exists()
    # and one SHA256SUMS does not list
    release.assets["SHA256SUMS"] = b""
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base, "BUSBAR_INSTALL_DIR": str(dest)})
    assert r.returncode == 1 and "SHA256SUMS has no line for %s" % name in r.stderr


@pytest.mark.parametrize("system,machine,target", [
    ("Darwin", "arm64", "aarch64-apple-darwin"),
    ("Darwin", "x86_64", "x86_64-apple-darwin"),
    ("Linux", "aarch64", "aarch64-unknown-linux-gnu"),
    ("Linux", "amd64", "x86_64-unknown-linux-gnu"),
])
def test_a_pinned_version_for_each_platform(release, tmp_path, system, machine, target):
    dest = tmp_path / "bin"
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base, "BUSBAR_INSTALL_DIR": str(dest),
                           "BUSBAR_VERSION": VERSION}, path=fake_uname(tmp_path, system, machine) + ":" + PATH)
    assert r.returncode == 0, r.stderr
    assert release.paths[0] == "/releases/download/v%s/busbar-%s.tar.gz" % (VERSION, target)
    assert "# %s" % target in (dest / "providers.yaml").read_text()


@pytest.mark.parametrize("system,machine,says", [
    ("Linux", "riscv64", "no busbar release for the riscv64 architecture"),
    ("FreeBSD", "amd64", "no busbar release for FreeBSD here"),
])
def test_refuses_what_has_no_release(release, tmp_path, system, machine, says):
    r = install(tmp_path, {"BUSBAR_BASE_URL": release.base, "BUSBAR_INSTALL_DIR": str(tmp_path / "bin")},
                path=fake_uname(tmp_path, system, machine) + ":" + PATH)
    assert r.returncode == 1 and says in r.stderr
    assert release.paths == []


def test_where_it_downloads_from(tmp_path):
    r = install(tmp_path, {"BUSBAR_INSTALL_DIR": str(tmp_path / "bin")})
    assert r.returncode == 1 and "set BUSBAR_REPO=OWNER/NAME" in r.stderr
    # The released copy carries its repository (the release workflow fills DEFAULT_REPO in); with
    # no route to github.com here the download fails, naming the URL it tried.
    with open(INSTALL) as f:
        text = f.read()
    assert text.count('\nDEFAULT_REPO=""\n') == 1
    stamped = tmp_path / "install.sh"
    stamped.write_text(text.replace('\nDEFAULT_REPO=""\n', '\nDEFAULT_REPO="example/busbar"\n'))
    r = install(tmp_path, {"BUSBAR_INSTALL_DIR": str(tmp_path / "bin"), "BUSBAR_VERSION": "1.2.3"},
                script=str(stamped), path=fake_uname(tmp_path, "Linux", "x86_64") + ":" + PATH)
    assert "https://github.com/example/busbar/releases/download/v1.2.3/busbar-x86_64-unknown-linux-gnu.tar.gz" \
        in r.stderr


def test_the_release_workflow_stamps_and_publishes_it():
    with open(os.path.join(ROOT, ".github", "workflows", "release.yml")) as f:
        workflow = f.read()
    assert "sed 's|^DEFAULT_REPO=\"\"$|DEFAULT_REPO=\"'\"$GITHUB_REPOSITORY\"'\"|' packaging/install.sh" in workflow
    assert "packaging/homebrew.py" in workflow


# --- the Homebrew formula ---------------------------------------------------------------------

def homebrew(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "homebrew.py"), *args],
                          capture_output=True, text=True, timeout=30)


def test_formula_has_the_release_checksums(tmp_path):
    assets = {"busbar-%s.tar.gz" % t: archive(t) for t in TARGETS}
    assets["busbar-x86_64-pc-windows-msvc.zip"] = b"zip"
    assets["busbar-v9.9.9.cdx.json"] = b"{}"
    (tmp_path / "SHA256SUMS").write_bytes(sums(assets))
    r = homebrew("--version", "v" + VERSION, "--repo", "example/busbar", "--sums", str(tmp_path / "SHA256SUMS"))
    assert r.returncode == 0, r.stderr
    rb = r.stdout
    assert 'version "9.9.9"' in rb
    assert 'BASE = "https://github.com/example/busbar/releases/download/v#{version}".freeze' in rb
    blocks = re.findall(r"  (on_macos|on_linux) do\n(.*?)\n  end\n", rb, re.S)
    assert [b[0] for b in blocks] == ["on_macos", "on_linux"]
    seen = {}
    for os_block, body in blocks:
        for arch, name, digest in re.findall(
                r'    (on_arm|on_intel) do\n      url "#\{BASE\}/(\S+)"\n      sha256 "([0-9a-f]{64})"\n    end', body):
            seen[(os_block, arch)] = (name, digest)
    assert seen == {
        (o, a): ("busbar-%s.tar.gz" % t, hashlib.sha256(assets["busbar-%s.tar.gz" % t]).hexdigest())
        for o, a, t in (("on_macos", "on_arm", "aarch64-apple-darwin"), ("on_macos", "on_intel", "x86_64-apple-darwin"),
                        ("on_linux", "on_arm", "aarch64-unknown-linux-gnu"),
                        ("on_linux", "on_intel", "x86_64-unknown-linux-gnu"))}
    assert '    bin.install "busbar"\n' in rb
    assert 'assert_match "busbar #{version}", shell_output("#{bin}/busbar --version")' in rb
    if shutil.which("ruby"):
        (tmp_path / "busbar.rb").write_text(rb)
        assert subprocess.run(["ruby", "-c", str(tmp_path / "busbar.rb")], capture_output=True).returncode == 0


def test_formula_refuses_an_incomplete_release(tmp_path):
    (tmp_path / "SHA256SUMS").write_text("%s  busbar-x86_64-apple-darwin.tar.gz\n" % ("0" * 64))
    r = homebrew("--version", VERSION, "--repo", "example/busbar", "--sums", str(tmp_path / "SHA256SUMS"))
    assert r.returncode == 1
    assert "no archive for aarch64-apple-darwin, aarch64-unknown-linux-gnu, x86_64-unknown-linux-gnu" in r.stderr
    (tmp_path / "SHA256SUMS").write_text("not a sum line\n")
    r = homebrew("--version", VERSION, "--repo", "example/busbar", "--sums", str(tmp_path / "SHA256SUMS"))
    assert r.returncode == 1 and "SHA256SUMS line 1" in r.stderr
    (tmp_path / "SHA256SUMS").write_bytes(sums({"busbar-%s.tar.gz" % t: b"x" for t in TARGETS}))
    assert homebrew("--version", VERSION, "--repo", "example/busbar", "--sums", str(tmp_path / "SHA256SUMS")) \
        .returncode == 0
    r = homebrew("--version", "1.2", "--repo", "example/busbar", "--sums", str(tmp_path / "SHA256SUMS"))
    assert r.returncode == 1 and "expected X.Y.Z" in r.stderr
    r = homebrew("--version", VERSION, "--repo", "no-slash", "--sums", str(tmp_path / "SHA256SUMS"))
    assert r.returncode == 1 and "expected OWNER/NAME" in r.stderr
