"""``LedgerOptions``: what a front door was asked to do, validated once.

Every front door (``IdempotentToolNode``, ``IdempotencyMiddleware``, ``idempotent_task``)
takes the same keyword arguments and turns them into one of these, so the rules ("a
mapping names tools this node has", "on_unknown is one of four words") are written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from typing_extensions import TypedDict, Unpack

from langgraph_idem_saver.engine.types import (
    ON_EARLIER_CALL_VALUES,
    ON_UNKNOWN_VALUES,
    READ_ONLY_METADATA_KEY,
    OnEarlierCall,
    OnUnknown,
    VerifyFn,
)
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.keys import KeyPolicy, scope_of
from langgraph_idem_saver.ledger import ToolCallLedger

ExceptionTypes = tuple[type[BaseException], ...]


class LedgerKwargs(TypedDict, total=False):
    """The ledger keyword arguments every front door takes (``**kwargs: Unpack[...]``),
    described once in ``IdempotentToolNode``'s docstring."""

    ledger: ToolCallLedger | None
    key_policy: KeyPolicy | Mapping[str, KeyPolicy]
    namespace: str | None
    read_only: Iterable[str]
    verify: Mapping[str, VerifyFn] | None
    on_unknown: OnUnknown | Mapping[str, OnUnknown]
    on_earlier_call: OnEarlierCall | Mapping[str, OnEarlierCall]
    not_applied_errors: ExceptionTypes | Mapping[str, ExceptionTypes]
    lease_seconds: float
    wait_seconds: float
    poll_seconds: float


V = TypeVar("V")


@dataclass(frozen=True)
class PerTool(Generic[V]):
    """A setting given for every tool, or per tool name (``on_unknown="rerun"`` or
    ``on_unknown={"charge": "interrupt"}``): every such option is read and looked
    up by one rule. A mapping leaves the tools it does not name at ``default``."""

    default: V
    by_tool: Mapping[str, V] = field(default_factory=dict)

    @classmethod
    def of(cls, value: V | Mapping[str, V], default: V, *, check: Callable[[V], V]) -> PerTool[V]:
        """``value`` as given (one for all, or a mapping), each value passed through
        ``check`` (which raises :class:`ConfigError` or returns it normalized)."""
        if isinstance(value, Mapping):
            return cls(check(default), {k: check(v) for k, v in value.items()})
        return cls(check(value))

    def of_tool(self, tool_name: str) -> V:
        return self.by_tool.get(tool_name, self.default)


