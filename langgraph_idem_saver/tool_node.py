"""``IdempotentToolNode``: LangGraph's ``ToolNode`` plus a durable tool-call ledger.

Every side-effecting tool call is *claimed* in the ledger (an ``issued`` row, committed)
before the tool runs and *finished* (``completed``/``failed`` with the serialized result)
before the node returns. When LangGraph re-runs the node - after a crash, a resume, a
retry, or a second process picking the thread up - calls already recorded are replayed
from the ledger instead of running again, and calls whose outcome is unknown (the process
died between claim and finish) are never silently re-run: a ``verify`` hook, a policy, or
a human (``interrupt``) decides.

How it hooks into ``ToolNode``
------------------------------
``ToolNode``'s ``wrap_tool_call`` hooks see one call at a time, and any exception they
raise is turned into an error ``ToolMessage`` when ``handle_tool_errors`` allows it. The
ledger needs the whole batch (all parallel calls of one node run are claimed in ONE
transaction) and its own errors (conflicts, calls in progress elsewhere) must reach the
caller, not the model. So the node overrides the two levels of ``ToolNode``:

* ``_afunc``/``_func`` (one node run): parse the calls, compute keys, adopt orphans,
  claim everything in one ``aclaim``, settle existing entries (replay, conflict, wait,
  unknown outcome) *sequentially in call order* - which keeps ``interrupt()`` indices
  stable - and then hand over to ``ToolNode`` unchanged;
* ``_arun_one``/``_run_one`` (one call): replay, or run the unchanged ``ToolNode`` path -
  the user's ``wrap_tool_call``/``awrap_tool_call``, injection, ``handle_tool_errors``,
  ``Command`` validation - and record its outcome.

So the user's wrappers run *inside* ours, and on replay they do not run at all.

Finding the ledger
------------------
``ledger=`` if given, else the graph's checkpointer (LangGraph puts it in
``config["configurable"]["__pregel_checkpointer"]``, also for subgraphs) when it
implements :class:`~langgraph_idem_saver.ledger.ToolCallLedger` - our savers do. If
neither, the node raises :class:`NoLedgerError` when it runs: it never runs a
side-effecting tool unprotected.

Sync ``invoke``
---------------
The ledger is async-only. In sync mode the node runs its (async) bookkeeping on a
private event loop in the node's own thread, so that ``interrupt()``, ``get_config()``
and the tools see the node's context, and sends each ledger coroutine to the loop the
ledger lives on (``ledger.loop``, as LangGraph's ``AsyncSqliteSaver`` sync bridge does)
with ``asyncio.run_coroutine_threadsafe``. Ledgers without a ``loop`` attribute are
awaited on the private loop. Calling ``graph.invoke`` on the ledger's own loop thread
would deadlock, so it is refused (use ``ainvoke`` there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import dataclasses
import enum
import inspect
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallWrapper,
    ToolInvocationError,
    ToolNode,
    ToolRuntime,
    _default_handle_tool_errors,
    msg_content_output,
)
from langgraph.runtime import Runtime
from langgraph.types import Command, Send, interrupt
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from langgraph_idem_saver.errors import (
    ConfigError,
    CorruptRecordError,
    IdemSaverError,
    SerializationError,
)
from langgraph_idem_saver.keys import (
    KeyContext,
    KeyPolicy,
    agent_path_of,
    args_hash,
    canonical_args,
    compute_key,
    scope_of,
    storable_call_id,
    tool_call_keys,
)
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    LedgerEntry,
    ToolCallLedger,
    make_owner,
    minted_here,
)

__all__ = [
    "NOT_APPLIED",
    "IdempotencyConflict",
    "IdempotencyCounters",
    "IdempotentToolNode",
    "NoLedgerError",
    "NotAppliedError",
    "OnUnknown",
    "ToolCallInProgress",
    "UnknownToolOutcome",
    "VerifyFn",
]

T = TypeVar("T")

# --- public types ------------------------------------------------------------------------


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
_ON_UNKNOWN_VALUES: frozenset[str] = frozenset(("interrupt", "rerun", "fail", "raise"))

READ_ONLY_METADATA_KEY = "idempotent_read_only"
"""Tool ``metadata`` flag: ``{"idempotent_read_only": True}`` skips the ledger."""


@dataclass
class IdempotencyCounters:
    """In-process counters of what the node did (for tests, logs and benchmarks)."""

    executed: int = 0
    replayed: int = 0
    unknown: int = 0
    conflicts: int = 0
    adopted: int = 0
    read_only: int = 0
    released: int = 0
    abandoned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    def as_dict(self) -> dict[str, int]:
        return {
            k: int(getattr(self, k))
            for k in (
                "executed",
                "replayed",
                "unknown",
                "conflicts",
                "adopted",
                "read_only",
                "released",
                "abandoned",
            )
        }


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

_RESUME_ADAPTER: TypeAdapter[Any] = TypeAdapter(UnknownOutcomeResume)
# LangGraph >= 1.1 validates resume values against ``response_schema`` and does not save
# invalid ones (the interrupt can be answered again); older versions lack the parameter.
_INTERRUPT_HAS_SCHEMA = "response_schema" in inspect.signature(interrupt).parameters


# --- per-run planning ----------------------------------------------------------------------


class _Kind(enum.Enum):
    SKIP = "skip"  # not ledgered: read-only or unregistered tool
    PENDING = "pending"  # being settled
    RUN = "run"  # we hold the claim: run the tool, then finish
    REPLAY = "replay"  # return the recorded result
    RETURN = "return"  # return a result settled during planning (verify/interrupt/fail)
    FOLLOW = "follow"  # same key as an earlier call of this batch: reuse its result


@dataclass(eq=False)
class _Plan:
    call: ToolCall
    kind: _Kind = _Kind.SKIP
    intent: CallIntent | None = None
    policy: KeyPolicy = "tool_call"
    ledger_key: str | None = None  # the row we act on (an adopted orphan's key differs)
    entry: LedgerEntry | None = None
    result: Any = None
    leader: _Plan | None = None
    owned: bool = False  # we hold an ``issued`` claim on (scope, ledger_key)
    started: bool = False  # the tool was handed to ToolNode (its effect may have happened)
    outcome: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


@dataclass(eq=False)
class _Batch:
    node: IdempotentToolNode
    sync: bool
    plans: dict[str, deque[_Plan]] = field(default_factory=dict)
    all_plans: list[_Plan] = field(default_factory=list)
    ledger: ToolCallLedger | None = None
    ledger_loop: asyncio.AbstractEventLoop | None = None
    serde: SerializerProtocol | None = None
    scope: str = ""
    # tool call ids of every AIMessage in the visible state (None: no state visible), and
    # the id of the newest message carrying each
    known_ids: set[str] | None = None
    origins: dict[str, str] = field(default_factory=dict)
    reused_ids: set[str] = field(default_factory=set)  # ids found in several messages
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (call id, message id)

    def add(self, plan: _Plan) -> None:
        self.plans.setdefault(str(plan.call["id"]), deque()).append(plan)
        self.all_plans.append(plan)

    def take(self, call: ToolCall) -> _Plan | None:
        queue = self.plans.get(str(call["id"]))
        return queue.popleft() if queue else None


_BATCH: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar(
    "langgraph_idem_saver_tool_batch", default=None
)

# Tool call ids that adopted an orphan in this process (bounded, most recent kept). An
# entry adopted by one of them belongs to a live run here, maybe a sibling task whose
# message exists only in memory: never re-adopted (see ``_aadopt_orphans``).
_ADOPTED_HERE: OrderedDict[str, None] = OrderedDict()
_ADOPTED_HERE_MAX = 4096
_ADOPTED_HERE_LOCK = threading.Lock()


def _note_adopted_here(tool_call_id: str) -> None:
    with _ADOPTED_HERE_LOCK:
        _ADOPTED_HERE[tool_call_id] = None
        _ADOPTED_HERE.move_to_end(tool_call_id)
        while len(_ADOPTED_HERE) > _ADOPTED_HERE_MAX:
            _ADOPTED_HERE.popitem(last=False)


def _adopted_here(tool_call_id: str | None) -> bool:
    return tool_call_id is not None and tool_call_id in _ADOPTED_HERE


if hasattr(os, "register_at_fork"):  # a forked child runs nothing its parent adopted
    os.register_at_fork(after_in_child=_ADOPTED_HERE.clear)


# --- the node ------------------------------------------------------------------------------


class IdempotentToolNode(ToolNode):
    """A drop-in ``ToolNode`` whose side-effecting calls run at most once.

    Args (beyond ``ToolNode``'s, which keep their meaning):
        ledger: the :class:`ToolCallLedger` to use. Default: the graph's checkpointer,
            when it is one (e.g. ``langgraph_idem_saver.AsyncSqliteSaver``).
        key_policy: ``"tool_call"`` (default; one entry per model tool call id, with
            orphan adoption), ``"args"`` (same tool + same args in the scope = one call),
            or ``key_fn(tool_call, ctx) -> str``; or a mapping tool name -> one of those
            (unlisted tools use ``"tool_call"``).
        namespace: share the ledger scope across threads under ``"ns:<namespace>"``
            instead of the default per-thread scope.
        read_only: names of tools that skip the ledger (pure reads, safe to re-run).
            A tool may also declare itself with ``metadata={"idempotent_read_only": True}``.
        verify: tool name -> ``verify(args)`` (sync or async), consulted first for an
            unknown outcome: return the result if the effect landed (a ``ToolMessage``,
            ``Command``, or content) or :data:`NOT_APPLIED` if it did not (re-run).
        on_unknown: policy for unknown outcomes without a verify hook - ``"interrupt"``
            (default; ask a human via ``interrupt()``), ``"rerun"``, ``"fail"`` (an error
            ``ToolMessage``; the entry stays for an operator) or ``"raise"``
            (:class:`UnknownToolOutcome`); or a mapping tool name -> policy.
        not_applied_errors: exception types that mean "the tool failed and nothing
            happened" (a tuple for every tool, or a mapping tool name -> tuple). Any
            other exception that escapes a tool leaves its call an unknown outcome (see
            :class:`NotAppliedError`, which always means "nothing happened").
        lease_seconds: how long a claim is exclusive. A tool that may run longer must
            raise it: past the lease, a resumer treats the call as an unknown outcome.
        wait_seconds: how long to wait for a call another owner is running before
            raising :class:`ToolCallInProgress`.
        poll_seconds: polling interval while waiting.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: bool
        | str
        | Callable[..., str]
        | type[Exception]
        | tuple[type[Exception], ...] = _default_handle_tool_errors,
        messages_key: str = "messages",
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
        ledger: ToolCallLedger | None = None,
        key_policy: KeyPolicy | Mapping[str, KeyPolicy] = "tool_call",
        namespace: str | None = None,
        read_only: Iterable[str] = (),
        verify: Mapping[str, VerifyFn] | None = None,
        on_unknown: OnUnknown | Mapping[str, OnUnknown] = "interrupt",
        not_applied_errors: tuple[type[BaseException], ...]
        | Mapping[str, tuple[type[BaseException], ...]] = (),
        lease_seconds: float = 300.0,
        wait_seconds: float = 30.0,
        poll_seconds: float = 0.1,
    ) -> None:
        super().__init__(
            tools,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=awrap_tool_call,
        )
        if ledger is not None and not isinstance(ledger, ToolCallLedger):
            raise ConfigError(f"ledger must be a ToolCallLedger, got {type(ledger).__name__}")
        if lease_seconds <= 0 or wait_seconds < 0 or poll_seconds <= 0:
            raise ConfigError("lease_seconds and poll_seconds must be > 0, wait_seconds >= 0")
        self._ledger = ledger
        self._namespace = namespace
        if namespace is not None:
            scope_of("", namespace)  # validate early
        self._lease_seconds = float(lease_seconds)
        self._wait_seconds = float(wait_seconds)
        self._poll_seconds = float(poll_seconds)

        names = set(self.tools_by_name)
        self._read_only: frozenset[str] = frozenset(read_only) | {
            n
            for n, t in self.tools_by_name.items()
            if (t.metadata or {}).get(READ_ONLY_METADATA_KEY)
        }
        self._verify: dict[str, VerifyFn] = dict(verify or {})
        self._default_policy: KeyPolicy = "tool_call"
        self._policies: dict[str, KeyPolicy] = {}
        if isinstance(key_policy, Mapping):
            self._policies = dict(key_policy)
        else:
            self._default_policy = key_policy
        for policy in [self._default_policy, *self._policies.values()]:
            if not (policy in ("tool_call", "args") or callable(policy)):
                raise ConfigError(f"unknown key policy {policy!r}")
        self._default_on_unknown: OnUnknown = "interrupt"
        self._on_unknown: dict[str, OnUnknown] = {}
        if isinstance(on_unknown, str):
            self._default_on_unknown = on_unknown
        else:
            self._on_unknown = dict(on_unknown)
        for value in [self._default_on_unknown, *self._on_unknown.values()]:
            if value not in _ON_UNKNOWN_VALUES:
                raise ConfigError(
                    f"on_unknown must be one of {sorted(_ON_UNKNOWN_VALUES)}, got {value!r}"
                )
        self._not_applied_default: tuple[type[BaseException], ...] = ()
        self._not_applied: dict[str, tuple[type[BaseException], ...]] = {}
        if isinstance(not_applied_errors, Mapping):
            self._not_applied = {k: tuple(v) for k, v in not_applied_errors.items()}
        else:
            self._not_applied_default = tuple(not_applied_errors)
        for types in [self._not_applied_default, *self._not_applied.values()]:
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
                raise ConfigError(f"not_applied_errors must hold exception types, got {types!r}")
        for what, mapping in (
            ("read_only", self._read_only),
            ("verify", self._verify),
            ("key_policy", self._policies),
            ("on_unknown", self._on_unknown),
            ("not_applied_errors", self._not_applied),
        ):
            unknown = set(mapping) - names
            if unknown:
                raise ConfigError(f"{what} names tools this node does not have: {sorted(unknown)}")

        self.counters = IdempotencyCounters()
        self._owner_lock = threading.Lock()
        self._owner_id = make_owner()

    # --- small accessors -------------------------------------------------------------------

    @property
    def owner(self) -> str:
        """``host:pid:nonce``, renewed after ``fork`` so children never share claims.

        Read by the tool threads of a sync ``invoke`` at once: the check and the renewal
        happen under a lock, and the id is one attribute, so no thread sees half of it.
        """
        owner = self._owner_id
        if minted_here(owner):
            return owner
        with self._owner_lock:
            if not minted_here(self._owner_id):
                self._owner_id = make_owner()
            return self._owner_id

    @property
    def read_only_tools(self) -> frozenset[str]:
        """Names of the tools that skip the ledger."""
        return self._read_only

    def _policy_for(self, tool_name: str) -> KeyPolicy:
        return self._policies.get(tool_name, self._default_policy)

    def _on_unknown_for(self, tool_name: str) -> OnUnknown:
        return self._on_unknown.get(tool_name, self._default_on_unknown)

    def _had_no_effect(self, tool_name: str, exc: BaseException) -> bool:
        """Whether an exception from running a call proves its tool did nothing final:
        an ``interrupt()`` (or other LangGraph control flow), arguments refused before the
        tool ran, or an exception the tool or the user declared "not applied"."""
        safe = (GraphBubbleUp, ToolInvocationError, NotAppliedError)
        declared = self._not_applied.get(tool_name, self._not_applied_default)
        return isinstance(exc, safe + declared)

    def _is_ledgered(self, call: ToolCall) -> bool:
        # Unregistered names never reach a tool (ToolNode answers with an error message).
        return call["name"] in self.tools_by_name and call["name"] not in self._read_only

    def _find_ledger(self, config: RunnableConfig) -> ToolCallLedger:
        if self._ledger is not None:
            return self._ledger
        checkpointer = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
        if isinstance(checkpointer, ToolCallLedger):
            return checkpointer
        found = "no checkpointer" if checkpointer is None else type(checkpointer).__name__
        raise NoLedgerError(
            f"IdempotentToolNode {self.name!r} needs a ToolCallLedger, found {found}: compile "
            "the graph with a checkpointer that implements it (e.g. "
            "langgraph_idem_saver.AsyncSqliteSaver) or pass ledger=... to the node. "
            "Refusing to run side-effecting tools unprotected."
        )

    # --- node entry points -----------------------------------------------------------------

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        batch = _Batch(node=self, sync=False)
        token = _BATCH.set(batch)
        try:
            await self._aprepare(batch, input, config)
            return await ToolNode._afunc(self, input, config, runtime)
        finally:
            _BATCH.reset(token)
            await self._arelease_unstarted(batch)

    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        batch = _Batch(node=self, sync=True)
        token = _BATCH.set(batch)
        try:
            _run_private(self._aprepare(batch, input, config))
            return ToolNode._func(self, input, config, runtime)
        finally:
            _BATCH.reset(token)
            if any(p.owned and not p.started for p in batch.all_plans):
                _run_private(self._arelease_unstarted(batch))

    async def _arun_one(
        self,
        call: ToolCall,
        input_type: Literal["list", "dict", "tool_calls"],
        tool_runtime: ToolRuntime,
    ) -> Any:
        batch = _BATCH.get()
        plan = batch.take(call) if batch is not None and batch.node is self else None
        if batch is None or plan is None or plan.kind is _Kind.SKIP:
            return await ToolNode._arun_one(self, call, input_type, tool_runtime)
        try:
            if plan.kind is _Kind.RUN:
                plan.started = True
                try:
                    result = await ToolNode._arun_one(self, call, input_type, tool_runtime)
                except Exception as exc:
                    await self._araised(batch, plan, exc)
                    raise
                result = await self._afinish(batch, plan, result)
            else:
                result = await self._aanswer(batch, plan)
        except BaseException as exc:
            _settle_future(plan, exc=exc)
            raise
        _settle_future(plan, result=result)
        return result

    def _run_one(
        self,
        call: ToolCall,
        input_type: Literal["list", "dict", "tool_calls"],
        tool_runtime: ToolRuntime,
    ) -> Any:
        batch = _BATCH.get()
        plan = batch.take(call) if batch is not None and batch.node is self else None
        if batch is None or plan is None or plan.kind is _Kind.SKIP:
            return ToolNode._run_one(self, call, input_type, tool_runtime)
        try:
            if plan.kind is _Kind.RUN:
                # The tool runs in this thread, outside any event loop, exactly as under
                # ToolNode (a sync tool may itself call asyncio.run()).
                plan.started = True
                try:
                    result = ToolNode._run_one(self, call, input_type, tool_runtime)
                except Exception as exc:
                    _run_private(self._araised(batch, plan, exc))
                    raise
                result = _run_private(self._afinish(batch, plan, result))
            else:
                if plan.leader is not None:
                    plan.leader.outcome.result()  # block this thread, not a loop
                result = _run_private(self._aanswer(batch, plan))
        except BaseException as exc:
            _settle_future(plan, exc=exc)
            raise
        _settle_future(plan, result=result)
        return result

    # --- planning: keys, adoption, claim, settling -----------------------------------------

    async def _aprepare(
        self,
        batch: _Batch,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
    ) -> None:
        tool_calls, _ = self._parse_input(input)
        for call in tool_calls:
            plan = _Plan(call=call)
            if self._is_ledgered(call):
                plan.kind = _Kind.PENDING
            elif call["name"] in self._read_only:
                self.counters.bump("read_only")
            batch.add(plan)
        pending = [p for p in batch.all_plans if p.kind is _Kind.PENDING]
        if not pending:
            return  # nothing side-effecting: no ledger needed

        ledger = self._find_ledger(config)
        batch.ledger = ledger
        loop = getattr(ledger, "loop", None)
        batch.ledger_loop = loop if isinstance(loop, asyncio.AbstractEventLoop) else None
        serde = getattr(ledger, "serde", None)
        batch.serde = serde if serde is not None else JsonPlusSerializer()

        configurable = config.get("configurable", {})
        thread_id = configurable.get("thread_id")
        if thread_id is None:
            raise ConfigError(
                "IdempotentToolNode needs config['configurable']['thread_id'] to scope its "
                "ledger entries"
            )
        thread_id = str(thread_id)
        scope = scope_of(thread_id, self._namespace)
        batch.scope = scope
        agent_path = agent_path_of(str(configurable.get("checkpoint_ns", "")))
        raw_run_id = config.get("run_id") or config.get("metadata", {}).get("run_id")
        run_id = None if raw_run_id is None else str(raw_run_id)
        batch.known_ids, batch.pairs = self._calls_in_state(input, config)
        for call_id, message_id in batch.pairs:
            if batch.origins.setdefault(call_id, message_id) != message_id:
                batch.reused_ids.add(call_id)
                batch.origins[call_id] = message_id  # the newest message wins

        # Keys first, for every call: a bad argument or key_fn fails before any claim.
        leaders: dict[str, _Plan] = {}
        for plan in pending:
            call = plan.call
            name = call["name"]
            canon = canonical_args(call["args"], tool_name=name, tool_call_id=str(call["id"]))
            storable_call_id(str(call["id"]), name)
            digest = args_hash(canon)
            policy = self._policy_for(name)
            origin = batch.origins.get(str(call["id"]), "")
            ctx = KeyContext(scope, thread_id, agent_path, name, canon, digest, origin)
            key = compute_key(policy, call, ctx)
            plan.policy = policy
            plan.intent = CallIntent(
                scope=scope,
                key=key,
                thread_id=thread_id,
                agent_path=agent_path,
                tool_name=name,
                args_hash=digest,
                args=canon.encode("utf-8"),
                tool_call_id=str(call["id"]),
                run_id=run_id,
            )
            leader = leaders.get(key)
            if leader is None:
                leaders[key] = plan
                continue
            assert leader.intent is not None
            if leader.intent.args_hash != digest or leader.intent.tool_name != name:
                self.counters.bump("conflicts")
                raise IdempotencyConflict(
                    f"tool calls {leader.call['id']!r} and {call['id']!r} of one step share "
                    f"ledger key {key!r} but not their tool/arguments"
                )
            plan.kind = _Kind.FOLLOW
            plan.leader = leader

        # Any exception from here on (conflict, interrupt(), timeout) releases the fresh
        # claims of this step: see the entry points' ``finally``.
        await self._aadopt_orphans(batch, list(leaders.values()), input, config)
        await self._aclaim(batch, [p for p in leaders.values() if p.entry is None])
        await self._asettle(batch, [p for p in leaders.values() if p.kind is _Kind.PENDING])

    def _calls_in_state(
        self, input: list[AnyMessage] | dict[str, Any] | BaseModel, config: RunnableConfig
    ) -> tuple[set[str] | None, list[tuple[str, str]]]:
        """Ids of every tool call in the messages state (None when no state is visible),
        and every (call id, message id) pair, oldest message first.

        Without the messages we cannot tell an orphan from a call of an earlier turn, so
        adoption is then skipped; the message id goes into the default key, so a model
        that reuses call ids across turns still makes distinct calls.
        """
        try:
            state = self._extract_state(input, config)
        except Exception:
            return None, []
        messages: Any
        if isinstance(state, list):
            messages = state
        elif isinstance(state, dict):
            messages = state.get(self._messages_key)
        else:
            messages = getattr(state, self._messages_key, None)
        if not messages or not isinstance(messages, list):
            return None, []
        pairs = [
            (str(tc["id"]), m.id or "")
            for m in messages
            if isinstance(m, AIMessage)
            for tc in m.tool_calls
        ]
        return {call_id for call_id, _ in pairs}, pairs

    async def _aadopt_orphans(
        self,
        batch: _Batch,
        leaders: list[_Plan],
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
    ) -> None:
        """Give a call the entry of the same call made under an id the model never saw.

        With durability ``"async"``/``"exit"`` a crash can lose the AIMessage whose calls
        were already claimed (and maybe executed). The model then runs again and emits
        the same call under a new id. An entry with the same (scope, agent path, tool,
        args) whose AIMessage was never durable is that call: adopt it (oldest first)
        instead of executing again. Entries already adopted by this very id are found
        too, and an entry whose adopter's message was lost as well is adopted again, so
        any number of consecutive losses cannot cause a re-run.

        "Never durable" is checked against everything that may still hold the call, so
        that an agent never adopts the entry of a *sibling* - another task of the same
        agent path, e.g. two ``Send``s to one agent node, each with its own state:

        * the tool calls in this task's own state;
        * claims and adoptions made by this process: a lost message needs a dead
          process, while a claim of this process may belong to a sibling running right
          now (its state may exist only in memory, e.g. under durability ``"exit"``);
        * the tool calls in any checkpoint or pending write of the thread, in every
          namespace (read only when a candidate is left, i.e. rarely).
        """
        candidates = [p for p in leaders if p.policy == "tool_call"]
        if not candidates:
            return
        known = batch.known_ids
        if known is None:
            return
        assert batch.ledger is not None
        first = candidates[0].intent
        assert first is not None
        entries: list[LedgerEntry] = []
        for signature in dict.fromkeys(
            (p.intent.tool_name, p.intent.args_hash) for p in candidates if p.intent
        ):
            entries += await self._lg(
                batch, batch.ledger.afind_orphans(batch.scope, first.agent_path, *signature)
            )
        present = {e.key for e in entries}
        # the keys of every call in this state: an entry under one of them is not an
        # orphan (ids alone would not do: a model may reuse "call_0" every turn)
        known_keys = {
            key
            for call_id, msg in batch.pairs
            for key in tool_call_keys(first.agent_path, call_id, msg)
        }
        orphans = [
            e
            for e in entries
            if e.key not in known_keys
            and not minted_here(e.owner)
            and (
                e.adopted_by is None
                or (e.adopted_by not in known and not _adopted_here(e.adopted_by))
            )
        ]
        taken: set[str] = set()
        durable: set[str] | None = None  # tool call ids found in the thread's checkpoints
        for plan in candidates:
            intent = plan.intent
            assert intent is not None
            if intent.key in present:
                continue  # the call has its own entry: the claim will return it
            # recorded by a release whose key was the id alone (no message id)
            [legacy_key] = tool_call_keys(intent.agent_path, intent.tool_call_id, "")
            legacy = [e for e in entries if e.key == legacy_key and e.key != intent.key]
            if legacy:
                plan.entry, plan.ledger_key = legacy[0], legacy_key
                taken.add(legacy_key)
                continue

            def same_call(e: LedgerEntry, intent: CallIntent = intent) -> bool:
                return (
                    e.tool_name == intent.tool_name
                    and e.args_hash == intent.args_hash
                    and e.thread_id == intent.thread_id
                )

            mine = [
                e
                for e in entries
                if e.adopted_by == intent.tool_call_id
                and intent.tool_call_id not in batch.reused_ids
                and same_call(e)
            ]
            if mine:
                plan.entry, plan.ledger_key = mine[0], mine[0].key
                taken.add(mine[0].key)
                continue
            matching = [e for e in orphans if e.key not in taken and same_call(e)]
            if not matching:
                continue
            if durable is None:
                wanted = {e.key for e in orphans} | {e.adopted_by or "" for e in orphans}
                durable = await self._adurable_calls(
                    batch, config, intent.thread_id, wanted - {""}
                )
            for e in matching:
                if e.key in durable or (e.adopted_by or "") in durable:
                    continue  # its message exists: a sibling's (or an earlier) call
                adopted = await self._lg(
                    batch,
                    batch.ledger.aadopt(
                        batch.scope,
                        e.key,
                        tool_call_id=intent.tool_call_id,
                        previous=e.adopted_by,
                    ),
                )
                if adopted is None:
                    continue  # another resumer adopted it first
                _note_adopted_here(intent.tool_call_id)
                taken.add(e.key)
                plan.entry, plan.ledger_key = adopted, adopted.key
                self.counters.bump("adopted")
                break

    async def _adurable_calls(
        self, batch: _Batch, config: RunnableConfig, thread_id: str, wanted: set[str]
    ) -> set[str]:
        """Which of ``wanted`` (ledger keys and tool call ids) belong to a call found in a
        saved checkpoint (or pending write) of the thread, in any namespace. Newest first,
        stopping once all are found. A call found there is known by its id and by every
        key it may have been recorded under (see ``tool_call_keys``).

        Without a checkpointer that can list the thread, nothing is known (empty set).
        """
        checkpointer = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
        alist = getattr(checkpointer, "alist", None)
        if alist is None or not wanted:
            return set()
        agent_path = agent_path_of(str(config.get("configurable", {}).get("checkpoint_ns", "")))

        async def scan() -> set[str]:
            found: set[str] = set()
            async for tup in alist({"configurable": {"thread_id": thread_id}}):
                pairs: set[tuple[str, str]] = set()
                _collect_tool_calls(tup.checkpoint.get("channel_values"), pairs)
                for write in tup.pending_writes or ():
                    _collect_tool_calls(write[2], pairs)
                for call_id, message_id in pairs:
                    found.add(call_id)
                    found |= tool_call_keys(agent_path, call_id, message_id)
                if wanted <= found:
                    break
            return found & wanted

        if checkpointer is batch.ledger:
            loop = batch.ledger_loop
        else:
            cp_loop = getattr(checkpointer, "loop", None)
            loop = cp_loop if isinstance(cp_loop, asyncio.AbstractEventLoop) else None
        return await _on_loop(loop, scan())

    async def _aclaim(self, batch: _Batch, plans: list[_Plan]) -> None:
        """ONE ``aclaim`` for all calls of the step that have no entry yet."""
        if not plans:
            return
        assert batch.ledger is not None
        outcomes = await self._lg(
            batch,
            batch.ledger.aclaim(
                [cast(CallIntent, p.intent) for p in plans],
                owner=self.owner,
                lease_seconds=self._lease_seconds,
            ),
        )
        for plan, outcome in zip(plans, outcomes, strict=True):
            plan.entry = outcome.entry
            plan.ledger_key = outcome.entry.key
            if outcome.claimed:
                plan.kind, plan.owned = _Kind.RUN, True

    async def _asettle(self, batch: _Batch, plans: list[_Plan]) -> None:
        """Decide what to do with calls that already had an entry.

        Order matters: conflicts first (nothing else is sound), then wait for calls
        running elsewhere, then unknown outcomes - all decisions (verify hooks and
        ``interrupt()`` calls, in call order) before any ledger write, so that a node
        re-entered after an interrupt makes the same ``interrupt()`` calls in the same
        order and LangGraph matches each resume value to the right call.
        """
        assert batch.ledger is not None
        for plan in plans:
            entry, intent = plan.entry, plan.intent
            assert entry is not None and intent is not None
            if entry.args_hash != intent.args_hash or entry.tool_name != intent.tool_name:
                await self._lg(
                    batch, batch.ledger.anote_replay(batch.scope, entry.key, conflict=True)
                )
                self.counters.bump("conflicts")
                raise IdempotencyConflict(
                    f"tool call {intent.tool_call_id!r} to {intent.tool_name!r} maps to ledger "
                    f"key {entry.key!r} in scope {batch.scope!r}, which records a call to "
                    f"{entry.tool_name!r} (id {entry.tool_call_id!r}) with different arguments;"
                    " refusing to replay or run it"
                )

        busy = [p for p in plans if _live(cast(LedgerEntry, p.entry))]
        if busy:
            await asyncio.gather(*(self._await_settled(batch, p) for p in busy))

        unknown: list[_Plan] = []
        for plan in plans:
            if plan.kind is not _Kind.PENDING:
                continue  # claimed while waiting (the owner released it)
            entry = cast(LedgerEntry, plan.entry)
            if entry.status is CallStatus.ISSUED:
                if not entry.is_unknown():
                    raise ToolCallInProgress(
                        f"tool call {plan.call['id']!r} to {plan.call['name']!r} (key "
                        f"{entry.key!r}) is being run by {entry.owner!r}; it did not finish "
                        f"within {self._wait_seconds}s. Retry later."
                    )
                unknown.append(plan)
            else:
                self._set_replay(batch, plan, entry)

        sole = sum(p.kind is not _Kind.SKIP for p in batch.all_plans) == 1
        decisions = [(plan, await self._adecide(batch, plan, sole=sole)) for plan in unknown]
        for plan, decision in decisions:
            await self._aapply(batch, plan, decision)

    async def _await_settled(self, batch: _Batch, plan: _Plan) -> None:
        """Poll a call another owner is running until it finishes, lapses or vanishes."""
        assert batch.ledger is not None
        deadline = time.monotonic() + self._wait_seconds
        entry = cast(LedgerEntry, plan.entry)
        while _live(entry) and time.monotonic() < deadline:
            await asyncio.sleep(self._poll_seconds)
            fresh = await self._lg(batch, batch.ledger.aget_entry(batch.scope, entry.key))
            if fresh is None:
                # The owner released its claim (its tool was interrupted): claim it anew.
                intent = cast(CallIntent, plan.intent)
                if entry.key != intent.key:
                    raise ToolCallInProgress(f"adopted entry {entry.key!r} vanished; retry")
                await self._aclaim(batch, [plan])
                if plan.kind is _Kind.RUN:
                    return
                fresh = cast(LedgerEntry, plan.entry)
            entry = fresh
        plan.entry = entry

    def _set_replay(self, batch: _Batch, plan: _Plan, entry: LedgerEntry) -> None:
        plan.kind = _Kind.REPLAY
        plan.entry = entry
        plan.result = self._replayed_result(batch, entry, plan.call)

    # --- unknown outcomes ------------------------------------------------------------------

    async def _adecide(self, batch: _Batch, plan: _Plan, *, sole: bool) -> tuple[str, Any]:
        """What to do with an unknown outcome: ("completed", result) | ("failed", error)
        | ("rerun", None) | ("fail", None). Makes no ledger write.

        ``sole``: this is the only ledgered call of the node run, so an interrupt answer
        cannot belong to another call of the same task (see :meth:`_ask`)."""
        call, entry = plan.call, cast(LedgerEntry, plan.entry)
        name = call["name"]
        if entry.rerun_approved():
            return ("rerun", None)  # an operator settled it: it did not happen
        hook = self._verify.get(name)
        if hook is not None:
            outcome = await _call_maybe_async(hook, dict(call["args"]))
            if outcome is NOT_APPLIED:
                return ("rerun", None)
            if outcome is None:
                raise ConfigError(
                    f"verify hook for tool {name!r} returned None: return the call's result "
                    "when the effect happened, or NOT_APPLIED when it did not (nothing was "
                    "recorded; the call stays an unknown outcome)"
                )
            return ("completed", outcome)
        policy = self._on_unknown_for(name)
        if policy == "rerun":
            return ("rerun", None)
        if policy == "fail":
            return ("fail", None)
        if policy == "raise":
            raise UnknownToolOutcome(
                f"tool call {call['id']!r} to {name!r} (key {entry.key!r}, scope "
                f"{batch.scope!r}) was started at {entry.issued_at:.3f} and never finished; "
                "it may or may not have taken effect"
            )
        value = self._ask(batch, plan, sole=sole)
        if value["action"] == "completed":
            return ("completed", value["result"])
        if value["action"] == "failed":
            return ("failed", value["error"])
        return ("rerun", None)

    def _ask(self, batch: _Batch, plan: _Plan, *, sole: bool) -> Any:
        """Ask a human through ``interrupt()`` until an answer that is about this call
        *and this attempt* comes back.

        LangGraph hands a task's resume values back by position. After a crash between
        two answers were applied, or when the same call is unknown again one attempt
        later, the value at a position may be about another call or an older attempt.
        So the payload names ``key`` and ``attempt``; an answer that names another key or
        attempt is skipped (the next ``interrupt()`` takes the next value, or asks anew),
        and an answer naming neither is accepted only where it cannot be misplaced: the
        node run's only ledgered call, on its first attempt.
        """
        call, entry = plan.call, cast(LedgerEntry, plan.entry)
        name = call["name"]
        payload: dict[str, Any] = {
            "kind": "unknown_tool_outcome",
            "tool": name,
            "args": call["args"],
            "tool_call_id": call["id"],
            "key": entry.key,
            "attempt": entry.attempts,
            "attempts": entry.attempts,  # kept for answers written against 0.1
            "scope": batch.scope,
            "agent_path": entry.agent_path,
            "issued_at": entry.issued_at,
            "error": entry.error,
        }
        while True:
            if _INTERRUPT_HAS_SCHEMA:
                answer = interrupt(payload, response_schema=cast(Any, UnknownOutcomeResume))
            else:  # pragma: no cover - LangGraph < 1.1
                answer = interrupt(payload)
            try:
                value = _RESUME_ADAPTER.validate_python(answer)
            except ValidationError as exc:
                raise UnknownToolOutcome(
                    f"invalid resume value for the unknown outcome of {name!r} call "
                    f"{call['id']!r}: {answer!r}. Expected {{'action': 'completed', "
                    "'result': ...}, {'action': 'rerun'} or {'action': 'failed', "
                    "'error': '...'}, with the interrupt's 'key' and 'attempt'"
                ) from exc
            reason = _answer_mismatch(value, entry, sole=sole)
            if reason is None:
                return value
            payload = {**payload, "previous_answer_ignored": reason}

    async def _aapply(self, batch: _Batch, plan: _Plan, decision: tuple[str, Any]) -> None:
        ledger = cast(ToolCallLedger, batch.ledger)
        entry = cast(LedgerEntry, plan.entry)
        action, value = decision
        call = plan.call
        self.counters.bump("unknown")  # once per call decided, not per re-entry
        if action == "fail":
            plan.kind = _Kind.RETURN
            plan.result = ToolMessage(
                content=(
                    f"Error: the outcome of an earlier {call['name']!r} call with these "
                    "arguments is unknown: it started but was never recorded as finished, so "
                    "it may or may not have taken effect. It was NOT retried; an operator "
                    "must resolve it."
                ),
                name=call["name"],
                tool_call_id=call["id"],
                status="error",
            )
            return
        if action == "rerun":
            fresh = await self._lg(
                batch,
                ledger.areclaim(
                    batch.scope,
                    entry.key,
                    owner=self.owner,
                    lease_seconds=self._lease_seconds,
                    expected_attempts=entry.attempts,
                    expected_owner=entry.owner,
                ),
            )
            if fresh is not None:
                plan.kind, plan.owned, plan.entry = _Kind.RUN, True, fresh
                return
        else:
            if action == "completed":
                status, error = CallStatus.COMPLETED, None
                result = _as_result(value, call, self._messages_key)
            else:
                status, error = CallStatus.FAILED, str(value)
                result = ToolMessage(
                    content=f"Error: {value}",
                    name=call["name"],
                    tool_call_id=call["id"],
                    status="error",
                )
            result_type, data = self._dumps(batch, result)
            settled = await self._lg(
                batch,
                ledger.aresolve(
                    batch.scope,
                    entry.key,
                    status=status,
                    result_type=result_type,
                    result=data,
                    error=error,
                    expected_attempts=entry.attempts,
                    expected_owner=entry.owner,
                ),
            )
            if settled is not None:
                plan.kind, plan.result, plan.entry = _Kind.RETURN, result, settled
                return
        # The row changed under us: someone else settled or reclaimed it first. A
        # resumer that reclaimed it is running it now: wait for it, as for any live claim.
        latest = await self._lg(batch, ledger.aget_entry(batch.scope, entry.key))
        if latest is not None and _live(latest):
            plan.entry = latest
            await self._await_settled(batch, plan)
            if plan.kind is _Kind.RUN:
                return
            latest = plan.entry
        if latest is not None and latest.status is not CallStatus.ISSUED:
            self._set_replay(batch, plan, latest)
            return
        raise ToolCallInProgress(
            f"the unknown outcome of {call['name']!r} call {call['id']!r} (key {entry.key!r}) "
            "was taken over concurrently by another resumer; retry later"
        )

    # --- executing one call ----------------------------------------------------------------

    async def _aanswer(self, batch: _Batch, plan: _Plan) -> Any:
        """The result of a call that is not run: settled, replayed, or its twin's."""
        ledger = cast(ToolCallLedger, batch.ledger)
        if plan.kind is _Kind.RETURN:
            return plan.result
        if plan.kind is _Kind.REPLAY:
            entry = cast(LedgerEntry, plan.entry)
            await self._lg(batch, ledger.anote_replay(batch.scope, entry.key))
            self.counters.bump("replayed")
            return plan.result
        if plan.kind is _Kind.FOLLOW:
            leader = cast(_Plan, plan.leader)
            leader_result = await asyncio.wrap_future(leader.outcome)
            if leader.ledger_key is not None:
                await self._lg(batch, ledger.anote_replay(batch.scope, leader.ledger_key))
            self.counters.bump("replayed")
            return _retarget(leader_result, {str(leader.call["id"])}, plan.call, self._messages_key)
        raise RuntimeError(  # pragma: no cover - planning always decides
            f"unplanned tool call {plan.call['id']!r} ({plan.kind})"
        )

    async def _afinish(self, batch: _Batch, plan: _Plan, result: Any) -> Any:
        """Record what the tool returned; an error ToolMessage is a ``failed`` call.

        Exceptions that escape ``ToolNode`` (not handled by ``handle_tool_errors``, or
        ``interrupt()`` inside the tool) never get here: the claim is released instead,
        because the tool reported that it did not complete and LangGraph will run it
        again on retry/resume. Cancellation releases nothing: the effect may have
        happened, so after the lease the call is an unknown outcome.
        """
        ledger = cast(ToolCallLedger, batch.ledger)
        failed = isinstance(result, ToolMessage) and result.status == "error"
        result_type, data = self._dumps(batch, result)
        await self._lg(
            batch,
            ledger.afinish(
                batch.scope,
                cast(str, plan.ledger_key),
                owner=self.owner,
                status=CallStatus.FAILED if failed else CallStatus.COMPLETED,
                result_type=result_type,
                result=data,
                error=_text(result.content) if failed else None,
            ),
        )
        plan.owned = False
        self.counters.bump("executed")
        return result

    async def _araised(self, batch: _Batch, plan: _Plan, exc: BaseException) -> None:
        """A started call raised instead of returning (``handle_tool_errors`` let it out).

        Unless the exception proves nothing happened (:meth:`_had_no_effect`), the call
        is an unknown outcome: a timeout or a reset connection often comes *after* the
        effect landed. The claim is abandoned, not released - the row stays ``issued``
        with its lease ended and the error kept - so the next attempt (a ``RetryPolicy``
        retry, or the user's resume) goes through verify -> policy -> human, as after a
        crash, and never re-runs it silently.
        """
        if self._had_no_effect(plan.call["name"], exc):
            await self._arelease(batch, plan)
            return
        if not plan.owned or plan.ledger_key is None or batch.ledger is None:
            return
        plan.owned = False
        error = f"{type(exc).__name__}: {exc}"[:2000]
        await self._lg(
            batch,
            batch.ledger.aabandon(batch.scope, plan.ledger_key, owner=self.owner, error=error),
        )
        self.counters.bump("abandoned")

    # --- ledger plumbing -------------------------------------------------------------------

    async def _arelease(self, batch: _Batch, plan: _Plan) -> None:
        if not plan.owned or plan.ledger_key is None or batch.ledger is None:
            return
        plan.owned = False
        release = getattr(batch.ledger, "arelease", None)
        if release is None:  # pragma: no cover - ledgers predating arelease
            return  # safe default: the claim lapses into an unknown outcome
        if await self._lg(batch, release(batch.scope, plan.ledger_key, owner=self.owner)):
            self.counters.bump("released")

    async def _arelease_unstarted(self, batch: _Batch) -> None:
        """Drop claims of calls that never reached their tool (the step was aborted)."""
        for plan in batch.all_plans:
            if plan.owned and not plan.started:
                await self._arelease(batch, plan)

    async def _lg(self, batch: _Batch, coro: Coroutine[Any, Any, T]) -> T:
        """Await a ledger coroutine on the ledger's own event loop."""
        return await _on_loop(batch.ledger_loop, coro)

    def _dumps(self, batch: _Batch, result: Any) -> tuple[str | None, bytes | None]:
        serde = batch.serde or JsonPlusSerializer()
        try:
            return serde.dumps_typed(result)
        except Exception as exc:
            raise SerializationError(
                f"the result of a {self.name!r} tool call cannot be serialized for the "
                f"ledger ({type(exc).__name__}: {exc})"
            ) from exc

    def _replayed_result(self, batch: _Batch, entry: LedgerEntry, call: ToolCall) -> Any:
        """The recorded result, re-addressed to the current tool call id."""
        if entry.result is None or entry.result_type is None:
            status: Literal["success", "error"] = (
                "error" if entry.status is CallStatus.FAILED else "success"
            )
            return ToolMessage(
                content=entry.error or f"{call['name']} already ran (no result was recorded)",
                name=call["name"],
                tool_call_id=call["id"],
                status=status,
            )
        serde = batch.serde or JsonPlusSerializer()
        try:
            value = serde.loads_typed((entry.result_type, entry.result))
        except Exception as exc:
            raise CorruptRecordError(
                "tool call result", location={"scope": entry.scope, "key": entry.key}, cause=exc
            ) from exc
        recorded_ids = {entry.tool_call_id} | ({entry.adopted_by} if entry.adopted_by else set())
        if isinstance(value, ToolMessage):
            recorded_ids.add(value.tool_call_id)
        elif not isinstance(value, (Command, list)):
            return _as_result(value, call, self._messages_key)
        return _retarget(value, recorded_ids, call, self._messages_key)


