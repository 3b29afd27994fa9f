"""Fork slots: two branches of one thread never both run the same logical call.

Two workers that resume one thread at the same moment both re-run its pending model step,
and LangGraph forks the checkpoint chain: each branch carries the model's calls under
fresh tool-call ids, so the default key (the id in its message) sees two calls. A lost
model message (durability ``"async"``/``"exit"``) is the same situation one process at a
time: the re-run step is a new branch of the same point of history.

So a call claimed under the default key also takes a *fork slot*: its **position** (the
thread, the namespace of the graph running the tool node with its task ids, the node,
and the step - the same in every branch that forked from one checkpoint), its tool and
canonical arguments, and its **occurrence** (the n-th identical call of the step). The
slot is unique in the ledger, so the database decides between two claims made at the
same instant. A claim refused by the slot of another **branch** (the checkpoint the
step ran from) follows that branch's entry - replayed, waited for while it runs, or
settled as an unknown outcome - instead of running again. A claim refused by a slot of
its *own* branch is another identical call of the same step (a ``Send`` sibling): it
takes the next occurrence.

Time travel (resuming from an earlier ``checkpoint_id``) is not such a fork: LangGraph
first writes a "fork" checkpoint one step later, so its calls get other positions - a
new line of history (docs/guarantees.md).

The position comes from LangGraph's task config: ``metadata["langgraph_step"]`` and the
private ``checkpoint_map`` (namespace -> id of the checkpoint the step ran from). This
module is the only reader of the latter; ``tests/test_forks.py`` fails loudly if
LangGraph stops providing it.
"""

from __future__ import annotations

import dataclasses

from langchain_core.runnables import RunnableConfig

from langgraph_idem_saver.engine.types import Kind, Plan
from langgraph_idem_saver.engine.upstream import CONFIG_KEY_CHECKPOINT_MAP
from langgraph_idem_saver.keys import fork_position


@dataclasses.dataclass(frozen=True)
class ForkPoint:
    """Where a step runs: its position in the thread's history and its branch."""

    position: str
    branch: str


def fork_point(config: RunnableConfig, thread_id: str) -> ForkPoint | None:
    """The fork point of the task ``config`` belongs to; None outside a graph step (a
    tool node invoked directly has no place in a thread's history)."""
    configurable = config.get("configurable", {})
    step = config.get("metadata", {}).get("langgraph_step")
    checkpoint_map = configurable.get(CONFIG_KEY_CHECKPOINT_MAP)
    task_ns = configurable.get("checkpoint_ns")
    if not isinstance(step, int) or not isinstance(checkpoint_map, dict) or not task_ns:
        return None
    graph_ns, _, node = str(task_ns).rpartition("|")
    branch = checkpoint_map.get(graph_ns)
    if not isinstance(branch, str):
        return None
    return ForkPoint(fork_position(thread_id, graph_ns, node.split(":", 1)[0], step), branch)


def siblings_refused(plans: list[Plan]) -> list[Plan]:
    """Calls refused by a slot that a call of their own branch holds: identical calls of
    one step (e.g. ``Send`` tasks each carrying one) - moved to their next occurrence,
    to be claimed again. Calls refused by another branch's slot keep its entry."""
    again = []
    for plan in plans:
        intent, entry = plan.intent, plan.entry
        if plan.kind is not Kind.PENDING or intent is None or entry is None:
            continue
        if entry.key == intent.key or intent.position is None:
            continue
        if entry.branch == intent.branch:
            plan.intent = dataclasses.replace(intent, occurrence=intent.occurrence + 1)
            plan.entry = plan.ledger_key = None
            again.append(plan)
    return again
