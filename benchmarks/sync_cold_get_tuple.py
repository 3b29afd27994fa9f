"""The sync ``get_tuple`` of checkpoints read once: the case ``value_copies.py`` cannot help.

``bench.py``'s "sync get_tuple, latest" reads one checkpoint again and again, as
``graph.get_state`` polling or a resumed ``invoke`` does, so from its third read our saver
rebuilds the value from its in-process copy. Here every call reads a checkpoint no call
read before: a thread of ``N`` checkpoints whose 20-message list slides by one message a
checkpoint (different bytes every time, each stored whole), written by LangGraph's sync
``SqliteSaver`` and by ours, then every checkpoint read once, the two savers alternating,
on the calling thread's CPU clock (our sync saver reads on the caller's thread; so does
LangGraph's). Both files use WAL with ``synchronous=NORMAL``: the reads do not commit.

    python benchmarks/sync_cold_get_tuple.py [N]
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver

from langgraph_idem_saver.sqlite import SqliteSaver


def write_thread(saver: Any, messages: list[Any], n: int) -> list[str]:
    """``n`` checkpoints of one thread, the list sliding by one message each; their ids."""
    config: Any = {"configurable": {"thread_id": "cold", "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    ids = []
    for i in range(n):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"count": i, "messages": messages[i : i + 20]}
        for channel in ("count", "messages"):
            versions[channel] = saver.get_next_version(versions.get(channel), None)
        checkpoint["channel_versions"] = dict(versions)
        config = saver.put(config, checkpoint, {"source": "loop"}, dict(versions))
        ids.append(config["configurable"]["checkpoint_id"])
    return ids


def main(n: int) -> None:
    messages = [bench.Sim.payloads.ai(random.Random(i), 500) for i in range(n + 20)]
    with tempfile.TemporaryDirectory() as folder:
        conns = {
            label: sqlite3.connect(f"{folder}/{label}.db", check_same_thread=False)
            for label in ("official", "ours")
        }
        for conn in conns.values():
            conn.execute("PRAGMA synchronous=NORMAL")
        with SqliteSaver(conns["ours"], synchronous="NORMAL") as ours:
            savers: dict[str, Any] = {
                "official": OfficialSqliteSaver(conns["official"]),
                "ours": ours,
            }
            for saver in savers.values():
                saver.setup()
            ids = {label: write_thread(s, messages, n) for label, s in savers.items()}
            cpu: dict[str, list[int]] = {label: [] for label in savers}
            for i in range(n):
                for label in ("official", "ours") if i % 2 else ("ours", "official"):
                    config: Any = {
                        "configurable": {
                            "thread_id": "cold",
                            "checkpoint_ns": "",
                            "checkpoint_id": ids[label][i],
                        }
                    }
                    start = time.thread_time_ns()
                    got = savers[label].get_tuple(config)
                    cpu[label].append(time.thread_time_ns() - start)
                    assert got is not None
                    assert len(got.checkpoint["channel_values"]["messages"]) == 20
        for conn in conns.values():
            conn.close()
    official, mine = (statistics.median(cpu[label]) / 1000 for label in ("official", "ours"))
    print(
        f"sync get_tuple of {n} checkpoints, each read once (thread CPU, medians): "
        f"official {official:,.0f} µs, ours {mine:,.0f} µs, ratio {official / mine:.2f}x"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 600)
