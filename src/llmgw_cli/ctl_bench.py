"""`llmgw-ctl bench`: its flags, a closed-loop run or a sweep of :mod:`llmgw.bench`
with a progress bar, and the latency tables, JSON and samples it reports."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from llmgw import bench
from llmgw.bench.runner import BAND_HEADER, SESSION_HEADER
from llmgw.bench.sweeping import PERCENTILES
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    CliError,
    float_in,
    header,
    http_url,
    int_in,
    int_list,
    json_object,
    positive_duration,
)
from llmgw_cli.ctl_output import print_json, stdout


def add_parser(b: argparse.ArgumentParser) -> None:
    b.description = (
        "Drive a closed-loop workload against an OpenAI-compatible server (/v1 is appended "
        "to --url) and report TTFT, inter-token and end-to-end latency percentiles and "
        "throughput. A prompt of N tokens is N three-letter pseudo-words (~1 token each)."
    )
    b.add_argument(
        "--url",
        required=True,
        type=http_url,
        help="server base URL, e.g. http://127.0.0.1:8080",
    )
    b.add_argument("--model", required=True, help="model name to request")
    b.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    b.add_argument("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY")
    b.add_argument("--concurrency", type=int_in(1), default=8, metavar="N")
    b.add_argument(
        "--requests", type=int_in(1), metavar="N", help="stop after N requests (default 200)"
    )
    b.add_argument(
        "--duration", type=positive_duration, metavar="DUR", help="stop starting requests after DUR"
    )
    b.add_argument("--prompt-tokens", type=int_in(1), default=256, metavar="N")
    b.add_argument("--output-tokens", type=int_in(1), default=64, metavar="N")
    b.add_argument(
        "--shared-prefix-ratio",
        type=float_in(0, 1),
        default=0.0,
        metavar="R",
        help="fraction of each prompt shared within its prefix group (0..1)",
    )
    b.add_argument("--prefix-groups", type=int_in(1), default=1, metavar="N")
    b.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    b.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send ignore_eos so every response has exactly --output-tokens (vLLM/SGLang)",
    )
    b.add_argument("--band", metavar="NAME", help="priority band to request")
    b.add_argument("--band-header", default=BAND_HEADER, metavar="NAME")
    b.add_argument(
        "--session-header",
        metavar="NAME",
        help=f"session header name (default {SESSION_HEADER} with --sessions)",
    )
    b.add_argument(
        "--sessions", type=int_in(0), default=0, metavar="N", help="spread requests over N sessions"
    )
    b.add_argument("--header", type=header, action="append", default=[], metavar="'NAME: VALUE'")
    b.add_argument("--extra-body", type=json_object, metavar="JSON", help="merged into bodies")
    b.add_argument(
        "--seed",
        type=int,
        help="workload seed (default: random, and reported). A fixed seed repeats the "
        "prompts exactly, which a warm server answers from its prefix cache",
    )
    b.add_argument(
        "--request-timeout",
        type=positive_duration,
        default=120.0,
        metavar="DUR",
        help="bound on each request (default 120s)",
    )
    b.add_argument("--samples", type=Path, metavar="FILE", help="write per-request JSON lines")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = b.add_argument_group("sweep")
    g.add_argument(
        "--sweep",
        type=int_list(1),
        metavar="C1,C2,...",
        help="run once per concurrency (each bounded like a single run)",
    )
    g.add_argument(
        "--target-ttft",
        type=positive_duration,
        metavar="DUR",
        help="suggest router.scoring targets that keep TTFT under DUR",
    )
    g.add_argument("--ttft-percentile", choices=PERCENTILES, default="p90")
    g.add_argument(
        "--replicas",
        type=int_in(1),
        default=1,
        help="engine replicas behind --url (for per-replica targets)",
    )
    g.add_argument(
        "--metrics-url",
        action="append",
        metavar="URL",
        help="an engine's Prometheus page for its waiting queue (repeatable; default: URL/metrics)",
    )
    g.add_argument("--sweep-all", action="store_true", help="keep going after a missed step")


class ProgressBar:
    """A rich progress bar on stderr: one task per run (one per sweep step)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.failed = 0

    def run_started(self, target: bench.Target, config: bench.LoadConfig) -> None:
        self.failed = 0
        self.task = self.progress.add_task(
            f"c={config.concurrency}", total=config.requests, status=""
        )

    def request_done(self, sample: bench.Sample) -> None:
        if self.task is None:
            return
        if not sample.ok:
            self.failed += 1
        status = f"[red]{self.failed} failed" if self.failed else ""
        self.progress.update(self.task, advance=1, status=status)

    def run_finished(self, result: bench.BenchResult) -> None:
        if self.task is not None:
            self.progress.update(self.task, total=len(result.samples))


