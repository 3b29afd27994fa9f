"""How the schema's plpgsql functions are declared: one way, for all of them.

Why functions at all (``sql.py``, migrations 7-13): a statement sent prepared, as
LangGraph's savers send theirs (``prepare_threshold=0``), gets a generic plan cached
after five executions, built for the tables as they were then. Built while they were
small, it scans them whole once they have grown, until their next ``ANALYZE``. Inside a
function running with sequential scans off, every plan PostgreSQL may cache probes
indexes. ``search_path FROM CURRENT``: the function reads the tables of the schema it was
created in, whoever calls it.
"""

from __future__ import annotations

# the columns of a checkpoint tuple, as sql.SELECT_TUPLES returns them
TUPLE_RESULT = """TABLE (
    thread_id text, checkpoint_ns text, checkpoint_id text, parent_checkpoint_id text,
    type text, checkpoint bytea, metadata jsonb, metadata_exact text,
    channel_values bytea[], pending_writes bytea[])"""


def plpgsql_function(
    signature: str,
    returns: str,
    body: str,
    *,
    volatile: bool = False,
    use_column: bool = False,
    plan_each_call: bool = False,
    generic_plan: bool = False,
) -> str:
    """``CREATE OR REPLACE FUNCTION signature RETURNS returns`` running ``body`` (from
    ``DECLARE`` or ``BEGIN`` to ``END``) with sequential scans off. ``volatile``: each of
    its statements takes a new snapshot. ``use_column``: where a name is both a column
    and an OUT parameter (``RETURNS TABLE``), the query means the column.
    ``plan_each_call``: its statements are planned on every call, for the tables as they
    are then, never from a cached generic plan (for a join whose best order depends on
    the table's size: a generic plan built while the table was empty reads all of it).
    ``generic_plan``: its statements use one generic plan a session, built on the first
    call - with sequential scans off, the index probes whatever the statistics say -
    never re-planned per call: left to choose (``auto``), a session settles on the
    generic plan or on planning every call by comparing cost estimates, which depend on
    the statistics and on the first calls' arguments."""
    conflict = "#variable_conflict use_column\n" if use_column else ""
    planning = "SET plan_cache_mode = force_custom_plan\n" if plan_each_call else ""
    if generic_plan:
        planning = "SET plan_cache_mode = force_generic_plan\n"
    return f"""
CREATE OR REPLACE FUNCTION {signature}
RETURNS {returns}
LANGUAGE plpgsql {"VOLATILE" if volatile else "STABLE"}
SET enable_seqscan = off
{planning}SET search_path FROM CURRENT
AS $fn$
{conflict}{body.strip()}
$fn$
"""
