"""busbar: an LLM gateway. The control and I/O layer; the codecs live in cbusbar."""
__version__ = "0.1.0"
