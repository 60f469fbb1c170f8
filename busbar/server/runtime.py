"""How the gateway's processes run on this platform: which event loop, whether workers are forked,
how they share the listening port, how signals reach the loop.

| platform | loop    | workers                  | listening port                                |
|----------|---------|--------------------------|-----------------------------------------------|
| Linux    | uvloop  | forked, one per core     | each worker binds it (SO_REUSEPORT: the kernel balances connections) |
| macOS    | uvloop  | forked, one per core     | bound once, inherited by every worker (accept() spreads them) |
| Windows  | asyncio | one process              | bound once                                    |

macOS has SO_REUSEPORT but does not balance with it (one socket of the group gets the
connections), hence the inherited socket. Windows has no uvloop, no fork, no SO_REUSEPORT and no
SIGHUP: busbar runs one process on the standard library's loop there, stops on Ctrl+C /
Ctrl+Break, and reloads through the admin API (POST /api/v1/admin/config/reload).

Both other forms are selectable anywhere they can run, so that the paths Linux CI does not run
natively cannot rot (`make test` runs the SDK suites on BUSBAR_LOOP=asyncio):
  BUSBAR_LOOP=asyncio       the standard library's loop, one process, signals through
                            signal.signal (the Windows path); `uvloop` is the default where
                            uvloop is installed
  BUSBAR_LISTENER=inherit   forked workers accept on the one socket bound before the fork (the
                            macOS path); `reuseport` (Linux's default) only where it balances
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass

LOOP_ENV = "BUSBAR_LOOP"
LISTENER_ENV = "BUSBAR_LISTENER"
LOOPS = ("uvloop", "asyncio")
LISTENERS = ("reuseport", "inherit")


class RuntimeChoiceError(Exception):
    """BUSBAR_LOOP / BUSBAR_LISTENER name something this platform cannot run; str() is the one line
    the CLI prints after 'error: '."""


@dataclass(frozen=True, slots=True)
class Runtime:
    loop: str           # "uvloop" | "asyncio"
    fork: bool          # workers beyond the first are forked processes
    listener: str       # "reuseport" (each worker binds) | "inherit" (bound once before the fork)

    def new_event_loop(self):
        if self.loop == "uvloop":
            import uvloop
            return uvloop.new_event_loop()
        return asyncio.new_event_loop()


def _have_uvloop() -> bool:
    if sys.platform == "win32":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def choose(env=os.environ, platform: str = sys.platform) -> Runtime:
    """This process's runtime: the platform's defaults (the table above), as BUSBAR_LOOP and
    BUSBAR_LISTENER adjust them. Raises RuntimeChoiceError for a value this platform cannot run."""
    loop = env.get(LOOP_ENV) or ("uvloop" if _have_uvloop() else "asyncio")
    if loop not in LOOPS:
        raise RuntimeChoiceError("%s=%s: expected uvloop or asyncio" % (LOOP_ENV, loop))
    if loop == "uvloop" and not _have_uvloop():
        raise RuntimeChoiceError("%s=uvloop: uvloop is not installed here (it does not exist for "
                                 "Windows); unset it for the standard library's loop" % LOOP_ENV)
    # The standard library's loop is the Windows path, one process there: the same here.
    fork = loop == "uvloop" and hasattr(os, "fork")
    listener = env.get(LISTENER_ENV) or ("reuseport" if platform.startswith("linux") else "inherit")
    if listener not in LISTENERS:
        raise RuntimeChoiceError("%s=%s: expected reuseport or inherit" % (LISTENER_ENV, listener))
    if listener == "reuseport" and not platform.startswith("linux"):
        raise RuntimeChoiceError("%s=reuseport: SO_REUSEPORT balances connections across "
                                 "processes on Linux only; use inherit" % LISTENER_ENV)
    return Runtime(loop, fork, listener)


_current: Runtime | None = None


def current() -> Runtime:
    """The runtime this process chose (busbar.supervisor.serve sets it), else the defaults'."""
    global _current
    if _current is None:
        _current = choose()
    return _current


def use(runtime: Runtime) -> None:
    global _current
    _current = runtime


def on_signals(loop, runtime: Runtime, signums, callback) -> None:
    """callback(signum) on the loop whenever one of `signums` arrives (names this platform lacks,
    e.g. SIGHUP on Windows, are skipped: pass getattr(signal, NAME, None)). uvloop: the loop's own
    signal handlers. The standard library's loop: Python's signal handlers, which hand the call to
    the loop (loop.add_signal_handler does not exist on Windows; it is not used on Linux either, so
    that this path is the one tested)."""
    for signum in signums:
        if signum is None:
            continue
        if runtime.loop == "uvloop":
            loop.add_signal_handler(signum, callback, signum)
        else:
            signal.signal(signum, lambda s, _frame: loop.call_soon_threadsafe(callback, s))


def stop_signals():
    """The signals that drain and stop busbar here: SIGTERM and SIGINT, and Windows' Ctrl+Break."""
    return (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGBREAK", None))
