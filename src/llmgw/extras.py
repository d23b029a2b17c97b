"""llmgw's optional extras (pyproject.toml's ``[project.optional-dependencies]``): the
modules each brings, whether they are installed, and the one message a missing one
gives.

``pip install llmgw`` is the library and the data plane: a :class:`llmgw.Router`
served on a socket by llmgw's own HTTP server, the control plane's parts, the agent
and the simulator. The rest is an extra, its libraries imported only where they are
used, after :func:`require` (or a configuration check through :func:`needs`) has
said what to install:

* ``server``: quart-trio, hypercorn, jinja2. The admin API and dashboard, the TLS
  listeners; so ``llmgw.assemble``, ``llmgw.serve`` and ``llmgw-server``.
* ``postgres``: psycopg, for a ``postgresql://`` store.
* ``ctl``: rich, the tables and progress of ``llmgw-ctl``.
* ``profiling``: pyinstrument, the admin API's CPU profiles (``llmgw-ctl debug profile``).
* ``tracing``: OpenTelemetry's SDK and OTLP/HTTP exporter (``[tracing] endpoint``).

``all`` is every one of them; ``dev`` (the tests and tools) includes ``all``.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtra", "missing", "needs", "require"]

#: extra -> {a module it brings: the distribution that brings it}. The module is what
#: is looked for; the distributions are named in the message.
EXTRAS: dict[str, dict[str, str]] = {
    "server": {"quart_trio": "quart-trio", "hypercorn": "hypercorn", "jinja2": "jinja2"},
    "postgres": {"psycopg": "psycopg"},
    "ctl": {"rich": "rich"},
    "profiling": {"pyinstrument": "pyinstrument"},
    "tracing": {
        "opentelemetry.sdk.trace": "opentelemetry-sdk",
        "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    },
}


class MissingExtra(ImportError):
    """What needs an extra was asked for without it; the message says what to install."""


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing (or refused)
        return False


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that are not installed."""
    return [dist for module, dist in EXTRAS[extra].items() if not _found(module)]


def needs(what: str, extra: str) -> str | None:
    """The message saying that `what` needs `extra`, or None when it is installed."""
    absent = missing(extra)
    if not absent:
        return None
    return f"{what} needs {', '.join(absent)}, not installed: pip install 'llmgw[{extra}]'"


def require(what: str, extra: str) -> None:
    """Raise :class:`MissingExtra` unless `extra` (which `what` needs) is installed."""
    message = needs(what, extra)
    if message is not None:
        raise MissingExtra(message)
