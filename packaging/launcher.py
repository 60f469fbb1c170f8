"""Entry script of the one-file executable: busbar's own CLI (busbar.cli:main), after two things only
an executable needs.

CA roots. A `FROM scratch` image has no /etc/ssl, and the OpenSSL inside the executable looks for
roots at the build machine's compiled-in paths, so without this a TLS call to a real provider
cannot verify. An SSL_CERT_FILE the operator set always wins; the system's certificate directory
(SSL_CERT_DIR or OpenSSL's default) is still consulted, so a host's own roots keep working beside
the bundle. botocore (the AWS credential chain's STS and SSO calls) reads its roots from
AWS_CA_BUNDLE instead of OpenSSL's defaults: it gets the same file, unless the operator set it.

Lazy parts. The one-file bootloader writes every file of the archive to its temporary directory
before Python starts, each a new inode (on ext4 without a journal, as on the build machine, a
create right after other deletes scans past every inode deleted in the last 30 s: a quarter of
the CPU of a start measured back to back). What only some configs use (packaging/busbar.spec:
LAZY, LAZY_DATA) travels instead as members of ONE file, lazy.pack, each zlib-compressed:
extension modules with the libraries only they link, and package data. LazyPack, first on
sys.meta_path, writes a module's libraries and then the module out beside the others (same
directory, same lifetime) when it is first imported, and a package's data when the package is.
The directory is on LD_LIBRARY_PATH (the bootloader's), so the dynamic loader finds a library
written there late.
"""
import os
import sys

CA_BUNDLE = os.path.join("certs", "ca-certificates.crt")


def _bundle_dir() -> str:
    return getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(__file__)))


def use_bundled_roots(env=os.environ) -> None:
    if not env.get("SSL_CERT_FILE"):
        path = os.path.join(_bundle_dir(), CA_BUNDLE)
        if os.path.isfile(path):
            env["SSL_CERT_FILE"] = path
    if env.get("SSL_CERT_FILE") and not env.get("AWS_CA_BUNDLE"):
        env["AWS_CA_BUNDLE"] = env["SSL_CERT_FILE"]


PACK = "lazy.pack"
MAGIC = b"BUSBAR-LAZY 1 "
XZ_MAGIC = b"\xfd7zXZ\x00"


class LazyPack:
    """A meta path finder over lazy.pack in `root`. The pack: MAGIC, the index's length as ten
    digits and a newline, the index (UTF-8 lines, tab-separated), then the members, each
    zlib- or xz-compressed (told apart by the xz magic), at offsets counted from the end of the
    index. Index lines:
      m <module> <suffix> <offset> <length> <library,...>   an extension module
      l <library> <offset> <length>                        a library one of them links
      d <package> <path> <offset> <length>                 data its package reads from <path>
    """

    def __init__(self, root: str):
        self.root = root
        self.modules, self.libraries, self.data = {}, {}, {}
        self.path = os.path.join(root, PACK)
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(MAGIC) + 11)
                if not head.startswith(MAGIC):
                    return
                index = f.read(int(head[len(MAGIC):-1])).decode()
                self.base = len(head) + len(index.encode())
        except (OSError, ValueError):
            return
        for line in index.splitlines():
            kind, *f = line.split("\t")
            if kind == "m":
                self.modules[f[0]] = (f[1], int(f[2]), int(f[3]), [x for x in f[4].split(",") if x])
            elif kind == "l":
                self.libraries[f[0]] = (int(f[1]), int(f[2]))
            elif kind == "d":
                self.data.setdefault(f[0], []).append((f[1], int(f[2]), int(f[3])))

    def find_spec(self, name, path=None, target=None):
        files = self.data.pop(name, None)
        if files:               # a package whose data travels here: written out, then imported as usual
            for rel, offset, length in files:
                self._write_out(offset, length, os.path.join(self.root, *rel.split("/")), 0o644)
            return None
        entry = self.modules.get(name)
        if entry is None:
            return None
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import spec_from_file_location
        suffix, offset, length, libs = entry
        for lib in libs:
            self._write_out(*self.libraries[lib], os.path.join(self.root, lib), 0o755)
        dest = os.path.join(self.root, *name.split(".")) + suffix
        self._write_out(offset, length, dest, 0o755)
        return spec_from_file_location(name, dest, loader=ExtensionFileLoader(name, dest))

    def _write_out(self, offset: int, length: int, dest: str, mode: int) -> None:
        if os.path.exists(dest):
            return
        with open(self.path, "rb") as f:
            f.seek(self.base + offset)
            data = f.read(length)
        if data.startswith(XZ_MAGIC):
            import lzma
            data = lzma.decompress(data)
        else:
            import zlib
            data = zlib.decompress(data)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        # A name of this process's own: forked workers importing it at once each write a copy, and
        # the rename makes one of them the file, whole.
        part = "%s.%d.part" % (dest, os.getpid())
        with open(part, "wb") as f:
            f.write(data)
        os.chmod(part, mode)
        os.replace(part, dest)


def write_pack(path: str, modules=(), libraries=(), data=(), xz=()) -> None:
    """Writes lazy.pack (LazyPack's format). modules: (name, suffix, file, [library names]);
    libraries: (name, file); data: (package, path in the bundle with '/', file). The modules and
    libraries named in `xz` are xz-compressed (smaller, slower to decompress), the rest zlib."""
    import lzma
    import zlib
    index, blobs, offset = [], [], 0

    def add(src, name=None):
        nonlocal offset
        with open(src, "rb") as f:
            raw = f.read()
        blob = (lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME) if name in xz
                else zlib.compress(raw, 9))
        blobs.append(blob)
        offset += len(blob)
        return "%d\t%d" % (offset - len(blob), len(blob))

    for name, suffix, src, libs in modules:
        index.append("m\t%s\t%s\t%s\t%s" % (name, suffix, add(src, name), ",".join(libs)))
    for name, src in libraries:
        index.append("l\t%s\t%s" % (name, add(src, name)))
    for package, rel, src in data:
        index.append("d\t%s\t%s\t%s" % (package, rel, add(src)))
    text = "\n".join(index).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + b"%010d\n" % len(text) + text)
        for blob in blobs:
            f.write(blob)


def install_lazy_extensions() -> None:
    if getattr(sys, "frozen", False):
        sys.meta_path.insert(0, LazyPack(_bundle_dir()))


if __name__ == "__main__":
    use_bundled_roots()
    install_lazy_extensions()
    from busbar.cli import main
    sys.exit(main())
