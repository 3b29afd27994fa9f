"""The maintenance commands: ``prune`` (a dry run unless ``--apply``) and ``stats``.

``prune`` plans in Python over :meth:`acheckpoint_nodes` (what ``keep_latest`` keeps,
DeltaChannel ancestors included) and applies with the saver's ``aprune`` or, for
``--before``, its ``adelete_checkpoints``: the one place to point at retention methods.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from langgraph_idem_saver.cli.commands.state import require_thread
from langgraph_idem_saver.cli.common import (
    EXIT_OK,
    checkpoint_time,
    iso,
    parse_when,
    short_time,
)
from langgraph_idem_saver.cli.database import Db
from langgraph_idem_saver.cli.render import Out, human_size
from langgraph_idem_saver.inspect_types import CheckpointNode, parse_metadata
from langgraph_idem_saver.inspection import astats


@dataclasses.dataclass
class PrunePlan:
    thread_id: str
    checkpoints: int = 0
    delete: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    delete_writes: int = 0


def plan_prune(nodes: Sequence[CheckpointNode], before: datetime | None) -> dict[str, PrunePlan]:
    """Which checkpoints ``keep_latest`` (``before`` None) or ``--before`` would delete.

    Both keep each namespace's latest checkpoint and the ancestors a kept checkpoint's
    ``DeltaChannel`` still replays from (``saver_base.checkpoints_to_keep``), as the
    savers' ``aprune`` does; ``--before`` also keeps every checkpoint created at or after
    ``before``, and those whose id carries no time.
    """
    from langgraph_idem_saver.saver_base import checkpoints_to_keep

    groups: dict[tuple[str, str], dict[str, CheckpointNode]] = defaultdict(dict)
    for n in nodes:
        groups[(n.thread_id, n.checkpoint_ns)][n.checkpoint_id] = n
    plans: dict[str, PrunePlan] = {}
    for (thread_id, ns), by_id in sorted(groups.items()):
        plan = plans.setdefault(thread_id, PrunePlan(thread_id))
        plan.checkpoints += len(by_id)

        def read(
            cid: str, by_id: dict[str, CheckpointNode] = by_id
        ) -> tuple[str | None, dict[str, Any]] | None:
            n = by_id.get(cid)
            return None if n is None else (n.parent_checkpoint_id, parse_metadata(n.metadata))

        head = max(by_id)
        keep = {head}
        if before is not None:
            for cid in by_id:
                created = checkpoint_time(cid)
                if created is None or created >= before:
                    keep.add(cid)
        for cid in list(keep):
            parent = by_id[cid].parent_checkpoint_id
            if parent is not None and parent not in keep:  # a boundary of what stays
                keep.update(checkpoints_to_keep(cid, read))
        for cid, n in sorted(by_id.items()):
            if cid not in keep:
                plan.delete.append((thread_id, ns, cid))
                plan.delete_writes += n.writes
    return plans


async def sweep_idle_threads(db: Db, args: argparse.Namespace, out: Out) -> int:
    """``prune --older-than AGE``: the saver's retention sweep, once, with that window."""
    from langgraph_idem_saver.retention import TTLConfig

    now = datetime.now(timezone.utc)
    after = now - parse_when(args.older_than, now=now)
    ttl = TTLConfig(after=after, strategy=args.strategy)
    report = await db.saver.asweep(now, ttl=ttl, dry_run=not args.apply)
    if out.as_json:
        out.json({"mode": "older_than", "older_than": args.older_than, **report.as_dict()})
        return EXIT_OK
    verb = "deleted" if args.apply else "would delete"
    out.table(
        f"prune: threads idle for more than {args.older_than} ({args.strategy})",
        ["", verb],
        [
            ["threads deleted", report.threads_deleted],
            ["threads pruned to their latest checkpoint", report.threads_pruned],
            ["checkpoints", report.checkpoints_deleted],
            ["pending writes", report.writes_deleted],
            ["blobs", report.blobs_deleted],
            ["ledger entries", report.ledger_entries_deleted],
            ["named-namespace entries", report.namespace_entries_deleted],
        ],
    )
    if report.issued_kept:
        out.line(f"{report.issued_kept} unsettled ledger entr(ies) kept: see `pending`")
    if not args.apply:
        out.line("dry run: nothing was changed; add --apply to delete")
    return EXIT_OK