# --- helpers ---------------------------------------------------------------------------------


def _answer_mismatch(value: Mapping[str, Any], entry: LedgerEntry, *, sole: bool) -> str | None:
    """Why an interrupt answer cannot be applied to ``entry`` (None: it can)."""
    if "key" in value and value["key"] != entry.key:
        return f"it answered key {value['key']!r}, not {entry.key!r}"
    if "attempt" in value and value["attempt"] != entry.attempts:
        return f"it answered attempt {value['attempt']}, this is attempt {entry.attempts}"
    if "key" not in value and not (sole and entry.attempts == 1):
        return "answers must name the interrupt's 'key' and 'attempt' here"
    return None


def _live(entry: LedgerEntry) -> bool:
    """Issued and still within its lease: someone may be running it right now."""
    return entry.status is CallStatus.ISSUED and not entry.is_unknown()


def _settle_future(plan: _Plan, *, result: Any = None, exc: BaseException | None = None) -> None:
    """Publish a call's outcome to calls of the same step that share its key."""
    if plan.outcome.done():
        return
    if exc is not None:
        plan.outcome.set_exception(exc)
    else:
        plan.outcome.set_result(result)


async def _on_loop(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on ``loop`` (the loop its saver/ledger lives on), or here if None."""
    if loop is None or loop is asyncio.get_running_loop():
        return await coro
    if loop.is_closed() or not loop.is_running():
        coro.close()
        raise ConfigError(
            "the ledger's event loop is not running: a sync graph.invoke with an async "
            "ledger needs that loop running in another thread"
        )
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def _collect_tool_calls(value: Any, found: set[tuple[str, str]], depth: int = 0) -> None:
    """Add (tool call id, message id) for the tool calls of every AIMessage found in a
    channel value or a pending write (messages lists, ``Send`` packets carrying a state,
    nested dicts)."""
    if depth > 8:
        return
    if isinstance(value, AIMessage):
        found.update((str(tc["id"]), value.id or "") for tc in value.tool_calls if tc.get("id"))
    elif isinstance(value, dict):
        if value.get("type") == "ai" and isinstance(value.get("tool_calls"), list):
            message_id = str(value.get("id") or "")
            found.update(
                (str(tc["id"]), message_id)
                for tc in value["tool_calls"]
                if isinstance(tc, dict) and tc.get("id")
            )
            return
        for item in value.values():
            _collect_tool_calls(item, found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_tool_calls(item, found, depth + 1)
    elif isinstance(value, Send):
        _collect_tool_calls(value.arg, found, depth + 1)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(content)


def _as_result(value: Any, call: ToolCall, messages_key: str = "messages") -> Any:
    """A verify/resume answer as what the tool would have returned for ``call``.

    A ``Command`` (e.g. a state update carrying spend) is kept; when its update holds
    exactly one ToolMessage, that message is re-addressed to ``call`` - a verify hook
    sees only the arguments, not the tool call id.
    """
    if isinstance(value, Command):
        update = value.update
        messages = update.get(messages_key) if isinstance(update, dict) else update
        tool_messages = [
            m
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, ToolMessage)
        ]
        ids = {m.tool_call_id for m in tool_messages}
        if len(ids) == 1 and ids != {str(call["id"])}:
            value = _retarget(value, ids, call, messages_key)
        elif any(m.name is None for m in tool_messages):
            value = copy.deepcopy(value)
        else:
            return value
        # as ToolNode's own Command validation does, name the answer after the tool
        update = value.update
        messages = update.get(messages_key) if isinstance(update, dict) else update
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, ToolMessage) and m.tool_call_id == call["id"] and m.name is None:
                m.name = call["name"]
        return value
    if isinstance(value, ToolMessage):
        msg = value.model_copy(update={"tool_call_id": call["id"]})
        if msg.name is None:
            msg.name = call["name"]
        return msg
    content = cast("str | list[str | dict[Any, Any]]", msg_content_output(value))
    return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"])


def _retarget(value: Any, old_ids: set[str], call: ToolCall, messages_key: str) -> Any:
    """Deep copy of a recorded result with its ToolMessages answering ``call`` instead.

    A message re-addressed to a different call also loses its message id, so that it is
    appended to the state rather than replacing the original message.
    """
    new_id = str(call["id"])

    def fix_message(msg: Any) -> Any:
        if isinstance(msg, ToolMessage) and msg.tool_call_id in old_ids:
            update: dict[str, Any] = {"tool_call_id": new_id}
            if msg.tool_call_id != new_id:
                update["id"] = None
            return msg.model_copy(update=update, deep=True)
        if (
            isinstance(msg, dict)
            and msg.get("tool_call_id") in old_ids
            and msg.get("type", msg.get("role")) in ("tool", None)
        ):
            fixed = dict(msg, tool_call_id=new_id)
            if msg.get("tool_call_id") != new_id:
                fixed.pop("id", None)
            return fixed
        return msg

    def fix(item: Any) -> Any:
        if isinstance(item, (ToolMessage, dict)):
            return fix_message(item)
        if isinstance(item, Command):
            update = item.update
            if isinstance(update, dict) and isinstance(update.get(messages_key), list):
                update = {**update, messages_key: [fix_message(m) for m in update[messages_key]]}
            elif isinstance(update, list):
                update = [fix_message(m) for m in update]
            return dataclasses.replace(item, update=update)
        return item

    value = copy.deepcopy(value)  # never hand out (or mutate) the recorded/leader object
    if isinstance(value, list):
        return [fix(v) for v in value]
    return fix(value)


async def _call_maybe_async(fn: Callable[..., Any], arg: Any) -> Any:
    """Call a sync or async hook. Sync hooks run in a worker thread: they may block (I/O
    to the vendor) or call ``asyncio.run`` themselves, neither of which a loop allows."""
    if inspect.iscoroutinefunction(fn):
        return await fn(arg)
    result = await asyncio.to_thread(fn, arg)
    if inspect.isawaitable(result):
        result = await result
    return result


def _run_private(coro: Coroutine[Any, Any, T]) -> T:
    """Run the node's async bookkeeping on a private loop in the current (node) thread.

    The coroutine's task copies this thread's context, so ``interrupt()`` and
    ``get_config()`` work inside it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise ConfigError(
            "IdempotentToolNode was invoked synchronously from a thread running an event "
            "loop; use `await graph.ainvoke(...)` there (or run graph.invoke in a worker "
            "thread, e.g. asyncio.to_thread)"
        )
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
