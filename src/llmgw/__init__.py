"""llmgw: an OpenAI-compatible LLM gateway and GPU-fleet control plane on trio."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmgw")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
