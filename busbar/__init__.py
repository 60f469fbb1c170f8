"""busbar: an LLM gateway. The control and I/O layer; the codecs live in cbusbar."""
import cbusbar  # noqa: F401  (installs the finder for the compiled modules, busbar's among them)

__version__ = "0.1.0"
