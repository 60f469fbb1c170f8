/* What cbusbar's C needs from the compiler and the OS, in one place, for the three builds the
   release makes: GCC on Linux, Clang on macOS, MSVC on Windows (issue 39).

   The GCC/Clang forms are exactly the builtins and POSIX calls the modules used before this header
   existed (the same machine code on Linux). The MSVC forms:
   - atomics: the Interlocked*64 intrinsics, which are full barriers (at least as strong as every
     order asked for here); a load is a volatile read and a release store a volatile write between
     compiler barriers, which x86-64's memory model makes acquire/release (x86-64 is the only
     Windows target; an ARM64 build takes the loads through a locked compare-exchange instead);
   - bit scans: _BitScanReverse64/_BitScanForward (the same answers as __builtin_clzll/ctz for a
     nonzero argument, which is all the callers pass);
   - the SSSE3 check: __cpuid leaf 1, ECX bit 9 (what __builtin_cpu_supports("ssse3") reads);
   - clocks: QueryPerformanceCounter for CLOCK_MONOTONIC (what CPython's perf_counter reads on
     Windows, and its monotonic from 3.13; GetTickCount64 before) and GetSystemTimePreciseAsFileTime
     for CLOCK_REALTIME (time.time()); on macOS CLOCK_UPTIME_RAW (CPython's mach_absolute_time);
   - shared libraries: GetModuleHandleA/LoadLibraryA + GetProcAddress for dlopen/dlsym;
   - processes: OpenProcess/GetExitCodeProcess for kill(pid, 0), SwitchToThread for sched_yield;
   - gmtime_s for gmtime_r, and a byte loop for glibc's memmem.
   The OS forms key on _WIN32 (MinGW GCC is _WIN32 without _MSC_VER: GCC's builtins, Win32 calls);
   the compiler forms on _MSC_VER. packaging/check_windows.sh compiles both on Linux. */
#ifndef BUSBAR_PORT_H
#define BUSBAR_PORT_H
#include <stddef.h>
#include <string.h>
#include <time.h>

#if defined(_MSC_VER)
#include <intrin.h>
#endif

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#endif

/* ---------------------------------------------------------------------------- atomics (64-bit) */
#if defined(_MSC_VER)
#if defined(__GNUC__)   /* packaging/check_windows.sh: GCC compiling the MSVC forms */
#define BB_FORCEINLINE static inline __attribute__((always_inline))
#else
#define BB_FORCEINLINE static __forceinline
#endif
#if defined(_M_X64) || defined(_M_IX86) || defined(__x86_64__)
BB_FORCEINLINE long long bb_atomic_load_(long long *p) {
    long long v;
    _ReadWriteBarrier();
    v = *(volatile long long *)p;
    _ReadWriteBarrier();
    return v;
}
#else
BB_FORCEINLINE long long bb_atomic_load_(long long *p) {
    return _InterlockedCompareExchange64((volatile long long *)p, 0, 0);
}
#endif
BB_FORCEINLINE int bb_atomic_cas_(long long *p, long long *expected, long long v) {
    long long seen = _InterlockedCompareExchange64((volatile long long *)p, v, *expected);
    if (seen == *expected) return 1;
    *expected = seen;
    return 0;
}
#define bb_atomic_load_relaxed(p) bb_atomic_load_(p)
#define bb_atomic_load_acquire(p) bb_atomic_load_(p)
#define bb_atomic_load_seq_cst(p) bb_atomic_load_(p)
#define bb_atomic_add_fetch_relaxed(p, d) (_InterlockedExchangeAdd64((volatile long long *)(p), (d)) + (d))
#define bb_atomic_add_fetch_seq_cst(p, d) (_InterlockedExchangeAdd64((volatile long long *)(p), (d)) + (d))
#define bb_atomic_sub_fetch_seq_cst(p, d) (_InterlockedExchangeAdd64((volatile long long *)(p), -(d)) - (d))
#if defined(_M_X64) || defined(_M_IX86) || defined(__x86_64__)
#define bb_atomic_store_release(p, v) \
    do { _ReadWriteBarrier(); *(volatile long long *)(p) = (v); _ReadWriteBarrier(); } while (0)
