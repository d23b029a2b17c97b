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
    "Catalog": "llmgw.catalog",
    "Config": "llmgw.config",
    "Controller": "llmgw.control.controller",
    "Endpoint": "llmgw.router.endpoints",
    "EndpointSink": "llmgw.router.endpoints",
    "Inventory": "llmgw.control.inventory",
    "Reconciler": "llmgw.control.reconciler",
    "Router": "llmgw.router.core",
}


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
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "Controller Inventory Reconciler []"
