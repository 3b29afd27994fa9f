"""``line_graph``: a ``StateGraph`` whose nodes run one after another, START to END.

Most graphs the tests drive are such a line (a node that asks, then one that acts); the
builder calls for it were written out in every test module. What is added, and in which
order, is what those modules did by hand: the nodes in the order given, then an edge from
START to the first, between each neighbour, and from the last to END.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from langgraph.graph import END, START, StateGraph


def line_graph(schema: Any, checkpointer: Any = None, /, **nodes: Any) -> Any:
    """``schema``'s graph running ``nodes`` (name=action, in keyword order) in a line,
    compiled with ``checkpointer`` (None: a subgraph, which takes its parent's)."""
    builder = StateGraph(schema)
    for name, action in nodes.items():
        builder.add_node(name, action)
    names = [START, *nodes, END]
    for before, after in pairwise(names):
        builder.add_edge(before, after)
    return builder.compile(checkpointer=checkpointer)
