"""The executable's figures: size, compressed image size, time to ready, memory idle (one worker,
then two), under load and after it. Run after packaging/build.sh; the load part needs wrk (Debian:
`apt-get install wrk`; --load-secs 0 skips it).

    .venv/bin/python packaging/measure.py [--runs 15] [--load-secs 20] [--settle-secs 30]

Memory is summed over the executable's whole process tree: the static launcher (staticx), the
one-file launcher (PyInstaller) and the Python processes that serve (worker 0 and the workers it
forks). PSS (proportional set size: each page divided by the processes mapping it) is the figure
that adds up across workers; RSS counts a page shared by two workers twice. Everything talks
over loopback only.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "dist", "busbar")
TICK = os.sysconf("SC_CLK_TCK")
# The environment packaging/config.default.yaml needs (`docker run -e ANTHROPIC_KEY -e
# BUSBAR_ADMIN_TOKEN`), with the admin listener on a port of the kernel's choosing.
DEFAULT_ENV = {"ANTHROPIC_KEY": "sk-ant-placeholder", "BUSBAR_ADMIN_TOKEN": "admin-placeholder",
               "BUSBAR_ADMIN_LISTEN": "127.0.0.1:0"}
SMALL_BODY = '{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid: int) -> list[int]:
    out = [pid]
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = f.read().split()
    except OSError:
        return out
    for k in kids:
        out += tree(int(k))
    return out


def rss_kib(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_secs(pid: int) -> float:
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except OSError:
        return 0.0


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return b" 200 " in c.recv(128)
    except OSError:
        return False


def start(argv, port, timeout=30.0, env=None):
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env or {}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not healthy(port):
        if p.poll() is not None or time.perf_counter() - t0 > timeout:
            raise SystemExit("%s did not become ready" % argv)
        time.sleep(0.001)
    return p, time.perf_counter() - t0


def stop(p) -> int:
    p.send_signal(signal.SIGTERM)
    return p.wait(timeout=30)


def write_config(folder: str, port: int, mock_port: int | None, workers: int = 1) -> str:
    path = os.path.join(folder, "config-%d.yaml" % port)
    if mock_port is None:
        # The image's default config, with providers.yaml beside it (DEFAULT_ENV resolves its two
        # references; nothing is sent upstream).
        shutil.copy(os.path.join(ROOT, "busbar", "data", "providers.yaml"), folder)
        with open(os.path.join(ROOT, "packaging", "config.default.yaml")) as f:
            text = f.read().replace('"0.0.0.0:8080"', '"127.0.0.1:%d"' % port)
    else:
        text = ('listen: "127.0.0.1:%d"\nproviders:\n  mock: {protocol: openai, base_url: '
                '"http://127.0.0.1:%d"}\nmodels:\n  gpt-4o-mini: {provider: mock}\n'
                "advanced: {worker_threads: %d}\n" % (port, mock_port, workers))
    with open(path, "w") as f:
        f.write(text)
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=EXE)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--load-secs", type=int, default=20)
    ap.add_argument("--settle-secs", type=int, default=30)
    # How long a started gateway idles before its memory is read: its idle trim runs every 5 s
    # (busbar/supervisor.py, TRIM_SECS).
    ap.add_argument("--idle-secs", type=float, default=6.0)
    ap.add_argument("--connections", type=int, default=256)
    args = ap.parse_args()
    exe = args.exe

    sys.path.insert(0, os.path.join(ROOT, "packaging"))
    import oci_image
    image = oci_image.build(exe)
    compressed = sum(len(b) for b in image["blobs"].values())
    print("executable: %d bytes (%.2f MiB)" % (os.path.getsize(exe), os.path.getsize(exe) / 2**20))
    print("image: %d bytes compressed (%.2f MiB): layer %d, config + manifest %d" % (
        compressed, compressed / 2**20, len(image["blobs"][image["layer"]]),
        compressed - len(image["blobs"][image["layer"]])))

    with tempfile.TemporaryDirectory() as tmp:
        walls, cpus = [], []
        for _ in range(args.runs):
            port = free_port()
            p, wall = start([exe, "serve", "--config", write_config(tmp, port, None)], port,
                            env=DEFAULT_ENV)
            cpus.append(sum(cpu_secs(q) for q in tree(p.pid)))
            walls.append(wall)
            rc = stop(p)
        print("ready (exec to /healthz 200, default config), %d runs: median %.0f ms, min %.0f, "
              "max %.0f; CPU of the processes at ready: median %.0f ms; SIGTERM exit %d" % (
                  args.runs, statistics.median(walls) * 1000, min(walls) * 1000,
                  max(walls) * 1000, statistics.median(cpus) * 1000, rc))

        mock_port = free_port()
        mock, _ = start([exe, "mock", "--port", str(mock_port)], mock_port)
        for workers in (1, 2):
            port = free_port()
            gw, _ = start([exe, "serve", "--config", write_config(tmp, port, mock_port, workers)], port)
            time.sleep(args.idle_secs)
            pids = tree(gw.pid)
            pss, rss = [pss_kib(q) for q in pids], [rss_kib(q) for q in pids]
            print("idle, %d worker%s: PSS %d KiB (%.1f MiB) = %s KiB (launcher, one-file launcher, "
                  "worker 0%s); RSS %d KiB (%.1f MiB)" % (
                      workers, "s" if workers > 1 else "", sum(pss), sum(pss) / 1024,
                      " + ".join(map(str, pss)), ", forked worker" * (workers - 1), sum(rss), sum(rss) / 1024))
            if workers == 2:
                break
            stop(gw)
        try:
            wrk = shutil.which("wrk")
            if args.load_secs <= 0:
                return 0
            if wrk is None:
                print("load: skipped (no wrk; apt-get install wrk)")
                return 0
            script = os.path.join(tmp, "post.lua")
            with open(script, "w") as f:
                f.write('wrk.method = "POST"\nwrk.body = \'%s\'\n'
                        'wrk.headers["Content-Type"] = "application/json"\n' % SMALL_BODY)
            load = subprocess.Popen([wrk, "-t2", "-c%d" % args.connections, "-d%ds" % args.load_secs,
                                     "-s", script, "http://127.0.0.1:%d/v1/chat/completions" % port],
                                    stdout=subprocess.PIPE, text=True)
            peak = 0
            while load.poll() is None:
                peak = max(peak, sum(rss_kib(q) for q in tree(gw.pid)))
                time.sleep(0.25)
            out = load.stdout.read()
            rps = [line for line in out.splitlines() if "Requests/sec" in line or "Non-2xx" in line
                   or "Socket errors" in line]
            print("under load (wrk -t2 -c%d -d%ds, small OpenAI chat call relayed to the mock): "
                  "peak RSS %d KiB (%.1f MiB); %s" % (args.connections, args.load_secs, peak,
                                                      peak / 1024, "; ".join(s.strip() for s in rps)))
            time.sleep(args.settle_secs)
            after = sum(rss_kib(q) for q in tree(gw.pid))
            print("%d s after the load: RSS %d KiB (%.1f MiB)" % (args.settle_secs, after, after / 1024))
        finally:
            print("SIGTERM exit codes: gateway %d, mock %d" % (stop(gw), stop(mock)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
