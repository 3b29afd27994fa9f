"""OpenTelemetry spans and metrics for the ledger, when ``opentelemetry-api`` is installed.

Operators already watch OpenTelemetry (DBOS and Temporal emit spans and metrics for every
step); this makes the ledger visible there: a span for each step's claim, each tool call
run through the ledger (``execute_tool {gen_ai.tool.name}``, OpenTelemetry's GenAI
convention), each replay, each unknown-outcome decision (a ``verify`` call, a policy, a
question to a human) and each operator resolution; counters of what happened and
histograms of claim and outcome-commit latency.

Without OpenTelemetry nothing changes: :data:`ENABLED` is one ``find_spec`` at import
(nothing imported), and the engine's hooks are decorators that return the function
itself when it is False - no wrapper at all. With only the API installed (no SDK) the
spans are OpenTelemetry's no-op ones. Install the ``[otel]`` extra and configure an SDK
``TracerProvider``/``MeterProvider`` as for any instrumented library.

The OpenTelemetry modules are imported on first use (:func:`_otel`); every name of theirs
used here is read through that one object.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import operator
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from langgraph_idem_saver.engine.types import Batch, Plan

__all__ = ["ENABLED", "ToolSpan", "observe_unknown"]

ENABLED: bool = importlib.util.find_spec("opentelemetry") is not None
"""Whether ``opentelemetry`` can be imported (checked once, without importing it)."""

SCOPE = "langgraph_idem_saver"

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# engine counter name (``IdempotencyCounters.bump``) -> metric name
COUNTER_NAMES = {
    "executed": "idem.calls.ran",
    "replayed": "idem.calls.replayed",
    "conflicts": "idem.calls.conflicts",
    "abandoned": "idem.unknown.raised",
    "unknown": "idem.unknown.decided",
    "adopted": "idem.calls.adopted",
    "released": "idem.calls.released",
}
EXTRA_COUNTERS = {
    "idem.calls.claimed": "ledgered calls claimed to run (a first run or a re-run)",
    "idem.calls.verified": "unknown outcomes a verify hook settled as done",
    "idem.calls.rerun": "unknown outcomes decided to run again (policy, verify, operator)",
    "idem.unknown.settled": "unknown outcomes settled without asking (verify, policy)",
    "idem.unknown.resolved": "unknown outcomes an operator resolved",
}


class _Otel:
    """The OpenTelemetry API, its tracer, and the instruments, made once."""

    def __init__(self) -> None:
        from opentelemetry import context, metrics, trace

        self.context = context
        self.trace = trace
        self.tracer = trace.get_tracer(SCOPE)
        # providers that record nothing: the API's own, before an SDK is configured
        self.silent = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self.no_span = contextlib.nullcontext(trace.INVALID_SPAN)
        self.traced = False
        meter = metrics.get_meter(SCOPE)
        self.counters = {
            name: meter.create_counter(name, unit="{call}", description=f"engine: {key}")
            for key, name in COUNTER_NAMES.items()
        }
        for name, description in EXTRA_COUNTERS.items():
            self.counters[name] = meter.create_counter(name, unit="{call}", description=description)
        self.claim_seconds = meter.create_histogram(
            "idem.claim.duration",
            unit="s",
            description="a step's keys, claim and settling (LedgerEngine.aprepare)",
        )
        self.outcome_seconds = meter.create_histogram(
            "idem.outcome.duration",
            unit="s",
            description="committing a call's (or a step's) outcomes",
        )
        self.observation = metrics.Observation
        meter.create_observable_gauge(
            "idem.unknown.waiting",
            callbacks=[_observe_waiting],
            unit="{call}",
            description="unknown outcomes waiting for verify, a human or an operator",
        )

    def tracing(self) -> bool:
        """Whether an SDK (or any real provider) takes spans: with the API alone every
        span is a no-op, not worth making (a few microseconds a tool call)."""
        if self.traced:
            return True  # a provider, once set, stays (OpenTelemetry sets it once)
        self.traced = not isinstance(self.trace.get_tracer_provider(), self.silent)
        return self.traced

    def span(self, name: str, attributes: dict[str, Any] | None = None) -> Any:
        """``start_as_current_span``, or a context of the no-op span when not tracing."""
        if not self.tracing():
            return self.no_span
        return self.tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False, set_status_on_exception=False
        )

    def error(self, span: Any, exc: BaseException | None) -> None:
        """Mark ``span`` failed by ``exc`` - unless it is LangGraph's control flow (an
        ``interrupt()`` bubbling up is a question, not an error)."""
        if exc is None or not isinstance(exc, Exception) or _control_flow(exc):
            return
        span.record_exception(exc)
        span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, type(exc).__name__))


_loaded: _Otel | None = None


def _otel() -> _Otel:
    global _loaded
    if _loaded is None:
        _loaded = _Otel()
    return _loaded


# the ledgers whose waiting unknown outcomes the gauge reports (observe_unknown)
_WATCHED: dict[int, tuple[str, Any]] = {}
_WATCHED_LOCK = threading.Lock()
WAITING_TIMEOUT_SECONDS = 10.0


def observe_unknown(ledger: Any, *, name: str = "default") -> Callable[[], None]:
    """Report ``ledger``'s unknown outcomes waiting (``alist_unknown``: issued, never
    finished, lease lapsed) as the observable gauge ``idem.unknown.waiting``, with
    ``idem.backend`` (its class) and ``idem.ledger`` (``name``) - one database read at
    each metric collection, on the ledger's own loop. Returns a function that stops it.

    A collection made on the ledger's own loop thread cannot wait for that loop, so it
    reports nothing for this ledger (an SDK's periodic reader collects in its own thread).
    Without OpenTelemetry this registers nothing."""
    if not ENABLED:
        return lambda: None
    _otel()  # the gauge exists once something is watched
    with _WATCHED_LOCK:
        _WATCHED[id(ledger)] = (name, ledger)

    def stop() -> None:
        with _WATCHED_LOCK:
            _WATCHED.pop(id(ledger), None)

    return stop


def _observe_waiting(options: Any) -> Iterator[Any]:
    with _WATCHED_LOCK:
        watched = list(_WATCHED.values())
    for name, ledger in watched:
        waiting = _count_waiting(ledger)
        if waiting is not None:
            attributes = {"idem.backend": type(ledger).__name__, "idem.ledger": name}
            yield _otel().observation(waiting, attributes)


def _count_waiting(ledger: Any) -> int | None:
    """How many unknown outcomes ``ledger`` holds, read on its loop (None: not now)."""
    loop = getattr(ledger, "loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    try:
        if asyncio.get_running_loop() is loop:
            return None  # would wait for the loop this thread runs
    except RuntimeError:
        pass  # no loop in this thread: the usual case (a reader's thread)
    future = asyncio.run_coroutine_threadsafe(ledger.alist_unknown(), loop)
    try:
        return len(future.result(timeout=WAITING_TIMEOUT_SECONDS))
    except Exception:
        future.cancel()
        return None


def _control_flow(exc: BaseException) -> bool:
    from langgraph.errors import GraphBubbleUp

    return isinstance(exc, GraphBubbleUp)


def tracing() -> bool:
    """Whether spans are recorded (an SDK's tracer provider is set)."""
    return _otel().tracing()


def count(name: str, by: int = 1) -> None:
    """Add ``by`` to the metric of engine counter ``name`` (or a metric name)."""
    metric = COUNTER_NAMES.get(name, name)
    counter = _otel().counters.get(metric)
    if counter is not None:
        counter.add(by)


class ToolSpan:
    """The open ``execute_tool`` span of a call the ledger runs, current while it runs
    (so spans the tool makes - an HTTP client's, a model's - are its children)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span, self.token = span, token

    def end(self, exc: BaseException | None) -> None:
        otel = _otel()
        if exc is not None:
            otel.error(self.span, exc)
            if _control_flow(exc):
                self.span.set_attribute("idem.outcome", "asked")  # interrupt() in the tool
        otel.context.detach(self.token)
        self.span.end()


def tool_span(batch: Batch, plan: Plan) -> ToolSpan:
    """Open and make current the span of a call about to run (``call_context.in_call``).

    Its attributes are read off the plan (no :class:`CallInfo`, whose vendor key is a
    digest): an SDK span costs tens of microseconds already, once per tool call."""
    otel = _otel()
    entry, intent, call = plan.entry, plan.intent, plan.call
    name = call["name"]
    span = otel.tracer.start_span(
        f"execute_tool {name}",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": str(call.get("id")),
            "idem.key": plan.ledger_key or "",
            "idem.attempt": entry.attempts if entry is not None else 1,
            "idem.thread_id": intent.thread_id if intent is not None else "",
            "idem.agent_path": intent.agent_path if intent is not None else "",
            "idem.outcome": "ran",
        },
    )
    token = otel.context.attach(otel.trace.set_span_in_context(span))
    return ToolSpan(span, token)


def _backend(batch: Any) -> str:
    return type(batch.ledger).__name__ if batch.ledger is not None else ""


def _plans_attributes(batch: Any) -> dict[str, Any]:
    from langgraph_idem_saver.engine.types import Kind

    plans = [p for p in batch.all_plans if p.kind is not Kind.SKIP]
    intent = next((p.intent for p in plans if p.intent is not None), None)
    return {
        "idem.thread_id": intent.thread_id if intent is not None else "",
        "idem.agent_path": intent.agent_path if intent is not None else "",
        "idem.calls": len(plans),
        "idem.backend": _backend(batch),
    }


_KIND = operator.attrgetter("kind")  # of a plan


def traced_prepare(fn: F) -> F:
    """``LedgerEngine.aprepare`` in an ``idem.claim`` span, timed, its claims counted
    (:func:`claim_span`)."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def aprepare(engine: Any, batch: Any, config: Any) -> None:
        with claim_span(batch):
            await fn(engine, batch, config)

    return cast(F, aprepare)


@contextlib.contextmanager
def claim_span(batch: Any) -> Iterator[None]:
    """A step's preparation in an ``idem.claim`` span, timed, its claims counted; only
    when the step has a call to claim. ``traced_prepare`` wraps ``aprepare`` in it; a
    sync front door that prepares outside ``aprepare`` (``engine.prepare``) opens it
    itself, in the node's thread and context.

    Whether a run's calls open spans is decided here, once a run (``Batch.traced``):
    asking OpenTelemetry for its provider reads the environment while none is set, and
    a wide step runs 50 calls. Without a provider the span's attributes (passes over
    the plans) are not computed either; the metrics are recorded either way."""
    from langgraph_idem_saver.engine.types import Kind

    if not ENABLED or not any(p.kind is Kind.PENDING for p in batch.all_plans):
        yield
        return
    otel = _otel()
    traced = batch.traced = otel.tracing()
    started = time.perf_counter()
    with otel.span("idem.claim") if traced else otel.no_span as span:
        try:
            yield
        except BaseException as exc:
            otel.error(span, exc)
            raise
        finally:
            if traced:
                span.set_attributes(_plans_attributes(batch))
            otel.claim_seconds.record(
                time.perf_counter() - started, {"idem.backend": _backend(batch)}
            )
        running = list(map(_KIND, batch.all_plans)).count(Kind.RUN)
        if traced:
            span.set_attribute("idem.claimed", running)
            # given the entry of a lost call (an orphan, a reworded call) or a fork slot's
            span.set_attribute("idem.adopted", sum(_adopted(p) for p in batch.all_plans))
        if running:
            otel.counters["idem.calls.claimed"].add(running)


def _adopted(plan: Any) -> bool:
    entry, intent = plan.entry, plan.intent
    return entry is not None and intent is not None and entry.key != intent.key


def traced_answer(fn: F) -> F:
    """``LedgerEngine.aanswer`` in a span: ``idem.replay {tool}`` for a replayed call
    (no ``execute_tool`` span: the tool does not run), ``idem.answer {tool}`` for one
    settled while planning (``verify``, a human's answer, ``on_unknown="fail"``)."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def aanswer(engine: Any, batch: Any, plan: Any) -> Any:
        from langgraph_idem_saver.engine.types import Kind

        if plan.kind is Kind.SKIP or not _otel().tracing():
            return await fn(engine, batch, plan)
        replay = plan.kind in (Kind.REPLAY, Kind.FOLLOW)
        entry = plan.entry if plan.kind is not Kind.FOLLOW else plan.leader.entry
        attributes = {
            "gen_ai.tool.name": str(plan.call["name"]),
            "gen_ai.tool.call.id": str(plan.call.get("id")),
            "idem.key": entry.key if entry is not None else "",
            "idem.attempt": entry.attempts if entry is not None else 0,
            "idem.outcome": "replayed" if replay else _settled_outcome(entry),
            **_plans_attributes(batch),
        }
        del attributes["idem.calls"]
        name = "idem.replay" if replay else "idem.answer"
        with _otel().span(f"{name} {plan.call['name']}", attributes):
            return await fn(engine, batch, plan)

    return cast(F, aanswer)


def _settled_outcome(entry: Any) -> str:
    from langgraph_idem_saver.ledger import CallStatus

    if entry is None or entry.status is CallStatus.ISSUED:
        return "refused"  # on_unknown="fail": left for an operator
    return "verified"


def traced_decision(fn: F) -> F:
    """``unknown.adecide`` in a span: ``idem.verify {tool}`` when the tool's ``verify``
    hook decides, else ``idem.unknown_outcome {tool}``; ``idem.outcome`` says what was
    decided (verified / rerun / refused / asked)."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def adecide(engine: Any, batch: Any, plan: Any, *, sole: bool) -> tuple[str, Any]:
        from langgraph_idem_saver.engine.nested import orchestrates

        entry = plan.entry
        name = str(plan.call["name"])
        if entry.rerun_approved():
            by = "operator"
        elif orchestrates(entry):
            by = "nested"
        elif engine.options.verify.get(name) is not None:
            by = "verify"
        else:
            by = str(engine.options.on_unknown_for(name))
        otel = _otel()
        attributes = {
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": str(plan.call.get("id")),
            "idem.key": entry.key,
            "idem.attempt": entry.attempts,
            "idem.decided_by": by,
            "idem.thread_id": entry.thread_id,
            "idem.agent_path": entry.agent_path,
        }
        span_name = f"idem.verify {name}" if by == "verify" else f"idem.unknown_outcome {name}"
        with otel.span(span_name, attributes) as span:
            try:
                decision: tuple[str, Any] = await fn(engine, batch, plan, sole=sole)
            except BaseException as exc:
                span.set_attribute("idem.outcome", "asked" if _control_flow(exc) else "refused")
                otel.error(span, exc)
                raise
            action = decision[0]
            outcome = {"completed": "verified", "rerun": "rerun", "fail": "refused"}.get(
                action, "failed"
            )
            if by == "interrupt" and action != "fail":
                outcome = "asked"  # a human's answer, applied
            span.set_attribute("idem.outcome", outcome)
            if action == "rerun":
                otel.counters["idem.calls.rerun"].add(1)
            if by == "verify" and action == "completed":
                otel.counters["idem.calls.verified"].add(1)
            if by != "interrupt" and action != "fail":
                otel.counters["idem.unknown.settled"].add(1)
            return decision

    return cast(F, adecide)


def traced_resolution(fn: F) -> F:
    """``inspection.aresolve_unknown`` in an ``idem.resolve {tool}`` span (an operator's
    decision), counted in ``idem.unknown.resolved``."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def aresolve(ledger: Any, entry: Any, resolution: str, **kwargs: Any) -> Any:
        otel = _otel()
        attributes = {
            "gen_ai.tool.name": entry.tool_name,
            "gen_ai.tool.call.id": entry.tool_call_id,
            "idem.key": entry.key,
            "idem.attempt": entry.attempts,
            "idem.thread_id": entry.thread_id,
            "idem.agent_path": entry.agent_path,
            "idem.outcome": "resolved",
            "idem.resolution": str(resolution),
            "idem.backend": type(ledger).__name__,
        }
        with otel.span(f"idem.resolve {entry.tool_name}", attributes):
            settled = await fn(ledger, entry, resolution, **kwargs)
        otel.counters["idem.unknown.resolved"].add(1)
        return settled

    return cast(F, aresolve)


def traced_outcomes(fn: F) -> F:
    """Time an outcome commit (``arecord``: a call's own, ``aoutcomes``: a step's)."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            _otel().outcome_seconds.record(time.perf_counter() - started)

    return cast(F, timed)
