"""The rows of a claim or of a batch of outcomes as ONE JSON parameter for PostgreSQL.

Why JSON: passed as one array per column, a 50-call step made psycopg dump 12 arrays of
50 elements in Python for every statement - more time than the server spent on the
statement. One ``json.dumps`` (C) of the rows is one parameter whatever the batch size;
the server unpacks it with ``json_to_recordset`` (see ``ledger_sql.CLAIM_STEP`` and
``FINISH_STEP_FUNCTION``). Bytes travel base64-encoded (``decode(..., 'base64')`` on the server).

Text no PostgreSQL column can hold is refused by the server as it was as a text
parameter: a NUL (``\\u0000``, SQLSTATE 22P05) becomes a ``SerializationError`` (see
``connection.PostgresConnection._typed_error``); a lone surrogate cannot be encoded to
UTF-8 on the client, as before.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

from langgraph_idem_saver.backend import INTENT_COLUMNS
from langgraph_idem_saver.json_text import encoder_of

_JSON = encoder_of(ensure_ascii=False, allow_nan=False)  # json.dumps(rows, these options)

# INTENT_COLUMNS, in order, plus the row's place in the batch (inserted in that order)
_CLAIM_FIELDS = (*INTENT_COLUMNS, "ord")
_ARGS = INTENT_COLUMNS.index("args")
# an outcome's parameters, in order (see ledger_policy.LedgerPolicy._finish_soon)
_FINISH_FIELDS = (
    "status", "result_type", "result", "error", "finished_at", "scope", "key", "owner"
)  # fmt: skip
_RESULT = _FINISH_FIELDS.index("result")


def _b64(data: bytes | None) -> str | None:
    # what base64.b64encode returns, without its Python frame (two a call of a step)
    return None if data is None else binascii.b2a_base64(data, newline=False).decode("ascii")


def claim_rows(rows: Sequence[tuple[Any, ...]]) -> str:
    """Claim rows (``INTENT_COLUMNS`` values) as the JSON ``CLAIM_STEP`` reads."""
    out = []
    for ord_, row in enumerate(rows):
        values = list(row)
        values[_ARGS] = _b64(values[_ARGS])
        values.append(ord_)
        out.append(dict(zip(_CLAIM_FIELDS, values, strict=True)))
    return _JSON(out)


def finish_rows(batch: Sequence[tuple[Any, ...]]) -> str:
    """Outcomes (``_finish_soon``'s parameters) as the JSON ``FINISH_STEP_KEYS`` reads."""
    out = []
    for params in batch:
        values = list(params)
        values[_RESULT] = _b64(values[_RESULT])
        out.append(dict(zip(_FINISH_FIELDS, values, strict=True)))
    return _JSON(out)
