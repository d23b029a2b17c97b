"""The entry points of the console scripts whose program needs an extra
(llmgw.extras; pyproject.toml's [project.scripts] names these): the extra is checked
before the program is imported, so a missing one is a line saying what to install,
not an ImportError's traceback. llmgw-agent and llmgw-sim need none: their entry
points are their modules' ``main``."""

from __future__ import annotations

from llmgw import extras
from llmgw_cli._common import EXIT_RUNTIME, fail


def _require(prog: str, extra: str) -> None:
    missing = extras.needs(prog, extra)
    if missing is not None:
        fail(prog, missing, EXIT_RUNTIME)


def server() -> None:
    """``llmgw-server``: its admin listener (API, dashboard) and TLS listeners need
    llmgw[server]."""
    _require("llmgw-server", "server")
    from llmgw_cli.server import main

    main()


def ctl() -> int:
    """``llmgw-ctl``: its tables and progress are rich's, llmgw[ctl]."""
    _require("llmgw-ctl", "ctl")
    from llmgw_cli.ctl import main

    return main()
