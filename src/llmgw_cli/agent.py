"""llmgw-agent: the node side of the control plane."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw_cli._common import EXIT_RUNTIME, fail, parser

PROG = "llmgw-agent"


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(PROG, "Node agent: registers this machine's GPUs and runs engine replicas.")
    p.add_argument("--server", metavar="HOST:PORT", required=True, help="control plane address")
    p.add_argument("--node-id", metavar="ID", help="node identity (default: hostname)")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="node label")
    p.add_argument("--fabric", action="append", default=[], metavar="NAME", help="fabric name")
    p.add_argument("--fake-gpus", metavar="SPEC", help="pretend GPUs, e.g. 4x80GB")
    p.add_argument("--tls-cert", metavar="FILE")
    p.add_argument("--tls-key", metavar="FILE")
    p.add_argument("--tls-ca", metavar="FILE")
    p.parse_args(argv)
    fail(PROG, "the agent is not implemented yet", EXIT_RUNTIME)
