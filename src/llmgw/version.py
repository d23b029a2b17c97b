"""llmgw's version, in a module of its own so that any module can import it without
a cycle through the package's ``__init__``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmgw")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
