"""A claim builds the entries of the rows it inserted instead of reading them back
(``Claims.issued_entry``, issue 16): the built entry must be the entry a read gives, field
for field, on both backends, with args sealed by an encrypting serializer too. A claim
refused by the key or by the fork slot still reads the row that refused it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from langgraph_idem_saver.ledger import CallIntent, CallStatus, LedgerEntry, StepLookup


def intent(i: int, *, scope: str = "t", **kw: Any) -> CallIntent:
    values: dict[str, Any] = {
        "scope": scope,
        "key": f"key-{i}",
        "thread_id": scope,
        "agent_path": "agent|tools",
        "tool_name": "charge",
        "args_hash": f"hash-{i}",
        "args": f'{{"invoice": "inv-{i}", "note": "é\\u00e9"}}'.encode(),
        "tool_call_id": f"call_{i}",
    }
    return CallIntent(**(values | kw))


# every optional column set, none of them, odd text: what a read gives back must match
VARIANTS = [
    {},
    {"run_id": "run-1", "position": "pos-1", "branch": "b-1", "occurrence": 2},
    {"run_id": None, "position": None, "branch": None, "occurrence": 0},
    {"agent_path": "", "tool_call_id": "ünïcode ☃", "position": "p", "occurrence": 7},
]


def fields_of(entry: LedgerEntry) -> dict[str, Any]:
    return {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}


async def assert_built_equals_read(saver: Any, intents: list[CallIntent]) -> None:
    outcomes = await saver.aclaim(intents, owner="owner-1", lease_seconds=60)
    assert [o.claimed for o in outcomes] == [True] * len(intents)
    for call, outcome in zip(intents, outcomes, strict=True):
        read = await saver.aget_entry(call.scope, call.key)
        assert fields_of(outcome.entry) == fields_of(read)
        assert outcome.entry == read and repr(outcome.entry) == repr(read)
        assert outcome.entry.status is CallStatus.ISSUED and outcome.entry.args == call.args


async def test_built_entries_are_the_entries_read(saver: Any) -> None:
    await assert_built_equals_read(saver, [intent(i, **kw) for i, kw in enumerate(VARIANTS)])


async def test_a_step_claim_builds_the_same_entries(saver: Any) -> None:
    """The step claim (``aclaim_step``: the adoption read and the claim in one trip)."""
    calls = [intent(i, **kw) for i, kw in enumerate(VARIANTS)]
    lookup = StepLookup("t", "agent|tools", [("other", "x")], [("nowhere", "other")])
    claim = await saver.aclaim_step(calls, lookup, owner="o", lease_seconds=60)
    assert not claim.candidates.any() and claim.claimed is not None
    for call, outcome in zip(calls, claim.claimed, strict=True):
        assert outcome.claimed and outcome.entry == await saver.aget_entry(call.scope, call.key)


async def test_sealed_args_are_built_in_clear(backend: str, db: Any) -> None:
    """With an encrypting serializer the row holds sealed args; the entry, built or read,
    holds them in clear."""
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    async with db.open(serde=serde) as saver:
        await assert_built_equals_read(saver, [intent(i, **kw) for i, kw in enumerate(VARIANTS)])
    [(stored,)] = await db.query("SELECT args FROM idem_tool_calls WHERE key = ?", ("key-0",))
    assert b"inv-0" not in bytes(stored)  # sealed in the database


async def test_refused_claims_still_read_the_row_that_refused_them(saver: Any) -> None:
    first = await saver.aclaim([intent(0), intent(1, position="p", occurrence=0)], owner="a",
                               lease_seconds=60)  # fmt: skip
    same_key = intent(0, args=b'{"other": 1}')
    same_slot = intent(9, position="p", occurrence=0, args_hash="hash-1")
    fresh = intent(2)
    again = await saver.aclaim([same_key, same_slot, fresh, intent(2)], owner="b", lease_seconds=60)
    assert [o.claimed for o in again] == [False, False, True, False]
    assert again[0].entry == first[0].entry and again[0].entry.owner == "a"
    assert again[1].entry == first[1].entry  # the slot's holder
    assert again[3].entry == again[2].entry  # a key repeated in the batch: claimed once
    assert again[2].entry == await saver.aget_entry("t", "key-2")


async def test_a_serializer_swapped_on_a_live_saver_seals_from_then_on(db: Any) -> None:
    """Whether args are sealed follows the serializer the saver has at each claim: a
    saver whose ``serde`` is replaced (by a user, or LangGraph's ``with_allowlist``)
    seals with the new one at once, and stops when it is swapped back."""
    async with db.open() as saver:
        await saver.aclaim([intent(0)], owner="a", lease_seconds=60)  # in clear
        clear = saver.serde
        saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
        await saver.aclaim([intent(1)], owner="a", lease_seconds=60)  # sealed
        saver.serde = clear
        await saver.aclaim([intent(2)], owner="a", lease_seconds=60)  # in clear again
    rows = await db.query("SELECT key, args FROM idem_tool_calls ORDER BY key")
    stored = {key: bytes(args) for key, args in rows}
    assert b"inv-0" in stored["key-0"] and b"inv-2" in stored["key-2"]
    assert b"inv-1" not in stored["key-1"], "sealed while the encrypting serializer was set"


async def test_the_engine_builds_every_field_of_an_intent(saver: Any) -> None:
    """The engine builds intents without the dataclass's ``__init__`` (``intent_of``):
    each has every field, equals the one ``CallIntent(...)`` makes from the same values,
    and is claimed as such - a leader with its fork slot, its same-key follower without."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from langgraph_idem_saver import IdempotentToolNode
    from langgraph_idem_saver.engine.intents import INTENT_FIELDS
    from langgraph_idem_saver.engine.types import Kind

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        return invoice

    calls = [
        {"name": "charge", "args": {"invoice": "inv-1"}, "id": "call_0", "type": "tool_call"},
        {"name": "charge", "args": {"invoice": "inv-1"}, "id": "call_0", "type": "tool_call"},
        {"name": "charge", "args": {"invoice": "é"}, "id": "call_1", "type": "tool_call"},
    ]
    node = IdempotentToolNode([charge], ledger=saver)
    config: Any = {
        "configurable": {
            "thread_id": "t-intents",
            "checkpoint_ns": "tools:task-1",
            "checkpoint_map": {"": "checkpoint-1"},
        },
        "metadata": {"langgraph_step": 3},
        "run_id": "run-9",
    }
    state = {"messages": [AIMessage(content="", id="ai-1", tool_calls=calls)]}
    batch = node._plan(state, config, sync=False)
    await node.engine.aprepare(batch, config)

    leader, follower, other = batch.all_plans
    assert [p.kind for p in batch.all_plans] == [Kind.RUN, Kind.FOLLOW, Kind.RUN]
    for plan in batch.all_plans:
        assert plan.intent is not None
        assert set(vars(plan.intent)) == INTENT_FIELDS
        assert plan.intent == CallIntent(**vars(plan.intent))
    assert leader.intent is not None and other.intent is not None
    assert leader.intent.position is not None and leader.intent.branch == "checkpoint-1"
    assert (leader.intent.occurrence, other.intent.occurrence) == (0, 0)
    assert leader.intent.run_id == "run-9" and leader.intent.agent_path == "tools"
    assert follower.intent is not None and follower.intent.position is None
    for plan in (leader, other):
        assert plan.intent is not None
        read = await saver.aget_entry(plan.intent.scope, plan.intent.key)
        assert read is not None and read.args == plan.intent.args
        assert (read.position, read.branch, read.occurrence, read.run_id) == (
            plan.intent.position, plan.intent.branch, 0, "run-9",
        )  # fmt: skip
