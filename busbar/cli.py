"""busbar's command line: serve, validate, mock, --version."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from busbar import __version__


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal width read here: argparse imports shutil for it
    (and shutil bz2 and lzma), ~0.5 MiB a serving process kept for a --help it never prints."""

    def __init__(self, prog, **kw):
        if kw.get("width") is None:
            try:
                cols = int(os.environ["COLUMNS"])
            except (KeyError, ValueError):
                try:
                    cols = os.get_terminal_size(sys.stdout.fileno()).columns
                except (OSError, ValueError, AttributeError):
                    cols = 80
            kw["width"] = max(cols, 20) - 2     # as argparse does
        super().__init__(prog, **kw)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser with _Formatter; its subparsers are _Parsers too (add_subparsers makes
    parsers of the parent's class)."""

    def __init__(self, *args, formatter_class=_Formatter, **kw):
        super().__init__(*args, formatter_class=formatter_class, **kw)


# `busbar mock`'s default port: beside the gateway's 8080 and the admin listener's 8081, clear of
# both (and of 8000, vLLM's and many a dev server's).
MOCK_PORT = 8089


def _split_listen(value: str):
    """--listen HOST:PORT, checked as the config's `listen:` is (one line on error)."""
    from busbar.config import ConfigError
    from busbar.config.checks import Problems
    from busbar.config.loader import _listen
    out = Problems()
    host, port = _listen(value, out, "--listen")
    if out.errors:
        raise ConfigError(out.errors)
    return host, port


def cmd_serve(args) -> int:
    from busbar import config as cfgmod
    from busbar.supervisor import serve

    if args.demo:
        from busbar.demo import demo_yaml, free_port
        mock_port = free_port()
        cfg = cfgmod.load(text=demo_yaml(args.listen or "127.0.0.1:8080", mock_port))

        async def start_mock(loop):
            from busbar import mock
            await mock.start("127.0.0.1", mock_port)

        def ready(gw):
            from busbar.demo import banner
            print(banner(cfg), flush=True)

        return serve(cfg, args.workers or 1, on_ready=ready, extra=start_mock)
    cfg = cfgmod.load(args.config)
    for line in cfg.warnings:
        logging.getLogger("busbar").warning("%s", line)
    if args.listen:
        import dataclasses
        host, port = _split_listen(args.listen)
        cfg = dataclasses.replace(cfg, listen_host=host, listen_port=port)

    def ready(gw):
        print("busbar %s listening on %s:%d (%d provider(s), %d model(s), %d pool(s))" % (
            __version__, cfg.listen_host, cfg.listen_port, len(cfg.providers), len(cfg.models),
            len(cfg.pools)), flush=True)

    return serve(cfg, args.workers, on_ready=ready,
                 path=cfg.source if cfg.source != "<embedded>" else None)


def cmd_validate(args) -> int:
    from busbar import config as cfgmod
    return cfgmod.validate_main(args.config, offline=args.offline)


def cmd_mock(args) -> int:
    from busbar import mock
    mock.main(args.host, args.port, require_auth=args.require_auth)
    return 0


def main(argv=None) -> int:
    p = _Parser(prog="busbar", description="An LLM gateway.")
    p.add_argument("--version", "-V", action="version", version="busbar " + __version__)
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", help="config file (default: $BUSBAR_CONFIG, else ./config.yaml)")
    s.add_argument("--listen", help="listen address HOST:PORT (overrides the config)")
    s.add_argument("--workers", type=int, help="worker processes (default: cores)")
    s.add_argument("--demo", action="store_true",
                   help="serve the embedded demo config on the built-in mock provider")
    s.set_defaults(func=cmd_serve)
    v = sub.add_parser("validate", help="check a config with no network; exit 0 valid, 1 invalid")
    v.add_argument("--config")
    v.add_argument("--offline", action="store_true",
                   help="lint without the environment: secret references and ${VAR} need not be set (CI)")
    v.set_defaults(func=cmd_validate)
    m = sub.add_parser(
        "mock", help="run the built-in mock provider alone (http://127.0.0.1:8089)",
        description="The built-in mock provider: all six wire protocols (OpenAI Chat, Responses, "
        "Anthropic, Gemini, Cohere v2, Bedrock Converse) on one port, deterministic answers "
        "('mock: <your text> w1 ... w8'), failure switches per request (header x-mock-status: 503, "
        "x-mock-delay-ms, ...; see busbar/mock/__init__.py). Point a provider at it with its "
        "protocol and base_url, e.g. in config.yaml: providers: {mock: {protocol: openai, "
        "base_url: \"http://127.0.0.1:8089\"}}; no api_key is needed unless --require-auth.")
    m.add_argument("--port", type=int, default=MOCK_PORT,
                   help="port to listen on (default: %(default)s)")
    m.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, loopback only)")
    m.add_argument("--require-auth", action="store_true",
                   help="refuse a request without its protocol's credential (Bearer, x-api-key, "
                   "x-goog-api-key or ?key=, SigV4) as the real provider does; any value is accepted")
    m.set_defaults(func=cmd_mock)
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 0
    logging.basicConfig(level=os.environ.get("BUSBAR_LOG", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except Exception as e:  # config errors and the like: one clear message, no traceback
        from busbar.config import ConfigError
        from busbar.server.listen import ListenError
        if isinstance(e, ListenError):
            print("error: %s" % e, file=sys.stderr)
            return 1
        if isinstance(e, ConfigError):
            for line in e.problems:
                print("error: " + line if not line.startswith(("error:", "warning:")) else line,
                      file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
