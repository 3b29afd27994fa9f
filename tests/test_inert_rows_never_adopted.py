"""``StepLookup.inert`` is sound: adoption never acts on a row it names.

On Postgres, a claim whose adoption read found only rows under ``StepLookup.inert`` keys
(the other calls of the step's message, as this state shows them) and adopted by nobody
goes on in the same statement: adoption is skipped. That is right only if adoption, given
those rows, decides nothing - no orphan taken, no lost call superseded, no entry handed to
any leader. This pins it for any state: ids reused across messages, leaders a subset of
the message, rows of any status, tool, arguments, fork slot and branch, owned by a process
that is not this one. The control shows the harness sees adoption act: a row of a call
the state does not hold (an orphan) is taken.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langgraph_idem_saver.engine import adoption
from langgraph_idem_saver.engine.types import Batch, Kind, Plan
from langgraph_idem_saver.keys import tool_call_keys
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    LedgerEntry,
    StepCandidates,
    adopted_with,
    adopter_of,
    is_paired,
    paired_with,
)

PATH = "tools"
IDS = ["c0", "c1", "c2", "c3"]
TOOLS = ["send", "pay"]
HASHES = ["h0", "h1"]
FAR = "far-host:1:owner"  # not this process: never ``minted_here``


class RecordingLedger:
    """The ledger adoption would write to: records every adoption it tries."""

    def __init__(self) -> None:
        self.adopted: list[tuple[str, str]] = []

    async def aadopt(self, scope: str, key: str, **kwargs: Any) -> LedgerEntry | None:
        self.adopted.append((key, kwargs["tool_call_id"]))
        return None

    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        return None


def message_key(call_id: str, message_id: str) -> str:
    [key] = tool_call_keys(PATH, call_id, message_id) - tool_call_keys(PATH, call_id, "")
    return key


def state(pairs: list[tuple[str, str]], ledger: RecordingLedger) -> Batch:
    """A batch as ``LedgerEngine.note_state`` leaves it for these (id, message) pairs."""
    batch = Batch(sync=False)
    batch.scope, batch.ledger = "t", cast(Any, ledger)
    batch.known_ids = {c for c, _ in pairs}
    batch.pairs = list(pairs)
    for call_id, message_id in pairs:
        if batch.origins.setdefault(call_id, message_id) != message_id:
            batch.reused_ids.add(call_id)
            batch.origins[call_id] = message_id
    return batch


def leader(call_id: str, message_id: str, tool: str, digest: str) -> Plan:
    plan = Plan({"name": tool, "args": {}, "id": call_id, "type": "tool_call"})
    plan.kind, plan.policy = Kind.PENDING, "tool_call"
    plan.intent = CallIntent(
        scope="t", key=message_key(call_id, message_id), thread_id="t", agent_path=PATH,
        tool_name=tool, args_hash=digest, args=b"{}", tool_call_id=call_id, position="p",
        branch="b-now", occurrence=0,
    )  # fmt: skip
    return plan


def row(key: str, call_id: str, tool: str, digest: str, **fields: Any) -> LedgerEntry:
    values: dict[str, Any] = {
        "scope": "t", "key": key, "thread_id": "t", "agent_path": PATH, "tool_name": tool,
        "args_hash": digest, "args": b"{}", "tool_call_id": call_id,
        "status": CallStatus.ISSUED, "attempts": 1, "replays": 0, "conflicts": 0,
        "owner": FAR, "issued_at": 1.0, "lease_expires_at": 2.0, "position": "p",
        "branch": "b-old", "occurrence": 0,
    }  # fmt: skip
    return LedgerEntry(**{**values, **fields})


async def adopt(batch: Batch, leaders: list[Plan], found: list[LedgerEntry]) -> None:
    """Both adoption passes, as ``LedgerEngine.aprepare`` runs them on what it found
    (the leaders the batch's plans: a ``create_agent`` call's batch is that call)."""
    for plan in leaders:
        batch.add(plan)
    lookup = adoption.step_lookup(batch, leaders)
    assert lookup is not None
    candidates = StepCandidates.sorted_out(found, PATH, lookup.signatures, lookup.spots)
    ctx, config = cast(Any, None), cast(Any, {})  # neither is reached unless adopting
    await adoption.aadopt_orphans(ctx, batch, leaders, config, candidates)
    await adoption.aadopt_superseded(ctx, batch, leaders, config, candidates)


calls = st.lists(st.sampled_from(IDS), min_size=1, max_size=4)
signature = st.tuples(st.sampled_from(TOOLS), st.sampled_from(HASHES))
rows = st.fixed_dictionaries(
    {
        "status": st.sampled_from(list(CallStatus)),
        "signature": signature,
        "position": st.sampled_from(["p", None]),
        "branch": st.sampled_from(["b-old", "b-now"]),
        "lease_expires_at": st.sampled_from([0.0, 2.0, 9e12]),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    older=st.lists(st.sampled_from(IDS), max_size=3),
    current=calls,
    leading=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    signatures=st.lists(signature, min_size=4, max_size=4),
    found=st.lists(rows, max_size=8),
    picks=st.lists(st.integers(0, 63), min_size=8, max_size=8),
)
def test_rows_under_inert_keys_change_no_adoption(
    older: list[str],
    current: list[str],
    leading: list[int],
    signatures: list[tuple[str, str]],
    found: list[dict[str, Any]],
    picks: list[int],
) -> None:
    """Whatever the state and the rows, adoption given only rows under the leaders'
    inert keys, adopted by nobody, gives no leader an entry and tries no adoption."""
    pairs = [(c, "m-old") for c in older] + [(c, "m-now") for c in current]
    ledger = RecordingLedger()
    batch = state(pairs, ledger)
    ids = list(dict.fromkeys(current[i % len(current)] for i in leading))
    leaders = [
        leader(c, "m-now", *signatures[IDS.index(c)]) for c in ids if c not in batch.reused_ids
    ]
    if not leaders:
        return
    inert = sorted(adoption.sibling_keys(batch, {str(p.call["id"]) for p in leaders}, PATH))
    if not inert:
        return
    entries = []
    for i, fields in enumerate(found):
        key = inert[picks[i] % len(inert)]
        owner_id = next(c for c, m in pairs if key in tool_call_keys(PATH, c, m))
        tool, digest = fields.pop("signature")
        entries.append(row(key, owner_id, tool, digest, **fields))
    asyncio.run(adopt(batch, leaders, entries))
    assert ledger.adopted == []
    assert [p.entry for p in leaders] == [None] * len(leaders)
    assert not any(p.superseded for p in leaders)


@pytest.mark.parametrize("where", ["signature", "fork slot"])
async def test_the_control_a_row_of_a_call_the_state_lacks_is_adopted(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness sees adoption act: a row under the key of a call this state does not
    hold (an orphan), same signature - or, reworded, at the leader's fork slot - is
    taken for the leader (``aadopt`` is tried; at the fork slot as a pairing,
    ``earlier.PAIRED``)."""
    monkeypatch.setattr(adoption, "_ADOPTED_HERE", OrderedDict())  # what _atake notes
    ledger = RecordingLedger()
    batch = state([("c0", "m-now"), ("c1", "m-now")], ledger)
    plans = [leader("c0", "m-now", "send", "h0")]
    digest = "h0" if where == "signature" else "h1"
    orphan = row(message_key("c9", "m-lost"), "c9", "send", digest)
    await adopt(batch, plans, [orphan])
    # reworded, the entry is paired with the leader: a question, not an adoption
    by = "c0" if where == "signature" else paired_with("c0")
    assert ledger.adopted == [(orphan.key, by)]