def _load_config(args: argparse.Namespace) -> bench.LoadConfig:
    if args.session_header and not args.sessions:
        raise CliError("--session-header needs --sessions N (how many sessions to spread over)")
    if args.target_ttft is not None and not args.sweep:
        raise CliError("--target-ttft needs --sweep C1,C2,... (the concurrencies to measure)")
    requests = args.requests
    if requests is None and args.duration is None:
        requests = 200
    try:
        return bench.LoadConfig(
            concurrency=args.concurrency,
            requests=requests,
            duration=args.duration,
            stream=args.stream,
            workload=bench.WorkloadSpec(
                prompt_tokens=args.prompt_tokens,
                output_tokens=args.output_tokens,
                shared_prefix_ratio=args.shared_prefix_ratio,
                prefix_groups=args.prefix_groups,
                sessions=args.sessions,
                seed=args.seed if args.seed is not None else random.randrange(2**31),
            ),
            band=args.band,
            band_header=args.band_header,
            session_header=args.session_header or SESSION_HEADER,
            ignore_eos=args.ignore_eos,
            request_timeout=args.request_timeout,
            extra_body=args.extra_body or {},
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _latency_table(summary: bench.Summary) -> Table:
    table = Table("ms", "mean", "p50", "p90", "p99", "max", "n", box=box.SIMPLE_HEAD)
    for name, d in (
        ("TTFT", summary.ttft),
        ("ITL", summary.itl),
        ("TPOT", summary.tpot),
        ("E2E", summary.e2e),
    ):
        if d is None:
            table.add_row(name, "-", "-", "-", "-", "-", "0")
        else:
            table.add_row(
                name, _ms(d.mean), _ms(d.p50), _ms(d.p90), _ms(d.p99), _ms(d.max), str(d.count)
            )
    return table


def _print_summary(console: Console, result: bench.BenchResult) -> None:
    s = result.summary
    c = result.config
    bound = " and ".join(
        part
        for part in (
            f"{c.requests} requests" if c.requests else "",
            f"{c.duration:g}s" if c.duration else "",
        )
        if part
    )
    console.print(
        f"{escape(result.target)}  model {escape(result.model)}  concurrency {c.concurrency}  "
        f"{bound}  {'streaming' if c.stream else 'not streaming'}  "
        f"prompt {c.workload.prompt_tokens} / output {c.workload.output_tokens} tokens  "
        f"seed {c.workload.seed}"
    )
    console.print(_latency_table(s))
    cached = "" if s.cached_tokens is None else f" ({s.cached_tokens} cached)"
    console.print(
        f"requests    {s.requests} in {s.duration:.2f}s: {s.ok} ok, {s.failed} failed\n"
        f"throughput  {s.request_throughput:.2f} req/s, {s.output_token_throughput:.1f} "
        f"output tok/s, {s.total_token_throughput:.1f} total tok/s\n"
        f"tokens      prompt {s.prompt_tokens}{cached}, completion {s.completion_tokens}"
    )
    if s.errors:
        console.print(
            "errors      " + ", ".join(f"{escape(k)} x{v}" for k, v in s.errors.items()),
            style="red",
        )


def _sweep_table(result: bench.SweepResult) -> Table:
    pct = result.percentile
    second = pct if pct != "p50" else "p99"
    table = Table(
        "conc",
        "/replica",
        "req/s",
        "out tok/s",
        "TTFT p50",
        f"TTFT {second}",
        "E2E p50",
        "waiting",
        "failed",
        "meets",
        box=box.SIMPLE_HEAD,
        title="latencies in ms; waiting = mean engine queue per replica",
        title_justify="left",
    )
    for step in result.steps:
        s = step.summary
        ttft2 = s.ttft.percentile(second) if s.ttft else None
        table.add_row(
            str(step.concurrency),
            f"{step.per_replica:g}",
            f"{s.request_throughput:.2f}",
            f"{s.output_token_throughput:.1f}",
            _ms(s.ttft.p50 if s.ttft else None),
            _ms(ttft2),
            _ms(s.e2e.p50 if s.e2e else None),
            "-" if step.engine is None else f"{step.engine.waiting_mean:.1f}",
            str(s.failed),
            "-" if step.passed is None else ("yes" if step.passed else "no"),
        )
    return table


def _sweep_json(result: bench.SweepResult) -> dict[str, Any]:
    """The sweep without per-request samples (those go to --samples)."""
    return {
        "target": result.target,
        "model": result.model,
        "target_ttft": result.target_ttft,
        "percentile": result.percentile,
        "replicas": result.replicas,
        "config": bench.to_jsonable(result.steps[0].result.config) if result.steps else None,
        "steps": [
            {
                "concurrency": step.concurrency,
                "per_replica": step.per_replica,
                "ttft": step.ttft,
                "passed": step.passed,
                "engine": bench.to_jsonable(step.engine),
                "summary": bench.to_jsonable(step.summary),
            }
            for step in result.steps
        ],
        "suggestion": bench.to_jsonable(result.suggestion),
    }


def _write_samples(path: Path, results: Sequence[bench.BenchResult]) -> None:
    try:
        with path.open("w") as f:
            for result in results:
                for sample in result.samples:
                    record = {
                        "target": result.target,
                        "concurrency": result.config.concurrency,
                        **bench.to_jsonable(sample),
                    }
                    f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise CliError(f"cannot write --samples {path}: {exc.strerror}", EXIT_RUNTIME) from None


def _no_success(results: Sequence[bench.BenchResult]) -> str | None:
    """Why nothing succeeded, or None when something did."""
    if any(r.summary.ok for r in results):
        return None
    failed = [s for r in results for s in r.samples]
    if not failed:
        return "no request was sent"
    first = failed[0]
    detail = f": {first.message}" if first.message else ""
    return f"no request succeeded ({len(failed)} x {first.error}{detail})"


def run(args: argparse.Namespace) -> int:
    config = _load_config(args)
    target = bench.Target(
        url=args.url,
        model=args.model,
        api_key=args.api_key,
        endpoint=args.endpoint,
        headers=tuple(args.header),
    )
    out = stdout()
    show_progress = not args.json and not args.no_progress and sys.stderr.isatty()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=Console(stderr=True),
        disable=not show_progress,
    )
    observer = ProgressBar(progress)
    swept: bench.SweepResult | None = None
    try:
        with progress:
            if args.sweep:
                swept = trio.run(
                    partial(
                        bench.sweep,
                        target,
                        config,
                        args.sweep,
                        target_ttft=args.target_ttft,
                        percentile=args.ttft_percentile,
                        replicas=args.replicas,
                        metrics_urls=args.metrics_url,
                        stop_on_miss=not args.sweep_all,
                        observer=observer,
                    )
                )
                results = [step.result for step in swept.steps]
            else:
                results = [trio.run(partial(bench.run, target, config, observer=observer))]
    except KeyboardInterrupt:
        raise CliError("interrupted", EXIT_RUNTIME) from None
    if args.samples:
        _write_samples(args.samples, results)
    if swept is not None:
        if args.json:
            print_json(_sweep_json(swept))
        else:
            _print_sweep(out, swept)
    elif args.json:
        result = results[0]
        print_json(
            {
                "target": result.target,
                "model": result.model,
                "endpoint": target.endpoint,
                "config": bench.to_jsonable(result.config),
                "summary": bench.to_jsonable(result.summary),
            }
        )
    else:
        _print_summary(out, results[0])
    problem = _no_success(results)
    if problem is not None:
        raise CliError(problem, EXIT_RUNTIME)
    return EXIT_OK


def _print_sweep(console: Console, result: bench.SweepResult) -> None:
    console.print(
        f"sweep {escape(result.target)} model {escape(result.model)}, {result.replicas} replica(s)"
    )
    console.print(_sweep_table(result))
    s = result.suggestion
    if s is None:
        return
    target = "-" if result.target_ttft is None else f"{result.target_ttft * 1000:g}ms"
    if s.capacity is None:
        console.print(f"no suggestion for TTFT {result.percentile} <= {target}: {s.note}")
    else:
        waiting = "unknown" if s.target_waiting is None else str(s.target_waiting)
        console.print(
            f"suggested for TTFT {result.percentile} <= {target}: "
            f"capacity = {s.capacity} on each endpoint, router.scoring.target_waiting = "
            f"{waiting}  (measured at concurrency {s.concurrency})"
        )
        if s.note:
            console.print(f"note: {escape(s.note)}")
    console.print(f"rule: {escape(s.rule)}", style="dim")
