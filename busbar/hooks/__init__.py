"""Hooks: the operator's own logic on the request path, through a sidecar over HTTP (docs/hooks.md).

A hook is defined once under the top-level `hooks:` (config.py) and named from `pools.hooks` or a
pool's own `hooks:` list. busbar has one hook module built in, `busbar-webrequest-hook`: every
message to the hook is one JSON POST to the sidecar's `settings.url` (sidecar.py), in the wire
format of the Rust gateway's hook contract (wire.py). What fires when, and what a reply may change,
is run.py's: rewrite gates before routing, decision gates concurrently, taps fire and forget.
"""
