#!/usr/bin/env bash
# Does cbusbar's C compile for Windows? As far as a Linux machine can tell (issue 39): the release
# builds the Windows executable with MSVC on a GitHub runner (.github/workflows/release.yml); this
# checks the same C here before a tag gets that far.
#
#   packaging/check_windows.sh [PYTHON]     (after `PYTHON setup.py build_ext --inplace`)
#   packaging/check_windows.sh --lint       (3. alone: needs neither MinGW nor a build)
#
# 1. Every C file the extension is built from (Cython's output beside each cbusbar/**/*.pyx and
#    busbar/**/*.py with a .pxd, and cbusbar/_native.c) compiled with MinGW-w64's GCC for
#    x86_64 Windows, -fsyntax-only: the Win32 forms of cbusbar/port.h (clocks, GetProcAddress,
#    OpenProcess, gmtime_s, memmem) against the Windows SDK headers, with a call to anything
#    Windows lacks (clock_gettime, dlopen, memmem...) an error, not a warning.
# 2. The same files again with _MSC_VER defined: port.h's and simd.h's MSVC forms (the Interlocked
#    and _BitScan intrinsics, __cpuid, the fp_contract pragma) against MinGW's intrin.h.
# 3. No GCC builtin, GCC attribute or POSIX-only call left in cbusbar's sources outside port.h.
#
# What this cannot prove, and only the Windows runner can: that MSVC itself accepts the code (MSVC
# is not GCC with _MSC_VER defined: its C dialect, its own intrin.h and the UCRT headers differ),
# the link, and anything at run time. Python's headers here are Linux's CPython 3.11 with a
# Windows pyconfig.h written below (the sizes and feature macros of a 64-bit Windows build: LLP64,
# 32-bit long), not the pyconfig.h of a Windows install.
#
# Exit status: 0 all passed; 1 something failed; 77 MinGW-w64 is not installed (Debian: apt-get
# install mingw-w64), which tests/cbusbar/test_windows_build.py reports as a skip. The project's
# CI does not install it: `make test` runs the --lint part (what would break the Windows build most
# often: a new builtin or POSIX call in a .pyx), and the Windows runner of the release compiles
# with MSVC itself; the full check takes ~40 s of CPU on two cores plus a ~300 MB toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

lint_only=0
if [ "${1:-}" = --lint ]; then
    lint_only=1
    shift
fi
PY=${1:-${PYTHON:-.venv/bin/python}}
[ -x "$PY" ] || PY=python3

# 3. raw builtins and POSIX calls: each has its portable form in port.h. Looked for in C code (the
#    headers, the C blocks of `cdef extern from *`) and in the names Cython code declares and calls;
#    comments and docstrings may name them.
status=0
"$PY" - <<'PYEOF' || status=1
import io, pathlib, re, sys, tokenize

C_BAD = re.compile(r"__atomic_|__builtin_|__attribute__|__sync_|\b(clock_gettime|gmtime_r|dlopen|dlsym|"
                   r"memmem|sched_yield|kill|mallopt)\s*\(|#\s*include\s*<(dlfcn|unistd|pthread|sched|"
                   r"signal|sys/[a-z_]+)\.h>")
NAMES = {"clock_gettime", "gmtime_r", "dlopen", "dlsym", "memmem", "sched_yield", "mallopt",
         "RTLD_NOW", "RTLD_NOLOAD", "CLOCK_MONOTONIC", "CLOCK_REALTIME", "posix"}
HEADERS = re.compile(r"dlfcn\.h|unistd\.h|pthread\.h|sched\.h|sys/")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# glibc-only code that compiles everywhere because it is #if defined(__GLIBC__)
ALLOWED = {("cbusbar/sysmem.pyx", "mallopt")}
bad = []


def c_code(path, text, line0):
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for i, line in enumerate(text.splitlines()):
        m = C_BAD.search(line)
        if m and (path, (m.group(1) or "")) not in ALLOWED:
            bad.append("%s:%d: %s" % (path, line0 + i, line.strip()))


for f in sorted(pathlib.Path("cbusbar").rglob("*")):
    path = f.as_posix()
    if f.suffix == ".h" and path != "cbusbar/port.h":
        c_code(path, f.read_text(), 1)
    if f.suffix not in (".pyx", ".pxd"):
        continue
    toks = list(tokenize.generate_tokens(io.StringIO(f.read_text()).readline))
    for i, t in enumerate(toks):
        line = t.line.strip()
        if t.type == tokenize.STRING:
            prev = [p for p in toks[:i] if p.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                                          tokenize.COMMENT)]
            if prev and prev[-1].string == ":" and prev[-1].line.lstrip().startswith("cdef extern from *"):
                c_code(path, t.string, t.start[0])         # C block of cdef extern from *
            elif prev and prev[-1].string == "from" and HEADERS.search(t.string):
                bad.append("%s:%d: %s" % (path, t.start[0], line))
        elif t.type == tokenize.NAME and t.string in NAMES and (path, t.string) not in ALLOWED:
            bad.append("%s:%d: %s" % (path, t.start[0], line))
