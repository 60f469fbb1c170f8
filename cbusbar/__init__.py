"""cbusbar: the typed Cython layer (IR, codecs, framing, hot helpers).

Every compiled module of the project, cbusbar's and busbar's own (busbar.engine.exchange and the
other .py files with a .pxd beside them), lives in one shared object, cbusbar/_native.<abi>.so
(setup.py says why). This finder, installed first on sys.meta_path when the package is imported,
loads each of the modules that object names (cbusbar._native.MODULES) from it, by the same
ExtensionFileLoader Python uses for one module per file; every other import is left to the usual
finders. Without a build there is no _native and nothing is installed: importing a compiled module
then fails as it would without its .so."""
import sys as _sys


def _install():
    try:
        from cbusbar import _native
    except ImportError:
        return
    from importlib.machinery import ExtensionFileLoader
    from importlib.util import spec_from_file_location

    path, names = _native.__file__, frozenset(_native.MODULES)

    class NativeFinder:
        """Finds the modules linked into cbusbar._native."""

        @staticmethod
        def find_spec(name, path_=None, target=None):
            if name in names:
                return spec_from_file_location(name, path, loader=ExtensionFileLoader(name, path))
            return None

    if not any(getattr(f, "__name__", "") == "NativeFinder" for f in _sys.meta_path):
        _sys.meta_path.insert(0, NativeFinder)


_install()
