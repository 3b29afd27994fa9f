"""``current_call()``: the ledgered call's own key, inside the call.

Most payment, email and messaging APIs dedupe by a key the caller sends (Stripe's
``Idempotency-Key``, a message id, a producer's dedup id). A tool that hands its vendor
the ledger's key for the call makes a re-run after a crash a no-op at the vendor: with
``on_unknown="rerun"`` that is exactly once without a ``verify`` hook or a human.

The key is derived from the ledger row the call acts on (its scope and key: an adopted
orphan's or a reworded call's entry, not the key the call would have minted), so it is
the same on every attempt, retry and resume of one logical call and differs for any
other call. It is ``idem-`` and 40 hex digits of a SHA-256: short, ASCII, and safe in an
HTTP header.

Set by the front doors where a planned call starts running (:func:`in_call`): in the
tool's own thread for a sync tool (LangChain's executors copy the context into it), in
the tool's task for an async one. The same spot opens the tool's telemetry span
(``telemetry.py``), so this module is the one place a running call is entered.
"""

from __future__ import annotations

import contextvars
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.errors import IdemSaverError

if TYPE_CHECKING:
    from langgraph_idem_saver.engine.types import Batch, Plan

__all__ = ["CallInfo", "NotInLedgeredCall", "current_call", "in_call", "vendor_key"]

KEY_PREFIX = "idem-"


class NotInLedgeredCall(IdemSaverError):
    """``current_call()`` was asked outside a call the ledger is running (a read-only
    tool, a tool under a plain ``ToolNode``, or code outside any tool): there is no
    ledger key to hand a vendor."""


@dataclass(frozen=True, slots=True)
class CallInfo:
    """The running ledgered call: ``key`` for the vendor, ``attempt`` (1 on the first
    run, 2 on the first re-run...), and where it comes from."""

    key: str
    attempt: int
    tool_name: str
    tool_call_id: str
    thread_id: str
    agent_path: str
    ledger_key: str


# the running call, as (its run's batch, its plan): set by ``in_call``, or directly by a
# front door's path that opens no span (``IdempotentToolNode``'s untraced step: a tuple,
# not an object with methods, a call of a 50-call step). The CallInfo is made when first
# asked for, and kept on the plan.
RUNNING_CALL: contextvars.ContextVar[tuple[Batch, Plan] | None] = contextvars.ContextVar(
    "langgraph_idem_saver_current_call", default=None
)


def vendor_key(scope: str, ledger_key: str) -> str:
    """The vendor-safe key of the ledger row (``scope``, ``ledger_key``)."""
    digest = hashlib.sha256(f"{scope}\x00{ledger_key}".encode()).hexdigest()
    return KEY_PREFIX + digest[:40]


def current_call() -> CallInfo:
    """The ledgered call running here; :class:`NotInLedgeredCall` outside one."""
    running = RUNNING_CALL.get()
    if running is None:
        raise NotInLedgeredCall(
            "current_call() is only available inside a tool run through the ledger "
            "(IdempotentToolNode, IdempotencyMiddleware, idempotent_task) and not for a "
            "read-only tool: there is no ledger key here"
        )
    return info_of(*running)


def info_of(batch: Batch, plan: Plan) -> CallInfo:
    """The :class:`CallInfo` of a planned ``RUN`` call (its entry is the row it acts on),
    made once a plan: a plan is run once, and what it acts on is settled by then."""
    info = plan.call_info
    if info is None:
        info = plan.call_info = _made_info(batch, plan)
    return info


def _made_info(batch: Batch, plan: Plan) -> CallInfo:
    entry = plan.entry
    intent = plan.intent
    ledger_key = plan.ledger_key or (entry.key if entry is not None else "")
    return CallInfo(
        key=vendor_key(batch.scope, ledger_key),
        attempt=entry.attempts if entry is not None else 1,
        tool_name=str(plan.call["name"]),
        tool_call_id=str(plan.call.get("id")),
        thread_id=intent.thread_id if intent is not None else "",
        agent_path=intent.agent_path if intent is not None else "",
        ledger_key=ledger_key,
    )


class in_call:  # a context manager, named as one
    """Around the run of a planned ``RUN`` call's tool: :func:`current_call` answers it,
    and its ``execute_tool`` span is open (when the run is traced: ``Batch.traced``). A
    class with slots, not a generator: entered once per call (the engine's ``Running``
    is one, entered from its ``__aenter__``/``__aexit__``). Only what a call needs is
    set: the :class:`CallInfo` (a digest, a dataclass) is made only when asked for -
    most tools never call :func:`current_call` - and the span and the context
    variable's token when it is entered."""

    __slots__ = ("batch", "plan", "span", "token")
    span: telemetry.ToolSpan | None
    token: contextvars.Token[tuple[Batch, Plan] | None]

    def __init__(self, batch: Batch, plan: Plan) -> None:
        self.batch, self.plan = batch, plan

    @property
    def info(self) -> CallInfo:
        return info_of(self.batch, self.plan)

    def __enter__(self) -> in_call:
        self.token = RUNNING_CALL.set((self.batch, self.plan))
        self.span = telemetry.tool_span(self.batch, self.plan) if self.batch.traced else None
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        span = self.span
        if span is not None:
            self.span = None
            span.end(exc)
        RUNNING_CALL.reset(self.token)
