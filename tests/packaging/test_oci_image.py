"""packaging/oci_image.py: the OCI layout and `docker load` tarball of the image, checked blob by
blob. A small stand-in takes the executable's place, so this needs no build."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "packaging"))
import oci_image  # noqa: E402

sys.path.pop(0)

CONFIG_DEFAULT = os.path.join(ROOT, "packaging", "config.default.yaml")
PROVIDERS = os.path.join(ROOT, "busbar", "data", "providers.yaml")


def digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def stand_in(path, machine: int = 62):
    """An ELF header for `machine` (62: x86-64, 183: AArch64), then filler: what the image reads
    of an executable is its bytes and its architecture."""
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (2).to_bytes(2, "little") + machine.to_bytes(2, "little")
    path.write_bytes(header + b"stand-in executable\n" * 100)


@pytest.fixture()
def inputs(tmp_path):
    exe = tmp_path / "busbar"
    stand_in(exe)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n")
    return str(exe), str(ca)


@pytest.fixture()
def written(inputs, tmp_path):
    exe, ca = inputs
    layout, archive = tmp_path / "oci", tmp_path / "image.tar"
    assert oci_image.main(["--executable", exe, "--ca-bundle", ca, "--layout", str(layout),
                           "--archive", str(archive)]) == 0
    return layout, archive


def blob(layout, d: str) -> bytes:
    algo, hexd = d.split(":")
    data = (layout / "blobs" / algo / hexd).read_bytes()
    assert digest(data) == d
    return data


def test_layout_index_manifest_config(written):
    layout, _ = written
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [desc] = index["manifests"]
    assert desc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    version = oci_image.version()
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == version
    assert desc["annotations"]["io.containerd.image.name"] == "busbar:" + version
    manifest_bytes = blob(layout, desc["digest"])
    assert len(manifest_bytes) == desc["size"]

    manifest = json.loads(manifest_bytes)
    assert manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config_bytes = blob(layout, manifest["config"]["digest"])
    assert len(config_bytes) == manifest["config"]["size"]
    [layer_desc] = manifest["layers"]
    assert layer_desc["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    layer = blob(layout, layer_desc["digest"])
    assert len(layer) == layer_desc["size"]

    config = json.loads(config_bytes)
    assert config["architecture"] == "amd64" and config["os"] == "linux"
    c = config["config"]
    assert c["User"] == "65532:65532"
    assert c["ExposedPorts"] == {"8080/tcp": {}}
    # `/busbar` alone (it serves $BUSBAR_CONFIG), as the Rust gateway's image: an entrypoint and
    # no command, so a chart's `args: []` and `docker run IMAGE --validate` mean the same on both.
    assert c["Entrypoint"] == ["/busbar"]
    assert "Cmd" not in c
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in c["Env"]
    assert "BUSBAR_CONFIG=/etc/busbar/config.yaml" in c["Env"]
    assert config["rootfs"] == {"type": "layers", "diff_ids": [digest(gzip.decompress(layer))]}
    # Nothing else in the blob store.
    stored = sorted(p.name for p in (layout / "blobs" / "sha256").iterdir())
    assert stored == sorted(d.split(":")[1] for d in (desc["digest"], manifest["config"]["digest"],
                                                      layer_desc["digest"]))


def layer_of(layout) -> bytes:
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(layout, index["manifests"][0]["digest"]))
    return blob(layout, manifest["layers"][0]["digest"])


def test_layer_files_modes_owner(written, inputs):
    layout, _ = written
    exe, ca = inputs
    layer = layer_of(layout)
    # gzip header: no file name, mtime 0 (bytes 4-7), so equal input gives an equal blob.
    assert layer[:3] == b"\x1f\x8b\x08"
    assert layer[3] & 0x08 == 0
    assert layer[4:8] == b"\0\0\0\0"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        got = {m.name: (m.type, m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members}
        reg, dir_ = tarfile.REGTYPE, tarfile.DIRTYPE
        assert got == {
            "busbar": (reg, 0o755, 0, 0, "", "", 0),
            "etc": (dir_, 0o755, 0, 0, "", "", 0),
            "etc/busbar": (dir_, 0o755, 0, 0, "", "", 0),
            "etc/busbar/config.yaml": (reg, 0o644, 0, 0, "", "", 0),
            "etc/busbar/providers.yaml": (reg, 0o644, 0, 0, "", "", 0),
            "etc/ssl": (dir_, 0o755, 0, 0, "", "", 0),
            "etc/ssl/certs": (dir_, 0o755, 0, 0, "", "", 0),
            "etc/ssl/certs/ca-certificates.crt": (reg, 0o644, 0, 0, "", "", 0),
            "tmp": (dir_, 0o1777, 0, 0, "", "", 0),
        }
        content = {m.name: tar.extractfile(m).read() for m in members if m.isreg()}
    with open(exe, "rb") as f:
        assert content["busbar"] == f.read()
    with open(ca, "rb") as f:
        assert content["etc/ssl/certs/ca-certificates.crt"] == f.read()
    with open(CONFIG_DEFAULT, "rb") as f:
        assert content["etc/busbar/config.yaml"] == f.read()
    with open(PROVIDERS, "rb") as f:
        assert content["etc/busbar/providers.yaml"] == f.read()


def test_docker_load_archive(written):
    layout, archive = written
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members.values())
        files = {n: tar.extractfile(m).read() for n, m in members.items() if m.isreg()}
    # The same layout, file for file.
    on_disk = {str(p.relative_to(layout)): p.read_bytes() for p in layout.rglob("*") if p.is_file()}
    assert files == on_disk
    [entry] = json.loads(files["manifest.json"])
    assert entry["RepoTags"] == ["busbar:" + oci_image.version()]
    config = json.loads(files[entry["Config"]])
    assert config["config"]["User"] == "65532:65532"
    [layer_path] = entry["Layers"]
    assert files[layer_path] == layer_of(layout)


def test_reproducible(inputs, tmp_path):
    exe, ca = inputs
    a = oci_image.build(exe, ca)
    b = oci_image.build(exe, ca)
    assert a["manifest"] == b["manifest"] and a["blobs"] == b["blobs"] and a["index"] == b["index"]
    oci_image.write_archive(a, str(tmp_path / "a.tar"))
    oci_image.write_archive(b, str(tmp_path / "b.tar"))
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    # ...and the digest follows the inputs.
    assert oci_image.build(exe, ca, mtime=1)["manifest"] != a["manifest"]
    with open(exe, "ab") as f:
        f.write(b"changed")
    assert oci_image.build(exe, ca)["layer"] != a["layer"]


def test_rootfs_matches_layer(inputs, tmp_path):
    exe, ca = inputs
    rootfs = tmp_path / "rootfs"
    assert oci_image.main(["--executable", exe, "--ca-bundle", ca, "--rootfs", str(rootfs)]) == 0
    for name, src, mode in oci_image.layer_files(exe, ca):
        path = rootfs / name
        assert (path.stat().st_mode & 0o7777) == mode, name
        if src is None:
            assert path.is_dir()
        else:
            with open(src, "rb") as f:
                assert path.read_bytes() == f.read()


def test_dockerfile_final_stage_matches():
    """The Dockerfile's final stage and oci_image.py describe the same image."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read()
    final = text[text.rindex("\nFROM "):]
    assert final.splitlines()[1] == "FROM scratch"
    assert "COPY --from=build /rootfs/ /" in final
    assert re.search(r"^USER 65532:65532$", final, re.M)
    assert re.search(r"^EXPOSE 8080$", final, re.M)
    assert re.search(r'^ENTRYPOINT \["/busbar"\]$', final, re.M)
    assert not re.search(r"^CMD\b", final, re.M)
    env = re.search(r"^ENV (.*?)\n(?=\S)", final, re.M | re.S).group(1)
    pairs = sorted(p for p in re.split(r"[\s\\]+", env) if p)
    assert pairs == sorted(oci_image.ENV)
    assert "oci_image.py --rootfs /rootfs" in text


