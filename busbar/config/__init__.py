"""Configuration: config.yaml + the shipped providers.yaml catalog -> a frozen, validated Config.

    from busbar import config
    cfg = config.load()                 # $BUSBAR_CONFIG or ./config.yaml; raises config.ConfigError
    cfg = config.load(text=DEMO_YAML)   # an embedded config
    config.validate_main(path)          # `busbar validate`: 0 ok / 1 invalid, no network
"""
from __future__ import annotations

import importlib

# The package's names, each from its module, imported on first use (PEP 562): the leaf helpers
# (checks, secrets, urls, modules) are imported by the feature parsers the loader itself imports
# (busbar/observability/settings.py, busbar/governance/config.py, busbar/reliability/config.py), so
# importing one of them must not run the loader first.
_FROM = {
    **dict.fromkeys(("CONFIG_ENV", "PROVIDERS_ENV", "SHIPPED_CATALOG", "ConfigError", "build",
                     "load", "load_catalog", "validate_main"), ".loader"),
    **dict.fromkeys(("AUTH_MODES", "DEFAULT_AUTH", "PROTOCOLS", "Config", "Limits", "Member",
                     "Model", "Pool", "Provider"), ".schema"),
}


def __getattr__(name):
    module = _FROM.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AUTH_MODES",
    "CONFIG_ENV",
    "Config",
    "ConfigError",
    "DEFAULT_AUTH",
    "Limits",
    "Member",
    "Model",
    "PROTOCOLS",
    "PROVIDERS_ENV",
    "Pool",
    "Provider",
    "SHIPPED_CATALOG",
    "build",
    "load",
    "load_catalog",
    "validate_main",
]