@dataclass(frozen=True)
class LedgerOptions:
    """The validated options of one front door (see ``IdempotentToolNode`` for each)."""

    ledger: ToolCallLedger | None = None
    namespace: str | None = None
    read_only: frozenset[str] = frozenset()
    verify: Mapping[str, VerifyFn] = field(default_factory=dict)
    key_policy: PerTool[KeyPolicy] = field(default_factory=lambda: PerTool[KeyPolicy]("tool_call"))
    on_unknown: PerTool[OnUnknown] = field(default_factory=lambda: PerTool[OnUnknown]("interrupt"))
    # a call an earlier entry might answer without proof (engine/earlier.py)
    on_earlier_call: PerTool[OnEarlierCall] = field(
        default_factory=lambda: PerTool[OnEarlierCall]("ask")
    )
    not_applied: PerTool[ExceptionTypes] = field(
        default_factory=lambda: PerTool[ExceptionTypes](())
    )
    lease_seconds: float = 300.0
    wait_seconds: float = 30.0
    poll_seconds: float = 0.1

    @classmethod
    def build(
        cls, *, tools: Mapping[str, Any] | None, **kwargs: Unpack[LedgerKwargs]
    ) -> LedgerOptions:
        """Validate the keyword arguments every front door takes.

        ``tools`` (name -> tool) lets mappings be checked against the tools there are, and
        adds tools that declare themselves read-only in their metadata; None when the
        front door learns its tools only at run time (the middleware).
        """
        ledger = kwargs.get("ledger")
        namespace = kwargs.get("namespace")
        lease_seconds = kwargs.get("lease_seconds", 300.0)
        wait_seconds = kwargs.get("wait_seconds", 30.0)
        poll_seconds = kwargs.get("poll_seconds", 0.1)
        if ledger is not None and not isinstance(ledger, ToolCallLedger):
            raise ConfigError(f"ledger must be a ToolCallLedger, got {type(ledger).__name__}")
        if lease_seconds <= 0 or wait_seconds < 0 or poll_seconds <= 0:
            raise ConfigError("lease_seconds and poll_seconds must be > 0, wait_seconds >= 0")
        if namespace is not None:
            scope_of("", namespace)  # validate early
        declared = {n for n, t in (tools or {}).items() if declares_read_only(t)}
        options = cls(
            ledger=ledger,
            namespace=namespace,
            read_only=frozenset(kwargs.get("read_only", ())) | declared,
            verify=dict(kwargs.get("verify") or {}),
            key_policy=PerTool.of(
                kwargs.get("key_policy", "tool_call"), "tool_call", check=_key_policy
            ),
            on_unknown=PerTool.of(
                kwargs.get("on_unknown", "interrupt"), "interrupt", check=_on_unknown
            ),
            on_earlier_call=PerTool.of(
                kwargs.get("on_earlier_call", "ask"), "ask", check=_on_earlier_call
            ),
            not_applied=PerTool.of(
                kwargs.get("not_applied_errors", ()), (), check=_exception_types
            ),
            lease_seconds=float(lease_seconds),
            wait_seconds=float(wait_seconds),
            poll_seconds=float(poll_seconds),
        )
        if tools is not None:
            options.check_tool_names(set(tools))
        return options

    def check_tool_names(self, names: set[str]) -> None:
        """Every per-tool mapping names tools there are (a typo must not silently drop a
        verify hook or a read-only flag)."""
        for what, mapping in (
            ("read_only", self.read_only),
            ("verify", self.verify),
            ("key_policy", self.key_policy.by_tool),
            ("on_unknown", self.on_unknown.by_tool),
            ("on_earlier_call", self.on_earlier_call.by_tool),
            ("not_applied_errors", self.not_applied.by_tool),
        ):
            unknown = set(mapping) - names
            if unknown:
                raise ConfigError(f"{what} names tools this node does not have: {sorted(unknown)}")

    def policy_for(self, tool_name: str) -> KeyPolicy:
        return self.key_policy.of_tool(tool_name)

    def on_unknown_for(self, tool_name: str) -> OnUnknown:
        return self.on_unknown.of_tool(tool_name)

    def on_earlier_call_for(self, tool_name: str) -> OnEarlierCall:
        return self.on_earlier_call.of_tool(tool_name)

    def not_applied_for(self, tool_name: str) -> ExceptionTypes:
        return self.not_applied.of_tool(tool_name)

    def is_read_only(self, tool_name: str, tool: Any = None) -> bool:
        """Named read-only, or the tool declares it in its metadata (``read_only`` or
        ``idempotent_read_only``)."""
        return tool_name in self.read_only or (tool is not None and declares_read_only(tool))


def declares_read_only(tool: Any) -> bool:
    """``metadata={"read_only": True}`` (or ``{"idempotent_read_only": True}``) on a tool."""
    metadata = getattr(tool, "metadata", None) or {}
    return bool(metadata.get(READ_ONLY_METADATA_KEY) or metadata.get("read_only"))


def _key_policy(policy: KeyPolicy) -> KeyPolicy:
    if not (policy in ("tool_call", "args") or callable(policy)):
        raise ConfigError(f"unknown key policy {policy!r}")
    return policy


def _on_unknown(value: OnUnknown) -> OnUnknown:
    if value not in ON_UNKNOWN_VALUES:
        raise ConfigError(f"on_unknown must be one of {sorted(ON_UNKNOWN_VALUES)}, got {value!r}")
    return value


def _on_earlier_call(value: OnEarlierCall) -> OnEarlierCall:
    if value not in ON_EARLIER_CALL_VALUES:
        raise ConfigError(
            f"on_earlier_call must be one of {sorted(ON_EARLIER_CALL_VALUES)}, got {value!r}"
        )
    return value


def _exception_types(types: ExceptionTypes) -> ExceptionTypes:
    types = tuple(types)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ConfigError(f"not_applied_errors must hold exception types, got {types!r}")
    return types
