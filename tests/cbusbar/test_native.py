"""cbusbar/__init__.py and setup.py: every compiled module is linked into the one extension
cbusbar/_native and loaded from it (setup.py says why), busbar's compiled .py modules included."""
import glob
import importlib
import os
import pathlib
import subprocess
import sys

import cbusbar
from cbusbar import _native

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sources():
    """Dotted names setup.py compiles: cbusbar's .pyx, and each busbar .py with a .pxd beside it."""
    names = set()
    for p in glob.glob(str(ROOT / "cbusbar" / "**" / "*.pyx"), recursive=True):
        names.add(os.path.relpath(p, ROOT)[:-4].replace(os.sep, "."))
    for p in glob.glob(str(ROOT / "busbar" / "**" / "*.pxd"), recursive=True):
        names.add(os.path.relpath(p, ROOT)[:-4].replace(os.sep, "."))
    return names


def test_the_extension_names_every_compiled_module():
    assert set(_native.MODULES) == _sources()
    assert len(_native.MODULES) == len(set(_native.MODULES))
    # a shared object holds one PyInit_<last part> per module: two modules ending alike could not
    # both be in it (cbusbar/http.pyx became cbusbar/h1.pyx beside busbar/server/http.py for that)
    short = [n.rsplit(".", 1)[-1] for n in _native.MODULES]
    assert len(short) == len(set(short))


def test_each_module_is_loaded_from_the_one_extension():
    for name in _native.MODULES:
        mod = importlib.import_module(name)
        assert mod.__file__ == _native.__file__, name
        assert type(mod.__loader__).__name__ == "ExtensionFileLoader", name
    # compiled from busbar/engine/exchange.py, but the .py beside it is not what runs
    from busbar.engine import exchange
    assert exchange.__file__.endswith(".so")
    assert exchange.Exchange.__module__ == "busbar.engine.exchange"


def test_no_module_per_file_extension_is_left_beside_it():
    left = [p for p in glob.glob(str(ROOT / "busbar" / "**" / "*.so"), recursive=True)]
    left += [p for p in glob.glob(str(ROOT / "cbusbar" / "**" / "*.so"), recursive=True)
             if not os.path.basename(p).startswith("_native.")]
    assert left == []


def test_other_imports_are_left_to_the_usual_finders():
    finder = sys.meta_path[0]
    assert type(finder).__name__ == "type" and finder.__name__ == "NativeFinder"
    assert finder.find_spec("busbar.config.loader") is None          # a plain .py module
    assert finder.find_spec("cbusbar.no_such_module") is None
    assert importlib.import_module("busbar.config.loader").__file__.endswith(".py")
    # importing cbusbar again (or busbar, which imports it) does not stack a second finder
    importlib.reload(cbusbar)
    assert sum(getattr(f, "__name__", "") == "NativeFinder" for f in sys.meta_path) == 1


def test_a_fresh_interpreter_importing_busbar_first_gets_the_compiled_modules():
    code = ("import busbar.engine.exchange as e, cbusbar.proto.openai as o, cbusbar._native as n;"
            "print(e.__file__ == o.__file__ == n.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
