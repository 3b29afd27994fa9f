"""The engine's vocabulary: errors, options' value types, counters, interrupt answers,
and the per-run plan of each tool call.

Shared by every front door (``IdempotentToolNode``, ``IdempotencyMiddleware``,
``idempotent_task``); nothing here knows about ``ToolNode``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import operator
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.messages import ToolCall
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.types import interrupt
from pydantic import Field, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.errors import ConfigError, IdemSaverError
from langgraph_idem_saver.keys import KeyPolicy
from langgraph_idem_saver.ledger import (
    CallCounts,
    CallIntent,
    CallStatus,
    LedgerEntry,
    ToolCallLedger,
)

if TYPE_CHECKING:
    from langgraph_idem_saver.call_context import CallInfo
    from langgraph_idem_saver.engine.step_writes import StepWrites

# what the engine package exports (engine/__init__.py re-exports exactly these)
__all__ = [
    "NOT_APPLIED",
    "Batch",
    "IdempotencyConflict",
    "IdempotencyCounters",
    "Kind",
    "MiddlewareOrderError",
    "NoLedgerError",
    "NotAppliedError",
    "OnUnknown",
    "Plan",
    "ToolCallInProgress",
    "UnknownToolOutcome",
    "VerifyFn",
    "live",
]


class IdempotencyConflict(IdemSaverError):
    """Two calls share a ledger key but not their arguments.

    Replaying the other call's result would answer a different question, and running
    this one could duplicate an effect the key was meant to make unique, so the node
    refuses. Usually a ``key_fn`` that ignores an argument that matters, or a model that
    reused a tool call id.
    """


class ToolCallInProgress(IdemSaverError):
    """Another owner holds a live claim on this call and did not finish in time.

    Retry later: when it finishes the call is replayed; when its lease lapses it becomes
    an unknown outcome.
    """


class UnknownToolOutcome(IdemSaverError):
    """A claimed call never finished and nothing settled whether it took effect.

    Raised by the ``"raise"`` unknown-outcome policy (and for an inconsistent resume
    value). Settle it with the tool's ``verify`` hook, an ``interrupt`` answer, or the
    ledger's ``aresolve`` (operator), then run the graph again.
    """


class NoLedgerError(ConfigError):
    """The node found no ``ToolCallLedger``: neither ``ledger=`` nor the checkpointer."""


class MiddlewareOrderError(ConfigError):
    """``IdempotencyMiddleware`` is listed in an order where another middleware would
    defeat it: one that re-runs the tool inside our single claim (``ToolRetryMiddleware``
    listed after ours), or one that raises its own ``interrupt()`` inside our call
    (``HumanInTheLoopMiddleware(interrupt_mode="per_call")`` listed after ours: LangGraph
    hands a task's answers back by position, so after a crash our question would take
    its answer). Raised at the first tool call, before any tool runs; the message says
    which order to use.
    """


class NotAppliedError(Exception):
    """Raised by a tool to say "I failed and nothing happened": safe to run again.

    Any other exception from a ledgered tool is an *unknown outcome* (a timeout may come
    after the charge went through): the next attempt asks ``verify``, the ``on_unknown``
    policy or a human. Raise this (or list your own types in ``not_applied_errors=``)
    when the tool knows it failed before any side effect, e.g. a validation error or a
    card declined before charging. The claim is then released and the exception
    propagates as usual.
    """


class _NotApplied(enum.Enum):
    NOT_APPLIED = "NOT_APPLIED"

    def __repr__(self) -> str:
        return "NOT_APPLIED"


NOT_APPLIED = _NotApplied.NOT_APPLIED
"""Returned by a ``verify`` hook: the effect did not happen, so run the tool again."""

VerifyFn = Callable[[dict[str, Any]], Any]
"""``verify(args) -> result | NOT_APPLIED`` (sync or async): did an unknown call land?"""

OnUnknown = Literal["interrupt", "rerun", "fail", "raise"]
ON_UNKNOWN_VALUES: frozenset[str] = frozenset(("interrupt", "rerun", "fail", "raise"))

OnEarlierCall = Literal["ask", "run", "replay"]
"""What answers a call an earlier entry might answer without proof (``engine/earlier.py``)."""
ON_EARLIER_CALL_VALUES: frozenset[str] = frozenset(("ask", "run", "replay"))

READ_ONLY_METADATA_KEY = "idempotent_read_only"
"""Tool ``metadata`` flag: ``{"idempotent_read_only": True}`` skips the ledger."""


@dataclass
class IdempotencyCounters(CallCounts):
    """In-process counters of what the node did (for tests, logs and benchmarks). Bumped
    under a lock: a sync graph runs a step's tool calls on a thread pool, and ``+=`` on
    an attribute is not atomic across threads."""

    adopted: int = 0
    read_only: int = 0
    released: int = 0
    abandoned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)
        if telemetry.ENABLED:
            telemetry.count(name, by)  # the same count as an OpenTelemetry metric


# --- resume values of the unknown-outcome interrupt ---------------------------------------


class _ResumeCompleted(TypedDict):
    action: Literal["completed"]
    result: Any
    key: NotRequired[str]
    attempt: NotRequired[int]


class _ResumeRerun(TypedDict):
    action: Literal["rerun"]
    key: NotRequired[str]
    attempt: NotRequired[int]


class _ResumeFailed(TypedDict):
    action: Literal["failed"]
    error: str
    key: NotRequired[str]
    attempt: NotRequired[int]


UnknownOutcomeResume = Annotated[
    _ResumeCompleted | _ResumeRerun | _ResumeFailed, Field(discriminator="action")
]
"""What ``Command(resume=...)`` may answer to an ``unknown_tool_outcome`` interrupt."""

RESUME_ADAPTER: TypeAdapter[Any] = TypeAdapter(UnknownOutcomeResume)
# LangGraph >= 1.1 validates resume values against ``response_schema`` and does not save
# invalid ones (the interrupt can be answered again); older versions lack the parameter.
INTERRUPT_HAS_SCHEMA = "response_schema" in inspect.signature(interrupt).parameters


# --- per-run planning ----------------------------------------------------------------------


class Kind(enum.Enum):
    SKIP = "skip"  # not ledgered: read-only or unregistered tool
    PENDING = "pending"  # being settled
    RUN = "run"  # we hold the claim: run the tool, then finish
    REPLAY = "replay"  # return the recorded result
    RETURN = "return"  # return a result settled during planning (verify/interrupt/fail)
    FOLLOW = "follow"  # same key as an earlier call of this batch: reuse its result


@dataclass(eq=False, init=False)
class Plan:
    """What one tool call of a run will do, decided step by step while planning.

    Built with its call alone: the other fields' defaults are the class's attributes
    until planning sets them on the plan. A step makes one per call (50 in a wide step),
    and a dataclass ``__init__`` setting all twelve fields was ~35 bytecodes a call,
    more than the slots it replaced saved on reads."""

    def __init__(self, call: ToolCall, kind: Kind = Kind.SKIP) -> None:
        self.call, self.kind = call, kind

    call: ToolCall
    kind: Kind = Kind.SKIP
    intent: CallIntent | None = None
    policy: KeyPolicy = "tool_call"
    ledger_key: str | None = None  # the row we act on (an adopted orphan's key differs)
    entry: LedgerEntry | None = None
    result: Any = None
    leader: Plan | None = None
    owned: bool = False  # we hold an ``issued`` claim on (scope, ledger_key)
    started: bool = False  # the tool was handed to ToolNode (its effect may have happened)
    # the entry is a lost call of the same step with other arguments (adoption.
    # aadopt_superseded): settled by it, and run only if it did not happen
    superseded: bool = False
    # published to calls of the step that share this call's key (``Kind.FOLLOW``); made
    # while planning, only for a call that has such followers (most have none)
    outcome: concurrent.futures.Future[Any] | None = None
    # what ``current_call()`` answers while it runs, made when first asked for
    call_info: CallInfo | None = None


@dataclass(eq=False, init=False)
class Batch:
    """The tool calls of one front-door run (a ToolNode step, or one middleware call)
    and what they share: the ledger, its loop and serializer, the scope, the state.

    Built with ``sync`` alone: the fields with an immutable default keep the class's
    until the run sets them (as :class:`Plan`'s; a front door makes one a run, and the
    dataclass ``__init__`` of its seventeen fields was most of a lone call's planning)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.plans, self.repeats, self.all_plans = {}, {}, []
        self.origins, self.reused_ids, self.pairs, self.read_only = {}, set(), [], {}

    sync: bool
    # the plan each call id is answered with next (``take``): its first call's, then,
    # for an id the step repeats, the next of ``repeats`` once that one is taken
    plans: dict[str, Plan]
    repeats: dict[str, deque[Plan]]
    all_plans: list[Plan]
    # the id of the newest message of the visible state carrying each tool call id
    origins: dict[str, str]
    reused_ids: set[str]  # ids found in several messages
    pairs: list[tuple[str, str]]  # (call id, message id)
    read_only: dict[str, bool]  # per tool name, this run
    ledger: ToolCallLedger | None = None
    ledger_loop: asyncio.AbstractEventLoop | None = None
    serde: SerializerProtocol | None = None
    scope: str = ""
    # tool call ids of every AIMessage in the visible state (None: no state visible)
    known_ids: set[str] | None = None
    # the engine's owner id, read once when the run is prepared (``LedgerEngine.owner``)
    owner: str = ""
    # outcomes handed over and not yet awaited (``LedgerEngine.outcomes_at_end``); None:
    # each call awaits its own
    outcomes: StepWrites | None = None
    # its calls open ``execute_tool`` spans: an SDK tracer provider was set when the run
    # was prepared (``telemetry.traced_prepare``), asked once a run, not once a call
    traced: bool = False

    def add(self, plan: Plan) -> None:
        call_id = str(plan.call["id"])
        if call_id in self.plans:
            self.repeats.setdefault(call_id, deque()).append(plan)
        else:
            self.plans[call_id] = plan
        self.all_plans.append(plan)

    def take(self, call_id: str) -> Plan | None:
        """The plan of the next call of ``call_id`` (taken: each plan answers one call,
        in call order), None when the step planned no (more) call of that id."""
        plan = self.plans.pop(call_id, None)
        if plan is not None and self.repeats:
            queue = self.repeats.get(call_id)
            if queue:
                self.plans[call_id] = queue.popleft()
        return plan


_KIND = operator.attrgetter("kind")
_INTENT = operator.attrgetter("intent")


def of_kind(plans: list[Plan], kind: Kind) -> list[Plan]:
    """The plans of ``kind``, in order: ``compress`` over ``map``, no Python frame a plan
    (a wide step filters its 50 plans twice while it is prepared)."""
    return list(compress(plans, map(operator.is_, map(_KIND, plans), repeat(kind))))


def intents_of(plans: list[Plan]) -> list[CallIntent]:
    """The intents of planned calls (``LedgerEngine.aprepare`` sets one on every plan
    it claims; no ``cast()`` per plan: a wide step builds this list for 50)."""
    return list(map(_INTENT, plans))


def live(entry: LedgerEntry) -> bool:
    """Issued and still within its lease: someone may be running it right now."""
    return entry.status is CallStatus.ISSUED and not entry.is_unknown()
