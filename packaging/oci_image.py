"""busbar's container image without a container engine: the same image the Dockerfile's final stage
makes (`FROM scratch`, one layer), written as an OCI image layout and as a tarball `docker load`
and `podman load` accept. Standard library only.

    python packaging/oci_image.py                         # dist/busbar -> dist/oci/, dist/busbar-image.tar
    python packaging/oci_image.py --executable dist/busbar --executable dist/arm64/busbar
                                                          # one image index for both architectures
    python packaging/oci_image.py --rootfs /rootfs        # the layer's files into a directory (Dockerfile)

Each executable's architecture is read from its ELF header. With several, dist/oci/ is one OCI
image index naming an image per architecture (`skopeo copy --all oci:dist/oci:TAG docker://...`
pushes them under one tag, and a runtime pulls its own), and the `docker load` tarball holds the
first executable's image only (what one Docker engine runs).

Reproducible: the same inputs give byte-identical output and so the same digests. Every entry has
mtime SOURCE_DATE_EPOCH (default 0), uid/gid 0 with no user or group names, a fixed mode, and the
tar lists entries sorted by name; gzip records no name and mtime 0; JSON is written with sorted
keys and no spaces.

The layer:
    /busbar                             0755  the static executable
    /etc/ssl/certs/ca-certificates.crt  0644  CA roots (also inside the executable; this copy can
                                              be replaced by a mount, SSL_CERT_FILE points here)
    /etc/busbar/providers.yaml          0644  the provider catalog
    /etc/busbar/config.yaml             0644  packaging/config.default.yaml: one Anthropic provider
                                              ($ANTHROPIC_KEY), the admin API behind
                                              $BUSBAR_ADMIN_TOKEN
    /tmp/                               1777  where the one-file launchers unpack themselves
The image runs as user 65532, exposes 8080/tcp, and starts `/busbar` with no arguments (an
entrypoint and no command, as the Rust gateway's image): that serves $BUSBAR_CONFIG, and arguments
given to the container go to /busbar. It works with a read-only root filesystem when /tmp is a
tmpfs that allows exec (`--tmpfs /tmp:rw,exec,size=96m`; the executable unpacks 41 MB there, up to
46 MB once a config imports what travels in its lazy.pack, and removes it at exit).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER = "65532:65532"  # uid and gid: with no /etc/passwd a bare uid would run as gid 0
PORT = "8080/tcp"
ENV = (
    "PATH=/",
    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
    "BUSBAR_CONFIG=/etc/busbar/config.yaml",
)
# No Cmd: `/busbar` alone serves $BUSBAR_CONFIG.
ENTRYPOINT = ["/busbar"]

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

DEFAULT_CA = "/etc/ssl/certs/ca-certificates.crt"


def layer_files(executable: str, ca_bundle: str = DEFAULT_CA) -> list[tuple[str, str | None, int]]:
    """(path in the image, source file or None for a directory, mode), sorted by path."""
    entries = [
        ("busbar", executable, 0o755),
        ("etc", None, 0o755),
        ("etc/busbar", None, 0o755),
        ("etc/busbar/config.yaml", os.path.join(ROOT, "packaging", "config.default.yaml"), 0o644),
        ("etc/busbar/providers.yaml", os.path.join(ROOT, "busbar", "data", "providers.yaml"), 0o644),
        ("etc/ssl", None, 0o755),
        ("etc/ssl/certs", None, 0o755),
        ("etc/ssl/certs/ca-certificates.crt", ca_bundle, 0o644),
        ("tmp", None, 0o1777),
    ]
    return sorted(entries)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def layer_tar(files, mtime: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, src, mode in files:
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.mode = mode
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if src is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                data = _read(src)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return buf.getvalue()


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(media_type: str, data: bytes, **extra) -> dict:
    return {"mediaType": media_type, "digest": sha256(data), "size": len(data), **extra}


def version() -> str:
    sys.path.insert(0, ROOT)
    try:
        from busbar import __version__
    finally:
        sys.path.pop(0)
    return __version__


# ELF e_machine -> the OCI platform's architecture
ELF_ARCH = {62: "amd64", 183: "arm64"}


def elf_arch(path: str) -> str:
    """The OCI architecture of the ELF executable at `path` (amd64 or arm64)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        raise ValueError("%s is not an ELF executable" % path)
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    if machine not in ELF_ARCH:
        raise ValueError("%s is for ELF machine %d, not amd64 or arm64" % (path, machine))
    return ELF_ARCH[machine]


def _platform_image(executable: str, ca_bundle: str, mtime: int, created: str) -> dict:
    arch = elf_arch(executable)
    tar = layer_tar(layer_files(executable, ca_bundle), mtime)
    layer = gzip_bytes(tar)
    config = canonical_json({
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": USER,
            "ExposedPorts": {PORT: {}},
            "Env": list(ENV),
            "Entrypoint": ENTRYPOINT,
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "busbar",
                       "org.opencontainers.image.version": version()},
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        "history": [{"created": created, "created_by": "packaging/oci_image.py"}],
    })
    manifest = canonical_json({
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": descriptor(MT_CONFIG, config),
        "layers": [descriptor(MT_LAYER, layer)],
    })
    return {"arch": arch, "tar": tar, "layer": layer, "config": config, "manifest": manifest}


