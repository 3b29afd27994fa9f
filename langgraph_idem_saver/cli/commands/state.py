"""The commands that read checkpoints: ``threads``, ``history``, ``show``, ``diff``.

Checkpoint counts mean one thing in both places: ``threads`` counts a thread's root
checkpoints (the ones ``history`` lists by default) and shows its subgraphs' apart.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from langgraph_idem_saver.cli.common import (
    ERROR,
    EXIT_OK,
    EXIT_USAGE,
    INTERRUPT,
    MIN_CHECKPOINT_PREFIX,
    CliError,
    checkpoint_time,
    compact_json,
    iso,
    short,
    short_time,
)
from langgraph_idem_saver.cli.database import Db
from langgraph_idem_saver.cli.render import Out, render_messages
from langgraph_idem_saver.cli.values import (
    diff_messages,
    head_status,
    is_internal_channel,
    is_message_list,
    jsonable,
)


async def cmd_threads(db: Db, args: argparse.Namespace, out: Out) -> int:
    summaries = await db.saver.athread_summaries()
    unknown = Counter(e.thread_id for e in await db.saver.alist_unknown())
    rows: list[dict[str, Any]] = []
    for a in summaries:
        status, nxt = head_status(
            a.head,
            interrupted=a.head_interrupted,
            errored=a.head_error,
            exists=a.head_id is not None,
        )
        rows.append(
            {
                "thread_id": a.thread_id,
                "checkpoints": a.checkpoints,
                "subgraph_checkpoints": a.subgraph_checkpoints,
                "last_checkpoint_id": a.head_id,
                "updated_at": iso(checkpoint_time(a.head_id)),
                "status": status,
                "next": nxt,
                "ledger_entries": a.ledger_entries,
                "unknown_outcomes": unknown.get(a.thread_id, 0),
            }
        )
    rows.sort(key=lambda r: (r["updated_at"] or "", r["thread_id"]), reverse=True)
    if args.limit:
        rows = rows[: args.limit]
    if out.as_json:
        out.json({"threads": rows})
        return EXIT_OK
    if not rows:
        out.line("no threads")
        return EXIT_OK
    out.table(
        f"{len(rows)} thread(s)",
        [
            "thread",
            "checkpoints (root)",
            "subgraph ckpts",
            "updated (UTC)",
            "status",
            "next",
            "calls",
            "unknown",
        ],
        (
            [
                r["thread_id"],
                r["checkpoints"],
                r["subgraph_checkpoints"] or "",
                short_time(checkpoint_time(r["last_checkpoint_id"])),
                r["status"],
                ", ".join(r["next"]) or "",
                r["ledger_entries"],
                r["unknown_outcomes"] or "",
            ]
            for r in rows
        ),
    )
    return EXIT_OK


async def require_thread(db: Db, thread_id: str) -> None:
    if not await db.saver.athread_exists(thread_id):
        raise CliError(f"unknown thread {thread_id!r} (see: idem-saver threads)")


async def find_checkpoint(db: Db, thread_id: str, ns: str, ref: str) -> str:
    """A checkpoint id from an id or a unique prefix of one."""
    matches = await db.saver.acheckpoint_ids_with_prefix(thread_id, ns, ref)
    if ref in matches:
        return ref
    if len(ref) < MIN_CHECKPOINT_PREFIX or not matches:
        raise CliError(f"no checkpoint {ref!r} in thread {thread_id!r} (see: idem-saver history)")
    if len(matches) > 1:
        raise CliError(
            f"checkpoint prefix {ref!r} is ambiguous in thread {thread_id!r}: "
            + ", ".join(matches[:5]),
            EXIT_USAGE,
        )
    return matches[0]


async def cmd_history(db: Db, args: argparse.Namespace, out: Out) -> int:
    await require_thread(db, args.thread)
    history = await db.saver.acheckpoint_history(args.thread, args.ns, args.limit or None)
    total = history.total
    items: list[dict[str, Any]] = [
        {
            "checkpoint_id": r.checkpoint_id,
            "parent_checkpoint_id": r.parent_checkpoint_id,
            "created_at": iso(checkpoint_time(r.checkpoint_id)),
            "step": r.metadata.get("step"),
            "source": r.metadata.get("source"),
            "pending_writes": r.pending_writes,
        }
        for r in history.rows
    ]
    if out.as_json:
        out.json(
            {
                "thread_id": args.thread,
                "checkpoint_ns": args.ns,
                "total": total,
                "checkpoints": items,
            }
        )
        return EXIT_OK
    title = f"thread {args.thread!r}: {total} checkpoint(s)"
    title += " (root)" if not args.ns else ""
    if args.ns:
        title += f" in namespace {args.ns!r}"
    if len(items) < total:
        title += f", newest {len(items)} shown (--limit 0 for all)"
    out.table(
        title,
        ["checkpoint", "created (UTC)", "step", "source", "writes", "parent"],
        (
            [
                i["checkpoint_id"],
                short_time(checkpoint_time(i["checkpoint_id"])),
                i["step"],
                i["source"],
                i["pending_writes"] or "",
                (i["parent_checkpoint_id"] or "")[:13],
            ]
            for i in items
        ),
    )
    return EXIT_OK


async def load_tuple(db: Db, thread_id: str, ns: str, checkpoint_id: str | None) -> Any:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    if checkpoint_id:
        config["configurable"]["checkpoint_id"] = checkpoint_id
    tup = await db.saver.aget_tuple(config)  # type: ignore[arg-type]
    if tup is None:
        raise CliError(f"thread {thread_id!r} has no checkpoint in namespace {ns!r}")
    return tup


def state_of(tup: Any, all_channels: bool) -> dict[str, Any]:
    values = tup.checkpoint["channel_values"]
    return {k: values[k] for k in sorted(values) if all_channels or not is_internal_channel(k)}


async def cmd_show(db: Db, args: argparse.Namespace, out: Out) -> int:
    await require_thread(db, args.thread)
    cid = (
        await find_checkpoint(db, args.thread, args.ns, args.checkpoint)
        if args.checkpoint
        else None
    )
    tup = await load_tuple(db, args.thread, args.ns, cid)
    checkpoint_id = tup.config["configurable"]["checkpoint_id"]
    writes = tup.pending_writes or []
    status, nxt = head_status(
        tup.checkpoint,
        interrupted=any(c == INTERRUPT for _, c, _ in writes),
        errored=any(c == ERROR for _, c, _ in writes),
    )
    state = state_of(tup, args.all)
    doc = {
        "thread_id": args.thread,
        "checkpoint_ns": args.ns,
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": (tup.parent_config or {})
        .get("configurable", {})
        .get("checkpoint_id"),
        "created_at": iso(checkpoint_time(checkpoint_id)),
        "step": tup.metadata.get("step"),
        "source": tup.metadata.get("source"),
        "status": status,
        "next": nxt,
        "channels": {k: jsonable(v) for k, v in state.items()},
        "pending_writes": [
            {"task_id": t, "channel": c, "value": jsonable(v)} for t, c, v in writes
        ],
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    out.line(
        f"thread {args.thread!r}  checkpoint {checkpoint_id}  step {doc['step']}  "
        f"source {doc['source']}  created {short_time(checkpoint_time(checkpoint_id))} UTC"
    )
    out.line(f"status: {status}" + (f" (next: {', '.join(nxt)})" if nxt else ""))
    others = []
    for name, value in state.items():
        if is_message_list(value):
            render_messages(out, f"{name}: {len(value)} message(s)", jsonable(value))
        else:
            others.append([name, short(compact_json(jsonable(value)), 2000)])
    if others:
        out.table("channels", ["channel", "value"], others)
    if writes:
        out.table(
            "pending writes",
            ["task", "channel", "value"],
            ([t[:13], c, short(compact_json(jsonable(v)), 300)] for t, c, v in writes),
        )
    return EXIT_OK


async def cmd_diff(db: Db, args: argparse.Namespace, out: Out) -> int:
    await require_thread(db, args.thread)
    to_id = await find_checkpoint(db, args.thread, args.ns, args.to) if args.to else None
    new = await load_tuple(db, args.thread, args.ns, to_id)
    if args.from_:
        old = await load_tuple(
            db,
            args.thread,
            args.ns,
            await find_checkpoint(db, args.thread, args.ns, args.from_),
        )
    elif new.parent_config is not None:
        old = await load_tuple(
            db, args.thread, args.ns, new.parent_config["configurable"]["checkpoint_id"]
        )
    else:
        raise CliError("the checkpoint has no parent: pass --from ID")
    a, b = state_of(old, args.all), state_of(new, args.all)
    added = {k: jsonable(b[k]) for k in b if k not in a}
    removed = [k for k in a if k not in b]
    changed: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for k in a:
        if k not in b:
            continue
        va, vb = jsonable(a[k]), jsonable(b[k])
        if va == vb:
            continue
        if (is_message_list(a[k]) or a[k] == []) and is_message_list(b[k]):
            messages[k] = diff_messages(va, vb)
        else:
            changed[k] = {"from": va, "to": vb}
    doc = {
        "thread_id": args.thread,
        "checkpoint_ns": args.ns,
        "from": old.config["configurable"]["checkpoint_id"],
        "to": new.config["configurable"]["checkpoint_id"],
        "added": added,
        "removed": removed,
        "changed": changed,
        "messages": messages,
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    out.line(f"thread {args.thread!r}: {doc['from']} -> {doc['to']}")
    rows = [["+", k, short(compact_json(v), 500)] for k, v in added.items()]
    rows += [["-", k, ""] for k in removed]
    rows += [
        ["~", k, short(f"{compact_json(v['from'])} -> {compact_json(v['to'])}", 500)]
        for k, v in changed.items()
    ]
    for k, d in messages.items():
        parts = [f"{len(d[x])} {x}" for x in ("appended", "removed", "changed") if d[x]]
        rows.append(["~", k, ", ".join(parts)])
    if not rows:
        out.line("no changes")
    else:
        out.table("channels", ["", "channel", "change"], rows)
    for k, d in messages.items():
        for kind in ("appended", "removed", "changed"):
            if d[kind]:
                render_messages(out, f"{k}: {kind}", d[kind])
    return EXIT_OK