#else
#define bb_atomic_store_release(p, v) ((void)_InterlockedExchange64((volatile long long *)(p), (v)))
#endif
#define bb_atomic_store_seq_cst(p, v) ((void)_InterlockedExchange64((volatile long long *)(p), (v)))
/* strong compare-exchange: on failure *expected is set to the value seen */
#define bb_atomic_cas_relaxed(p, e, v) bb_atomic_cas_((p), (e), (v))
#define bb_atomic_cas_acquire(p, e, v) bb_atomic_cas_((p), (e), (v))
#define bb_atomic_cas_seq_cst(p, e, v) bb_atomic_cas_((p), (e), (v))
#else
#define bb_atomic_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define bb_atomic_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define bb_atomic_load_seq_cst(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define bb_atomic_add_fetch_relaxed(p, d) __atomic_add_fetch((p), (d), __ATOMIC_RELAXED)
#define bb_atomic_add_fetch_seq_cst(p, d) __atomic_add_fetch((p), (d), __ATOMIC_SEQ_CST)
#define bb_atomic_sub_fetch_seq_cst(p, d) __atomic_sub_fetch((p), (d), __ATOMIC_SEQ_CST)
#define bb_atomic_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define bb_atomic_store_seq_cst(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define bb_atomic_cas_relaxed(p, e, v) \
    __atomic_compare_exchange_n((p), (e), (v), 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)
#define bb_atomic_cas_acquire(p, e, v) \
    __atomic_compare_exchange_n((p), (e), (v), 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)
#define bb_atomic_cas_seq_cst(p, e, v) \
    __atomic_compare_exchange_n((p), (e), (v), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
#endif

/* ---------------------------------------------------------------------------- bit scans */
#if defined(_MSC_VER)
/* count of leading zero bits of a nonzero 64-bit value */
BB_FORCEINLINE int bb_clzll(unsigned long long v) {
    unsigned long i;
    _BitScanReverse64(&i, v);
    return 63 - (int)i;
}
/* count of trailing zero bits of a nonzero 32-bit value */
BB_FORCEINLINE int bb_ctz(unsigned v) {
    unsigned long i;
    _BitScanForward(&i, v);
    return (int)i;
}
#else
#define bb_clzll(v) __builtin_clzll(v)
#define bb_ctz(v) __builtin_ctz(v)
#endif

/* ---------------------------------------------------------------------------- SIMD dispatch */
/* BB_SSE2: SSE2 intrinsics may be used unconditionally (every x86-64; MSVC defines no __SSE2__). */
#if !defined(BUSBAR_NO_SIMD) && (defined(__SSE2__) || defined(_M_X64) || \
                                 (defined(_M_IX86_FP) && _M_IX86_FP >= 2))
#define BB_SSE2 1
#endif
/* BB_SSSE3_DISPATCH: an SSSE3 function may be compiled beside the baseline code and chosen at run
   time. GCC and Clang need the function marked for that target; MSVC compiles any intrinsic
   without a flag. */
#if !defined(BUSBAR_NO_SIMD) && defined(_MSC_VER) && (defined(_M_X64) || defined(__x86_64__))
#define BB_SSSE3_DISPATCH 1
#define BB_TARGET_SSSE3
BB_FORCEINLINE int bb_cpu_has_ssse3(void) {
    int info[4];
    __cpuid(info, 1);
    return (info[2] >> 9) & 1;
}
#elif !defined(BUSBAR_NO_SIMD) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BB_SSSE3_DISPATCH 1
#define BB_TARGET_SSSE3 __attribute__((target("ssse3"), unused))
#define bb_cpu_has_ssse3() __builtin_cpu_supports("ssse3")
#endif

