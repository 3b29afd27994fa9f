"""Recorded model responses: a step's model answer is committed before the graph uses it,
and replayed instead of asking the model again when the same step asks again.

Why: under durability ``"async"``/``"exit"`` (and under ``"sync"`` when the process dies
between the model's return and the checkpoint) LangGraph re-runs a model step after a
crash. A re-asked model mints new tool-call ids, may reword its calls or decide something
else; the ledger's orphan adoption and reworded-call pairing exist to guess which new call
is which lost one. A recorded response makes the guess unnecessary: the re-run step gets
the very message it had, with the same call ids, and the tool ledger replays by key.

What names one model call (its ledger key, under the reserved tool name
:data:`MODEL_TOOL_NAME` in the thread's scope):

* its **position**: the thread, the namespace of the graph running the node (with its
  task ids), the node, the LangGraph step (``engine.forks.fork_point``) and the task's
  path (``metadata["langgraph_path"]``: two ``Send`` tasks of one node in one step are two
  calls);
* a digest of its **input**: the messages (without their message ids, which a re-sent
  input gets anew), the tools, tool choice, response format, settings and the model's
  identity.

The branch (the checkpoint the step ran from) is kept with the record but is not part of
the key: under durability ``"exit"`` the re-run starts from a new checkpoint. A
time-travel fork runs at another step, so it is another position and asks anew.

The record is an ordinary ledger entry: read first (a step seen before is answered from
it), written after the model returned - so a crash during the model call leaves nothing
behind - and removed with its thread. A model call is not a side effect, so nothing is
claimed before it: on the savers of this package (and the ledgers forwarding to one) the
record is one ``completed`` entry inserted in one commit (``answer_records``; a record
another run wrote first is read back and wins); on other ledgers a claim and its outcome,
written back to back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Generic, TypeVar

from langchain_core.callbacks.manager import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from pydantic import BaseModel

from langgraph_idem_saver.answer_records import AnswerRecorder
from langgraph_idem_saver.counts import Counts
from langgraph_idem_saver.engine.forks import fork_point
from langgraph_idem_saver.engine.loops import on_loop, run_private, running_loop
from langgraph_idem_saver.engine.results import dumps
from langgraph_idem_saver.errors import ConfigError, CorruptRecordError, LedgerStateError
from langgraph_idem_saver.json_text import encoder_of
from langgraph_idem_saver.keys import scope_of
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    LedgerEntry,
    Outcome,
    ToolCallLedger,
)
from langgraph_idem_saver.owners import make_owner, minted_here

__all__ = [
    "MODEL_TOOL_NAME",
    "REPLAY_EVENT",
    "ModelCallSite",
    "ModelCounts",
    "ModelRecorder",
    "input_digest",
]

MODEL_TOOL_NAME = "__model__"
"""The tool name of a recorded model response in the ledger (no tool can be called so:
LangChain tool names are the model's function names, and this one is reserved)."""

REPLAY_EVENT = "idem_saver_replay"
"""The custom callback event a replayed model response sends, as replayed tool calls do
(``engine.core.REPLAY_EVENT``; the same name, so one listener sees both)."""

_RECORD_VERSION = 1
_CANONICAL = encoder_of(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_WHERE = encoder_of(separators=(",", ":"), ensure_ascii=False)  # keys as written: read first

T = TypeVar("T")


@dataclasses.dataclass
class ModelCounts(Counts):
    """What a recorder did in this process: model calls answered by the model and
    recorded, answered from the record, asked without a record (outside a graph step, or
    another process was recording the same call), and records a concurrent branch won."""

    recorded: int = 0
    replayed: int = 0
    unrecorded: int = 0
    adopted_other: int = 0


# --- the input's digest --------------------------------------------------------------------


def _qualname(obj: Any) -> str:
    kind = obj if isinstance(obj, type) else type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data that is the same in every process: messages without their
    ids, tools as the function schema a model sees, types and callables by name, other
    objects by their fields (dataclasses, pydantic models) or their type's name - never a
    ``repr`` (an object's address changes from process to process)."""
    if depth > 20:
        return "..."
    # the exact JSON types first (most of a dumped message): what the checks below give
    # them, without walking past BaseMessage, BaseTool and Mapping (ABC checks) for each
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if kind is list:
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, BaseMessage):
        data = value.model_dump(exclude={"id"})
        return {"message": plain(data, depth + 1)}
    if isinstance(value, BaseTool):
        return {"tool": plain(convert_to_openai_tool(value), depth + 1)}
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v, depth + 1) for v in value), key=_CANONICAL)
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if isinstance(value, type) or (callable(value) and not isinstance(value, BaseModel)):
        return {"type": _qualname(value)}
    if isinstance(value, BaseModel):
        return {"model": _qualname(value), "fields": plain(value.model_dump(), depth + 1)}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dataclass": _qualname(value), "fields": plain(fields, depth + 1)}
    return {"object": _qualname(value)}


