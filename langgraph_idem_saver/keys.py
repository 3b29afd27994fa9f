"""Ledger keys: canonical argument hashing, scopes, agent paths and key policies.

The key decides which tool calls are "the same call" and therefore run at most once.
Everything here is pure and deterministic, because two processes (the one that crashed
and the one resuming) must compute byte-identical keys from the same inputs.

Three policies:

* ``"tool_call"`` (default): one ledger entry per model-emitted tool call id *in its
  model message* (the AIMessage id, so a model that reuses ids such as ``call_0`` every
  turn still makes distinct calls), within the scope and agent path. Replays after a
  crash/resume hit the same entry; the model asking for the same thing twice (two ids)
  runs twice, as with a plain ``ToolNode``.
  When the model's message itself was lost (durability ``"async"``/``"exit"``) and the
  model re-emitted the call under a new id, the tool node *adopts* the orphaned entry
  (see ``tool_node``).
* ``"args"``: one entry per (scope, tool, canonical args): the same arguments twice in a
  thread are one call, whatever the ids.
* a callable ``key_fn(tool_call, ctx) -> str``: the caller names the identity, e.g. a
  vendor idempotency key found in the arguments.
"""

from __future__ import annotations

import hashlib
import json.encoder
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal, Union

from langgraph_idem_saver.errors import ConfigError, SerializationError
from langgraph_idem_saver.json_text import encoder_of, many_encoder_of
from langgraph_idem_saver.surrogates import escape_surrogates, has_split_pair, utf8_ok

__all__ = [
    "KeyContext",
    "KeyFn",
    "KeyPolicy",
    "agent_path_of",
    "args_hash",
    "builtin_key",
    "canonical_args",
    "compute_key",
    "fork_position",
    "scope_of",
    "tool_call_keys",
]


@dataclass(frozen=True)
class KeyContext:
    """What a custom ``key_fn`` may look at besides the tool call itself."""

    scope: str
    thread_id: str
    agent_path: str
    tool_name: str
    canonical_args: str
    args_hash: str
    message_id: str = ""
    """Id of the model message that carries the call ("" when the node cannot see it)."""


