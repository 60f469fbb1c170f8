"""One module per wire protocol, all with the identical shape (docs/codecs.md)."""
import importlib

PROTOCOLS = ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock")


def codec(name):
    """The codec module of a protocol name."""
    if name not in PROTOCOLS:
        raise KeyError(name)
    return importlib.import_module("cbusbar.proto." + name)