async def cmd_prune(db: Db, args: argparse.Namespace, out: Out) -> int:
    if args.older_than:
        return await sweep_idle_threads(db, args, out)
    before = parse_when(args.before) if args.before else None
    threads: list[str] | None = None
    if args.thread:
        threads = list(dict.fromkeys(args.thread))
        for t in threads:
            await require_thread(db, t)
    plans = plan_prune(await db.saver.acheckpoint_nodes(threads), before)
    doomed = [p for p in plans.values() if p.delete]
    blobs_deleted = 0
    if args.apply and doomed:
        if before is None:
            blobs_at_start = (await db.saver.astorage_counts()).blobs
            await db.saver.aprune([p.thread_id for p in doomed], strategy="keep_latest")
            blobs_deleted = blobs_at_start - (await db.saver.astorage_counts()).blobs
        else:
            keys = [k for p in doomed for k in p.delete]
            blobs_deleted = (await db.saver.adelete_checkpoints(keys)).blobs
    totals = {
        "checkpoints": sum(p.checkpoints for p in plans.values()),
        "delete_checkpoints": sum(len(p.delete) for p in plans.values()),
        "delete_writes": sum(p.delete_writes for p in plans.values()),
        "blobs_deleted": blobs_deleted,
    }
    if out.as_json:
        out.json(
            {
                "mode": "keep_latest" if before is None else "before",
                "before": iso(before),
                "applied": bool(args.apply),
                "threads": [
                    {
                        "thread_id": p.thread_id,
                        "checkpoints": p.checkpoints,
                        "delete_checkpoints": len(p.delete),
                        "delete_writes": p.delete_writes,
                    }
                    for p in plans.values()
                ],
                "totals": totals,
            }
        )
        return EXIT_OK
    verb = "deleted" if args.apply else "would delete"
    rule = (
        "keep the latest checkpoint of each namespace"
        if before is None
        else f"delete checkpoints created before {short_time(before)} UTC (the latest of "
        "each namespace is always kept)"
    )
    if doomed:
        out.table(
            f"prune: {rule}",
            ["thread", "checkpoints", verb, "their pending writes"],
            ([p.thread_id, p.checkpoints, len(p.delete), p.delete_writes] for p in doomed),
        )
    summary = (
        f"{verb} {totals['delete_checkpoints']} of {totals['checkpoints']} checkpoint(s) and "
        f"{totals['delete_writes']} pending write(s) in {len(doomed)} thread(s)"
    )
    if args.apply:
        summary += f", and {blobs_deleted} unreferenced blob(s)"
    out.line(summary + "; ledger entries are never pruned")
    if doomed and not args.apply:
        out.line("dry run: nothing was changed; add --apply to delete")
    return EXIT_OK


async def cmd_stats(db: Db, args: argparse.Namespace, out: Out) -> int:
    c = await db.saver.astorage_counts()
    ledger = await astats(db.saver)
    by_state = {
        "completed": ledger.by_status.get("completed", 0),
        "failed": ledger.failed,
        "unknown": ledger.unknown,
        "in_progress": ledger.in_progress,
    }
    doc = {
        "backend": db.backend,
        "database": db.database,
        "schema_version": c.schema_version,
        "threads": c.threads,
        "checkpoints": c.checkpoints,
        "blobs": c.blobs,
        "writes": c.writes,
        "ledger": {
            "total": sum(ledger.by_status.values()),
            "by_status": dict(sorted(ledger.by_status.items())),
            "by_state": by_state,
            "replays": ledger.replayed,
            "conflicts": ledger.conflicts,
        },
        "size_bytes": c.size_bytes,
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    rows: list[list[Any]] = [
        ["database", f"{db.database} ({db.backend}, schema v{c.schema_version})"],
        ["threads", c.threads],
        ["checkpoints", c.checkpoints],
        ["blobs", c.blobs],
        ["pending writes", c.writes],
        ["ledger entries", sum(ledger.by_status.values())],
    ]
    rows += [[f"  {state.replace('_', ' ')}", n] for state, n in by_state.items()]
    rows += [["  replays", ledger.replayed], ["  conflicts", ledger.conflicts]]
    rows.append(["size", "-" if c.size_bytes is None else human_size(c.size_bytes)])
    out.table(None, ["", "count"], rows)
    return EXIT_OK
