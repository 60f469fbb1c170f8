"""One module per wire protocol, all with the identical shape (docs/codecs.md)."""
import importlib

PROTOCOLS = ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock")
# Dialects that re-envelope another codec (Claude through Bedrock InvokeModel), by protocol name.
VARIANTS = {"bedrock-invoke": "bedrock_invoke"}


def codec(name):
    """The codec module of a protocol name."""
    module = name if name in PROTOCOLS else VARIANTS.get(name)
    if module is None:
        raise KeyError(name)
    return importlib.import_module("cbusbar.proto." + module)