/* ---------------------------------------------------------------------------- floating point */
/* BB_NO_FP_CONTRACT before a function: no fused multiply-add in it (a result that must equal
   Python's bit for bit). GCC takes the function attribute; MSVC the pragma (file scope, so it holds
   to the end of the file: x86-64 MSVC emits no FMA without /arch:AVX2 anyway). Clang ignores both:
   BB_NO_FP_CONTRACT_BODY, first in the function's body, turns it off there. */
#if defined(__clang__)
#define BB_NO_FP_CONTRACT
#define BB_NO_FP_CONTRACT_BODY _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define BB_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#define BB_NO_FP_CONTRACT_BODY
#elif defined(_MSC_VER)
#define BB_NO_FP_CONTRACT __pragma(fp_contract(off))
#define BB_NO_FP_CONTRACT_BODY
#else
#define BB_NO_FP_CONTRACT
#define BB_NO_FP_CONTRACT_BODY
#endif

/* ---------------------------------------------------------------------------- clocks */
/* bb_clock_gettime(clock, struct timespec *): clock_gettime. BB_CLOCK_MONOTONIC is the clock of
   time.perf_counter, BB_CLOCK_PY_MONOTONIC that of time.monotonic, BB_CLOCK_REALTIME that of
   time.time. The first two differ on Windows only: before Python 3.13 its time.monotonic is
   GetTickCount64 (milliseconds since boot, another origin than QueryPerformanceCounter's). */
#if defined(_WIN32)
#define BB_CLOCK_REALTIME 0
#define BB_CLOCK_MONOTONIC 1
#if defined(PY_VERSION_HEX) && PY_VERSION_HEX < 0x030D0000
#define BB_CLOCK_PY_MONOTONIC 2
#else
#define BB_CLOCK_PY_MONOTONIC BB_CLOCK_MONOTONIC
#endif
static inline int bb_clock_gettime(int clk, struct timespec *ts) {
    if (clk == 2) {
        ULONGLONG ms = GetTickCount64();
        ts->tv_sec = (time_t)(ms / 1000);
        ts->tv_nsec = (long)(ms % 1000) * 1000000L;
    } else if (clk == BB_CLOCK_MONOTONIC) {
        static LONGLONG freq = 0;
        LARGE_INTEGER c;
        LONGLONG ns;
        if (freq == 0) {
            LARGE_INTEGER f;
            QueryPerformanceFrequency(&f);  /* fixed at boot; never fails since Windows XP */
            freq = f.QuadPart;
        }
        QueryPerformanceCounter(&c);
        /* whole seconds and the remainder apart: c * 1e9 overflows after ~106 days at 10 MHz */
        ts->tv_sec = (time_t)(c.QuadPart / freq);
        ns = (c.QuadPart % freq) * 1000000000LL / freq;
        ts->tv_nsec = (long)ns;
    } else {
        FILETIME ft;
        ULONGLONG t;
        GetSystemTimePreciseAsFileTime(&ft);
        /* 100 ns ticks since 1601-01-01; 11644473600 s to 1970-01-01 */
        t = ((ULONGLONG)ft.dwHighDateTime << 32 | ft.dwLowDateTime) - 116444736000000000ULL;
        ts->tv_sec = (time_t)(t / 10000000ULL);
        ts->tv_nsec = (long)(t % 10000000ULL) * 100;
    }
    return 0;
}
static inline struct tm *bb_gmtime_r(const time_t *t, struct tm *out) {
    return gmtime_s(out, t) == 0 ? out : NULL;
}
#elif defined(__APPLE__)
/* CPython reads mach_absolute_time there, which stops while the machine sleeps: CLOCK_UPTIME_RAW
   (macOS's CLOCK_MONOTONIC goes on counting through sleep) */
