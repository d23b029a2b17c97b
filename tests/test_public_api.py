"""The top-level names the issue and docs promise (`llmgw.Inventory`, ...) are the
library's own objects, and `import llmgw` stays free of protobuf and gRPC."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import llmgw

# name -> the module that defines it
DOCUMENTED = {
    "AgentConnection": "llmgw.transport.base",
    "AgentConnector": "llmgw.transport.base",
    "AgentListener": "llmgw.transport.base",
    "Catalog": "llmgw.catalog.rules",
    "Config": "llmgw.config",
    "Controller": "llmgw.control.controller",
    "Endpoint": "llmgw.router.endpoints",
    "EndpointSink": "llmgw.router.endpoints",
    "Inventory": "llmgw.control.inventory",
    "Reconciler": "llmgw.control.reconciler",
    "Router": "llmgw.router.core",
}


def _fresh(code: str) -> str:
    """What `code` prints in a fresh interpreter: no other test's imports in it."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_a_documented_name_is_the_defining_modules_object(name: str) -> None:
    assert name in llmgw.__all__
    assert getattr(llmgw, name) is getattr(importlib.import_module(DOCUMENTED[name]), name)


def test_every_name_in_all_exists() -> None:
    missing = [name for name in llmgw.__all__ if not hasattr(llmgw, name)]
    assert missing == []


def test_a_fresh_import_has_the_names_without_protobuf_or_grpc() -> None:
    # A fresh interpreter: `import llmgw` first, before any submodule (catches import
    # cycles), and what it pulls in is not hidden by other tests' imports.
    code = (
        "import sys\n"
        "from llmgw import Controller, Inventory, Reconciler\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('google.protobuf', 'grpc')))\n"
        "print(Controller.__name__, Inventory.__name__, Reconciler.__name__, heavy)\n"
    )
    assert _fresh(code).strip() == "Controller Inventory Reconciler []"


def test_a_worker_process_loads_the_data_plane_only() -> None:
    # Each of llmgw-server's workers (one per core by default) is a fresh interpreter
    # that imports llmgw.workers.worker; the control plane, the admin app and TLS's
    # hypercorn stay in the control process. Each of these cost a worker 2-17 MB.
    code = (
        "import sys\n"
        "import llmgw.workers.worker\n"
        "roots = ('grpc', 'google.protobuf', 'quart', 'quart_trio', 'flask', 'hypercorn',\n"
        "         'httpx', 'jinja2', 'llmgw.admin', 'llmgw.control.controller',\n"
        "         'llmgw.dashboard',\n"
        "         'llmgw.server', 'sqlite3', 'psycopg')\n"
        "print(sorted({m.split('.')[0] if not m.startswith('llmgw') else m\n"
        "              for m in sys.modules if m.startswith(roots)}))\n"
    )
    assert _fresh(code).strip() == "[]"


def test_plain_http_engines_are_served_without_httpx() -> None:
    # The engine client's every operation to a plain http:// engine, in a fresh
    # interpreter: llmgw's own client carries them all, httpx is never imported.
    code = (
        "import sys, trio\n"
        "from functools import partial\n"
        "from llmgw.http.engine_client import EngineClient\n"
        "OK = b'HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok'\n"
        "async def engine(stream):\n"
        "    async with stream:\n"
        "        while await stream.receive_some(65536):  # a request (no body) a read\n"
        "            await stream.send_all(OK)\n"
        "async def main():\n"
        "    async with trio.open_nursery() as nursery:\n"
        "        serve = partial(trio.serve_tcp, engine, 0, host='127.0.0.1')\n"
        "        (listener,) = await nursery.start(serve)\n"
        "        url = 'http://127.0.0.1:%d/' % listener.socket.getsockname()[1]\n"
        "        client = EngineClient(2.0)\n"
        "        response = await client.send(url, b'', [])\n"
        "        answers = [await response.aread()]\n"
        "        await response.aclose()\n"
        "        async with client.request('GET', url) as page:\n"
        "            answers.append(await page.aread(2))\n"
        "        answers.append((await client.fetch('POST', url, body=b'', limit=2))[1])\n"
        "        await client.aclose()\n"
        "        nursery.cancel_scope.cancel()\n"
        "    print(answers, 'httpx' in sys.modules)\n"
        "trio.run(main)\n"
    )
    assert _fresh(code).strip() == "[b'ok', b'ok', b'ok'] False"


def test_the_names_load_their_modules_on_first_use() -> None:
    code = (
        "import sys, llmgw\n"
        "before = 'llmgw.control.controller' in sys.modules\n"
        "listed = 'Controller' in dir(llmgw)\n"
        "print(before, listed, llmgw.Controller.__module__)\n"
    )
    assert _fresh(code).split() == ["False", "True", "llmgw.control.controller"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        llmgw.Nope  # noqa: B018


def test_the_testing_package_loads_the_fleet_on_first_use() -> None:
    # Benchmarks and tests import llmgw.testing.procs (and llmgw.testing.gguf) to run
    # programs as processes: the package's __init__ does not pull the server into them.
    code = (
        "import sys\n"
        "import llmgw.testing.gguf, llmgw.testing.procs\n"
        "heavy = ('llmgw.server', 'llmgw.testing._')\n"
        "before = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "import llmgw.testing\n"
        "listed = 'fleet' in dir(llmgw.testing)\n"
        "print(before, listed, llmgw.testing.fleet.__module__, 'llmgw.server' in sys.modules)\n"
    )
    assert _fresh(code).split() == ["[]", "True", "llmgw.testing._fleet", "True"]


def test_an_unknown_testing_name_is_an_attribute_error() -> None:
    import llmgw.testing

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        llmgw.testing.Nope  # noqa: B018
