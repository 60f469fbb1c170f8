"""The processes a benchmark run starts, and what /proc says about them.

CPU is utime+stime from /proc/<pid>/stat (clock ticks, summed over a process and its descendants,
so a gateway that forks workers is counted whole); RSS is VmRSS from /proc/<pid>/status, summed the
same way (pages shared by a parent and its forked workers counted once per process); PSS is Pss from
/proc/<pid>/smaps_rollup (each shared page divided among the processes mapping it), summed the same
way: the honest total of a process tree. Every process started here is remembered and stopped by its own pid at the end.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return data[data.rindex(b")") + 2:].split()


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process (all its threads), in clock ticks; 0 when it is gone."""
    try:
        f = _stat_fields(pid)
    except (OSError, ValueError):
        return 0
    return int(f[11]) + int(f[12])


def cpu_ns(pid: int) -> int:
    """On-CPU time of every live thread of a process, in ns (schedstat's sum_exec_runtime): finer
    than clock ticks, for measurements over few requests."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_kib(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def smaps_rollup(pid: int) -> dict:
    """The kB fields of /proc/<pid>/smaps_rollup (Rss, Pss, Pss_Anon, ...); {} when it is gone."""
    out = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid, "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == b"kB":
                    out[parts[0].rstrip(b":").decode()] = int(parts[1])
    except (OSError, ValueError):
        return {}
    return out


def pss_kib(pid: int) -> int:
    return smaps_rollup(pid).get("Pss", 0)


def start_time(pid: int) -> int:
    """The process's start time (clock ticks after boot): with the pid, identifies it for good."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, ValueError, IndexError):
        return -1


def descendants(pid: int) -> list:
    """pid and every live descendant of it."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(name))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def insecure_tls():
    """A client context for the bench's own self-signed certificate (--tls): no verification."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def wait_http(port: int, proc: subprocess.Popen, path: str, timeout: float,
              tls: bool = False) -> str | None:
    """None once GET <path> on 127.0.0.1:<port> answers 200, else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited with code %s during startup" % proc.returncode
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
                s = insecure_tls().wrap_socket(raw) if tls else raw
                s.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                          % path.encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return None
        except OSError:
            pass
        time.sleep(0.1)
    return "did not answer GET %s within %.0f s" % (path, timeout)


class Started:
    """A process this run started: its Popen, its log file, its pid tree."""

    def __init__(self, name, proc, log_path):
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.pids = [proc.pid]
        self.identities = set()     # (pid, start time) of every process seen in the tree

    def refresh(self):
        self.pids = descendants(self.proc.pid) if self.proc.poll() is None else []
        self.identities.update((p, start_time(p)) for p in self.pids)

    def cpu_ticks(self) -> int:
        return sum(cpu_ticks(p) for p in self.pids)

    def cpu_ns(self) -> int:
        return sum(cpu_ns(p) for p in self.pids)

    def rss_kib(self) -> int:
        return sum(rss_kib(p) for p in self.pids)

    def pss_kib(self) -> int:
        return sum(pss_kib(p) for p in self.pids)

    def rollup_kib(self) -> dict:
        """smaps_rollup's fields summed over the tree (Pss, Pss_Anon, Pss_File, Rss, ...)."""
        out = {}
        for p in self.pids:
            for k, v in smaps_rollup(p).items():
                out[k] = out.get(k, 0) + v
        return out

    def settle(self, quiet=0.1, bound=5.0):
        """Waits until the process tree stops using CPU (a gateway still working off requests a
        finished load left in flight), so that work does not land in the next run's window."""
        deadline = time.monotonic() + bound
        last = self.cpu_ns()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            now = self.cpu_ns()
            if now - last < quiet * 1e9 * 0.02:
                return
            last = now

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n=6) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-n:])


def wait_idle(started_list, window=0.005, bound=0.5):
    """Waits until every process tree in started_list used under 5 % of a core over `window`
    seconds (bounded by `bound`)."""
    deadline = time.monotonic() + bound
    last = sum(s.cpu_ns() for s in started_list)
    while time.monotonic() < deadline:
        time.sleep(window)
        now = sum(s.cpu_ns() for s in started_list)
        if now - last < window * 1e9 * 0.05:
            return
        last = now


class Processes:
    """Starts processes pinned to a core, and stops every one of them (by pid) at the end."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.started = []
        self.history = []           # every process ever started, for its log after the run

    def start(self, name, argv, core, env, cwd):
        log_path = os.path.join(self.log_dir, name + ".log")
        log = open(log_path, "wb")
        # taskset execs the command, so the Popen pid is the process itself; children inherit the
        # affinity. A new session keeps a terminal's Ctrl-C away from them: run.py stops them itself.
        proc = subprocess.Popen(["taskset", "-c", str(core)] + list(argv), cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        s = Started(name, proc, log_path)
        self.started.append(s)
        self.history.append(s)
        return s

    def stop(self, s, timeout=10.0):
        """Stops one started process (SIGTERM, then SIGKILL after `timeout`) and the descendants
        it left behind, each by its pid."""
        s.refresh()
        if s.proc.poll() is None:
            try:
                s.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            s.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(5)
        _kill_leftovers(s)
        if s in self.started:
            self.started.remove(s)

    def stop_all(self):
        for s in self.started:
            s.refresh()
        for s in reversed(self.started):
            if s.proc.poll() is None:
                try:
                    s.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for s in self.started:
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(5)
            _kill_leftovers(s)
        self.started = []


def _kill_leftovers(s):
    """Descendants that outlived their parent (workers a server forked) are ended too, each by its
    pid once its start time shows it is still the same process."""
    for pid, started in s.identities:
        if pid != s.proc.pid and started >= 0 and start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class RssSampler(threading.Thread):
    """Samples the RSS of every watched process every `period` seconds, with timestamps."""

    def __init__(self, period=0.1):
        super().__init__(daemon=True)
        self.period = period
        self.watched = {}
        self.samples = []           # (monotonic time, name, KiB)
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def watch(self, name, started: Started):
        with self._lock:
            self.watched[name] = started

    def run(self):
        while not self._halt.wait(self.period):
            now = time.monotonic()
            with self._lock:
                items = list(self.watched.items())
            for name, s in items:
                self.samples.append((now, name, s.rss_kib()))

    def stop(self):
        self._halt.set()
        self.join(2)

    def peak(self, name, t0, t1) -> int:
        vals = [k for t, n, k in self.samples if n == name and t0 <= t <= t1]
        return max(vals) if vals else 0

    def at(self, name, t) -> int:
        """The first sample of `name` taken at or after t (0 if none yet)."""
        for ts, n, k in self.samples:
            if n == name and ts >= t:
                return k
        return 0


def git_head():
    """The repository's short HEAD, "+dirty" when the tree has changes (the results' header)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        # the worktree's .venv symlink to the shared venv is not a change to the tree
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", ".",
                                ":(exclude).venv"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (head or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def take_responses(buf: bytes):
    """The whole Content-Length-framed HTTP/1.1 responses at the front of `buf` (the bench
    clients' framing): ([(head, body), ...], the bytes left over)."""
    out = []
    while True:
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            break
        head = buf[:i]
        m = _CONTENT_LENGTH.search(head)
        n = int(m.group(1)) if m else 0
        if len(buf) < i + 4 + n:
            break
        out.append((head, buf[i + 4:i + 4 + n]))
        buf = buf[i + 4 + n:]
    return out, buf