def test_one_index_for_two_architectures(inputs, tmp_path):
    """amd64 and arm64 executables: index.json names one image index (the tag's), which names an
    image per platform, each with its own layer and config; the docker-load tarball holds the
    first one's image alone."""
    exe, ca = inputs
    arm = tmp_path / "arm64" / "busbar"
    arm.parent.mkdir()
    stand_in(arm, 183)
    layout, archive = tmp_path / "multi", tmp_path / "multi.tar"
    assert oci_image.main(["--executable", exe, "--executable", str(arm), "--ca-bundle", ca,
                           "--layout", str(layout), "--archive", str(archive)]) == 0
    [top] = json.loads((layout / "index.json").read_text())["manifests"]
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert top["annotations"]["org.opencontainers.image.ref.name"] == oci_image.version()
    inner = json.loads(blob(layout, top["digest"]))
    by_arch = {}
    for desc in inner["manifests"]:
        manifest = json.loads(blob(layout, desc["digest"]))
        config = json.loads(blob(layout, manifest["config"]["digest"]))
        assert desc["platform"] == {"architecture": config["architecture"], "os": "linux"}
        layer = blob(layout, manifest["layers"][0]["digest"])
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
            by_arch[config["architecture"]] = tar.extractfile("busbar").read()
    with open(exe, "rb") as f:
        assert by_arch == {"amd64": f.read(), "arm64": arm.read_bytes()}
    with tarfile.open(archive) as tar:
        [entry] = json.loads(tar.extractfile("manifest.json").read())
        assert json.loads(tar.extractfile(entry["Config"]).read())["architecture"] == "amd64"
    # one executable per architecture, and only ELF executables for amd64 or arm64
    with pytest.raises(ValueError, match="two executables for one architecture"):
        oci_image.build([exe, exe], ca)
    other = tmp_path / "riscv"
    stand_in(other, 243)
    with pytest.raises(ValueError, match="ELF machine 243"):
        oci_image.build(str(other), ca)
