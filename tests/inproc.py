"""A gateway in the test's own process: for a test that reads the gateway's own objects (its hooks'
records, its body budget, its connections) while it talks to it over real sockets. Every other
test runs `busbar serve` in a process (tests/conftest.py `start_gateway`).

    with InprocGateway(config_text, setup=lambda gw: gw.finish_hooks.append(records.append)) as g:
        ... g.port, g.gw ...

The gateway runs on its own thread with its own uvloop loop, bound to a free loopback port (which
replaces `{port}` in a config text; a Config object is served as it is, on that port);
`setup(gw)` runs in that thread before it serves, and `run(coro)` runs a coroutine there. The
`inproc_gateway` fixture (tests/conftest.py) makes them for one test and stops them after it.
"""
from __future__ import annotations

import asyncio
import threading

import uvloop

from busbar import config as cfgmod
from busbar.server.gateway import Gateway
from busbar.server.listen import bind
from tests.conftest import env as base_env
from tests.conftest import free_port


class InprocGateway:
    def __init__(self, config, env=None, setup=None, drain=False):
        """`config`: a config text or a Config; `env`: a text's environment (default:
        tests/conftest.py `env()`, where MOCK_KEY and MOCK_AWS are the mock's keys); `drain`:
        Gateway.drain() when stopped (it waits for requests in flight, up to
        limits.drain_timeout_secs, and stops the credential refreshers)."""
        self.port = port = free_port()
        if isinstance(config, str):
            e = base_env() if env is None else env
            config = cfgmod.load(text=config.replace("{port}", str(port)), env=e)
        self.config = config
        self.url = "http://127.0.0.1:%d" % port
        self.loop = loop = uvloop.new_event_loop()
        self.gw = None
        self._drain = drain
        self._error = None
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(loop)
            try:
                gw = self.gw = Gateway(self.config, loop)
                if setup is not None:
                    setup(gw)
                loop.run_until_complete(gw.start(bind("127.0.0.1", port, False)))
            except BaseException as exc:    # said in the test's thread, not lost in this one
                self._error = exc
                ready.set()
                return
            ready.set()
            loop.run_forever()
            if self._drain:
                loop.run_until_complete(gw.drain())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the in-process gateway did not start in 10 s")
        if self._error is not None:
            raise self._error

    def run(self, coro, timeout=30):
        """Runs `coro` on the gateway's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
