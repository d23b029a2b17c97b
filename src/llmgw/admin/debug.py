"""``/api/v1/debug/...``: what the process is doing, for an operator on the admin port.

The Python counterparts of Go's pprof (docs/debugging.md):

* ``GET /api/v1/debug``: which debugging aids are on (the profiler loaded or running,
  a profile hook on the event-loop thread, tracemalloc tracing). With none asked
  for, none is: nothing here is imported, started or hooked until a request asks.
* ``GET /api/v1/debug/tasks``: the trio task tree, each task with the frames it is
  suspended in (``file:line in function``, outermost first).
* ``GET /api/v1/debug/threads``: every thread's Python stack.
* ``POST /api/v1/debug/profile?seconds=N&format=text|speedscope|html``: a CPU profile
  of the event-loop thread (every trio task runs there) for N seconds, from
  pyinstrument's sampler. The handler sleeps while the sampler runs, so the loop keeps
  serving; one profile at a time (409 while one runs).
* ``POST /api/v1/debug/heap?limit=N`` starts tracemalloc (it then covers only what is
  allocated since) and answers the summary; ``GET /api/v1/debug/heap?limit=N``: the
  lines holding the most live memory, while tracing (409 ``not_tracing`` otherwise);
  ``DELETE /api/v1/debug/heap`` stops it, as tracing slows every allocation.

What changes the process's state is never a GET: a GET is what a link, an image or a
prefetch on any page makes the operator's browser send (tracing halved a server's
throughput). And every method here, GETs included, is refused cross-site
(llmgw.admin.web's guard). They are behind admin auth with the rest of ``/api/v1/``:
stacks, source lines and allocation sites show what the process holds and does.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import tracemalloc
import types
from typing import TYPE_CHECKING

import attrs
import trio
from quart import Response

from llmgw import extras
from llmgw.admin.bounds import (
    DEFAULT_HEAP_LINES,
    DEFAULT_PROFILE_SECONDS,
    MAX_HEAP_LINES,
    MAX_PROFILE_SECONDS,
    PROFILE_FORMATS,
)
from llmgw.admin.contract import ApiError, Param, json_reply
from llmgw.admin.inputs import query
from llmgw.admin.views import unstructure

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = [
    "HEAP_QUERY",
    "MAX_PROFILE_SECONDS",
    "PROFILE_FORMATS",
    "DebugStatus",
    "HeapStopped",
    "HeapSummary",
    "TaskTree",
    "ThreadList",
    "heap",
    "heap_start",
    "heap_stop",
    "profile",
    "profile_query",
    "status",
    "tasks",
    "threads",
]

#: pyinstrument's default: a sample at most every millisecond of the loop's thread.
PROFILE_INTERVAL = 0.001
# Frames tracemalloc keeps per allocation when the API starts it: each costs memory
# for every live block and time for every allocation, and a summary by line reads
# only the innermost.
HEAP_FRAMES = 1

HEAP_QUERY = (
    Param(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_HEAP_LINES, "default": DEFAULT_HEAP_LINES},
        "how many lines, largest first",
    ),
)


def profile_query(max_seconds: int) -> tuple[Param, ...]:
    return (
        Param(
            "seconds",
            {
                "type": "integer",
                "minimum": 1,
                "maximum": max_seconds,
                "default": min(DEFAULT_PROFILE_SECONDS, max_seconds),
            },
            "how long to sample",
        ),
        Param(
            "format",
            {"type": "string", "enum": list(PROFILE_FORMATS), "default": "text"},
            "text (pyinstrument's call tree), speedscope (JSON for speedscope.app) or html "
            "(pyinstrument's page)",
        ),
    )


# -- views -------------------------------------------------------------------------------


@attrs.frozen
class TaskView:
    """A trio task and the tasks its nurseries run."""

    name: str
    where: tuple[str, ...] = attrs.field(
        metadata={"description": "the frames it is suspended in, outermost first"}
    )
    children: tuple[TaskView, ...]
    waits_at: str | None = attrs.field(
        default=None,
        metadata={
            "description": "the innermost of its frames outside trio's own code: where it "
            "waits (trio's trap frame is the same for every task)"
        },
    )


@attrs.frozen
class TaskTree:
    """The trio task tree, from the root task."""

    count: int = attrs.field(metadata={"description": "tasks in the tree"})
    root: TaskView


@attrs.frozen
class ThreadView:
    """One thread and its Python stack."""

    name: str = attrs.field(metadata={"description": "the threading name, if it has one"})
    ident: int
    daemon: bool | None = attrs.field(metadata={"description": "null for a foreign thread"})
    stack: tuple[str, ...] = attrs.field(
        metadata={"description": "traceback entries, outermost first (innermost is running)"}
    )


@attrs.frozen
class ThreadList:
    """Every thread running Python code, the main thread first."""

    threads: tuple[ThreadView, ...]


@attrs.frozen
class HeapLine:
    """Live memory allocated by one line."""

    where: str = attrs.field(metadata={"description": "file:line"})
    size: int = attrs.field(metadata={"description": "bytes still allocated"})
    count: int = attrs.field(metadata={"description": "blocks still allocated"})


@attrs.frozen
class HeapSummary:
    """The lines holding the most live memory, of what tracemalloc has seen."""

    started_now: bool = attrs.field(
        metadata={"description": "this request started tracing: the next one shows more"}
    )
    tracing_since: float | None = attrs.field(
        metadata={"description": "Unix seconds; null when started outside the admin API"}
    )
    frames: int = attrs.field(
        metadata={"description": "frames kept per allocation (1 unless started otherwise)"}
    )
    traced_bytes: int = attrs.field(metadata={"description": "live memory traced, all lines"})
    peak_bytes: int
    overhead_bytes: int = attrs.field(metadata={"description": "what tracing itself holds"})
    note: str
    top: tuple[HeapLine, ...]


@attrs.frozen
class HeapStopped:
    """Tracing is off (and what it held is freed)."""

    was_tracing: bool


@attrs.frozen
class DebugStatus:
    """Which debugging aids are on: with none asked for, none is."""

    profiler_loaded: bool = attrs.field(
        metadata={"description": "pyinstrument is imported (by a profile request, or otherwise)"}
    )
    profile_running: bool
    profile_hook: bool = attrs.field(
        metadata={"description": "a profile or trace function is set on the event-loop thread"}
    )
    tracemalloc: bool = attrs.field(metadata={"description": "tracemalloc is tracing"})


# -- state ---------------------------------------------------------------------------------


@attrs.define
class _State:
    """Process-wide, as a profile hook and tracemalloc are."""

    profiling: bool = False
    heap_since: float | None = None


_STATE = _State()


def _where(frame: types.FrameType, lineno: int | None = None) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{lineno or frame.f_lineno} in {code.co_name}"


# -- handlers ------------------------------------------------------------------------------


async def status(app: AdminContext) -> Response:
    view = DebugStatus(
        profiler_loaded="pyinstrument" in sys.modules,
        profile_running=_STATE.profiling,
        profile_hook=sys.getprofile() is not None or sys.gettrace() is not None,
        tracemalloc=tracemalloc.is_tracing(),
    )
    return json_reply(200, unstructure(view))


def _task_view(task: trio.lowlevel.Task) -> tuple[TaskView, int]:
    count = 1
    children = []
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            view, n = _task_view(child)
            children.append(view)
            count += n
    frames = list(task.iter_await_frames())
    where = tuple(_where(frame, lineno) for frame, lineno in frames)
    ours = [_where(f, n) for f, n in frames if not _in_trio(f)]
    return TaskView(task.name, where, tuple(children), ours[-1] if ours else None), count


_TRIO = os.path.dirname(trio.__file__) + os.sep


def _in_trio(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_TRIO)


async def tasks(app: AdminContext) -> Response:
    task = trio.lowlevel.current_root_task()
    assert task is not None  # a handler runs inside trio.run
    root, count = _task_view(task)
    return json_reply(200, unstructure(TaskTree(count, root)))


async def threads(app: AdminContext) -> Response:
    known = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    views = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda kv: kv[0] != main):
        thread = known.get(ident)
        stack = tuple(traceback.format_stack(frame))
        name = thread.name if thread is not None else f"thread {ident}"
        daemon = thread.daemon if thread is not None else None
        views.append(ThreadView(name, ident, daemon, stack))
    return json_reply(200, unstructure(ThreadList(tuple(views))))


def _int_param(name: str, default: int, low: int, high: int) -> int:
    text = query().get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(
            400, f"{name}: expected a whole number, got {text!r}", "invalid_parameter", param=name
        ) from None
    if not low <= value <= high:
        raise ApiError(
            400,
            f"{name}: must be from {low} to {high}, got {value}",
            "invalid_parameter",
            param=name,
        )
    return value


async def profile(app: AdminContext) -> Response:
    limit = app.max_profile_seconds
    seconds = _int_param("seconds", min(DEFAULT_PROFILE_SECONDS, limit), 1, limit)
    fmt = query().get("format", "text")
    if fmt not in PROFILE_FORMATS:
        raise ApiError(
            400,
            f"format: must be one of {', '.join(PROFILE_FORMATS)}, got {fmt!r}",
            "invalid_parameter",
            param="format",
        )
    if _STATE.profiling:
        raise ApiError(409, "a profile is running: one at a time", "profile_running")
    if sys.getprofile() is not None:
        raise ApiError(
            409, "another profiler is hooked into the event-loop thread", "profile_running"
        )
    missing = extras.needs("a CPU profile", "profiling")
    if missing is not None:
        raise ApiError(501, missing, "profiler_missing")
    # Imported here: a server that is never profiled never loads the profiler.
    from pyinstrument import Profiler
    from pyinstrument.renderers import HTMLRenderer, SpeedscopeRenderer

    # "disabled": every task's frames on this thread, not only this handler's context.
    profiler = Profiler(interval=PROFILE_INTERVAL, async_mode="disabled")
    _STATE.profiling = True
    try:
        profiler.start()
        try:
            await trio.sleep(seconds)
        finally:
            profiler.stop()
    finally:
        _STATE.profiling = False

    def render() -> str:
        if fmt == "speedscope":
            return profiler.output(SpeedscopeRenderer())
        if fmt == "html":
            return profiler.output(HTMLRenderer())
        return profiler.output_text(unicode=False, color=False)

    # Rendering a long profile takes a while: off the loop (the session is finished).
    body = await trio.to_thread.run_sync(render)
    return Response(body, 200, content_type=PROFILE_FORMATS[fmt])


def _heap_stats(limit: int) -> tuple[list[HeapLine], int, int, int]:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<unknown>"),
        )
    )
    traced, peak = tracemalloc.get_traced_memory()
    top = [
        HeapLine(f"{s.traceback[0].filename}:{s.traceback[0].lineno}", s.size, s.count)
        for s in snapshot.statistics("lineno")[:limit]
    ]
    return top, traced, peak, tracemalloc.get_tracemalloc_memory()


async def heap_start(app: AdminContext) -> Response:
    """``POST``: start tracing (when off) and answer the summary."""
    return await _heap(start=True)


async def heap(app: AdminContext) -> Response:
    """``GET``: the summary while tracing; changes nothing (409 when off)."""
    return await _heap(start=False)


async def _heap(*, start: bool) -> Response:
    limit = _int_param("limit", DEFAULT_HEAP_LINES, 1, MAX_HEAP_LINES)
    started = not tracemalloc.is_tracing()
    if started and not start:
        raise ApiError(
            409,
            "tracemalloc is not tracing: POST /api/v1/debug/heap starts it "
            "(llmgw-ctl debug heap --start)",
            "not_tracing",
        )
    if started:
        tracemalloc.start(HEAP_FRAMES)
        _STATE.heap_since = time.time()
    try:
        # A snapshot of a large heap takes a while to group: off the loop.
        top, traced, peak, overhead = await trio.to_thread.run_sync(_heap_stats, limit)
    except RuntimeError:  # tracemalloc's "must be tracing": a DELETE came meanwhile
        raise ApiError(409, "tracing was stopped meanwhile: ask again", "not_tracing") from None
    if started:
        note = (
            "tracing started by this request: it shows only what was allocated since; "
            "ask again later, and DELETE /api/v1/debug/heap to stop (tracing slows "
            "every allocation)"
        )
    else:
        note = "live memory allocated since tracing started, by line"
    view = HeapSummary(
        started_now=started,
        tracing_since=_STATE.heap_since,
        frames=tracemalloc.get_traceback_limit(),
        traced_bytes=traced,
        peak_bytes=peak,
        overhead_bytes=overhead,
        note=note,
        top=tuple(top),
    )
    return json_reply(200, unstructure(view))


async def heap_stop(app: AdminContext) -> Response:
    was = tracemalloc.is_tracing()
    tracemalloc.stop()
    _STATE.heap_since = None
    return json_reply(200, unstructure(HeapStopped(was)))
