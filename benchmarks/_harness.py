"""Helpers shared by the benchmark scripts in this folder.

The scripts run as ``python benchmarks/bench_x.py``, so this folder is on ``sys.path``
and they import from here with ``from _harness import ...``. Everything here is
backend-neutral: payload generators, the synthetic checkpoint stream, the DeltaChannel
threads, the tool-node graphs of the ledger rows, the interleaved timer and its
summaries, and the report/JSON plumbing. The result row and the run profile are
``bench.py``'s (``Row``, ``Profile``): one of each for every row.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from typing_extensions import TypedDict

perf_ns = time.perf_counter_ns

# --------------------------------------------------------------------------------------
# Deterministic payloads
# --------------------------------------------------------------------------------------


class Payloads:
    """English-ish message generators over a fixed word list (deterministic per rng)."""

    def __init__(self, words_text: str) -> None:
        self.words = words_text.split()

    def text(self, rng: random.Random, nbytes: int) -> str:
        """English-ish text of about ``nbytes`` characters (compresses like prose)."""
        out: list[str] = []
        n = 0
        while n < nbytes:
            w = rng.choice(self.words)
            out.append(w)
            n += len(w) + 1
        return " ".join(out)[:nbytes]

    def human(self, rng: random.Random, nbytes: int) -> HumanMessage:
        return HumanMessage(
            content=self.text(rng, nbytes), id=str(uuid.UUID(int=rng.getrandbits(128)))
        )

    def ai(self, rng: random.Random, nbytes: int) -> AIMessage:
        return AIMessage(
            content=self.text(rng, nbytes),
            id=str(uuid.UUID(int=rng.getrandbits(128))),
            response_metadata={"model_name": "bench-model", "finish_reason": "stop"},
            usage_metadata={"input_tokens": 812, "output_tokens": 230, "total_tokens": 1042},
        )

    def tool_msg(self, rng: random.Random, nbytes: int) -> ToolMessage:
        return ToolMessage(
            content=self.text(rng, nbytes),
            tool_call_id=f"call_{rng.getrandbits(48):x}",
            id=str(uuid.UUID(int=rng.getrandbits(128))),
        )


# --------------------------------------------------------------------------------------
# Synthetic checkpoint stream (for the aput / read rows)
# --------------------------------------------------------------------------------------


class ConvSim:
    """Produces realistic (config, checkpoint, metadata, new_versions) tuples.

    Channels: ``messages`` (a sliding window of ``window`` ~1 KB messages, so the
    checkpoint size stays constant across the measurement), ``count`` (int),
    ``status`` (short str), and the trigger channels ``branch:to:agent`` /
    ``branch:to:tools``. Only the channels that changed in a step get a new version
    (from ``saver.get_next_version``) and appear in ``new_versions``.

    Subclasses set ``payloads`` (the message generators) and ``metadata_extra`` (keys
    added to every checkpoint's metadata).
    """

    payloads: Payloads
    metadata_extra: dict[str, Any] = {}  # noqa: RUF012 (read-only class default)

    def __init__(self, saver: Any, thread_id: str, window: int, msg_bytes: int, seed: int) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.rng = random.Random(seed)
        self.msg_bytes = msg_bytes
        self.step = -1
        self.parent_id: str | None = None
        self.cp = empty_checkpoint()
        p = self.payloads
        msgs = [
            p.human(self.rng, msg_bytes) if i % 2 == 0 else p.ai(self.rng, msg_bytes)
            for i in range(window)
        ]
        self.values: dict[str, Any] = {
            "messages": msgs,
            "count": 0,
            "status": "running",
            "branch:to:agent": None,
            "branch:to:tools": None,
        }
        self.versions = {ch: saver.get_next_version(None, None) for ch in self.values}

    def config(self) -> dict[str, Any]:
        c: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent_id is not None:
            c["checkpoint_id"] = self.parent_id
        return {"configurable": c}

    def next(self, changed: tuple[str, ...]) -> tuple[Any, Any, Any, Any]:
        self.step += 1
        new_versions = {}
        p = self.payloads
        for ch in changed:
            if ch == "messages":
                msgs = self.values["messages"]
                m = (
                    p.ai(self.rng, self.msg_bytes)
                    if self.step % 2
                    else p.tool_msg(self.rng, self.msg_bytes)
                )
                self.values["messages"] = [*msgs[1:], m]
            elif ch == "count":
                self.values["count"] += 1
            elif ch == "status":
                self.values["status"] = f"step-{self.step}"
            v = self.saver.get_next_version(self.versions[ch], None)
            self.versions[ch] = v
            new_versions[ch] = v
        node = "tools" if "branch:to:tools" in changed else "agent"
        cp = {
            "v": self.cp["v"],
            "id": str(uuid6(clock_seq=self.step)),
            "ts": "2025-01-01T00:00:00.000000+00:00",
            "channel_values": dict(self.values),
            "channel_versions": dict(self.versions),
            "versions_seen": {
                "__input__": {},
                "__start__": {"__start__": self.versions["count"]},
                node: {c: self.versions[c] for c in ("messages", "branch:to:" + node)},
            },
            "pending_sends": [],
            "updated_channels": list(changed),
        }
        md = {"source": "loop", "step": self.step, "parents": {}, **self.metadata_extra}
        return self.config(), cp, md, new_versions

    async def put(self, changed: tuple[str, ...]) -> Any:
        cfg, cp, md, nv = self.next(changed)
        out = await self.saver.aput(cfg, cp, md, nv)
        self.parent_id = cp["id"]
        return out


# changed-channel patterns
SMALL = ("count", "status", "branch:to:agent")
WITH_MSGS = ("messages", "branch:to:tools")


# --------------------------------------------------------------------------------------
# Workloads (saver_of: label -> saver; a Prepare maps a label to one timed call)
# --------------------------------------------------------------------------------------

Prepare = Callable[[str], Callable[[], Awaitable[Any]]]


async def aput_writes_prepare(
    sim_cls: type[ConvSim], saver_of: dict[str, Any], prof: Any
) -> Prepare:
    """One task's writes (3 channels) per call, on a checkpoint put first on each saver."""
    cfgs = {}
    for lab, saver in saver_of.items():
        sim = sim_cls(saver, "t-writes", prof.window, prof.msg_bytes, seed=2)
        cfgs[lab] = (saver, await sim.put(SMALL))
    msg = sim_cls.payloads.ai(random.Random(3), prof.msg_bytes)

    def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
        saver, cfg = cfgs[lab]
        writes = [("messages", [msg]), ("count", 7), ("branch:to:tools", None)]
        task_id = str(uuid.uuid4())
        return lambda: saver.aput_writes(cfg, writes, task_id, "~__pregel_pull, agent")

    return prepare


# --------------------------------------------------------------------------------------
# Tool-node graphs (the ledger rows)
# --------------------------------------------------------------------------------------


@tool
async def noop(i: int) -> str:
    """Do nothing (a side-effecting tool as far as the ledger knows)."""
    return "ok"


class MsgState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def tools_graph(kind: str, saver: Any) -> Any:
    """START -> tools -> END with LangGraph's ``ToolNode`` (``stock``) or ours (``idem``)."""
    from langgraph_idem_saver import IdempotentToolNode

    g = StateGraph(MsgState)
    g.add_node("tools", IdempotentToolNode([noop]) if kind == "idem" else ToolNode([noop]))
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    return g.compile(checkpointer=saver)


def tool_call_message(n: int, tag: str) -> AIMessage:
    """One model message asking for ``n`` parallel ``noop`` calls."""
    return AIMessage(
        content="",
        id=f"ai-{tag}",
        tool_calls=[
            {"name": "noop", "args": {"i": i}, "id": f"call_{tag}_{i}", "type": "tool_call"}
            for i in range(n)
        ],
    )


# --------------------------------------------------------------------------------------
# DeltaChannel threads (the "delta" rows)
# --------------------------------------------------------------------------------------

# Never reached (nor is LangGraph's 5,000-superstep bound): the latest checkpoint stores
# no value and a load walks back to the first checkpoint, so the walk is as long as the
# thread - the worst case of a DeltaChannel thread, and the one that shows how a saver's
# get_delta_channel_history grows with the chain.
DELTA_NO_SNAPSHOT = 10**9
DELTA_STEPS = (100, 1000)


def _extend(state: list[Any], writes: Sequence[list[Any]]) -> list[Any]:
    """A cheap batching-invariant reducer, so the replay does not hide the saver's cost."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaLoopState(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=DELTA_NO_SNAPSHOT)]
    count: int


def build_delta_graph(steps: int) -> Any:
    """One node looping ``steps`` supersteps, each appending a ~200-byte AI message to a
    ``DeltaChannel``: a thread of ``steps`` checkpoints storing each message once."""

    def step(state: DeltaLoopState) -> dict[str, Any]:
        c = state.get("count", 0) + 1
        return {
            "count": c,
            "messages": [AIMessage(content=f"step {c}: " + "x" * 180, id=f"m-{c}")],
        }

    g = StateGraph(DeltaLoopState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["count"] < steps else END, ["step", END])
    return g


async def populate_delta_threads(saver: Any) -> dict[int, Any]:
    """A ``delta-<steps>`` thread for each of ``DELTA_STEPS`` on ``saver``: their graphs."""
    graphs = {}
    for steps in DELTA_STEPS:
        graph = build_delta_graph(steps).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": f"delta-{steps}"}, "recursion_limit": steps + 10}
        await graph.ainvoke({"messages": [], "count": 0}, cfg, durability="async")
        graphs[steps] = graph
    return graphs


def delta_specs(graphs_of: dict[str, dict[int, Any]]) -> list[tuple[str, str, Prepare]]:
    """(key, title, prepare) of the delta rows: ``graph.aget_state`` of each thread's
    latest checkpoint (``aget_tuple``, ``aget_delta_channel_history`` over the whole
    thread, the replay), checking the whole conversation came back."""
    specs: list[tuple[str, str, Prepare]] = []
    for steps in DELTA_STEPS:

        def prepare(lab: str, steps: int = steps) -> Callable[[], Awaitable[Any]]:
            graph = graphs_of[lab][steps]
            cfg = {"configurable": {"thread_id": f"delta-{steps}"}}

            async def run() -> None:
                state = await graph.aget_state(cfg)
                assert len(state.values["messages"]) == steps, (lab, steps)

            return run

        title = f"DeltaChannel load: aget_state latest ({steps:,}-step thread)"
        specs.append((f"delta_load_{steps}", title, prepare))
    return specs


# --------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------


def summarize(samples_ns: list[int], scale: float = 1.0, with_mean: bool = True) -> dict:
    """Median and [p10, p90] (and mean) in µs, each sample divided by ``scale`` first."""
    s = sorted(samples_ns) if scale == 1.0 else sorted(x / scale for x in samples_ns)
    n = len(s)

    def q(p: float) -> float:
        return s[min(n - 1, max(0, round(p * (n - 1))))] / 1000.0

    out = {
        "n": n,
        "median_us": statistics.median(s) / 1000.0,
        "p10_us": q(0.10),
        "p90_us": q(0.90),
    }
    if with_mean:
        out["mean_us"] = statistics.fmean(s) / 1000.0
    return out


async def interleaved(
    labels: list[str],
    prepare: Prepare,
    warmup: int,
    rounds: int,
    per_round: int,
    budget_s: float | None = None,
) -> dict[str, list[int]]:
    """Time ``await prepare(label)()`` per call; preparation is not timed.

    The column order alternates every round (A B, B A, ...; with more than two columns
    it also rotates) so drift and disk write-back hit every column alike. Past
    ``budget_s`` stop after the current round (at least 2 rounds), so a pathologically
    slow backend cannot blow the run time; all columns keep equal counts.
    """
    t_begin = time.perf_counter()
    for lab in labels:
        for _ in range(warmup):
            await prepare(lab)()
    samples: dict[str, list[int]] = {lab: [] for lab in labels}
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        if len(labels) > 2:
            k = (r // 2) % len(labels)
            order = order[k:] + order[:k]
        for lab in order:
            gc.collect()
            buf = samples[lab]
            for _ in range(per_round):
                fn = prepare(lab)
                t0 = perf_ns()
                await fn()
                buf.append(perf_ns() - t0)
        if budget_s is not None and r >= 1 and time.perf_counter() - t_begin > budget_s:
            break
    return samples


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def fmt_us(v: float, ms_digits: int = 1) -> str:
    return f"{v / 1000:,.{ms_digits}f} ms" if v >= 10_000 else f"{v:,.0f} µs"


def spread(d: dict) -> str:
    """``[p10–p90]`` of a summary, or "" if it has none."""
    if "p10_us" not in d:
        return ""
    return f"[{d['p10_us']:,.0f}–{d['p90_us']:,.0f}]"


def print_targets(targets: list[dict[str, Any]]) -> None:
    print("\ntargets:")
    for t in targets:
        print(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def env_base() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def write_json(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2, default=str)
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------
# Run plumbing
# --------------------------------------------------------------------------------------


def load_average_checked() -> tuple[float, float, float]:
    """The load average now; warns on stderr if other processes are busy."""
    load = os.getloadavg()
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"WARNING: load average {load[0]:.2f} on {os.cpu_count()} CPUs: other "
            "processes are busy; expect noisy numbers (fsync-bound rows especially)",
            file=sys.stderr,
        )
    return load


def load_summary(elapsed: float, profile: str, before: Any, after: Any) -> str:
    return (
        f"\ntotal benchmark time {elapsed:.1f}s ({profile}); load average before "
        f"{before[0]:.2f}, after {after[0]:.2f} ({os.cpu_count()} CPUs)"
    )


def stepper(t_start: float) -> Callable[[str], None]:
    """A progress logger: ``[  12.3s] name ...`` on stderr."""

    def step(name: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {name} ...", file=sys.stderr, flush=True)

    return step


@contextmanager
def bench_tmpdir(prefix: str, parent: str | None, keep: bool) -> Iterator[str]:
    """A fresh temp dir, removed on exit unless ``keep`` (then its path goes to stderr)."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield tmp
    finally:
        if keep:
            print(f"kept temp files in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
