"""Entry script of the one-file executable: busbar's own CLI (busbar.cli:main), after two things only
an executable needs.

CA roots. A `FROM scratch` image has no /etc/ssl, and the OpenSSL inside the executable looks for
roots at the build machine's compiled-in paths, so without this a TLS call to a real provider
cannot verify. An SSL_CERT_FILE the operator set always wins; the system's certificate directory
(SSL_CERT_DIR or OpenSSL's default) is still consulted, so a host's own roots keep working beside
the bundle. botocore (the AWS credential chain's STS and SSO calls) reads its roots from
AWS_CA_BUNDLE instead of OpenSSL's defaults: it gets the same file, unless the operator set it.

Lazy extensions. The one-file bootloader writes every library of the archive to its temporary
directory before Python starts; the extensions only some configs load (packaging/busbar.spec,
LAZY) travel as lazy/<module>.<suffix>.xz instead, with the libraries only they link as
lazy/lib/<module>/<library>.xz, and LazyExtensions writes a module's libraries and then the module
out beside the others (same directory, same lifetime) when it is first imported. The directory is
on LD_LIBRARY_PATH (the bootloader's), so the dynamic loader finds a library written there late.
"""
import os
import sys

CA_BUNDLE = os.path.join("certs", "ca-certificates.crt")
LAZY_DIR = "lazy"


def _bundle_dir() -> str:
    return getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(__file__)))


def use_bundled_roots(env=os.environ) -> None:
    if not env.get("SSL_CERT_FILE"):
        path = os.path.join(_bundle_dir(), CA_BUNDLE)
        if os.path.isfile(path):
            env["SSL_CERT_FILE"] = path
    if env.get("SSL_CERT_FILE") and not env.get("AWS_CA_BUNDLE"):
        env["AWS_CA_BUNDLE"] = env["SSL_CERT_FILE"]


class LazyExtensions:
    """A meta path finder for the extensions carried compressed: `lazy/<dotted name>.<suffix>.xz`
    in `root` is decompressed to `<root>/<dotted name as a path>.<suffix>` on the module's first
    import and loaded from there as any extension is."""

    def __init__(self, root: str):
        self.root = root
        self.modules = {}
        try:
            names = os.listdir(os.path.join(root, LAZY_DIR))
        except OSError:
            names = []
        for packed in names:
            if packed.endswith(".xz"):
                module, suffix = _split(packed[:-3])
                self.modules[module] = (packed, suffix)

    def find_spec(self, name, path=None, target=None):
        entry = self.modules.get(name)
        if entry is None:
            return None
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import spec_from_file_location
        packed, suffix = entry
        dest = os.path.join(self.root, *name.split(".")) + suffix
        libs = os.path.join(self.root, LAZY_DIR, "lib", name)
        for lib in sorted(os.listdir(libs)) if os.path.isdir(libs) else ():
            if lib.endswith(".xz"):
                _write_out(os.path.join(libs, lib), os.path.join(self.root, lib[:-3]))
        _write_out(os.path.join(self.root, LAZY_DIR, packed), dest)
        return spec_from_file_location(name, dest, loader=ExtensionFileLoader(name, dest))


def _write_out(packed: str, dest: str) -> None:
    if os.path.exists(dest):
        return
    import lzma
    with open(packed, "rb") as f:
        data = lzma.decompress(f.read())
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # A name of this process's own: forked workers importing it at once each write a copy, and
    # the rename makes one of them the file, whole.
    part = "%s.%d.part" % (dest, os.getpid())
    with open(part, "wb") as f:
        f.write(data)
    os.chmod(part, 0o755)
    os.replace(part, dest)


def _split(stem: str):
    """'pkg.mod.abi3.so' -> ('pkg.mod', '.abi3.so'); 'pkg.mod.cpython-311-x86_64-linux-gnu.so' ->
    ('pkg.mod', '.cpython-311-x86_64-linux-gnu.so'); 'pkg.mod.pyd' -> ('pkg.mod', '.pyd'): the
    suffix starts at the first part that is a platform tag or the library extension itself."""
    parts = stem.split(".")
    for i, part in enumerate(parts):
        if i and (part in ("so", "pyd", "abi3") or part.startswith(("cpython-", "cp3"))):
            return ".".join(parts[:i]), "." + ".".join(parts[i:])
    raise ValueError("no extension suffix in %r" % stem)


def install_lazy_extensions() -> None:
    if getattr(sys, "frozen", False):
        sys.meta_path.insert(0, LazyExtensions(_bundle_dir()))


if __name__ == "__main__":
    use_bundled_roots()
    install_lazy_extensions()
    from busbar.cli import main
    sys.exit(main())
