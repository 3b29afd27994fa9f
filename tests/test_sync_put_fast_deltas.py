"""The list-delta encoder's cheaper write side decides exactly as before.

Every ``put`` of a graph with a list channel asks ``_Written.starts`` whether the new list
begins with the remembered version's very objects, ``_held`` how to remember a list, and
``ListDeltaEncoder._trim`` which of the oldest entries are dead. They now test in C
(``map`` over ``operator.is_``), copy a list whose first item's exact type takes no weak
reference without raising a ``TypeError``, and check ``dead()`` inline. Here each is run
beside the formulation it replaced (written out below) on the same lists - weakly
referable objects, ``str``/``int``/``None``/tuples/dicts, a ``str`` subclass, references
gone dead, ``None`` where a dead object was - and their answers compared.
Derandomized under CI by the suite's Hypothesis profile.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from langgraph_idem_saver.list_deltas import ListDeltaEncoder, _held, _Written


class Obj:
    """An item that takes weak references (as LangChain messages do)."""


class Text(str):
    """A ``str`` subclass: no weak references, and not one of the exact types listed."""


def held_before(items: list[Any]) -> tuple[list[Any], bool]:
    """``_held`` as it was: try weak references, copy on the ``TypeError``."""
    try:
        return list(map(weakref.ref, items)), True
    except TypeError:
        return list(items), False


def starts_before(written: _Written, value: list[Any]) -> bool:
    """``_Written.starts`` as it was: a generator a pair."""
    held = written.held
    if len(value) < len(held):
        return False
    if written.weak:
        return all(ref() is item is not None for ref, item in zip(held, value, strict=False))
    return all(a is b for a, b in zip(held, value, strict=False))


def trim_before(recent: OrderedDict[Any, _Written]) -> None:
    """``_trim``'s dead-entry check as it was (the size bound aside)."""
    for key in list(itertools.islice(recent, 4)):
        if recent[key].dead():
            del recent[key]


# an item of a drawn list: an index into the live objects, or a kind of unreferable value
TOKENS = st.one_of(
    st.integers(0, 2),
    st.sampled_from(["str", "int", "none", "tuple", "dict", "text", "dead"]),
)


def make(tokens: list[Any], live: list[Obj], dead: list[Obj]) -> list[Any]:
    """The list the tokens name; ``dead`` gets the objects that die with the caller's
    ``dead.clear()``."""
    out: list[Any] = []
    for t in tokens:
        if isinstance(t, int):
            out.append(live[t])
        elif t == "dead":
            dead.append(Obj())
            out.append(dead[-1])
        else:
            out.append(
                {"str": "s", "int": 7, "none": None, "tuple": (1,), "dict": {}}.get(t, Text("t"))
            )
    return out


def answer(held: tuple[list[Any], bool]) -> tuple[list[int], bool]:
    """What a holding keeps, comparable: the ids of the referents or the items."""
    items, weak = held
    return [id(r() if weak else r) for r in items], weak


@settings(max_examples=5 * settings.default.max_examples)
@given(st.lists(TOKENS, max_size=6))
@example([])
@example(["str", 0])
@example([0, "str"])
@example(["text", 0])
@example([0, 1, 2])
@example(["none"])
def test_held_decides_as_before(tokens: list[Any]) -> None:
    live = [Obj(), Obj(), Obj()]
    items = make(tokens, live, [])
    assert answer(_held(items)) == answer(held_before(items))


@settings(max_examples=5 * settings.default.max_examples)
@given(
    base=st.lists(TOKENS, min_size=1, max_size=5),
    extra=st.lists(TOKENS, max_size=3),
    change=st.none() | st.tuples(st.integers(0, 4), TOKENS),
    kill=st.booleans(),
)
@example(base=[0, "dead"], extra=[], change=None, kill=True)
@example(base=[0, "dead"], extra=[], change=(1, "none"), kill=True)
@example(base=[0, 1], extra=["str"], change=None, kill=False)
@example(base=["str", "int"], extra=[0], change=None, kill=False)
@example(base=[0, 1], extra=[], change=(1, 2), kill=False)
def test_starts_decides_as_before(
    base: list[Any], extra: list[Any], change: tuple[int, Any] | None, kill: bool
) -> None:
    live = [Obj(), Obj(), Obj()]
    dying: list[Obj] = []
    items = make(base, live, dying)
    written = _Written("1", *_held(items), 0)
    value = items + make(extra, live, [])
    if change is not None and change[0] < len(value):
        value[change[0]] = make([change[1]], live, [])[0]
    if kill:  # the run that held the list ended: its items are gone, None in their place
        value = [None if any(v is d for d in dying) else v for v in value]
        del items
        dying.clear()
    assert written.starts(value) == starts_before(written, value)
    if not kill and change is None:
        assert written.starts(value)  # the control: the same objects first


@settings(max_examples=5 * settings.default.max_examples)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=7))
@example([(True, True)] * 6)
@example([(False, False), (True, True), (True, False)])
def test_trim_drops_the_dead_entries_it_dropped_before(entries: list[tuple[bool, bool]]) -> None:
    """Each entry: weakly held or a copy, and (when weak) whether its items die."""
    keep: list[Obj] = []
    dying: list[Obj] = []
    encoder = ListDeltaEncoder()
    for i, (weak, dies) in enumerate(entries):
        obj = Obj()
        (dying if dies else keep).append(obj)
        items: list[Any] = [obj] if weak else ["s", obj]
        encoder.loaded("t", "", f"c{i}", "1", items, 0)
    dying.clear()
    before: OrderedDict[Any, _Written] = OrderedDict(encoder._recent)
    trim_before(before)
    encoder._trim()
    assert list(encoder._recent) == list(before)
