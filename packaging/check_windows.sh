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
#    Windows lacks (clock_gettime, dlopen, memmem...) an error, not a warning, and the GNU C that
#    MSVC's C compiler refuses and GCC takes silently (variable-length arrays, void * arithmetic).
# 2. The same files again with _MSC_VER defined: port.h's and simd.h's MSVC forms (the Interlocked
#    and _BitScan intrinsics, __cpuid, the fp_contract pragma) against MinGW's intrin.h.
# 3. No GCC builtin, GCC attribute or POSIX-only call left in cbusbar's sources outside port.h.
# 4. port.h and simd.h alone in the MSVC dialect itself (clang --target=x86_64-pc-windows-msvc
#    -fms-compatibility: no __GNUC__), every form used once, when clang is installed.
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
                    -Werror=vla -Werror=pointer-arith \
                    "${extra[@]}" "$2" 2>&1); then
                printf "== %s (%s)\n%s\n" "$2" "$1" "$(printf "%s\n" "$out" | grep -E "error|note" | head -20)"
                exit 1
            fi' _; then
    status=1
fi
# 4. port.h and simd.h in the MSVC dialect proper (no __GNUC__; __forceinline, __pragma, the
#    intrinsics as clang's MSVC-compatible intrin.h declares them), when clang is installed: one
#    file using every port.h form, against the Win32 and C declarations it needs, written here as
#    the Windows SDK and the UCRT declare them (clang has no Windows SDK of its own).
msvc_note="clang not installed: port.h not compiled in the MSVC dialect"
if command -v clang >/dev/null 2>&1; then
    mkdir -p "$tmp/stub"
    cat > "$tmp/stub/windows.h" <<'EOF2'
/* the Win32 declarations port.h uses, as the Windows SDK declares them */
typedef unsigned long DWORD;
typedef int BOOL;
typedef long long LONGLONG;
typedef unsigned long long ULONGLONG;
typedef void *HANDLE;
typedef struct HINSTANCE__ *HMODULE;
typedef long long (__stdcall *FARPROC)(void);
typedef union _LARGE_INTEGER { struct { DWORD LowPart; long HighPart; } u; LONGLONG QuadPart; } LARGE_INTEGER;
typedef struct _FILETIME { DWORD dwLowDateTime; DWORD dwHighDateTime; } FILETIME;
#define FALSE 0
#define PROCESS_QUERY_LIMITED_INFORMATION 0x1000
#define ERROR_INVALID_PARAMETER 87L
#define STILL_ACTIVE 259
#define LOAD_WITH_ALTERED_SEARCH_PATH 0x00000008
__declspec(dllimport) BOOL __stdcall QueryPerformanceCounter(LARGE_INTEGER *);
__declspec(dllimport) BOOL __stdcall QueryPerformanceFrequency(LARGE_INTEGER *);
__declspec(dllimport) void __stdcall GetSystemTimePreciseAsFileTime(FILETIME *);
__declspec(dllimport) ULONGLONG __stdcall GetTickCount64(void);
__declspec(dllimport) HMODULE __stdcall GetModuleHandleA(const char *);
__declspec(dllimport) HMODULE __stdcall LoadLibraryExA(const char *, HANDLE, DWORD);
__declspec(dllimport) FARPROC __stdcall GetProcAddress(HMODULE, const char *);
__declspec(dllimport) HANDLE __stdcall OpenProcess(DWORD, BOOL, DWORD);
__declspec(dllimport) DWORD __stdcall GetLastError(void);
__declspec(dllimport) BOOL __stdcall GetExitCodeProcess(HANDLE, DWORD *);
__declspec(dllimport) BOOL __stdcall CloseHandle(HANDLE);
__declspec(dllimport) BOOL __stdcall SwitchToThread(void);
EOF2
    cat > "$tmp/stub/time.h" <<'EOF2'
typedef long long time_t;
struct timespec { time_t tv_sec; long tv_nsec; };
struct tm { int tm_sec, tm_min, tm_hour, tm_mday, tm_mon, tm_year, tm_wday, tm_yday, tm_isdst; };
int gmtime_s(struct tm *, const time_t *);
EOF2
    cat > "$tmp/stub/string.h" <<'EOF2'
