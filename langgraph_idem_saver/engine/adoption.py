"""Orphan adoption: a call whose model message was lost gets back its ledger entry.

With durability ``"async"``/``"exit"`` a crash can lose the AIMessage whose calls were
already claimed (and maybe run). The model then runs again and emits the same calls under
new ids. This module maps each such call to the entry of the lost one (same scope, agent
path, tool and canonical arguments) instead of running it again - and takes care never to
take the entry of a *sibling* (another task of the same agent) or of an earlier turn.
"""

from __future__ import annotations

import asyncio
import operator
import os
import threading
from collections import OrderedDict
from itertools import compress, repeat
from operator import is_not

from langchain_core.runnables import RunnableConfig
from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from langgraph_idem_saver.engine.context import EngineContext, on_ledger_loop
from langgraph_idem_saver.engine.earlier import closed_superseded, of_ended_conversation
from langgraph_idem_saver.engine.history import alist_saved
from langgraph_idem_saver.engine.loops import on_loop
from langgraph_idem_saver.engine.results import collect_tool_calls
from langgraph_idem_saver.engine.types import Batch, Plan
from langgraph_idem_saver.keys import agent_path_of, tool_call_keys
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    LedgerEntry,
    StepCandidates,
    StepLookup,
    adopted_with,
    adopter_of,
    is_paired,
    paired_with,
)
from langgraph_idem_saver.owners import minted_here

# Tool call ids that adopted an orphan in this process (bounded, most recent kept). An
# entry adopted by one of them belongs to a live run here, maybe a sibling task whose
# message exists only in memory: never re-adopted.
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


_TOOL = operator.attrgetter("tool_name")
_ARGS_HASH = operator.attrgetter("args_hash")
_POSITION = operator.attrgetter("position")
_FIRST = operator.itemgetter(0)
_INTENT = operator.attrgetter("intent")
_TOOL_CALL_ID = operator.attrgetter("tool_call_id")
_POLICY = operator.attrgetter("policy")
_SECOND = operator.itemgetter(1)


def step_lookup(batch: Batch, leaders: list[Plan]) -> StepLookup | None:
    """What adoption must read for the leaders of a step, or None when it does not
    apply: no state visible (ids cannot be told apart), or no default-key call (only
    they adopt, and only they have fork slots)."""
    if batch.known_ids is None:
        return None
    intents = list(map(_INTENT, leaders))  # a ToolNode step's: every one (no frame a call)
    every = len(leaders)
    if list(map(_POLICY, leaders)).count("tool_call") != every or not all(
        map(is_not, intents, repeat(None))
    ):
        intents = [p.intent for p in leaders if p.policy == "tool_call" and p.intent is not None]
    if not intents:
        return None
    agent_path = intents[0].agent_path
    tools = list(map(_TOOL, intents))  # (map and zip: no Python frame a call of a wide step)
    spots = filter(_FIRST, zip(map(_POSITION, intents), tools, strict=True))
    return StepLookup(
        batch.scope,
        agent_path,
        list(dict.fromkeys(zip(tools, map(_ARGS_HASH, intents), strict=True))),
        list(dict.fromkeys(spots)),  # those with a position
        # every leader has its intent (``intents.key_calls``): its id is the call's
        sibling_keys(batch, set(map(_TOOL_CALL_ID, map(_INTENT, leaders))), agent_path),
    )


def sibling_keys(batch: Batch, ids: set[str], agent_path: str) -> frozenset[str]:
    """The keys of the other calls of the messages of ``ids`` (``StepLookup.inert``):
    keys of this state's calls (so never an orphan), none of them a key of ``ids``' own
    (their own entries and legacy keys are adoption's to look at). An id found in
    several messages gives nothing: which message it means is adoption's to decide."""
    messages = set(map(batch.origins.get, ids)) - {None}
    if not messages:
        return frozenset()
    pairs = batch.pairs  # the state's calls of those messages, not of ``ids`` (C: ``map``)
    others = set(compress(map(_FIRST, pairs), map(messages.__contains__, map(_SECOND, pairs))))
    if not others - ids - batch.reused_ids:
        return frozenset()  # every call of the messages is a leader (a ToolNode step)
    keys: set[str] = set()
    for call_id, message_id in batch.pairs:
        if message_id in messages and call_id not in ids and call_id not in batch.reused_ids:
            keys |= tool_call_keys(agent_path, call_id, message_id)
    if not keys:  # every call of the messages is a leader (a ToolNode step): no digest
        return frozenset()
    for call_id in ids:  # never one of the leaders' own keys, whatever the ids
        keys -= tool_call_keys(agent_path, call_id, batch.origins.get(call_id, ""))
    return frozenset(keys)


