"""cbusbar on Windows (issue 39): its C compiles there (packaging/check_windows.sh, as far as Linux
can tell: MinGW-w64's GCC, and port.h's MSVC forms with _MSC_VER defined), no GCC builtin or POSIX
call creeps back in outside cbusbar/port.h, and the Python-side choices that differ on Windows
(the anonymous mapping, where libcrypto is looked for) take the Windows branch there."""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from cbusbar import clock, ed25519, shared

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "check_windows.sh"


def _run(*args, cwd_script=SCRIPT):
    return subprocess.run(["bash", str(cwd_script), *args, sys.executable],
                          capture_output=True, text=True, timeout=600)


# the script is a Linux developer's check (bash, MinGW); the Windows runner compiles with MSVC itself
linux_check = pytest.mark.skipif(sys.platform == "win32", reason="checks made on Linux for Windows")


@linux_check
def test_no_gcc_builtin_or_posix_call_outside_port_h():
    r = _run("--lint")
    assert r.returncode == 0, r.stderr
    assert "ok: no raw GCC builtin" in r.stdout


@linux_check
def test_the_lint_names_a_raw_builtin_and_a_posix_declaration(tmp_path):
    """The same script over a tree holding the kinds of code it must refuse: C in a
    `cdef extern from *` block, a Cython declaration from <dlfcn.h>; and what it must let pass
    (the names in a docstring or comment, port.h itself)."""
    (tmp_path / "packaging").mkdir()
    script = tmp_path / "packaging" / "check_windows.sh"
    shutil.copy(SCRIPT, script)
    pkg = tmp_path / "cbusbar"
    pkg.mkdir()
    (pkg / "port.h").write_text("#define bb_clzll(v) __builtin_clzll(v)\n")
    (pkg / "fine.pyx").write_text(
        '"""Docstrings may say __atomic_load_n and clock_gettime(CLOCK_MONOTONIC)."""\n'
        "# and comments dlopen(NULL)\n"
        'cdef extern from *:\n    """\n    /* __builtin_ctz in a C comment */\n'
        '    #include "port.h"\n    static int f(unsigned long long v) { return bb_clzll(v); }\n'
        '    """\n    int f(unsigned long long v)\n')
    r = _run("--lint", cwd_script=script)
    assert r.returncode == 0, r.stderr
    (pkg / "bad.pyx").write_text(
        'cdef extern from *:\n    """\n    static long long g(long long *p) {\n'
        '        return __atomic_load_n(p, __ATOMIC_SEQ_CST);\n    }\n    """\n'
        "    long long g(long long *p)\n\n"
        'cdef extern from "<dlfcn.h>" nogil:\n    void* dlsym(void* h, const char* name)\n')
    r = _run("--lint", cwd_script=script)
    assert r.returncode == 1
    assert "cbusbar/bad.pyx:4:" in r.stderr          # the builtin, in the C block
    assert "cbusbar/bad.pyx:9:" in r.stderr          # the header
    assert "cbusbar/bad.pyx:10:" in r.stderr         # the declared name
    assert "fine.pyx" not in r.stderr


@linux_check
@pytest.mark.skipif(shutil.which("x86_64-w64-mingw32-gcc") is None,
                    reason="MinGW-w64 is not installed (Debian: apt-get install mingw-w64)")
def test_every_c_file_compiles_for_windows():
    r = _run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "C files compile for x86_64 Windows" in r.stdout


def test_the_anonymous_mapping_is_zeroed_and_writable():
    m = shared.anonymous_mapping(4096)
    assert len(m) == 4096 and m[:] == bytes(4096)
    m[0:3] = b"abc"
    assert m[0:3] == b"abc"
    # SharedCounters and the ledger's LimitTable live in one
    c = shared.SharedCounters(4)
    assert c.values(0, 4) == [0, 0, 0, 0]
    assert c.add(2, 5) == 5 and c.try_acquire(1, 1) and not c.try_acquire(1, 1)
    assert c.cas(2, 5, 7) and not c.cas(2, 5, 9) and c.value(2) == 7
    assert c.release(1) == 0


def test_libcrypto_is_looked_for_by_its_windows_names_there(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    names = ed25519._candidates()
    assert names[:4] == [b"libcrypto-3-x64.dll", b"libcrypto-3.dll", b"libcrypto-1_1-x64.dll",
                         b"libcrypto-1_1.dll"]
    import _hashlib
    beside = os.fsencode(os.path.join(os.path.dirname(_hashlib.__file__), "libcrypto-3.dll"))
    assert beside in names
    assert "among the loaded modules" in ed25519._looked_in()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert b"libcrypto.3.dylib" in ed25519._candidates()
    monkeypatch.setattr(sys, "platform", "linux")
    assert ed25519._candidates()[-2:] == [b"libcrypto.so.3", b"libcrypto.so.1.1"]
    assert "/proc/self/maps" in ed25519._looked_in()


def test_the_c_clocks_read_what_python_reads():
    """clock.now_ns is time.perf_counter_ns's clock and clock.monotonic time.monotonic's (port.h
    picks them per OS): read between two reads of Python's, each falls between them."""
    for _ in range(100):
        a = time.perf_counter_ns()
        b = clock.now_ns()
        c = time.perf_counter_ns()
        assert a - 1000 <= b <= c + 1000     # (Windows: a tick's rounding either way)
        x = time.monotonic()
        y = clock.monotonic()
        z = time.monotonic()
        assert x - 1e-6 <= y <= z + 1e-6
