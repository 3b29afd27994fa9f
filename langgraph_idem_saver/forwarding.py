"""Methods made from another object's async methods, written once as a table.

The savers expose the same operations three ways: the async saver's ``a``-methods (the
work), their sync twins (``get_tuple`` runs ``aget_tuple`` on the saver's loop), and the
sync savers' async methods (``aclaim`` hops to the private loop and runs the async
saver's). Spelled out, each is a copy of the target's signature around one line; here
each is one line, ``get_tuple = blocking(IdemSaverBase.aget_tuple)``, whose type
(``ParamSpec``) is the target's, so mypy checks callers as before and a change of the
target's signature changes the forwarder with it.

The owner class says where calls go by implementing :class:`Bridged`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Y = TypeVar("Y")

# items fetched per hop when iterating an async generator from elsewhere (``list``,
# a sync saver's ``alist``): the async savers read pages of 100
LIST_CHUNK = 100


class Bridged(Protocol):
    """What a class with forwarded methods provides."""

    def _bridge_target(self) -> Any:
        """The object whose ``a``-methods do the work."""

    def _run_blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` where the target lives and wait for its result (sync methods)."""

    async def _run_hopping(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` where the target lives, from any loop (async methods)."""

    def _bridge_closed(self) -> bool:
        """Whether nothing can run where the target lives any more (skip cleanup)."""


class _Forward(Generic[P, R]):
    """A class attribute naming the target's method ``method.__name__``."""

    def __init__(self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> None:
        self.target_name = method.__name__
        self.__doc__ = method.__doc__

    def _bound(self, obj: Bridged) -> Callable[P, Coroutine[Any, Any, R]]:
        method: Callable[P, Coroutine[Any, Any, R]] = getattr(
            obj._bridge_target(), self.target_name
        )
        return method


class blocking(_Forward[P, R]):
    """A sync method running the target's async ``method`` (``get_tuple`` from
    ``aget_tuple``) through the owner's ``_run_blocking``."""

    @overload
    def __get__(self, obj: None, owner: type) -> blocking[P, R]: ...

    @overload
    def __get__(self, obj: Bridged, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: Bridged | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        method = self._bound(obj)

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return obj._run_blocking(method(*args, **kwargs))

        return _like(call, method)


class hopping(_Forward[P, R]):
    """An async method awaiting the target's ``method`` of the same name through the
    owner's ``_run_hopping`` (on the target's loop)."""

    @overload
    def __get__(self, obj: None, owner: type) -> hopping[P, R]: ...

    @overload
    def __get__(
        self, obj: Bridged, owner: type | None = None
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, obj: Bridged | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        method = self._bound(obj)

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await obj._run_hopping(method(*args, **kwargs))

        return _like(call, method)


class _ForwardIter(Generic[P, Y]):
    """A class attribute naming the target's async generator method."""

    def __init__(self, method: Callable[Concatenate[Any, P], AsyncIterator[Y]]) -> None:
        self.target_name = method.__name__
        self.__doc__ = method.__doc__

    def _bound(self, obj: Bridged) -> Callable[..., AsyncIterator[Y]]:
        method: Callable[..., AsyncIterator[Y]] = getattr(obj._bridge_target(), self.target_name)
        return method


class paging(_ForwardIter[P, Y]):
    """A sync iterator over the target's async generator (``list`` from ``alist``),
    fetched lazily ``LIST_CHUNK`` items per hop: nothing is held between pages, so the
    caller may write while iterating."""

    @overload
    def __get__(self, obj: None, owner: type) -> paging[P, Y]: ...

    @overload
    def __get__(self, obj: Bridged, owner: type | None = None) -> Callable[P, Iterator[Y]]: ...

    def __get__(self, obj: Bridged | None, owner: type | None = None) -> Any:
        if obj is None:
            return self

        method = self._bound(obj)

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

        return _like(call, method)


class relaying(_ForwardIter[P, Y]):
    """An async generator over the target's, fetched ``LIST_CHUNK`` items per hop."""

    @overload
    def __get__(self, obj: None, owner: type) -> relaying[P, Y]: ...

    @overload
    def __get__(self, obj: Bridged, owner: type | None = None) -> Callable[P, AsyncIterator[Y]]: ...

    def __get__(self, obj: Bridged | None, owner: type | None = None) -> Any:
        if obj is None:
            return self

        method = self._bound(obj)

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

        return _like(call, method)


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