#include <stddef.h>
void *memchr(const void *, int, size_t);
int memcmp(const void *, const void *, size_t);
void *memcpy(void *, const void *, size_t);
void *memset(void *, int, size_t);
char *strchr(const char *, int);
EOF2
    cat > "$tmp/stub/stdlib.h" <<'EOF2'
#include <stddef.h>
void *malloc(size_t); void free(void *);
void *_aligned_malloc(size_t, size_t); void _aligned_free(void *);
EOF2
    echo '#include <stdlib.h>' > "$tmp/stub/malloc.h"
    cat > "$tmp/stub/setjmp.h" <<'EOF2'
typedef struct { unsigned long long Part[2]; } __declspec(align(16)) _JBTYPE;
typedef _JBTYPE jmp_buf[16];
EOF2
    cat > "$tmp/msvc.c" <<'EOF2'
#if defined(__GNUC__) || !defined(_MSC_VER)
#error "not the MSVC dialect"
#endif
typedef long long Py_ssize_t;
#define PY_VERSION_HEX 0x030B07F0
#include "port.h"
#include "simd.h"
long long use(long long *p, unsigned long long v, struct timespec *ts, struct tm *t, time_t *tt) {
    long long e = 0;
    long long r = bb_atomic_load_relaxed(p) + bb_atomic_load_acquire(p) + bb_atomic_load_seq_cst(p);
    r += bb_atomic_add_fetch_relaxed(p, 2) + bb_atomic_add_fetch_seq_cst(p, 3) + bb_atomic_sub_fetch_seq_cst(p, 1);
    bb_atomic_store_release(p, 0); bb_atomic_store_seq_cst(p, 1);
    r += bb_atomic_cas_relaxed(p, &e, 1) + bb_atomic_cas_acquire(p, &e, 2) + bb_atomic_cas_seq_cst(p, &e, 3);
    r += bb_clzll(v) + bb_ctz((unsigned)v) + bb_cpu_has_ssse3();
    bb_clock_gettime(BB_CLOCK_MONOTONIC, ts); bb_clock_gettime(BB_CLOCK_PY_MONOTONIC, ts); bb_clock_gettime(BB_CLOCK_REALTIME, ts);
    r += bb_gmtime_r(tt, t) != 0;
    r += bb_dlsym(bb_dlopen("libcrypto-3.dll", BB_RTLD_NOW), "EVP_sha256") != 0;
    r += bb_pid_dead(4); bb_sched_yield();
    r += bb_memmem("abc", 3, "c", 1) != 0;
    r += busbar_str_run((const unsigned char *)"ab\"", 0, 3) + busbar_utf8_valid((const unsigned char *)"ab", 2);
    return r;
}
BB_NO_FP_CONTRACT
static double nofma(double a, double b, double c) { BB_NO_FP_CONTRACT_BODY return a * b + c; }
double use2(double a) { return nofma(a, a, a); }
#if !defined(BB_SSE2) || !defined(BB_SSSE3_DISPATCH)
#error "the vector paths are off"
#endif
EOF2
    if out=$(clang --target=x86_64-pc-windows-msvc -fms-compatibility -fms-extensions -fsyntax-only \
            -Wall -Werror -nostdinc -isystem "$(clang -print-resource-dir)/include" \
            -isystem "$tmp/stub" -Icbusbar "$tmp/msvc.c" 2>&1); then
        msvc_note="port.h and simd.h compile in the MSVC dialect (clang --target=x86_64-pc-windows-msvc)"
    else
        printf '== cbusbar/port.h (clang, MSVC dialect)\n%s\n' "$out"
        status=1
    fi
fi

n=${#cfiles[@]}
if [ "$status" = 0 ]; then
    echo "check_windows: ok: $n C files compile for x86_64 Windows (MinGW-w64 GCC; and with _MSC_VER: port.h's MSVC forms); $msvc_note; no raw GCC builtin or POSIX call outside cbusbar/port.h"
fi
exit "$status"
