# cython: language_level=3
"""The request path's clock: `now_ns()` is time.perf_counter_ns read in C, `monotonic()`
time.monotonic.

CPython's perf_counter_ns and monotonic are clock_gettime(CLOCK_MONOTONIC) on Linux,
mach_absolute_time on macOS and QueryPerformanceCounter on Windows (monotonic: GetTickCount64
before Python 3.13); these read the same clocks (cbusbar/port.h), so they give the same numbers and
mix freely (a request's t0 read here, a span's start read by Python). Why in C:
the exchange reads the clock some ten times a request; each `time.perf_counter_ns()` from compiled
code is a module-global lookup, a call through Python and an int conversion inlined at the call
site (~100 instructions, ~8 cache lines of code each), where a cimported `now_ns()` is one C call
into code every call shares. On a small call that is code a request finds cold at concurrency 1
(README, Performance, "Issue #13: what stands in the way")."""

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec

# clock_gettime, or on Windows QueryPerformanceCounter (port.h)
cdef extern from "port.h" nogil:
    int BB_CLOCK_MONOTONIC
    int BB_CLOCK_PY_MONOTONIC
    int bb_clock_gettime(int clk, timespec *tp)


cpdef long long now_ns() noexcept:
    """Nanoseconds of CLOCK_MONOTONIC: what time.perf_counter_ns() answers on Linux."""
    cdef timespec ts
    bb_clock_gettime(BB_CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cpdef double monotonic() noexcept:
    """Seconds of CLOCK_MONOTONIC: what time.monotonic() answers on Linux."""
    cdef timespec ts
    bb_clock_gettime(BB_CLOCK_PY_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9
