"""The sync ``PostgresSaver`` under ``graph.invoke`` (issue #41), counted on the wire:
a 10-step ``graph.invoke(..., durability="sync")`` exchanges one statement per checkpoint
call with the server - 1 ``get_tuple``, 12 ``put``, 11 ``put_writes``: 24 round trips,
each its own transaction, committed when it returns, no ``BEGIN``/``COMMIT`` of ours -
and a delta ``put`` sends the bases it extends as one parameter (built by the client,
``sql.delta_bases_json``), which ``idem_missing_bases`` checks as before: deltas are
stored while their bases are, and a delta whose base is gone is written whole.

The counts come from libpq's own protocol trace of the user's connection (``PQtrace``,
test-local): what went over the wire, not what the package says it sent. Real PostgreSQL
(the tests' throwaway server, a fresh schema each).
"""

from __future__ import annotations

import operator
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from psycopg import pq
from psycopg.rows import dict_row
from typing_extensions import TypedDict

from langgraph_idem_saver.postgres import PostgresSaver
from langgraph_idem_saver.postgres.sql import delta_bases_json

# as LangGraph's PostgresSaver.from_conn_string, and bench.py's POOL_KWARGS
KW: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
STEPS = 10


class Loop(TypedDict):
    count: int
    log: Annotated[list[str], operator.add]


def loop_graph(saver: PostgresSaver) -> Any:
    """bench.py's ``loop_graph(10)``: one node looping, each step appending a line."""

    def step(state: Loop) -> dict[str, Any]:
        return {"count": state["count"] + 1, "log": [f"step {state['count']}" + "x" * 180]}

    g = StateGraph(Loop)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["count"] < STEPS else END)
    return g.compile(checkpointer=saver)


def invoke(graph: Any, thread: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    out: dict[str, Any] = graph.invoke({"count": 0, "log": []}, config, durability="sync")
    return out


@contextmanager
def wire(conn: psycopg.Connection[Any]) -> Iterator[list[list[str]]]:
    """The protocol messages ``conn`` exchanges in the block, libpq's trace of them
    split into fields (["F"|"B", length, message type, ...]), filled in at its end."""
    messages: list[list[str]] = []
    fd, path = tempfile.mkstemp(prefix="pqtrace-")
    try:
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield messages
        finally:
            conn.pgconn.untrace()  # flushes the trace
        with open(path) as trace:
            messages.extend(line.split("\t") for line in trace.read().splitlines() if line)
    finally:
        os.close(fd)
        os.unlink(path)


def kinds(messages: list[list[str]], side: str) -> Counter[str]:
    return Counter(m[2].split(" ")[0] for m in messages if m[0] == side and len(m) > 2)


def test_a_10_step_invoke_is_one_round_trip_and_one_commit_per_checkpoint_call(
    pg_dsn: str,
) -> None:
    with psycopg.Connection.connect(pg_dsn, **KW) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        graph = loop_graph(saver)
        invoke(graph, "warm")  # the statements prepared once, by the first invoke
        with wire(conn) as messages:
            out = invoke(graph, "t")
    assert out["count"] == STEPS
    sent, received = kinds(messages, "F"), kinds(messages, "B")
    # 1 get_tuple + 12 put + 11 put_writes: one statement each, one round trip each
    assert sent["Execute"] == 24, sent
    assert sent["Sync"] == 24, sent
    assert received["ReadyForQuery"] == 24, received
    # no simple-protocol command (BEGIN, COMMIT, SET ...) and no statement prepared anew
    assert sent["Query"] == 0, sent
    assert sent["Parse"] == 0, sent
    # each round trip ends its own transaction, committed: back to idle every time
    statuses = Counter(m[3].strip() for m in messages if m[0] == "B" and m[2] == "ReadyForQuery")
    assert statuses == Counter({"I": 24})


def test_an_invoke_stores_the_growing_list_as_deltas_and_reads_it_back(pg_dsn: str) -> None:
    """The bases a delta put sends are found (the put is not refused and retried whole):
    after 10 steps the ``log`` channel holds deltas, one round trip a put (above)."""
    thread = 'th\u00e9 \u2713 "quoted" \\ back'  # the JSON of the bases, quotes and all
    with psycopg.Connection.connect(pg_dsn, **KW) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        graph = loop_graph(saver)
        out = invoke(graph, thread)
        state = graph.get_state({"configurable": {"thread_id": thread}})
        rows = conn.execute(
            "SELECT count(*) AS n, count(base_version) AS deltas FROM idem_blobs "
            "WHERE thread_id = %s AND channel = 'log'",
            (thread,),
        ).fetchone()
    assert out["count"] == STEPS
    # the input's empty list and 10 appends; the empty one and the first append (whose
    # base holds nothing to extend) whole, every later append a delta of its base
    assert rows is not None and rows["n"] == STEPS + 1
    assert rows["deltas"] == STEPS - 1
    assert state.values["log"] == [f"step {i}" + "x" * 180 for i in range(STEPS)]


def test_a_delta_whose_base_was_deleted_behind_the_saver_is_written_whole(pg_dsn: str) -> None:
    with psycopg.Connection.connect(pg_dsn, **KW) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        graph = loop_graph(saver)
        config = {"configurable": {"thread_id": "t"}}
        graph.invoke({"count": 0, "log": []}, config, durability="sync", interrupt_after=["step"])
        # another session deletes the list's stored versions behind the saver's back
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("DELETE FROM idem_blobs WHERE channel = 'log'")
        out = graph.invoke(None, config, durability="sync", interrupt_after=["step"])
        rows = conn.execute(
            "SELECT version, base_version FROM idem_blobs WHERE channel = 'log'"
        ).fetchall()
    assert out["count"] == 2
    # the one version written since: the base it would extend is gone, so stored whole
    assert [r["base_version"] for r in rows] == [None]


@pytest.mark.parametrize(
    "text", ["t", "th\u00e9 \u2713", 'a "quoted" \\ back\\slash', "tab\tnew\nline"]
)
def test_the_bases_parameter_is_the_json_postgresql_built(pg_dsn: str, text: str) -> None:
    """``delta_bases_json`` reads back in PostgreSQL exactly as the
    ``json_agg(json_build_array(...))`` the statement used to build (``->>`` of each)."""
    bases = [(text, "", "log", "00000001.1"), (text, "ns", f"c {text}", "2")]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ours = conn.execute(
            "SELECT r ->> 0, r ->> 1, r ->> 2, r ->> 3 FROM json_array_elements(%s::json) AS r",
            (delta_bases_json(bases),),
        ).fetchall()
        built = conn.execute(
            "SELECT r ->> 0, r ->> 1, r ->> 2, r ->> 3 FROM json_array_elements(("
            "SELECT json_agg(json_build_array(a, b, c, d)) FROM (VALUES (%s, %s, %s, %s),"
            " (%s, %s, %s, %s)) AS v(a, b, c, d))) AS r",
            [v for base in bases for v in base],
        ).fetchall()
    assert ours == built == bases
