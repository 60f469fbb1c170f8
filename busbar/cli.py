"""busbar's command line.

The Rust gateway's interface (busbar is its drop-in replacement): `busbar` alone serves
$BUSBAR_CONFIG (default /etc/busbar/config.yaml), and one flag picks anything else: --validate,
--migrate-config FILE, --generate-signing-key, --print-metadata-blocklist, --list-plugins,
--version, --help (--safe-mode, and busbar's --config PATH, go with the ones that read the config).
An argument it does not know is a usage error (exit 2), never a silent start.

busbar's own subcommands stay as conveniences: `busbar serve`, `busbar validate`, `busbar mock`.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from busbar import __version__

CONFIG_ENV = "BUSBAR_CONFIG"
# Where `busbar` alone and the Rust-style flags look without $BUSBAR_CONFIG or --config (the Rust
# gateway's default and the image's file). `busbar serve`/`validate` keep ./config.yaml.
DEFAULT_CONFIG_PATH = "/etc/busbar/config.yaml"


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

HELP = """\
busbar {version} — an LLM gateway

Usage:
  busbar [--config PATH] [--safe-mode]
        serve $BUSBAR_CONFIG (default: /etc/busbar/config.yaml); SIGTERM/SIGINT drain and stop
  busbar --validate [--config PATH] [--safe-mode] [--offline]
        check the config as a boot would (catalog, every rule, secrets resolved) and start
        nothing: no listener, no network, nothing written; exit 0 valid, 1 invalid. An unset
        ${{VAR}} is read as its bare name and listed (it is needed at runtime); --offline also
        leaves secret references unread (CI)
  busbar --migrate-config FILE
        print FILE converted to the current config grammar on stdout (what changed on stderr);
        writes nothing
  busbar --generate-signing-key
        print a new auth.signing_key on stdout: an ed25519 secret key (its 32-byte seed) as 64
        lowercase hex characters, the form auth.signing_key reads (or the 32 raw bytes); how to
        wire it goes to stderr, which never contains the key
  busbar --print-metadata-blocklist
        the cloud-metadata hosts and ranges the SSRF guard refuses, one a line: the built-in list,
        then the config's security.blocked_metadata_hosts
  busbar --list-plugins
        the inventory of plugins.dir (busbar loads no plugin code: its modules are built in)
  busbar -V, --version
  busbar -h, --help

  --config PATH   the config file (instead of $BUSBAR_CONFIG)
  --safe-mode     ignore the persisted config overlay (what the admin API applied): run on the
                  config file alone; the overlay file is left as it is

Conveniences:
  busbar serve [--config PATH] [--listen HOST:PORT] [--workers N] [--safe-mode] [--demo]
        as `busbar`, looking for ./config.yaml without --config or $BUSBAR_CONFIG; --demo serves
        the embedded demo config on the built-in mock (no API key needed)
  busbar validate [--config PATH] [--offline] [--safe-mode]
        as --validate, with ./config.yaml as the default and an unset ${{VAR}} an error
  busbar mock [--port N] [--host H] [--require-auth]
        run the built-in mock provider alone (http://127.0.0.1:8089)

Environment:
  BUSBAR_CONFIG     the config file (default: /etc/busbar/config.yaml)
  BUSBAR_PROVIDERS  the providers catalog (deprecated: set providers_file: in the config)
  BUSBAR_LOG        log level: error, warning, info (default) or debug
  RUST_LOG          the same, as the Rust gateway reads it (`debug`, or `busbar=debug,...`);
                    BUSBAR_LOG wins when both are set
  BUSBAR_LOOP       asyncio: one process on the standard library's event loop (how busbar runs
                    on Windows); default uvloop with worker processes where uvloop exists
  BUSBAR_LISTENER   inherit: worker processes accept on one socket bound before they fork (the
                    macOS way); default on Linux: reuseport, each worker binds with SO_REUSEPORT