if bad:
    print("check_windows: GCC-only or POSIX-only code outside cbusbar/port.h (use its bb_* forms):",
          file=sys.stderr)
    print("\n".join(sorted(set(bad))), file=sys.stderr)
    sys.exit(1)
PYEOF

if [ "$lint_only" = 1 ]; then
    [ "$status" = 0 ] && echo "check_windows: ok: no raw GCC builtin or POSIX call outside cbusbar/port.h"
    exit "$status"
fi
CC=${MINGW_CC:-x86_64-w64-mingw32-gcc}
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "check_windows: $CC not found (Debian: apt-get install mingw-w64)" >&2
    exit 77
fi

# the C files, each newer than its source (a stale one would check old code)
cfiles=()
while IFS= read -r src; do
    c="${src%.*}.c"
    if [ ! -f "$c" ] || [ "$c" -ot "$src" ]; then
        echo "check_windows: $c is missing or older than $src: run '$PY setup.py build_ext --inplace' first" >&2
        exit 1
    fi
    cfiles+=("$c")
done < <( (find cbusbar -name '*.pyx'; find busbar -name '*.pxd' | sed 's/\.pxd$/.py/') | sort)
[ -f cbusbar/_native.c ] && cfiles+=(cbusbar/_native.c)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
cp -r "$inc" "$tmp/py"
cat > "$tmp/py/pyconfig.h" <<'EOF'
/* check_windows.sh: what a 64-bit Windows CPython's pyconfig.h tells extensions (LLP64). */
#ifndef Py_CONFIG_H
#define Py_CONFIG_H
#define MS_WIN32
#define MS_WIN64
#define MS_WINDOWS
#define NT_THREADS
#define WITH_THREAD
#define Py_ENABLE_SHARED 1
#define HAVE_DECLSPEC_DLL
#define PLATFORM "win32"
#define SIZEOF_SHORT 2
#define SIZEOF_INT 4
#define SIZEOF_LONG 4
#define SIZEOF_LONG_LONG 8
#define SIZEOF_DOUBLE 8
#define SIZEOF_FLOAT 4
#define SIZEOF_VOID_P 8
#define SIZEOF_SIZE_T 8
#define SIZEOF_TIME_T 8
#define SIZEOF_OFF_T 4
#define SIZEOF_FPOS_T 8
#define SIZEOF_WCHAR_T 2
#define SIZEOF__BOOL 1
#define SIZEOF_HKEY 8
#define LONG_BIT 32
#define WORD_BIT 32
#define HAVE_UINTPTR_T 1
#define HAVE_INTPTR_T 1
#define HAVE_SSIZE_T 1
#define HAVE_WCHAR_H 1
#define HAVE_IO_H
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_ERRNO_H 1
#define HAVE_FCNTL_H 1
#define HAVE_PROCESS_H 1
#define HAVE_SIGNAL_H 1
#define HAVE_COPYSIGN 1
#define HAVE_ROUND 1
#define HAVE_HYPOT
#define HAVE_CLOCK
#define HAVE_STRFTIME
#define HAVE_LARGEFILE_SUPPORT
#define WITH_DOC_STRINGS 1
#define WITH_PYMALLOC 1
#define HAVE_DYNAMIC_LOADING
#define DOUBLE_IS_LITTLE_ENDIAN_IEEE754 1
#include <io.h>
#include <stdio.h>
#include <basetsd.h>
#if defined(_MSC_VER) && !defined(__MINGW32__)
typedef __int64 ssize_t;
typedef int pid_t;
#endif
#endif
EOF

# each C file twice, as MinGW (mingw) and with _MSC_VER (msvc), on every core; a failure prints
# the file's first errors
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
export CC PYINC="$tmp/py"
# shellcheck disable=SC2016  # expanded by the inner bash
if ! for mode in mingw msvc; do for c in "${cfiles[@]}"; do printf '%s\n%s\n' "$mode" "$c"; done; done |
        xargs -d '\n' -n 2 -P "$jobs" bash -c '
            extra=(); [ "$1" = msvc ] && extra=(-D_MSC_VER=1930)
            if ! out=$("$CC" -fsyntax-only -I"$PYINC" -Wno-unknown-pragmas \
                    -Werror=implicit-function-declaration -Werror=implicit-int \
                    -Werror=incompatible-pointer-types -Werror=int-conversion \
                    "${extra[@]}" "$2" 2>&1); then
                printf "== %s (%s)\n%s\n" "$2" "$1" "$(printf "%s\n" "$out" | grep -E "error|note" | head -20)"
                exit 1
            fi' _; then
    status=1
fi
n=${#cfiles[@]}
if [ "$status" = 0 ]; then
    echo "check_windows: ok: $n C files compile for x86_64 Windows (MinGW-w64 GCC; and with _MSC_VER: port.h's MSVC forms); no raw GCC builtin or POSIX call outside cbusbar/port.h"
fi
exit "$status"