def test_a_pairing_hides_nothing_from_orphan_adoption_and_no_call_id_reads_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``adopted_by`` tells a reworded call's pairing (``ledger.PAIRED``) from an adoption:
    a pairing - whoever made it, even a live run here - leaves the entry an orphan for
    the lost call's own arguments, and still counts when pairing again; an adoption by a
    call whose id happens to start with the pairing's prefix is an adoption."""
    monkeypatch.setattr(adoption, "_ADOPTED_HERE", OrderedDict())
    known = {"c7"}
    paired = row("k1", "lost", "send", "h0", adopted_by=paired_with("c7"))
    assert is_paired(paired.adopted_by) and adopter_of(paired.adopted_by) == "c7"
    assert adoption._maybe_orphan(paired, known, set(), pairings=False)
    assert not adoption._maybe_orphan(paired, known, set(), pairings=True)
    adoption._note_adopted_here("c8")
    live = row("k2", "lost", "send", "h0", adopted_by=paired_with("c8"))
    assert adoption._maybe_orphan(live, set(), set(), pairings=False)
    assert not adoption._maybe_orphan(live, set(), set(), pairings=True)

    odd = "reworded:Z"  # a model-given id
    stored = adopted_with(odd)
    assert stored != odd and not is_paired(stored) and adopter_of(stored) == odd
    adoption._note_adopted_here(odd)  # adopted by a live run of this process
    taken = row("k3", "lost", "send", "h0", adopted_by=stored)
    assert not adoption._maybe_orphan(taken, set(), set(), pairings=False)
    assert adopted_with("call_1") == "call_1" and adopter_of("call_1") == "call_1"
