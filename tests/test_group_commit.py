"""``GroupCommit``, the batching under every SQLite write and Postgres's outcomes: what is
submitted together is committed together, what arrives during a commit is the next
batch, and nothing submitted is ever left waiting (the real-database behaviour is in
``test_sqlite_specific.py``, ``test_postgres_specific.py`` and ``test_ledger_cost.py``)."""

from __future__ import annotations

import asyncio

import pytest

from langgraph_idem_saver.group_commit import GroupCommit


class Recorder:
    """A commit function that records its batches and can be held mid-commit."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None

    async def commit(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return [i * 10 for i in items]


def submitted(group: GroupCommit[int, int], item: int) -> asyncio.Future[int]:
    """``group.submit(item)`` started now, as a caller's task would."""
    return asyncio.ensure_future(group.submit(item))


async def held_batch(rec: Recorder, group: GroupCommit[int, int], item: int) -> asyncio.Future[int]:
    """``item`` submitted and its batch being committed, held at the gate until it opens."""
    rec.gate.clear()
    future = submitted(group, item)
    while not rec.batches:
        await asyncio.sleep(0)
    return future


async def test_items_submitted_together_share_one_commit() -> None:
    rec = Recorder()
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    results = await asyncio.gather(*(group.submit(i) for i in range(5)))
    assert results == [0, 10, 20, 30, 40]
    assert rec.batches == [[0, 1, 2, 3, 4]]


async def test_items_arriving_during_a_commit_form_the_next_batch() -> None:
    rec = Recorder()
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    first = await held_batch(rec, group, 1)
    later = [submitted(group, 2), submitted(group, 3)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30]
    assert rec.batches == [[1], [2, 3]]


async def test_a_failed_commit_fails_its_batch_only() -> None:
    rec = Recorder()
    rec.fail_with = RuntimeError("disk on fire")
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    doomed = [submitted(group, 1), submitted(group, 2)]
    with pytest.raises(RuntimeError, match="disk on fire"):
        await doomed[0]
    with pytest.raises(RuntimeError, match="disk on fire"):
        await doomed[1]
    rec.fail_with = None
    assert await group.submit(3) == 30  # the next batch commits
    assert rec.batches == [[1, 2], [3]]


async def test_a_cancelled_caller_does_not_stop_the_batch() -> None:
    rec = Recorder()
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    dropped = submitted(group, 2)  # joins the batch of 1, below
    kept = await held_batch(rec, group, 1)
    dropped.cancel()
    rec.gate.set()
    assert await kept == 10
    assert rec.batches == [[2, 1]]  # the cancelled one was committed all the same


async def test_items_left_by_a_cancelled_commit_are_committed_by_the_next() -> None:
    rec = Recorder()
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    first = await held_batch(rec, group, 1)
    waiting = submitted(group, 2)
    await asyncio.sleep(0)
    [commit] = [
        t
        for t in asyncio.all_tasks()
        if t.get_coro().__qualname__ == "GroupCommit._run"  # type: ignore[union-attr]
    ]
    commit.cancel()  # e.g. the loop cancelling every task at shutdown
    with pytest.raises(asyncio.CancelledError):
        await first
    rec.gate.set()
    assert await asyncio.wait_for(waiting, 5) == 20
    assert rec.batches == [[1], [2]]


async def test_a_gathered_item_is_committed_with_what_is_pending_without_a_wait() -> None:
    """``submit_gathered`` (a step's outcomes, gathered by their caller over a loop
    iteration): its batch starts at once, one loop iteration sooner than
    ``submit_nowait``'s; with a batch already scheduled it joins it, and during a commit
    it joins the next batch, as any item does."""
    rec = Recorder()
    group: GroupCommit[int, int] = GroupCommit(rec.commit)
    alone = group.submit_gathered(1)
    await asyncio.sleep(0)  # the batch's task starts: no iteration spent gathering
    assert rec.batches == [[1]]
    assert await alone == 10

    scheduled = group.submit_nowait(2)
    joining = group.submit_gathered(3)
    assert await asyncio.gather(scheduled, joining) == [20, 30]
    assert rec.batches == [[1], [2, 3]]

    rec = Recorder()
    group = GroupCommit(rec.commit)
    first = await held_batch(rec, group, 4)
    during = group.submit_gathered(5)
    await asyncio.sleep(0)
    assert rec.batches == [[4]]  # not beside the batch in progress
    rec.gate.set()
    assert await asyncio.gather(first, during) == [40, 50]
    assert rec.batches == [[4], [5]]