def input_digest(parts: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a model call's input (see :func:`plain`)."""
    text = _CANONICAL(plain(parts))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def model_identity(model: Any) -> Any:
    """Which model answers: its class and the parameters LangChain identifies it by
    (model name, temperature...), so a fallback model is another call."""
    try:
        params = getattr(model, "_identifying_params", None)
    except Exception:  # a model whose property fails: its class alone names it
        params = None
    return {"class": _qualname(model), "params": plain(params or {})}


# --- where a call is made ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelCallSite:
    """One model call's identity in the ledger: where (``key`` digests the position,
    the task's path and the input) and what it needs to read and write its record."""

    ledger: ToolCallLedger
    scope: str
    key: str
    thread_id: str
    agent_path: str
    digest: str
    branch: str
    step: int
    node: str

    def intent(self, owner_run: str | None) -> CallIntent:
        """The ledger row the record is claimed with (its ``args`` say where it was made:
        what ``idem-saver ledger`` shows)."""
        where = {"model_call": self.node, "step": self.step, "branch": self.branch}  # in order
        return CallIntent(
            scope=self.scope,
            key=self.key,
            thread_id=self.thread_id,
            agent_path=self.agent_path,
            tool_name=MODEL_TOOL_NAME,
            args_hash=self.digest,
            args=_WHERE(where).encode("utf-8"),
            tool_call_id=f"model:{self.step}:{self.key[:16]}",
            run_id=owner_run,
        )


def find_ledger(config: RunnableConfig, ledger: ToolCallLedger | None) -> ToolCallLedger | None:
    """``ledger`` if given, else the graph's checkpointer when it is a ledger (None: a
    checkpointer that keeps no ledger, or none - then nothing is recorded)."""
    if ledger is not None:
        return ledger
    checkpointer = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
    return checkpointer if isinstance(checkpointer, ToolCallLedger) else None


def call_site(
    config: RunnableConfig, ledger: ToolCallLedger | None, parts: Mapping[str, Any]
) -> ModelCallSite | None:
    """The site of a model call made in the graph step ``config`` belongs to; None outside
    a graph step (no thread, no step: no place in a history to replay at) or without a
    ledger."""
    found = find_ledger(config, ledger)
    configurable = config.get("configurable", {})
    thread = configurable.get("thread_id")
    if found is None or thread is None:
        return None
    thread_id = str(thread)
    point = fork_point(config, thread_id)
    if point is None:
        return None
    metadata = config.get("metadata", {})
    step = int(metadata["langgraph_step"])
    path = plain(metadata.get("langgraph_path", ()))
    checkpoint_ns = str(configurable.get("checkpoint_ns", ""))
    node = checkpoint_ns.rpartition("|")[2].split(":", 1)[0]
    agent_path = "|".join(part.split(":", 1)[0] for part in checkpoint_ns.split("|"))
    digest = input_digest(parts)
    key_text = _CANONICAL(["model", point.position, path, digest])
    key = hashlib.sha256(key_text.encode("utf-8", "surrogatepass")).hexdigest()
    return ModelCallSite(
        ledger=found,
        scope=scope_of(thread_id, None),  # never a shared namespace: answers are per thread
        key=key,
        thread_id=thread_id,
        agent_path=agent_path,
        digest=digest,
        branch=point.branch,
        step=step,
        node=node,
    )


def run_blocking(ledger: ToolCallLedger, coro: Coroutine[Any, Any, T]) -> T:
    """Run a ledger coroutine for a sync caller and wait for it: on a private loop in this
    thread (``engine.loops.run_private``: a sync ``graph.invoke``), or - when this thread
    runs an event loop (a sync ``invoke`` inside an async node) - on the ledger's own loop
    if it runs elsewhere (a sync saver's). A ledger bound to this very loop cannot be
    waited for from it: :class:`ConfigError`, before the model is asked."""
    here = running_loop()
    if here is None:
        return run_private(coro)
    loop = ledger.loop
    if loop is not None and loop is not here and loop.is_running():
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    coro.close()
    raise ConfigError(
        "a recorded model call was made synchronously (invoke) in a thread running an "
        "event loop that its ledger needs: use `await model.ainvoke(...)` there (or run "
        "the sync call in a worker thread, e.g. asyncio.to_thread)"
    )


# --- record and replay ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Codec(Generic[T]):
    """How a front door's answer is stored: ``encode`` to what the saver's serializer
    writes, ``decode`` back, ``message`` the AIMessage a replay announces."""

    encode: Callable[[T], Any]
    decode: Callable[[Any], T]
    message: Callable[[T], Any]


class ModelRecorder:
    """Records model answers in the ledger and replays them (one per front door).

    ``ledger``: the ledger to record in (default: the graph's checkpointer when it is
    one; a checkpointer without a ledger records nothing). ``lease_seconds``: how long
    the claim written with a record holds off other writers (it is completed at once).
    ``wait_seconds``: how long to wait for another process's record of the same call
    that is being written (then the model is asked without recording).
    """

    def __init__(
        self,
        *,
        ledger: ToolCallLedger | None = None,
        lease_seconds: float = 300.0,
        wait_seconds: float = 5.0,
        poll_seconds: float = 0.05,
    ) -> None:
        if ledger is not None and not isinstance(ledger, ToolCallLedger):
            raise ConfigError(f"ledger must be a ToolCallLedger, got {type(ledger).__name__}")
        if lease_seconds <= 0 or wait_seconds < 0 or poll_seconds <= 0:
            raise ConfigError("lease_seconds and poll_seconds must be > 0, wait_seconds >= 0")
        self.ledger = ledger
        self.lease_seconds = float(lease_seconds)
        self.wait_seconds = float(wait_seconds)
        self.poll_seconds = float(poll_seconds)
        self.counts = ModelCounts()
        self._owner = make_owner()

    @property
    def owner(self) -> str:
        """A claim owner minted by this process (renewed after ``fork``)."""
        if not minted_here(self._owner):
            self._owner = make_owner()
        return self._owner

    def site(self, config: RunnableConfig, parts: Mapping[str, Any]) -> ModelCallSite | None:
        return call_site(config, self.ledger, parts)

    async def acall(
        self,
        config: RunnableConfig,
        parts: Mapping[str, Any],
        ask: Callable[[], Awaitable[T]],
        codec: Codec[T],
    ) -> T:
        """The recorded answer of this call if there is one, else ``ask()``'s, recorded
        (committed) before it is returned. An exception from ``ask`` records nothing."""
        site = self.site(config, parts)
        if site is None:
            self.counts.unrecorded += 1
            return await ask()
        ledger = site.ledger
        found = await self._arecorded(site)
        if found is not None:
            value = await on_loop(ledger.loop, self._areplay(site, found, codec))
            await _aannounce(site, codec.message(value))
            return value
        answer = await ask()
        return await on_loop(ledger.loop, self._arecord(site, answer, codec, config))

    def call(
        self,
        config: RunnableConfig,
        parts: Mapping[str, Any],
        ask: Callable[[], T],
        codec: Codec[T],
    ) -> T:
        """:meth:`acall` for a sync caller: the model runs in this thread, as without us;
        the ledger's reads and writes on its own loop (:func:`run_blocking`)."""
        site = self.site(config, parts)
        if site is None:
            self.counts.unrecorded += 1
            return ask()
        ledger = site.ledger
        found = run_blocking(ledger, self._arecorded(site))
        if found is not None:
            value = run_blocking(ledger, on_loop(ledger.loop, self._areplay(site, found, codec)))
            announce(site, codec.message(value))
            return value
        answer = ask()
        recording = self._arecord(site, answer, codec, config)
        return run_blocking(ledger, on_loop(ledger.loop, recording))

    async def _arecorded(self, site: ModelCallSite) -> LedgerEntry | None:
        """The completed record of this call, if any; waits (``wait_seconds``) while
        another live process holds its claim, as it writes the record that instant."""
        ledger = site.ledger
        deadline = time.monotonic() + self.wait_seconds
        while True:
            entry = await on_loop(ledger.loop, ledger.aget_entry(site.scope, site.key))
            if entry is None or entry.status is CallStatus.FAILED:
                return None
            if entry.status is CallStatus.COMPLETED:
                return entry
            if entry.is_unknown() or time.monotonic() >= deadline:
                return None  # a claim that never completed: nothing to replay
            await asyncio.sleep(self.poll_seconds)

    async def _areplay(self, site: ModelCallSite, entry: LedgerEntry, codec: Codec[T]) -> T:
        """The recorded answer, its replay counted on the entry (on the ledger's loop)."""
        value = self._decode(site, entry, codec)
        await site.ledger.anote_replay(site.scope, site.key)
        self.counts.replayed += 1
        return value

    async def _arecord(
        self, site: ModelCallSite, answer: T, codec: Codec[T], config: RunnableConfig
    ) -> T:
        """Write the record (on the ledger's loop): one commit on a ledger that records
        answers so (``answer_records``: this package's savers), else a claim completed at
        once. A record another branch wrote first wins: both branches then go on with
        one answer."""
        ledger = site.ledger
        result_type, blob = dumps(ledger.serde, codec.encode(answer), "a model call")
        run = config.get("run_id") or config.get("metadata", {}).get("run_id")
        owner = self.owner
        intent = site.intent(None if run is None else str(run))
        if isinstance(ledger, AnswerRecorder):
            recorded, entry = await ledger.arecord_answer(
                intent,
                owner=owner,
                lease_seconds=self.lease_seconds,
                result_type=result_type,
                result=blob,
            )
            if recorded:
                self.counts.recorded += 1
                return answer
        else:
            [claim] = await ledger.aclaim([intent], owner=owner, lease_seconds=self.lease_seconds)
            recorded, entry = claim.claimed, claim.entry
        if not recorded:
            if entry.status is CallStatus.ISSUED and not entry.is_unknown():
                # another branch claimed it an instant ago: its outcome follows at once
                entry = await self._arecorded(site) or entry
            if entry.status is CallStatus.COMPLETED:
                self.counts.adopted_other += 1
                return self._decode(site, entry, codec)
            if entry.status is not CallStatus.ISSUED or not entry.is_unknown():
                self.counts.unrecorded += 1
                return answer  # the other writer did not finish in wait_seconds
            taken = await ledger.areclaim(entry, owner=owner, lease_seconds=self.lease_seconds)
            if taken is None:
                self.counts.unrecorded += 1
                return answer
        try:
            outcome = Outcome.completed(result_type, blob)
            await ledger.record_outcome(site.scope, site.key, owner=owner, outcome=outcome)
        except LedgerStateError:
            # our claim was taken over between the two writes: the record is theirs
            self.counts.unrecorded += 1
            return answer
        self.counts.recorded += 1
        return answer

    @staticmethod
    def _decode(site: ModelCallSite, entry: LedgerEntry, codec: Codec[T]) -> T:
        """The recorded answer; an unreadable record is a :class:`CorruptRecordError`."""
        try:
            assert entry.result_type is not None and entry.result is not None
            stored = site.ledger.serde.loads_typed((entry.result_type, entry.result))
            if not isinstance(stored, dict) or stored.get("v") != _RECORD_VERSION:
                raise ValueError(f"not a model record: {type(stored).__name__}")
            return codec.decode(stored)
        except Exception as exc:
            raise CorruptRecordError(
                "recorded model response",
                location={"scope": entry.scope, "key": entry.key},
                cause=exc,
            ) from exc


def record_of(result: Sequence[Any], structured: Any = None) -> dict[str, Any]:
    """What is stored for a model answer: its messages (the AIMessage with its tool-call
    ids, usage and response metadata; a structured-output tool message) and the parsed
    structured response."""
    return {"v": _RECORD_VERSION, "result": list(result), "structured_response": structured}


def _event_data(site: ModelCallSite, message: Any) -> dict[str, Any]:
    calls = getattr(message, "tool_calls", None) or []
    return {
        "tool": MODEL_TOOL_NAME,
        "key": site.key,
        "recorded": CallStatus.COMPLETED.value,
        "node": site.node,
        "step": site.step,
        "message": message,
        "tool_call_ids": [c.get("id") for c in calls],
    }


def announce(site: ModelCallSite, message: Any) -> None:
    """The replay marker (``REPLAY_EVENT``) from a sync caller, under the node's run:
    streaming users see the replayed message there (``astream_events``: an
    ``on_custom_event``), as the model's own run would have shown it."""
    with contextlib.suppress(RuntimeError):  # no parent run: called outside a runnable
        dispatch_custom_event(REPLAY_EVENT, _event_data(site, message))


async def _aannounce(site: ModelCallSite, message: Any) -> None:
    """:func:`announce` from an async caller."""
    with contextlib.suppress(RuntimeError):
        await adispatch_custom_event(REPLAY_EVENT, _event_data(site, message))
