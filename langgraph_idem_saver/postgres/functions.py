"""How the schema's plpgsql functions are declared: one way, for all of them.

Why functions at all (``sql.py``, migrations 7-12): a statement sent prepared, as
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
    signature: str, returns: str, body: str, *, volatile: bool = False, use_column: bool = False
) -> str:
    """``CREATE OR REPLACE FUNCTION signature RETURNS returns`` running ``body`` (from
    ``DECLARE`` or ``BEGIN`` to ``END``) with sequential scans off. ``volatile``: each of
    its statements takes a new snapshot. ``use_column``: where a name is both a column
    and an OUT parameter (``RETURNS TABLE``), the query means the column."""
    conflict = "#variable_conflict use_column\n" if use_column else ""
    return f"""
CREATE OR REPLACE FUNCTION {signature}
RETURNS {returns}
LANGUAGE plpgsql {"VOLATILE" if volatile else "STABLE"}
SET enable_seqscan = off
SET search_path FROM CURRENT
AS $fn$
{conflict}{body.strip()}
$fn$
"""
