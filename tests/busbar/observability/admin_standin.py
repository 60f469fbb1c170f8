"""A gateway process with the observability routes on a stand-in admin listener (until the
control issue's admin listener lands): `python -m tests.busbar.observability.admin_standin CONFIG
ADMIN_PORT`. Same code paths as `busbar serve`, plus `mount.serve_routes` on the gateway's loop."""
import sys

from busbar import config as cfgmod
from busbar.observability import ADMIN_ROUTES
from busbar.observability.mount import serve_routes
from busbar.server.gateway import serve


def main():
    cfg = cfgmod.load(sys.argv[1])
    port = int(sys.argv[2])

    def ready(gw):
        gw.loop.create_task(serve_routes(gw, "127.0.0.1", port, ADMIN_ROUTES))

    return serve(cfg, 1, on_ready=ready)


if __name__ == "__main__":
    sys.exit(main())