async def aadopt_orphans(
    ctx: EngineContext,
    batch: Batch,
    leaders: list[Plan],
    config: RunnableConfig,
    found: StepCandidates,
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
    entries = [e for listed in found.by_signature.values() for e in listed]
    if not entries:
        return  # no entry of any signature of the step: the common case, no work per call
    present = {e.key for e in entries}
    # the keys of every call in this state: an entry under one of them is not an
    # orphan (ids alone would not do: a model may reuse "call_0" every turn)
    known_keys = {
        key
        for call_id, msg in batch.pairs
        for key in tool_call_keys(first.agent_path, call_id, msg)
    }
    orphans = [e for e in entries if _maybe_orphan(e, known, known_keys, pairings=False)]
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
            if e.adopted_by == adopted_with(intent.tool_call_id)
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
            wanted = {e.key for e in orphans} | {_adopter(e) for e in orphans}
            durable = await adurable_calls(batch, config, intent.thread_id, wanted - {""})
        for e in matching:
            if e.key in durable or _adopter(e) in durable:
                continue  # its message exists: a sibling's (or an earlier) call
            adopted = await _atake(batch, e, intent.tool_call_id)
            if adopted is None:
                continue
            taken.add(e.key)
            plan.entry, plan.ledger_key = adopted, adopted.key
            ctx.counters.bump("adopted")
            break


def _adopter(e: LedgerEntry) -> str:
    """The call that adopted ``e`` ("" when none did, or a reworded call only paired it:
    a pairing is not an adoption, ``ledger.PAIRED``)."""
    return "" if is_paired(e.adopted_by) else adopter_of(e.adopted_by) or ""


def _maybe_orphan(
    e: LedgerEntry, known: set[str], known_keys: set[str], *, pairings: bool = True
) -> bool:
    """Not a call of this state, not a claim or adoption of a live run here. With
    ``pairings=False`` (orphan adoption: the lost call's own arguments asking) a reworded
    call's pairing hides nothing (``ledger.PAIRED``); with ``pairings=True`` (pairing
    again) it counts as that call's."""
    if e.key in known_keys or minted_here(e.owner):
        return False
    if e.adopted_by is None or (not pairings and is_paired(e.adopted_by)):
        return True
    adopter = adopter_of(e.adopted_by)
    return adopter not in known and not _adopted_here(adopter)


async def _atake(
    batch: Batch, e: LedgerEntry, tool_call_id: str, *, paired: bool = False
) -> LedgerEntry | None:
    """Adopt ``e`` for ``tool_call_id`` (``paired``: as a reworded call, ``earlier.PAIRED``);
    None when a sibling task of this process took it."""
    assert batch.ledger is not None
    # noted before the write: a sibling task of this process that reads the
    # entry right after it must already see it as adopted here, not as an orphan
    _note_adopted_here(tool_call_id)
    by = paired_with(tool_call_id) if paired else adopted_with(tool_call_id)
    adopted = await on_ledger_loop(
        batch,
        batch.ledger.aadopt(batch.scope, e.key, tool_call_id=by, previous=e.adopted_by),
    )
    if adopted is not None:
        return adopted
    # Someone adopted it first. A call of this process (a sibling task) is another call:
    # look further. Another process resuming the same lost call is this call: follow its
    # entry (wait for it, replay, or settle it), never claim the call afresh.
    latest = await on_ledger_loop(batch, batch.ledger.aget_entry(batch.scope, e.key))
    if latest is None or _adopted_here(adopter_of(latest.adopted_by)):
        return None
    return latest


async def aadopt_superseded(
    ctx: EngineContext,
    batch: Batch,
    plans: list[Plan],
    config: RunnableConfig,
    found_at: StepCandidates,
) -> None:
    """Give a call the entry of a lost call of the same step that it replaced.

    A model re-run after its message was lost may ask for the same effect with other
    arguments (another wording of the same email). Nothing proves the two are one call,
    and nothing proves they are two; the lost one may have happened. So the new call
    takes the entry of a lost call of the *same tool at the same point of history* (the
    same fork position: thread, agent invocation, step - see ``forks``), oldest first,
    each at most once, and is settled by it (``plan.superseded``): a recorded outcome is
    replayed; an unknown one goes to ``verify`` (with the lost call's arguments) ->
    ``on_unknown`` -> a human, and only when it did not happen does the new call run
    (``unknown.aapply``). Never silently past it.
    """
    if batch.ledger is None or batch.known_ids is None:
        return
    known = batch.known_ids
    taken: set[str] = {p.ledger_key for p in batch.all_plans if p.ledger_key is not None}
    # a lost call whose arguments a call of this run asks for is that call's, not one
    # reworded: (tool, args hash) of every ledgered call here
    asked = {(p.intent.tool_name, p.intent.args_hash) for p in batch.all_plans if p.intent}
    durable: set[str] | None = None
    keys_of: dict[str, set[str]] = {}  # agent path -> the keys of the state's calls
    for plan in plans:
        intent = plan.intent
        if intent is None or intent.position is None or plan.entry is not None:
            continue
        found = found_at.at_position.get((intent.position, intent.tool_name), [])
        if not found:
            continue  # nothing made here before: the common case, and no work per call
        if intent.agent_path not in keys_of:
            keys_of[intent.agent_path] = {
                key
                for call_id, msg in batch.pairs
                for key in tool_call_keys(intent.agent_path, call_id, msg)
            }
        known_keys = keys_of[intent.agent_path]
        if intent.key in {e.key for e in found}:
            continue  # its own entry: the claim returns it
        # a lost call closed as superseded did not happen: it settles nothing; a call of
        # an ended conversation is no lost call of this one (earlier.py)
        found = [e for e in found if not closed_superseded(e) and not of_ended_conversation(e)]
        mine = [
            e
            for e in found
            if adopter_of(e.adopted_by) == intent.tool_call_id and e.key not in taken
        ]
        # a lost call settled by the call that replaced it hands over to that call's entry
        successors = {e.tool_call_id for e in found}
        lost = [
            e
            for e in found
            if e.key not in taken
            and (e.tool_name, e.args_hash) not in asked
            and e.branch != intent.branch
            and not (adopter_of(e.adopted_by) in successors and e.status is not CallStatus.ISSUED)
            and _maybe_orphan(e, known, known_keys)
        ]
        if not mine and lost and durable is None:
            wanted = {e.key for e in lost} | {adopter_of(e.adopted_by) or "" for e in lost}
            durable = await adurable_calls(batch, config, intent.thread_id, wanted - {""})
        for e in mine or lost:
            adopter = adopter_of(e.adopted_by) or ""
            if not mine and (e.key in (durable or ()) or adopter in (durable or ())):
                continue  # its message exists: a call of another live branch
            adopted = e if mine else await _atake(batch, e, intent.tool_call_id, paired=True)
            if adopted is None:
                continue
            taken.add(e.key)
            plan.entry, plan.ledger_key, plan.superseded = adopted, adopted.key, True
            ctx.counters.bump("adopted")
            break


async def adurable_calls(
    batch: Batch, config: RunnableConfig, thread_id: str, wanted: set[str]
) -> set[str]:
    """Which of ``wanted`` (ledger keys and tool call ids) belong to a call found in a
    saved checkpoint (or pending write) of the thread, in any namespace, whose parent
    checkpoints were saved too. Newest first, stopping once all are found. A call found
    there is known by its id and by every key it may have been recorded under (see
    ``tool_call_keys``).

    Without a checkpointer that can list the thread, nothing is known (empty set).
    """
    checkpointer = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
    alist = getattr(checkpointer, "alist", None)
    if alist is None or not wanted:
        return set()
    agent_path = agent_path_of(str(config.get("configurable", {}).get("checkpoint_ns", "")))

    async def scan() -> set[str]:
        found: set[str] = set()
        saved: set[tuple[str, str]] = set()  # (namespace, checkpoint id) of every checkpoint
        # calls in a subgraph's checkpoint count only if the checkpoints it ran from
        # (metadata "parents": namespace -> id) were saved too: under durability "exit" a
        # sub-agent that leaves through a handoff saves its own checkpoint, while the
        # root's is never written - a branch of history nobody will continue
        anchored: list[tuple[dict[str, str], set[str]]] = []
        # alist, or a sync-only saver's list in a thread (a ToolLedger beside it)
        async for tup in alist_saved(checkpointer, {"configurable": {"thread_id": thread_id}}):
            configurable = tup.config["configurable"]
            saved.add((str(configurable.get("checkpoint_ns", "")), configurable["checkpoint_id"]))
            pairs: set[tuple[str, str]] = set()
            collect_tool_calls(tup.checkpoint.get("channel_values"), pairs)
            for write in tup.pending_writes or ():
                collect_tool_calls(write[2], pairs)
            calls: set[str] = set()
            for call_id, message_id in pairs:
                calls.add(call_id)
                calls |= tool_call_keys(agent_path, call_id, message_id)
            parents = (tup.metadata or {}).get("parents") or {}
            if parents and calls & wanted:
                anchored.append((dict(parents), calls))
                continue
            found |= calls
            if wanted <= found:
                return found & wanted
        for parents, calls in anchored:  # the scan was complete: ``saved`` is all there is
            if all((ns, cid) in saved for ns, cid in parents.items()):
                found |= calls
        return found & wanted

    if checkpointer is batch.ledger:
        loop = batch.ledger_loop
    else:
        cp_loop = getattr(checkpointer, "loop", None)
        loop = cp_loop if isinstance(cp_loop, asyncio.AbstractEventLoop) else None
    return await on_loop(loop, scan())
