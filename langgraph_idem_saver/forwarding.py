"""Methods made from another object's async methods, written once as a table.

The savers expose the same operations three ways: the async saver's ``a``-methods (the
work), their sync twins (``get_tuple`` runs ``aget_tuple`` on the saver's loop), and the
sync savers' async methods (``aclaim`` hops to the private loop and runs the async
saver's). Spelled out, each is a copy of the target's signature around one line; here
each is one line, ``get_tuple = blocking(IdemSaverBase.aget_tuple)``, whose type
(``ParamSpec``) is the target's, so mypy checks callers as before and a change of the
target's signature changes the forwarder with it.

The owner class says where calls go by implementing :class:`Hops` (async forwarders) or
:class:`Bridged` (sync ones too).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Y = TypeVar("Y")
M = TypeVar("M")  # what a forwarder is on an instance
H = TypeVar("H")  # what it needs of the instance: Hops or Bridged
F = TypeVar("F", bound="_Forwarder[Any, Any]")

# items fetched per hop when iterating an async generator from elsewhere (``list``,
# a sync saver's ``alist``): the async savers read pages of 100
LIST_CHUNK = 100


class Hops(Protocol):
    """What a class with forwarded async methods provides."""

    def _bridge_target(self) -> Any:
        """The object whose ``a``-methods do the work."""

    async def _run_hopping(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` where the target lives, from any loop (async methods)."""

    def _bridge_closed(self) -> bool:
        """Whether nothing can run where the target lives any more (skip cleanup)."""


class Bridged(Hops, Protocol):
    """What a class with forwarded sync methods provides as well."""

    def _run_blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` where the target lives and wait for its result (sync methods)."""


class _Forwarder(Generic[M, H]):
    """A class attribute naming the target's method ``method.__name__``. Read on the
    class it is itself; read on an instance (``H``: what it must provide), the target's
    method as ``_wrap`` makes it run (``M``: its type there), presented as the target's."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.target_name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self: F, obj: None, owner: type) -> F: ...

    @overload
    def __get__(self, obj: H, owner: type | None = None) -> M: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        method = getattr(obj._bridge_target(), self.target_name)
        return _like(self._wrap(obj, method), method)

    def _wrap(self, obj: H, method: Any) -> M:
        """``method`` (the target's, bound) as the owner's method runs it."""
        raise NotImplementedError


class blocking(_Forwarder[Callable[P, R], Bridged]):
    """A sync method running the target's async ``method`` (``get_tuple`` from
    ``aget_tuple``) through the owner's ``_run_blocking``."""

    def __init__(self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> None:
        super().__init__(method)

    def _wrap(self, obj: Bridged, method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, R]:
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return obj._run_blocking(method(*args, **kwargs))

        return call


class hopping(_Forwarder[Callable[P, Coroutine[Any, Any, R]], Hops]):
    """An async method awaiting the target's ``method`` of the same name through the
    owner's ``_run_hopping`` (on the target's loop)."""

    def __init__(self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> None:
        super().__init__(method)

    def _wrap(
        self, obj: Hops, method: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await obj._run_hopping(method(*args, **kwargs))

        return call


class paging(_Forwarder[Callable[P, Iterator[Y]], Bridged]):
    """A sync iterator over the target's async generator (``list`` from ``alist``),
    fetched lazily ``LIST_CHUNK`` items per hop: nothing is held between pages, so the
    caller may write while iterating."""

    def __init__(self, method: Callable[Concatenate[Any, P], AsyncIterator[Y]]) -> None:
        super().__init__(method)

    def _wrap(
        self, obj: Bridged, method: Callable[P, AsyncIterator[Y]]
    ) -> Callable[P, Iterator[Y]]:
        def call(*args: P.args, **kwargs: P.kwargs) -> Iterator[Y]:
            agen = cast(AsyncGenerator[Y, None], method(*args, **kwargs))
            more, started = True, False
            try:
                while more:
                    items, more = obj._run_blocking(_pull(agen, LIST_CHUNK))
                    started = True
                    yield from items
            finally:
                if started and more and not obj._bridge_closed():  # the caller stopped early
                    obj._run_blocking(agen.aclose())

        return call


class relaying(_Forwarder[Callable[P, AsyncIterator[Y]], Hops]):
    """An async generator over the target's, fetched ``LIST_CHUNK`` items per hop."""

    def __init__(self, method: Callable[Concatenate[Any, P], AsyncIterator[Y]]) -> None:
        super().__init__(method)

    def _wrap(
        self, obj: Hops, method: Callable[P, AsyncIterator[Y]]
    ) -> Callable[P, AsyncIterator[Y]]:
        async def call(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Y]:
            agen = cast(AsyncGenerator[Y, None], method(*args, **kwargs))
            more, started = True, False
            try:
                while more:
                    items, more = await obj._run_hopping(_pull(agen, LIST_CHUNK))
                    started = True
                    for item in items:
                        yield item
            finally:
                if started and more and not obj._bridge_closed():  # the caller stopped early
                    await obj._run_hopping(agen.aclose())

        return call


async def _pull(agen: AsyncIterator[T], n: int) -> tuple[list[T], bool]:
    """Up to ``n`` items of ``agen`` and whether it may have more: one hop for many items."""
    items: list[T] = []
    while len(items) < n:
        try:
            items.append(await agen.__anext__())
        except StopAsyncIteration:
            return items, False
    return items, True


def _like(call: T, method: Any) -> T:
    """``call`` presented as ``method`` (name, doc, and ``inspect.signature`` through
    ``__wrapped__``): the few attributes ``functools.wraps`` would copy that matter, at a
    tenth of its cost - this runs on every attribute access."""
    function: Any = call
    function.__wrapped__ = method
    function.__doc__ = method.__doc__
    function.__name__ = function.__qualname__ = method.__name__
    return call
