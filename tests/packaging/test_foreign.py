"""dist/arm64/busbar, built on this x86_64 machine under emulation (`make dist ARCH=arm64`:
packaging/build_foreign.sh), run here under emulation too (binfmt_misc hands aarch64 executables
to qemu-user-static): the SDK suites through it, gateway and mock both, as on an arm64 host; and
the image index naming both architectures. Marked slow (the build before them takes ~10
minutes): `make test-arm64` builds and runs these, `make test` leaves them out."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import busbar
from tests import sdk_suites
from tests.packaging.conftest import ROOT

pytestmark = pytest.mark.slow

ARM64 = os.path.join(ROOT, "dist", "arm64", "busbar")
# Everything is ~10x slower emulated: the suites' own per-test timeout and the whole run's.
SUITES_TIMEOUT = 3600

sys.path.insert(0, os.path.join(ROOT, "packaging"))
import oci_image  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def arm64():
    assert os.path.isfile(ARM64), "no %s: `make dist ARCH=arm64` builds it" % ARM64
    return ARM64


def test_static_aarch64_and_runs_emulated(arm64):
    assert oci_image.elf_arch(arm64) == "arm64"
    # static: no program interpreter to find (file(1) reads the headers without running it)
    described = subprocess.run(["file", "-L", arm64], capture_output=True, text=True).stdout
    assert "ARM aarch64" in described and "statically linked" in described, described
    r = subprocess.run([arm64, "--version"], env={}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "busbar " + busbar.__version__


def test_sdk_suites_through_the_arm64_executable(arm64):
    sdk_suites.run({"BUSBAR_TEST_EXECUTABLE": arm64}, timeout=SUITES_TIMEOUT)


def test_the_image_is_one_index_for_both_architectures(arm64):
    layout = os.path.join(ROOT, "dist", "oci")
    with open(os.path.join(layout, "index.json")) as f:
        [top] = json.load(f)["manifests"]
    assert top["mediaType"] == oci_image.MT_INDEX
    with open(os.path.join(layout, "blobs", "sha256", top["digest"][7:]), "rb") as f:
        inner = json.load(f)
    assert sorted(m["platform"]["architecture"] for m in inner["manifests"]) == ["amd64", "arm64"]
