"""`llmgw-sim`: a simulated LLM engine that behaves like a small vLLM replica under load.

`--personality NAME` makes it resemble another engine instead (the engine zoo of
llmgw.sim.personalities): its values replace the engine defaults below, and any engine
flag given explicitly still wins over them. Without one, the defaults are those shown.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence
from functools import partial

import trio
import zmq

from llmgw import units
from llmgw.sim import personalities
from llmgw.sim.config import SimConfig
from llmgw.sim.faults import Faults
from llmgw.sim.kv_publisher import KVPublisher
from llmgw.sim.metrics import FORMATS
from llmgw.sim.model import EngineConfig
from llmgw.sim.server import describe, serve
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    READY_FILE_HELP,
    CliError,
    add_log_flags,
    check_ready_file,
    duration_at_least,
    fail,
    find_error,
    float_in,
    int_in,
    os_error_line,
    parse_or_fail,
    parser,
    ready_file,
    setup_logging,
    write_ready_file,
)

PROG = "llmgw-sim"


#: The flag that sets each EngineConfig field.
ENGINE_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "num_blocks": "--kv-blocks",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "prefill_us_per_token": "--prefill-us-per-token",
    "decode_step_ms": "--decode-step-ms",
    "decode_ms_per_seq": "--decode-ms-per-seq",
}


def _personalities_epilog() -> str:
    """Each personality and the values it sets, for --help."""
    out = ["personalities (--personality NAME; explicit engine flags still override):"]
    for p in personalities.PERSONALITIES.values():
        out.append(f"  {p.name}: {p.summary}")
        values = [f"--metrics-format {p.metrics_format}"]
        for field, value in p.engine.items():
            if field == "enable_prefix_caching":
                values.append("--prefix-caching" if value else "--no-prefix-caching")
            else:
                values.append(f"{ENGINE_FLAGS[field]} {value:g}")
        out.append(
            textwrap.fill(
                ", ".join(values),
                88,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, __doc__ or "")
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the epilog's lines
    p.epilog = _personalities_epilog()
    d = EngineConfig()
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument(
        "--port",
        type=int_in(0, 65535),
        default=8000,
        help="(default %(default)s; 0 picks a free one, see --ready-file)",
    )
    p.add_argument("--ready-file", metavar="PATH", help=READY_FILE_HELP)
    add_log_flags(p)
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="served model name; repeat for aliases, the first is the primary (default sim-model)",
    )
    p.add_argument(
        "--personality",
        choices=personalities.NAMES,
        default=None,
        metavar="NAME",
        help="defaults resembling a real engine (listed below)",
    )
    g = p.add_argument_group(
        "engine (a default in brackets is the one without --personality; a personality "
        "sets its own)"
    )
    # Engine flags default to None ("not given") so a personality can fill them.
    g.add_argument(
        "--max-num-seqs",
        type=int_in(1),
        default=None,
        metavar="N",
        help=f"sequences in the running batch [{d.max_num_seqs}]",
    )
    g.add_argument(
        "--kv-blocks",
        type=int_in(1),
        default=None,
        metavar="N",
        help=f"KV-cache blocks of {d.block_size} tokens [{d.num_blocks}]",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int_in(1),
        default=None,
        metavar="N",
        help=f"token budget of one step [{d.max_num_batched_tokens}]",
    )
    g.add_argument(
        "--max-model-len",
        type=int_in(2),
        default=None,
        metavar="N",
        help=f"prompt + output limit [{d.max_model_len}]",
    )
    g.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the prefix cache [on]",
    )
    g.add_argument(
        "--prefill-us-per-token",
        type=float_in(0),
        default=None,
        metavar="US",
        help=f"prefill cost per uncached prompt token [{d.prefill_us_per_token:g}]",
    )
    g.add_argument(
        "--decode-step-ms",
        type=float_in(0),
        default=None,
        metavar="MS",
        help=f"fixed cost of one engine step [{d.decode_step_ms:g}]",
    )
    g.add_argument(
        "--decode-ms-per-seq",
        type=float_in(0),
        default=None,
        metavar="MS",
        help=f"added step cost per decoding sequence [{d.decode_ms_per_seq:g}]",
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
        "--api-key",
        default=os.environ.get("LLMGW_SIM_API_KEY"),
        help="like vLLM's: API routes want 'Authorization: Bearer KEY' (probes stay open; "
        "default $LLMGW_SIM_API_KEY, which keeps it off the command line)",
    )
    g.add_argument(
        "--metrics-format",
        choices=FORMATS,
        default=None,
        help="metric names on /metrics (llamacpp also serves /props and /slots) [vllm]",
    )
    p.add_argument(
        "--messages",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve Anthropic's /v1/messages natively (default: with --metrics-format "
        "llamacpp only, as vLLM's versions before the endpoint)",
    )
    p.add_argument(
        "--sleep-mode",
        action="store_true",
        help="serve vLLM's sleep mode: POST /sleep, POST /wake_up, GET /is_sleeping "
        "(asleep, generation requests are answered 503)",
    )
    p.add_argument(
        "--wake-delay",
        type=duration_at_least(0),
        default=1.0,
        metavar="DURATION",
        help="how long POST /wake_up takes with --sleep-mode (default 1s)",
    )
    p.add_argument(
        "--kv-events-endpoint",
        metavar="ADDR",
        help="publish KV-cache events as vLLM's --kv-events-config does (ZMQ PUB, msgpack "
        "batches), bound to ADDR, e.g. tcp://127.0.0.1:5557 (port 0 picks one; the ready "
        "file says which, as kv_events); off by default",
    )
    p.add_argument(
        "--kv-events-replay-endpoint",
        metavar="ADDR",
        help="with --kv-events-endpoint: answer replay requests (vLLM's replay_endpoint, "
        "a ZMQ ROUTER) on ADDR, port 0 picking one (the ready file's kv_events_replay)",
    )
    p.add_argument(
        "--kv-events-topic",
        default="",
        metavar="TOPIC",
        help="the topic frame of every KV-event message (default: empty, as vLLM's)",
    )
    p.add_argument(
        "--startup-delay",
        type=duration_at_least(0),
        default=0.0,
        metavar="DURATION",
        help="wait this long before listening, as an engine loading its weights does "
        "(a cold start; e.g. 5s)",
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
    """Raises ValueError for combinations that argparse cannot check alone.

    Engine settings come from EngineConfig's defaults, then the personality's, then
    the flags given (an engine flag left out is None)."""
    persona = personalities.get(args.personality) if args.personality else None
    engine = personalities.engine_config(
        persona,
        max_num_seqs=args.max_num_seqs,
        num_blocks=args.kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        prefill_us_per_token=args.prefill_us_per_token,
        decode_step_ms=args.decode_step_ms,
        decode_ms_per_seq=args.decode_ms_per_seq,
        enable_prefix_caching=args.prefix_caching,
        seed=args.seed,
    )
    metrics_format = args.metrics_format or (persona.metrics_format if persona else "vllm")
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
    if args.kv_events_replay_endpoint and not args.kv_events_endpoint:
        raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
    return SimConfig(
        host=args.host,
        port=args.port,
        models=models,
        engine=engine,
        metrics_format=metrics_format,
        default_max_tokens=args.default_max_tokens,
        embedding_dim=args.embedding_dim,
        faults=faults,
        personality=persona.name if persona else None,
        api_key=args.api_key,
        messages=args.messages,
        sleep_mode=args.sleep_mode,
        wake_delay=args.wake_delay,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_topic=args.kv_events_topic,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
    )


async def _run(config: SimConfig, ready: str | None = None, startup_delay: float = 0.0) -> None:
    # vLLM and llama-server bind their port once the model is loaded: until then a
    # health check is refused, not answered.
    await trio.sleep(startup_delay)
    publisher = None
    if config.kv_events_endpoint is not None:
        publisher = KVPublisher(
            config.kv_events_endpoint, config.kv_events_topic, config.kv_events_replay_endpoint
        )
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, config, kv_publisher=publisher))
            print(describe(config, binds), flush=True)
            if publisher is not None:
                print(f"llmgw-sim: KV-cache events on {publisher.address}", flush=True)
            if ready is not None:
                found = {"listen": [url.removeprefix("http://") for url in binds]}
                if publisher is not None:
                    found["kv_events"] = [publisher.address]
                if publisher is not None and publisher.replay_address is not None:
                    found["kv_events_replay"] = [publisher.replay_address]
                write_ready_file(ready, found)
    finally:
        if publisher is not None:
            publisher.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_fail(build_parser(), argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        fail(PROG, str(e), EXIT_USAGE)
    try:
        check_ready_file(args.ready_file)
    except CliError as e:
        fail(PROG, str(e), e.code)
    setup_logging(args)
    try:
        with ready_file(args.ready_file):
            trio.run(_run, config, args.ready_file, args.startup_delay)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C during shutdown
    except zmq.ZMQError as e:
        fail(
            PROG, f"cannot bind --kv-events-endpoint {config.kv_events_endpoint}: {e}", EXIT_RUNTIME
        )
    except BaseException as e:
        err = find_error(e, OSError)  # from inside the server's nursery
        if err is None:
            raise
        where = units.Address(config.host, config.port)
        fail(PROG, os_error_line(err, f"cannot listen on {where}"), EXIT_RUNTIME)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