#define BB_CLOCK_REALTIME CLOCK_REALTIME
#define BB_CLOCK_MONOTONIC CLOCK_UPTIME_RAW
#define BB_CLOCK_PY_MONOTONIC CLOCK_UPTIME_RAW
#define bb_clock_gettime(clk, ts) clock_gettime((clk), (ts))
#define bb_gmtime_r(t, out) gmtime_r((t), (out))
#else
#define BB_CLOCK_REALTIME CLOCK_REALTIME
#define BB_CLOCK_MONOTONIC CLOCK_MONOTONIC
#define BB_CLOCK_PY_MONOTONIC CLOCK_MONOTONIC
#define bb_clock_gettime(clk, ts) clock_gettime((clk), (ts))
#define bb_gmtime_r(t, out) gmtime_r((t), (out))
#endif

/* ---------------------------------------------------------------------------- shared libraries */
/* bb_dlopen(name, flags): a library already in the process (or loaded by name); NULL: the
   process's own symbols. bb_dlsym: a function of it, or NULL. On Windows the flags are ignored and
   the handle is never released (as the POSIX callers never dlclose). */
#if defined(_WIN32)
#define BB_RTLD_NOW 0
static inline void *bb_dlopen(const char *name, int flags) {
    HMODULE h;
    (void)flags;
    if (name == NULL) return (void *)GetModuleHandleA(NULL);
    h = GetModuleHandleA(name);     /* loaded already (by _hashlib): no second reference */
    /* a bare name is only looked for among the loaded modules (never a DLL of that name from
       elsewhere); a path is loaded, its own dependencies looked for beside it */
    if (h == NULL && (strchr(name, '\\') != NULL || strchr(name, '/') != NULL))
        h = LoadLibraryExA(name, NULL, LOAD_WITH_ALTERED_SEARCH_PATH);
    return (void *)h;
}
static inline void *bb_dlsym(void *h, const char *name) {
    return (void *)GetProcAddress((HMODULE)h, name);
}
#else
#include <dlfcn.h>
#define BB_RTLD_NOW RTLD_NOW
#define bb_dlopen(name, flags) dlopen((name), (flags))
#define bb_dlsym(h, name) dlsym((h), (name))
#endif

/* ---------------------------------------------------------------------------- processes */
/* bb_pid_dead(pid): the process is known to be gone (a lock holder that died). */
#if defined(_WIN32)
static inline int bb_pid_dead(long long pid) {
    HANDLE h;
    DWORD code = 0;
    if (pid <= 0) return 0;
    h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, (DWORD)pid);
    if (h == NULL) return GetLastError() == ERROR_INVALID_PARAMETER;   /* no such process */
    if (!GetExitCodeProcess(h, &code)) code = STILL_ACTIVE;
    CloseHandle(h);
    return code != STILL_ACTIVE;
}
static inline void bb_sched_yield(void) { SwitchToThread(); }
#else
#include <sched.h>
#include <signal.h>
#include <errno.h>
#include <sys/types.h>
static inline int bb_pid_dead(long long pid) {
    return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}
static inline void bb_sched_yield(void) { sched_yield(); }
#endif

/* ---------------------------------------------------------------------------- bytes */
/* bb_memmem: the first `needle` in `hay`, or NULL (glibc's and the BSDs' memmem). */
#if defined(_WIN32)
static inline void *bb_memmem(const void *hay, size_t hlen, const void *needle, size_t nlen) {
    const unsigned char *h = (const unsigned char *)hay, *n = (const unsigned char *)needle;
    size_t i;
    if (nlen == 0) return (void *)h;
    if (hlen < nlen) return NULL;
    for (i = 0; i + nlen <= hlen; i++) {
        const unsigned char *q = (const unsigned char *)memchr(h + i, n[0], hlen - nlen + 1 - i);
        if (q == NULL) return NULL;
        i = (size_t)(q - h);
        if (memcmp(q, n, nlen) == 0) return (void *)q;
    }
    return NULL;
}
#else
#define bb_memmem(h, hl, n, nl) memmem((h), (hl), (n), (nl))
#endif

#endif
