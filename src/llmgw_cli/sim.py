"""`llmgw-sim`: a simulated LLM engine that behaves like a small vLLM replica under load."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial

import trio

from llmgw.sim.metrics import FORMATS
from llmgw.sim.model import EngineConfig
from llmgw.sim.server import Faults, SimConfig, describe, serve
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    READY_FILE_HELP,
    duration_at_least,
    fail,
    find_error,
    float_in,
    int_in,
    parser,
    ready_file,
    write_ready_file,
)

PROG = "llmgw-sim"


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, __doc__ or "")
    d = EngineConfig()
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument(
        "--port",
        type=int_in(0, 65535),
        default=8000,
        help="(default %(default)s; 0 picks a free one, see --ready-file)",
    )
    p.add_argument("--ready-file", metavar="PATH", help=READY_FILE_HELP)
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="served model name; repeat for aliases, the first is the primary (default sim-model)",
    )
    g = p.add_argument_group("engine")
    g.add_argument(
        "--max-num-seqs",
        type=int_in(1),
        default=d.max_num_seqs,
        metavar="N",
        help="sequences in the running batch (default %(default)s)",
    )
    g.add_argument(
        "--kv-blocks",
        type=int_in(1),
        default=d.num_blocks,
        metavar="N",
        help=f"KV-cache blocks of {d.block_size} tokens (default %(default)s)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int_in(1),
        default=d.max_num_batched_tokens,
        metavar="N",
        help="token budget of one step (default %(default)s)",
    )
    g.add_argument(
        "--max-model-len",
        type=int_in(2),
        default=d.max_model_len,
        metavar="N",
        help="prompt + output limit (default %(default)s)",
    )
    g.add_argument("--no-prefix-caching", action="store_true", help="disable the prefix cache")
    g.add_argument(
        "--prefill-us-per-token",
        type=float_in(0),
        default=d.prefill_us_per_token,
        metavar="US",
        help="prefill cost per uncached prompt token (default %(default)s)",
    )
    g.add_argument(
        "--decode-step-ms",
        type=float_in(0),
        default=d.decode_step_ms,
        metavar="MS",
        help="fixed cost of one engine step (default %(default)s)",
    )
    g.add_argument(
        "--decode-ms-per-seq",
        type=float_in(0),
        default=d.decode_ms_per_seq,
        metavar="MS",
        help="added step cost per decoding sequence (default %(default)s)",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int_in(1),
        default=16,
        metavar="N",
        help="output length when a request gives no max_tokens (default %(default)s)",
    )
    g.add_argument(
        "--embedding-dim",
        type=int_in(1, 65536),
        default=384,
        metavar="N",
        help="embedding vector size (default %(default)s)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of all randomness (default 0)")
    g.add_argument(
        "--metrics-format",
        choices=FORMATS,
        default="vllm",
        help="metric names on /metrics (default %(default)s)",
    )
    f = p.add_argument_group("fault injection (also settable at runtime: POST /sim/faults)")
    f.add_argument(
        "--fault-error-rate",
        type=float_in(0, 1),
        default=0.0,
        metavar="P",
        help="fraction of requests answered with --fault-error-status",
    )
    f.add_argument(
        "--fault-error-status",
        type=int_in(400, 599),
        default=500,
        metavar="CODE",
        help="status of injected errors (default %(default)s)",
    )
    f.add_argument(
        "--fault-hang-rate",
        type=float_in(0, 1),
        default=0.0,
        metavar="P",
        help="fraction of requests that hang before their first token",
    )
    f.add_argument(
        "--fault-first-token-delay",
        type=duration_at_least(0),
        default=0.0,
        metavar="DURATION",
        help="hold every request this long before it may be scheduled (e.g. 250ms, 2s)",
    )
    f.add_argument(
        "--fault-abort-after-chunks",
        type=int_in(0),
        default=None,
        metavar="N",
        help="close streams after N SSE events, without [DONE]",
    )
    f.add_argument(
        "--fault-exit-after",
        type=int_in(1),
        default=None,
        metavar="N",
        help="exit the process (status 1) after N requests",
    )
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Raises ValueError for combinations that argparse cannot check alone."""
    engine = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        num_blocks=args.kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        prefill_us_per_token=args.prefill_us_per_token,
        decode_step_ms=args.decode_step_ms,
        decode_ms_per_seq=args.decode_ms_per_seq,
        enable_prefix_caching=not args.no_prefix_caching,
        seed=args.seed,
    )
    faults = Faults(
        error_rate=args.fault_error_rate,
        error_status=args.fault_error_status,
        hang_rate=args.fault_hang_rate,
        first_token_delay=args.fault_first_token_delay,
        abort_after_chunks=args.fault_abort_after_chunks,
        exit_after=args.fault_exit_after,
    )
    models = tuple(dict.fromkeys(args.models or ["sim-model"]))
    if any(not m for m in models):
        raise ValueError("--model: a model name must not be empty")
    return SimConfig(
        host=args.host,
        port=args.port,
        models=models,
        engine=engine,
        metrics_format=args.metrics_format,
        default_max_tokens=args.default_max_tokens,
        embedding_dim=args.embedding_dim,
        faults=faults,
    )


async def _run(config: SimConfig, ready: str | None = None) -> None:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, config))
        print(describe(config, binds), flush=True)
        if ready is not None:
            write_ready_file(ready, {"listen": [url.removeprefix("http://") for url in binds]})


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    # Errors become one line (`fail`) instead of argparse's usage dump.
    p.exit_on_error = False
    try:
        args, extra = p.parse_known_args(argv)
    except argparse.ArgumentError as e:
        fail(PROG, str(e), EXIT_USAGE)
    if extra:
        fail(PROG, f"unrecognized arguments: {' '.join(extra)}", EXIT_USAGE)
    try:
        config = config_from_args(args)
    except ValueError as e:
        fail(PROG, str(e), EXIT_USAGE)
    try:
        with ready_file(args.ready_file):
            trio.run(_run, config, args.ready_file)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C during shutdown
    except BaseException as e:
        err = find_error(e, OSError)
        if err is None:
            raise
        fail(
            PROG,
            f"cannot serve on {config.host}:{config.port}: {err.strerror or err}",
            EXIT_RUNTIME,
        )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