"""


class _Usage(Exception):
    """A command line busbar does not accept: the message goes to stderr, exit 2."""


def _unrecognized(arg: str) -> _Usage:
    return _Usage("busbar: unrecognized argument '%s'. Try 'busbar --help'." % arg)


# The flags that choose what busbar does, and the options each accepts.
_MODES = {
    None: ("--config", "--safe-mode"),                  # serve
    "--validate": ("--config", "--safe-mode", "--offline"),
    "--migrate-config": (),
    "--generate-signing-key": (),
    "--print-metadata-blocklist": ("--config",),
    "--list-plugins": ("--config",),
    "--version": (),
    "-V": (),
    "--help": (),
    "-h": (),
}


def _parse_flags(args: list[str]):
    """(mode, options, operand) of a flag command line; the first flag that is not an option
    chooses the mode (`busbar --safe-mode --validate` is `busbar --validate --safe-mode`)."""
    mode = None
    operand = None
    opts: dict[str, object] = {}
    spelled: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                i += 1
                if i >= len(args):
                    raise _Usage("busbar: --config requires a path: busbar --config <config.yaml>")
                value = args[i]
            else:
                value = arg.split("=", 1)[1]
            if not value:
                raise _Usage("busbar: --config requires a path: busbar --config <config.yaml>")
            opts["--config"] = value
            spelled.setdefault("--config", arg)
        elif arg in ("--safe-mode", "--offline"):
            opts[arg] = True
            spelled.setdefault(arg, arg)
        elif mode is None and arg in _MODES:
            mode = arg
            if arg == "--migrate-config" and i + 1 < len(args):
                i += 1
                operand = args[i]
        else:
            raise _unrecognized(arg)
        i += 1
    for opt in opts:
        if opt not in _MODES[mode]:
            raise _unrecognized(spelled[opt])
    return mode, opts, operand


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("serve", "validate", "mock"):
        return _subcommand(args)
    try:
        mode, opts, operand = _parse_flags(args)
    except _Usage as e:
        print(e, file=sys.stderr)
        return 2
    if mode in ("--version", "-V"):
        print("busbar " + __version__)
        return 0
    if mode in ("--help", "-h"):
        sys.stdout.write(HELP.format(version=__version__))
        return 0
    if mode == "--generate-signing-key":
        return generate_signing_key()
    if mode == "--migrate-config":
        return migrate_config(operand)
    _setup_logging()
    path, given = _config_path(opts.get("--config"))
    if mode == "--print-metadata-blocklist":
        return print_metadata_blocklist(path)
    if mode == "--list-plugins":
        return list_plugins(path)
    if mode == "--validate":
        return _guard(validate, "[error] ", path, given, offline=bool(opts.get("--offline")),
                      safe_mode=bool(opts.get("--safe-mode")), rust=True)
    return _guard(serve_file, "[error] ", path, given, bool(opts.get("--safe-mode")))


# --- the config file ------------------------------------------------------------------------


def _config_path(flag: str | None) -> tuple[str, bool]:
    """(path, given): --config, else $BUSBAR_CONFIG, else /etc/busbar/config.yaml."""
    if flag:
        return flag, True
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH, False


def _where_looked(path: str) -> str:
    """No file where busbar looked: say where that was and how to point it (one line)."""
    where = os.path.abspath(path)
    if os.environ.get(CONFIG_ENV):
        looked = f"${CONFIG_ENV} names {where}, which does not exist"
    else:
        looked = f"no config file: ${CONFIG_ENV} is not set and there is no {where}"
    return (f"{looked}; point busbar at one with ${CONFIG_ENV}=PATH or --config PATH "
            f"(or try `busbar serve --demo`, which needs none)")


def _missing(path: str, given: bool) -> bool:
    return not given and not os.path.exists(path)


def _load(path, safe_mode: bool):
    """The validated Config of `path` (None: the loader's own default), the overlay left out
    under --safe-mode. Raises ConfigError."""
    from busbar.config.loader import ConfigError, build
    config, out = build(path, overlay=not safe_mode)
    if out.errors or config is None:
        raise ConfigError(out.errors, out.warnings)
    return config


class _LenientEnv(dict):
    """--validate's environment, as the Rust gateway's: an unset ${VAR} reads as its bare name
    and is listed in a closing note (boot still needs it); secret references are resolved from
    the real environment all the same."""

    def __init__(self, real):
        super().__init__(real)
        self.missing: set[str] = set()

    def interpolated(self, key):
        if key in self:
            return self[key]
        self.missing.add(key)
        return key


class _ShapeEnv(dict):
    """The environment for reading a config for what it says, not to run it
    (--print-metadata-blocklist, --list-plugins): ${VAR} as set, secret references unread."""

    offline = True


def _parsed(path: str):
    """The Config at `path` read for its content (see _ShapeEnv), or None when it does not
    load; never a secret read, never an error printed (the caller says what it skipped)."""
    from busbar.config.loader import build
    config, out = build(path, env=_ShapeEnv(os.environ), offline=True, overlay=False)
    return None if out.errors else config


# --- serve ----------------------------------------------------------------------------------


def serve_file(path: str, given: bool, safe_mode: bool) -> int:
    """`busbar [--config PATH] [--safe-mode]`."""
    from busbar.config.loader import ConfigError
    if _missing(path, given):
        raise ConfigError([_where_looked(path)])
    return _serve(_load(path, safe_mode), safe_mode)


def _serve(cfg, safe_mode: bool, listen: str | None = None, workers: int | None = None) -> int:
    from busbar.supervisor import serve
    log = logging.getLogger("busbar")
    for line in cfg.warnings:
        log.warning("%s", line)
    if safe_mode:
        log.warning("safe mode: the config overlay is not applied; serving %s alone (the overlay "
                    "file is left as it is; a config reload applies it again)", cfg.source)
    if listen:
        import dataclasses
        host, port = _split_listen(listen)
        cfg = dataclasses.replace(cfg, listen_host=host, listen_port=port)

    def ready(gw):
        print("busbar %s listening on %s:%d (%d provider(s), %d model(s), %d pool(s))" % (
            __version__, cfg.listen_host, cfg.listen_port, len(cfg.providers), len(cfg.models),
            len(cfg.pools)), flush=True)

    return serve(cfg, workers, on_ready=ready,
                 path=cfg.source if cfg.source != "<embedded>" else None)


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


# --- validate -------------------------------------------------------------------------------


def validate(path, given: bool, *, offline: bool = False, safe_mode: bool = False,
             rust: bool = False) -> int:
    """--validate (`rust`: the Rust gateway's output and default path, lenient ${VAR}) and
    `busbar validate` (busbar's: ./config.yaml by default, every ${VAR} required). Exit 0 with
    "ok: config valid — ..." on stdout, or 1 with one line per problem on stderr; warnings go to
    stderr either way. Nothing is started, written or fetched."""
    from busbar.config.loader import build
    from busbar.config.secrets import OfflineEnv
    error, warning = ("[error] ", "[warn] ") if rust else ("error: ", "warning: ")
    if rust and _missing(path, given):
        print(error + _where_looked(path), file=sys.stderr)
        return 1
    if offline:
        env = OfflineEnv(os.environ)
    elif rust:
        env = _LenientEnv(os.environ)
    else:
        env = os.environ
    config, out = build(path, env=env, offline=offline, overlay=not safe_mode)
    if offline:
        for name in sorted(env.missing):
            print(f"note: ${{{name}}} is not set (offline: checked with a placeholder)",
                  file=sys.stderr)
    for line in out.warnings:
        print(warning + line, file=sys.stderr)
    if out.errors or config is None:
        for line in out.errors:
            print(error + line, file=sys.stderr)
        return 1
    print(f"ok: config valid — {len(config.providers)} provider(s), "
          f"{len(config.models)} model(s), {len(config.pools)} pool(s)")
    if rust:
        print(f"  config:    {path}")
        plugins = (config.document or {}).get("plugins")
        if isinstance(plugins, dict) and plugins.get("enabled") is True:
            print("  plugins:   enabled, none loaded (busbar has no plugin loader; its modules "
                  "are built in)")
        else:
            print("  plugins:   disabled (plugins.enabled is false; no plugin will load)")
        unset = sorted(getattr(env, "missing", ())) if not offline else []
        if unset:
            print(f"  note: {len(unset)} env var(s) referenced but unset here — required at "
                  f"runtime: {', '.join(unset)}")
    return 0


# --- the other flags ------------------------------------------------------------------------

SIGNING_KEY_GUIDANCE = """\

# The line on stdout is a new ed25519 signing key for busbar-signed virtual keys: its 32-byte
# seed as 64 hex characters. It appears only there; this text never contains it.
#
# auth.signing_key is a secret reference (where the key lives), never the key itself:
#
#   busbar --generate-signing-key > /run/secrets/busbar-signing.key
#   auth:
#     signing_key: {file: /run/secrets/busbar-signing.key}
#
# or put the key (copied from stdout) in an environment variable and name that:
#
#   auth:
#     signing_key: {env: BUSBAR_SIGNING_KEY}
#
# Every node of a fleet needs the same key. Replacing it invalidates every virtual key signed
# with the old one."""


def generate_signing_key() -> int:
    """A fresh ed25519 signing key (a 32-byte seed from the OS's random source) as 64 lowercase
    hex characters on stdout, alone; how to wire it on stderr. Writes nothing."""
    try:
        seed = os.urandom(32)
    except (OSError, NotImplementedError) as e:
        print("busbar: could not generate a signing key: %s" % e, file=sys.stderr)
        return 1
    print(seed.hex(), flush=True)
    print(SIGNING_KEY_GUIDANCE, file=sys.stderr)
    return 0


def builtin_metadata_blocklist() -> list[str]:
    """The SSRF guard's built-in cloud-metadata denylist (busbar/config/urls.py), as an operator
    writes it: a single address without its /32 or /128."""
    from busbar.config.urls import DENIED_HOSTS, DENIED_NETWORKS
    nets = [str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)
            for n in DENIED_NETWORKS]
    return nets + sorted(DENIED_HOSTS)


def print_metadata_blocklist(path: str) -> int:
    """The built-in list, then the config's security.blocked_metadata_hosts when the config loads
    (a config that does not: a warning, and the built-in list alone). One entry a line, exit 0."""
    entries = builtin_metadata_blocklist()
    if os.path.exists(path):
        config = _parsed(path)
        if config is None:
            print(f"warning: config at {path} did not load; printing the built-in metadata "
                  "blocklist only (security.blocked_metadata_hosts skipped); `busbar --validate` "
                  "says why", file=sys.stderr)
        else:
            security = (config.document or {}).get("security")
            extra = security.get("blocked_metadata_hosts") if isinstance(security, dict) else None
            entries += [h for h in extra or () if isinstance(h, str)]
    sys.stdout.write("".join(e + "\n" for e in entries))
    return 0


def list_plugins(path: str) -> int:
    """The Rust gateway's manifest-only inventory of plugins.dir. busbar loads no plugin code (its
    stores, auth and secret modules are built in), so a tarball there is listed, never loaded."""
    plugins = None
    config = _parsed(path) if os.path.exists(path) else None
    if config is None:
        print(f"[warn] config at {path} not loaded; using the default plugins block",
              file=sys.stderr)
    else:
        plugins = (config.document or {}).get("plugins")
    plugins = plugins if isinstance(plugins, dict) else {}
    folder = plugins.get("dir") if isinstance(plugins.get("dir"), str) else "plugins"
    enabled = plugins.get("enabled") is True
    print(f"plugins dir: {folder} (plugins.enabled: {'true' if enabled else 'false'})")
    try:
        names = sorted(n for n in os.listdir(folder)
                       if n.endswith((".tar.gz", ".tgz")) and os.path.isfile(os.path.join(folder, n)))
    except OSError:
        names = []
    if not names:
        print("no plugin tarballs found")
        return 0
    row = "{:<34} {:<24} {:<12} {:<6} {:<9} {:<24} {}"
    print(row.format("FILE", "NAME", "ALIAS", "KIND", "VERSION", "SIGNATURE", "STATUS"))
    for name in names:
        print(row.format(name, "-", "-", "-", "-", "-",
                         "not loaded (busbar has no plugin loader; its modules are built in)"))
    return 0


def migrate_config(path: str | None) -> int:
    """--migrate-config FILE: busbar/config/migrate.py's main(path)."""
    if not path:
        print("busbar: --migrate-config requires a path: busbar --migrate-config "
              "<old-config.yaml>", file=sys.stderr)
        return 2
    from busbar.config import migrate
    return int(migrate.main(path) or 0)


# --- logging --------------------------------------------------------------------------------

_LEVEL_WORDS = {
    "error": "ERROR", "warn": "WARNING", "warning": "WARNING", "info": "INFO", "debug": "DEBUG",
    # busbar logs nothing below debug; tracing's numeric spellings: 1 = error ... 5 = trace
    "trace": "DEBUG", "1": "ERROR", "2": "WARNING", "3": "INFO", "4": "DEBUG", "5": "DEBUG",
}


def rust_log_level(value: str) -> str | None:
    """The level RUST_LOG gives busbar's logs: a bare level (`debug`), or the `busbar=<level>`
    directive of a filter list (`hyper=warn,busbar=debug`; it wins over a bare level there).
    None when it names none (the Rust gateway then logs at info)."""
    bare = own = None
    for directive in value.split(","):
        directive = directive.strip()
        if "=" in directive:
            target, _, level = directive.rpartition("=")
            if target.split("[", 1)[0].strip() == "busbar":
                own = _LEVEL_WORDS.get(level.strip().lower(), own)
        elif directive == "busbar":
            own = "DEBUG"           # a bare target: everything it logs
        elif directive.lower() in _LEVEL_WORDS:
            bare = _LEVEL_WORDS[directive.lower()]
    return own or bare


def log_level(environ) -> tuple[str | None, str | None]:
    """(the level the environment names, or None; a warning, or None): BUSBAR_LOG, else
    RUST_LOG. With neither, busbar logs at info."""
    own = (environ.get("BUSBAR_LOG") or "").strip()
    if own:
        level = _LEVEL_WORDS.get(own.lower())
        if level is None:
            return None, (f"BUSBAR_LOG={own!r} is not a log level (error, warning, info, debug); "
                          "ignoring it")
        return level, None
    return rust_log_level(environ.get("RUST_LOG") or ""), None


def _setup_logging() -> None:
    level, problem = log_level(os.environ)
    if level is not None:
        # The gateway's own loggers take their level from BUSBAR_LOG (busbar/observability): hand
        # it the level RUST_LOG (or a `warn`) named, spelled its way.
        os.environ["BUSBAR_LOG"] = level
    logging.basicConfig(level=level or "INFO", stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if problem:
        logging.getLogger("busbar").warning("%s", problem)


def _guard(fn, prefix: str, *args, **kw) -> int:
    """Runs a command; a config, listen or runtime error is its lines on stderr and exit 1, no
    traceback."""
    from busbar.config import ConfigError
    from busbar.server.listen import ListenError
    from busbar.server.runtime import RuntimeChoiceError
    try:
        return fn(*args, **kw)
    except (ListenError, RuntimeChoiceError) as e:
        print(prefix + str(e), file=sys.stderr)
        return 1
    except ConfigError as e:
        for line in e.problems:
            if prefix == "error: " and line.startswith(("error:", "warning:")):
                print(line, file=sys.stderr)
            else:
                print(prefix + line, file=sys.stderr)
        return 1


# --- busbar's subcommands -------------------------------------------------------------------


def cmd_serve(args) -> int:
    if args.demo:
        from busbar import config as cfgmod
        from busbar.demo import demo_yaml, free_port
        from busbar.supervisor import serve
        mock_port = free_port()
        cfg = cfgmod.load(text=demo_yaml(args.listen or "127.0.0.1:8080", mock_port))

        async def start_mock(loop):
            from busbar import mock
            await mock.start("127.0.0.1", mock_port)

        def ready(gw):
            from busbar.demo import banner
            print(banner(cfg), flush=True)

        return serve(cfg, args.workers or 1, on_ready=ready, extra=start_mock)
    return _serve(_load(args.config, args.safe_mode), args.safe_mode, args.listen, args.workers)


def cmd_validate(args) -> int:
    return validate(args.config, args.config is not None, offline=args.offline,
                    safe_mode=args.safe_mode)


def cmd_mock(args) -> int:
    from busbar import mock
    mock.main(args.host, args.port, require_auth=args.require_auth)
    return 0


def _subcommand(argv: list[str]) -> int:
    p = _Parser(prog="busbar", description="An LLM gateway (busbar --help: every command).")
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", help="config file (default: $BUSBAR_CONFIG, else ./config.yaml)")
    s.add_argument("--listen", help="listen address HOST:PORT (overrides the config)")
    s.add_argument("--workers", type=int, help="worker processes (default: cores)")
    s.add_argument("--safe-mode", action="store_true",
                   help="ignore the persisted config overlay: serve the config file alone")
    s.add_argument("--demo", action="store_true",
                   help="serve the embedded demo config on the built-in mock provider")
    s.set_defaults(func=cmd_serve)
    v = sub.add_parser("validate", help="check a config with no network; exit 0 valid, 1 invalid")
    v.add_argument("--config", help="config file (default: $BUSBAR_CONFIG, else ./config.yaml)")
    v.add_argument("--offline", action="store_true",
                   help="lint without the environment: secret references and ${VAR} need not be set (CI)")
    v.add_argument("--safe-mode", action="store_true",
                   help="check the config file alone, without the persisted config overlay")
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
    _setup_logging()
    return _guard(args.func, "error: ", args)


if __name__ == "__main__":
    sys.exit(main())
