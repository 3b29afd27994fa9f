"""The commands over the tool-call ledger: ``ledger``, ``pending``, ``resolve``.

Reads go through the saver's ledger methods and :mod:`langgraph_idem_saver.inspection`;
``resolve`` settles an entry only through ``inspection`` (audit trail, guards).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from langgraph_idem_saver.cli.commands.state import require_thread
from langgraph_idem_saver.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    KEY_SHORT,
    MIN_KEY_PREFIX,
    CliError,
)
from langgraph_idem_saver.cli.database import Db
from langgraph_idem_saver.cli.render import LEDGER_COLUMNS, Out, ledger_rows
from langgraph_idem_saver.cli.values import agent_matches, content_text, entry_dict
from langgraph_idem_saver.errors import LedgerStateError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry

MODEL_TOOL_NAME = "__model__"  # model_record.MODEL_TOOL_NAME (a test holds them equal)


async def cmd_ledger(db: Db, args: argparse.Namespace, out: Out) -> int:
    await require_thread(db, args.thread)
    now = time.time()
    found = await db.saver.alist_entries(args.thread)
    # --agent names an agent: its own calls and those of every agent path under it
    chosen = [e for e in found if args.agent is None or agent_matches(e.agent_path, args.agent)]
    entries = [model_answer(db.saver, e, entry_dict(db.saver, e, now)) for e in chosen]
    if out.as_json:
        out.json({"thread_id": args.thread, "agent_path": args.agent, "entries": entries})
        return EXIT_OK
    if not entries:
        message = f"thread {args.thread!r} has no ledger entries"
        if args.agent is not None:
            message += f" of agent {args.agent!r}"
            agents = sorted({e.agent_path for e in found})
            if agents:
                message += f" (its entries are under: {', '.join(agents)})"
        out.line(message)
        return EXIT_OK
    answers = sum(e["tool"] == MODEL_TOOL_NAME for e in entries)
    title = f"thread {args.thread!r}: {len(entries) - answers} tool call(s)"
    if answers:
        title += f", {answers} recorded model answer(s)"
    if args.agent is not None:
        title += f" of agent {args.agent!r}"
    out.table(title, LEDGER_COLUMNS, ledger_rows(entries, with_thread=False))
    return EXIT_OK


def model_answer(saver: Any, entry: LedgerEntry, shown: dict[str, Any]) -> dict[str, Any]:
    """A recorded model answer (tool ``__model__``, see ``model_record``) shown as what the
    model said: its text, or the tool calls it asked for (name and id)."""
    if entry.tool_name != MODEL_TOOL_NAME or entry.result is None or entry.result_type is None:
        return shown
    from langchain_core.messages import AIMessage  # only when there is one: a fast CLI

    try:
        stored = saver.serde.loads_typed((entry.result_type, entry.result))
        message = next(m for m in stored["result"] if isinstance(m, AIMessage))
    except Exception:  # shown as entry_dict decoded it (or could not)
        return shown
    calls = ", ".join(f"{c['name']} {c['id']}" for c in message.tool_calls)
    shown["result"] = f"asked for {calls}" if calls else content_text(message.content)
    return shown


async def cmd_pending(db: Db, args: argparse.Namespace, out: Out) -> int:
    from langgraph_idem_saver.inspection import astale_claims

    now = time.time()
    entries = [entry_dict(db.saver, e, now) for e in await db.saver.alist_unknown(now=now)]
    stale = [
        entry_dict(db.saver, e, now) for e in await astale_claims(db.saver, older_than=args.stale)
    ]
    if out.as_json:
        out.json({"entries": entries, "stale_claims": stale})
        return EXIT_OK
    columns = [*LEDGER_COLUMNS[:1], "thread", *LEDGER_COLUMNS[1:]]
    if stale:
        out.table(
            f"{len(stale)} live claim(s) older than {args.stale:g}s (owner may be gone)",
            [*columns, "owner"],
            [
                [*row, e["owner"]]
                for row, e in zip(ledger_rows(stale, with_thread=True), stale, strict=True)
            ],
        )
        out.line(
            "if an owner's process is gone (e.g. a replaced pod): idem-saver resolve KEY "
            "--force --rerun | --completed --result TEXT | --failed --error TEXT"
        )
    if not entries:
        out.line("no unknown outcomes")
        return EXIT_OK
    out.table(f"{len(entries)} unknown outcome(s)", columns, ledger_rows(entries, with_thread=True))
    out.line(
        "settle each after checking the outside world: idem-saver resolve KEY "
        "--completed --result TEXT | --failed --error TEXT | --rerun"
    )
    return EXIT_OK


async def cmd_resolve(db: Db, args: argparse.Namespace, out: Out) -> int:
    from langgraph_idem_saver.inspection import Resolution, aresolve_unknown, aretry_failed

    prefix = args.entry.strip().lower()
    if len(prefix) < MIN_KEY_PREFIX:
        raise CliError(
            f"entry key prefix {args.entry!r} is too short: give at least {MIN_KEY_PREFIX} "
            "characters (as shown by idem-saver ledger / pending)",
            EXIT_USAGE,
        )
    if args.thread is not None:
        await require_thread(db, args.thread)
    matches = await db.saver.aentry_keys_with_prefix(prefix, args.thread)
    if not matches:
        where = f" in thread {args.thread!r}" if args.thread else ""
        raise CliError(f"no ledger entry with key {prefix!r}{where} (see: idem-saver pending)")
    if len({k for _, k in matches}) > 1 or len(matches) > 1:
        found = []
        for scope, key in matches[:5]:
            entry = await db.saver.aget_entry(scope, key)
            found.append(f"{key[:KEY_SHORT]} (thread {entry.thread_id if entry else scope!r})")
        hint = "a longer prefix" if len({k for _, k in matches}) > 1 else "--thread"
        raise CliError(
            f"entry {prefix!r} is ambiguous: {', '.join(found)}; give {hint}", EXIT_USAGE
        )
    scope, key = matches[0]
    entry = await db.saver.aget_entry(scope, key)
    if entry is None:
        raise CliError(f"ledger entry {key[:KEY_SHORT]} disappeared while being read")
    if args.expect_attempts is not None and args.expect_attempts != entry.attempts:
        raise CliError(
            f"entry {key[:KEY_SHORT]} ({entry.tool_name}) changed since it was shown: "
            f"attempt {entry.attempts} now, {args.expect_attempts} expected; look at it again"
        )
    resolution: Resolution = "completed" if args.completed else "failed" if args.failed else "rerun"
    try:
        if args.retry:
            settled = await aretry_failed(db.saver, entry, note=args.note)
        else:
            settled = await aresolve_unknown(
                db.saver,
                entry,
                resolution,
                result=args.result,
                error=args.error,
                force=args.force,
                note=args.note,
            )
    except LedgerStateError as exc:
        raise CliError(f"refused: {exc}") from None
    if args.retry:
        resolution = "rerun"
    status = "released" if settled.status is CallStatus.ISSUED else settled.status.value
    if out.as_json:
        out.json(
            {
                "key": key,
                "thread_id": entry.thread_id,
                "tool": entry.tool_name,
                "resolution": resolution,
                "status": status,
            }
        )
        return EXIT_OK
    what = {
        "completed": "completed: the next resume replays the given result",
        "failed": "failed: the next resume returns the error to the model",
        "rerun": "released: the next resume runs the tool again",
    }[resolution]
    out.line(f"entry {key[:KEY_SHORT]} ({entry.tool_name}, thread {entry.thread_id!r}) {what}")
    return EXIT_OK