# json.dumps with these arguments, made once and without json's Python frames (the same
# text, byte for byte: json_text); two a tool call. The key's parts are a list of our own
# strings, never circular: no check for cycles (the same text; a C encoder made once)
_CANONICAL = encoder_of(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_PARTS = encoder_of(separators=(",", ":"), ensure_ascii=False, check_circular=False)

# the same text as _CANONICAL for arguments that are not circular (a circular value is a
# RecursionError here, a ValueError there: either way ``canonical_args`` raises its own
# error for it), without a dict of markers a call: the step's pass (``step_texts``)
_CANONICAL_MANY = many_encoder_of(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# one JSON string, as _PARTS writes each part (its ``encode_basestring``, C)
_STRING: Callable[[str], str] = json.encoder.encode_basestring
# a step's columns through ``map`` (C, no Python frame a call): ``step_texts``
_ID, _ARGS = operator.itemgetter("id"), operator.itemgetter("args")
_HEX = operator.methodcaller("hexdigest")

KeyFn = Callable[[Mapping[str, Any], KeyContext], str]
"""``key_fn(tool_call, ctx) -> str``: a stable identity for the call (any string)."""

KeyPolicy = Union[Literal["tool_call", "args"], KeyFn]  # noqa: UP007 (runtime alias, py3.10)


def canonical_args(args: Any, *, tool_name: str = "?", tool_call_id: str = "?") -> str:
    """The canonical JSON text of model-emitted tool arguments.

    Sorted keys, no whitespace, UTF-8 kept as is, and NaN/Infinity refused, so that two
    processes always agree on the text (and on its hash). Lone surrogates are written as
    ``\\uXXXX`` escapes (see :func:`_as_serialized`), so the stored text reads back exactly.
    Arguments that JSON cannot represent faithfully raise :class:`SerializationError`
    *before* the tool runs: a key we could not recompute after a crash would make the
    ledger useless for that call.
    """
    try:
        text = _CANONICAL(args)
        canonical = _as_serialized(text)
        if canonical is not text and has_split_pair(text):
            raise ValueError(
                "a high surrogate directly followed by a low one (two code points) reads "
                "back from JSON as one character"
            )
        return canonical
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(
            f"arguments of tool call {tool_call_id!r} to {tool_name!r} are not canonical "
            f"JSON, so the call cannot be made idempotent ({type(exc).__name__}: {exc}); "
            "nothing was run"
        ) from exc


def _as_serialized(text: str) -> str:
    """JSON ``text`` with each lone surrogate written as a ``\\uXXXX`` escape.

    A model's arguments can carry lone surrogates (cf. CVE-2025-64439). Our savers store
    them exactly (:mod:`langgraph_idem_saver.surrogates`), so after a resume the call read
    back from the checkpoint has the same text and the same hash; the escapes keep the
    stored text valid UTF-8 that ``json.loads`` reads back exactly. Text without lone
    surrogates is returned unchanged: keys of ordinary arguments are as before.
    """
    return escape_surrogates(text)


def storable_call_id(tool_call_id: str, tool_name: str = "?") -> str:
    """The tool call id, if a database can store it; :class:`SerializationError` before
    anything runs otherwise (a lone surrogate or a NUL from a misbehaving model)."""
    try:
        tool_call_id.encode("utf-8")
        ok = "\x00" not in tool_call_id
    except UnicodeEncodeError:
        ok = False
    if not ok:
        raise SerializationError(
            f"tool call id {tool_call_id!r} of {tool_name!r} cannot be stored (lone surrogate "
            "or NUL), so the call cannot be made idempotent; nothing was run"
        )
    return tool_call_id


def args_hash(canonical: str) -> str:
    """SHA-256 hex digest of canonical arguments text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _digest(*parts: str) -> str:
    """SHA-256 of a JSON list of the parts: unambiguous however the parts look."""
    text = _PARTS(list(parts))
    return hashlib.sha256(_as_serialized(text).encode("utf-8")).hexdigest()


def scope_of(thread_id: str, namespace: str | None) -> str:
    """The ledger scope: the thread by default, ``"ns:<name>"`` when opted in.

    A wider scope shares (and so deduplicates) calls across threads; it must be asked
    for by name because it changes behaviour for every thread using it.
    """
    if namespace is None:
        if thread_id.startswith("ns:"):
            # would share the named namespace's entries: a replay across tenants
            raise ConfigError(
                f"thread_id {thread_id[:40]!r} starts with 'ns:', which names a shared "
                "ledger namespace; use another thread id (nothing was run)"
            )
        return thread_id
    if not namespace:
        raise ConfigError("namespace must be a non-empty string (or None for per-thread scope)")
    return f"ns:{namespace}"


def agent_path_of(checkpoint_ns: str) -> str:
    """``"parent:<task_id>|child:<task_id>"`` -> ``"parent|child"``.

    Task ids change when LangGraph re-runs a task (e.g. a resumed subgraph); node names
    do not, and they are what identifies "which agent made this call".

    The agent path is the chain of node names from the root graph down to *and
    including* the tool node, joined by ``"|"`` (LangGraph forbids ``"|"`` and ``":"`` in
    node names, so the format is unambiguous):

    * a tool node of the root graph: ``"tools"``;
    * ``create_react_agent`` compiled into the root graph as node ``"researcher"``
      (v1, and v2 whose tool calls are ``Send`` tasks of the same node): ``"researcher|tools"``;
    * an agent invoked from inside a node function ``"writer"``: ``"writer|tools"``;
    * nested: ``"supervisor|researcher|tools"``; a name repeated at two depths stays
      two agents: ``"researcher|researcher|tools"`` is not ``"researcher|tools"``;
    * a subgraph compiled with ``checkpointer=True`` has no task id in its namespace
      part; the name is kept the same way.

    Parallel tasks of one node (two ``Send``s to the same agent node) share a path: under
    ``key_policy="tool_call"`` their calls differ by tool call id, and orphan adoption
    never takes a sibling's entry (see ``IdempotentToolNode``).
    """
    if not checkpoint_ns:
        return ""
    return "|".join(part.split(":", 1)[0] for part in checkpoint_ns.split("|"))


def tool_call_keys(agent_path: str, tool_call_id: str, message_id: str) -> set[str]:
    """Every ``"tool_call"``-policy key a call may have been recorded under: with its
    message id, and without (keys computed where the node could not see the message, or
    by a release before message ids were part of the key)."""
    keys = {_digest("tool_call", agent_path, tool_call_id)}
    if message_id:
        keys.add(_digest("tool_call", agent_path, tool_call_id, message_id))
    return keys


def fork_position(thread_id: str, graph_ns: str, node: str, step: int) -> str:
    """Where in a thread's history a step runs, the same in every branch forked from one
    checkpoint: the thread, the namespace of the graph running the node (with its task
    ids: one invocation of a sub-agent), the node, and the step."""
    return _digest("position", thread_id, graph_ns, node, str(step))


def compute_key(
    policy: KeyPolicy,
    tool_call: Mapping[str, Any],
    ctx: KeyContext,
) -> str:
    """The ledger key of one call under ``policy`` (a SHA-256 hex digest).

    Each policy hashes under its own tag, so keys of different policies never collide.
    The scope is deliberately *not* hashed in: the ledger's primary key is
    ``(scope, key)``, and ``acopy_thread`` re-scopes a thread's rows to its fork, where
    the same calls must find them under the same keys.
    A ``key_fn`` key is also bound to the tool name: two tools that happen to derive the
    same vendor key are still two calls.
    """
    if callable(policy):
        user_key = policy(tool_call, ctx)
        if not isinstance(user_key, str) or not user_key:
            raise ConfigError(
                f"key_fn for tool {ctx.tool_name!r} must return a non-empty str, got {user_key!r}"
            )
        return _digest("key_fn", ctx.tool_name, user_key)
    return builtin_key(
        policy,
        agent_path=ctx.agent_path,
        tool_call_id=str(tool_call["id"]),
        message_id=ctx.message_id,
        tool_name=ctx.tool_name,
        canonical=ctx.canonical_args,
    )


def builtin_key(
    policy: str,
    *,
    agent_path: str,
    tool_call_id: str,
    message_id: str,
    tool_name: str,
    canonical: str,
) -> str:
    """:func:`compute_key` for the ``"tool_call"`` and ``"args"`` policies, from the parts
    they hash: no :class:`KeyContext` to build (a frozen dataclass: ~1 µs a call, 50 in a
    step) when no ``key_fn`` will look at it."""
    if policy == "tool_call":
        if message_id:
            # Models that reuse call ids ("call_0" every turn) make the id alone ambiguous:
            # the message carrying the call tells two turns apart.
            return _digest("tool_call", agent_path, tool_call_id, message_id)
        return _digest("tool_call", agent_path, tool_call_id)
    if policy == "args":
        return _digest("args", tool_name, canonical)
    raise ConfigError(f"unknown key policy {policy!r}: use 'tool_call', 'args' or a callable")


# --- a step's calls at once ---------------------------------------------------------------
# A wide step keys 50 calls: done call by call, the functions above are ~300 bytecodes of
# Python a call (benchmarks/ledger_bytecodes.py). The same texts and digests for a step
# at once: one pass of the C encoder a call, the checks for NULs and lone surrogates once
# over the step's text; whatever the fast pass cannot take goes call by call through the
# functions above (the same values, the same typed errors). ``tests/test_step_keys.py``
# checks that both give the same.


def step_texts(calls: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """Each call's id (:func:`storable_call_id`) and canonical arguments
    (:func:`canonical_args`), in call order."""
    try:
        ids = list(map(str, map(_ID, calls)))
        texts = _CANONICAL_MANY(map(_ARGS, calls))
    except (TypeError, ValueError, RecursionError):
        ids = texts = []
    ids_text = "".join(ids)
    if len(texts) != len(calls) or "\x00" in ids_text or not utf8_ok(ids_text + "".join(texts)):
        ids, texts = [], []
        for call in calls:  # call by call: the first bad one raises its own error
            name, call_id = call["name"], str(call["id"])
            texts.append(canonical_args(call["args"], tool_name=name, tool_call_id=call_id))
            ids.append(storable_call_id(call_id, name))
    return ids, texts


def step_hashes(texts: Sequence[str]) -> list[str]:
    """:func:`args_hash` of each canonical text."""
    return list(map(_HEX, map(hashlib.sha256, map(str.encode, texts))))


def step_tool_call_keys(agent_path: str, ids: Sequence[str], origins: Sequence[str]) -> list[str]:
    """The ``"tool_call"`` key of each call (:func:`builtin_key`): its id in its message
    (``origins``: each call's message id, "" when not known)."""
    string = _STRING
    head = f'["tool_call",{string(agent_path)},'
    if len(ids) != len(origins):
        raise ValueError("one message id a call id")
    if all(origins):  # each in its message (a ToolNode step): the texts through ``map``
        quoted = zip(map(string, ids), repeat(","), map(string, origins), repeat("]"))
        texts = list(map(head.__add__, map("".join, quoted)))
    else:
        texts = [
            f"{head}{string(i)},{string(o)}]" if o else f"{head}{string(i)}]"
            for i, o in zip(ids, origins, strict=True)
        ]
    if not utf8_ok("".join(texts)):
        texts = [_as_serialized(text) for text in texts]
    return step_hashes(texts)