def build(executable, ca_bundle: str = DEFAULT_CA, tag: str | None = None,
          mtime: int | None = None) -> dict:
    """The image's blobs and top-level files: {"blobs": {digest: bytes}, "index": bytes,
    "manifest_json": bytes, "manifest": digest, "config": digest, "layer": digest, "diff_id": ...,
    "archs": [...]}. `executable`: one path, or a list of them (one per architecture): then
    index.json names an image index of them all, and "manifest", "config", "layer",
    "manifest_json" are the first one's."""
    if mtime is None:
        mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    tag = tag or "busbar:" + version()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
    paths = [executable] if isinstance(executable, str) else list(executable)
    images = [_platform_image(p, ca_bundle, mtime, created) for p in paths]
    archs = [i["arch"] for i in images]
    if len(set(archs)) != len(archs):
        raise ValueError("two executables for one architecture: %s" % ", ".join(archs))
    ref = {"org.opencontainers.image.ref.name": tag.rpartition(":")[2], "io.containerd.image.name": tag}
    blobs = {}
    for i in images:
        blobs.update({sha256(b): b for b in (i["layer"], i["config"], i["manifest"])})
    platform_descriptors = [descriptor(MT_MANIFEST, i["manifest"], platform={"architecture": i["arch"], "os": "linux"})
                            for i in images]
    if len(images) == 1:
        top = [dict(platform_descriptors[0], annotations=ref)]
    else:
        inner = canonical_json({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": platform_descriptors})
        blobs[sha256(inner)] = inner
        top = [descriptor(MT_INDEX, inner, annotations=ref)]
    index = canonical_json({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": top})
    first = images[0]
    # docker load before Docker 25 reads only this file; later ones read index.json.
    docker_manifest = canonical_json([{
        "Config": "blobs/sha256/" + sha256(first["config"])[7:],
        "RepoTags": [tag],
        "Layers": ["blobs/sha256/" + sha256(first["layer"])[7:]],
    }])
    return {
        "blobs": blobs,
        "index": index,
        "manifest_json": docker_manifest,
        "manifest": sha256(first["manifest"]),
        "config": sha256(first["config"]),
        "layer": sha256(first["layer"]),
        "diff_id": sha256(first["tar"]),
        "tag": tag,
        "mtime": mtime,
        "archs": archs,
    }


def layout_files(image: dict) -> list[tuple[str, bytes | None]]:
    """The OCI layout as (path, content or None for a directory), sorted."""
    files = [("blobs", None), ("blobs/sha256", None),
             ("index.json", image["index"]), ("manifest.json", image["manifest_json"]),
             ("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))]
    files += [("blobs/sha256/" + d[7:], b) for d, b in image["blobs"].items()]
    return sorted(files)


def write_layout(image: dict, directory: str) -> None:
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    for path, data in layout_files(image):
        full = os.path.join(directory, path)
        if data is None:
            os.makedirs(full, exist_ok=True)
        else:
            with open(full, "wb") as f:
                f.write(data)


def write_archive(image: dict, path: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in layout_files(image):
            info = tarfile.TarInfo(name)
            info.mtime = image["mtime"]
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.mode = 0o644
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)


def write_rootfs(files, directory: str) -> None:
    """The layer's files into `directory` (for the Dockerfile's `COPY --from=build /rootfs/ /`)."""
    for name, src, mode in files:
        full = os.path.join(directory, name)
        if src is None:
            os.makedirs(full, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            shutil.copyfile(src, full)
        os.chmod(full, mode)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executable", action="append",
                    help="the executable (default dist/busbar); repeat it for one index of several "
                         "architectures")
    ap.add_argument("--ca-bundle", default=DEFAULT_CA)
    ap.add_argument("--layout", default=os.path.join(ROOT, "dist", "oci"),
                    help="OCI image layout directory to write")
    ap.add_argument("--archive", default=os.path.join(ROOT, "dist", "busbar-image.tar"),
                    help="tarball for `docker load -i`")
    ap.add_argument("--tag", help="image name (default busbar:VERSION)")
    ap.add_argument("--rootfs", help="only write the layer's files into this directory")
    args = ap.parse_args(argv)
    executables = args.executable or [os.path.join(ROOT, "dist", "busbar")]
    for path in executables + [args.ca_bundle]:
        if not os.path.isfile(path):
            ap.error("%s not found" % path)
    if args.rootfs:
        if len(executables) > 1:
            ap.error("--rootfs takes one executable")
        write_rootfs(layer_files(executables[0], args.ca_bundle), args.rootfs)
        return 0
    try:
        image = build(executables, args.ca_bundle, args.tag)
    except ValueError as e:
        ap.error(str(e))
    write_layout(image, args.layout)
    # the docker-load tarball: the first architecture's image alone
    write_archive(build(executables[0], args.ca_bundle, args.tag) if len(executables) > 1 else image,
                  args.archive)
    layer = image["blobs"][image["layer"]]
    print("%s %s (%s)\n  layer %s: %d bytes compressed\n  %s, %s" % (
        image["tag"], image["manifest"], ", ".join("linux/" + a for a in image["archs"]), image["layer"],
        len(layer), args.layout, args.archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
