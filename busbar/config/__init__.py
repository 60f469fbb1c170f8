"""Configuration: config.yaml + the shipped providers.yaml catalog -> a frozen, validated Config.

    from busbar import config
    cfg = config.load()                 # $BUSBAR_CONFIG or ./config.yaml; raises config.ConfigError
    cfg = config.load(text=DEMO_YAML)   # an embedded config
    config.validate_main(path)          # `busbar validate`: 0 ok / 1 invalid, no network
"""
from .loader import CONFIG_ENV, PROVIDERS_ENV, SHIPPED_CATALOG, ConfigError, build, load, load_catalog, validate_main
from .schema import AUTH_MODES, DEFAULT_AUTH, PROTOCOLS, Config, Limits, Member, Model, Pool, Provider

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
