"""``LedgerOptions``: what a front door was asked to do, validated once.

Every front door (``IdempotentToolNode``, ``IdempotencyMiddleware``, ``idempotent_task``)
takes the same keyword arguments and turns them into one of these, so the rules ("a
mapping names tools this node has", "on_unknown is one of four words") are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict, Unpack

from langgraph_idem_saver.engine.types import (
    ON_UNKNOWN_VALUES,
    READ_ONLY_METADATA_KEY,
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
    not_applied_errors: ExceptionTypes | Mapping[str, ExceptionTypes]
    lease_seconds: float
    wait_seconds: float
    poll_seconds: float


@dataclass(frozen=True)
class LedgerOptions:
    """The validated options of one front door (see ``IdempotentToolNode`` for each)."""

    ledger: ToolCallLedger | None = None
    namespace: str | None = None
    read_only: frozenset[str] = frozenset()
    verify: Mapping[str, VerifyFn] = field(default_factory=dict)
    default_policy: KeyPolicy = "tool_call"
    policies: Mapping[str, KeyPolicy] = field(default_factory=dict)
    default_on_unknown: OnUnknown = "interrupt"
    on_unknown: Mapping[str, OnUnknown] = field(default_factory=dict)
    default_not_applied: ExceptionTypes = ()
    not_applied: Mapping[str, ExceptionTypes] = field(default_factory=dict)
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
        key_policy = kwargs.get("key_policy", "tool_call")
        namespace = kwargs.get("namespace")
        on_unknown = kwargs.get("on_unknown", "interrupt")
        not_applied_errors = kwargs.get("not_applied_errors", ())
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
        policies: dict[str, KeyPolicy] = {}
        default_policy: KeyPolicy = "tool_call"
        if isinstance(key_policy, Mapping):
            policies = dict(key_policy)
        else:
            default_policy = key_policy
        for policy in [default_policy, *policies.values()]:
            if not (policy in ("tool_call", "args") or callable(policy)):
                raise ConfigError(f"unknown key policy {policy!r}")
        default_on_unknown: OnUnknown = "interrupt"
        per_tool_on_unknown: dict[str, OnUnknown] = {}
        if isinstance(on_unknown, str):
            default_on_unknown = on_unknown
        else:
            per_tool_on_unknown = dict(on_unknown)
        for value in [default_on_unknown, *per_tool_on_unknown.values()]:
            if value not in ON_UNKNOWN_VALUES:
                raise ConfigError(
                    f"on_unknown must be one of {sorted(ON_UNKNOWN_VALUES)}, got {value!r}"
                )
        default_not_applied: ExceptionTypes = ()
        not_applied: dict[str, ExceptionTypes] = {}
        if isinstance(not_applied_errors, Mapping):
            not_applied = {k: tuple(v) for k, v in not_applied_errors.items()}
        else:
            default_not_applied = tuple(not_applied_errors)
        for types in [default_not_applied, *not_applied.values()]:
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
                raise ConfigError(f"not_applied_errors must hold exception types, got {types!r}")
        options = cls(
            ledger=ledger,
            namespace=namespace,
            read_only=frozenset(kwargs.get("read_only", ())) | declared,
            verify=dict(kwargs.get("verify") or {}),
            default_policy=default_policy,
            policies=policies,
            default_on_unknown=default_on_unknown,
            on_unknown=per_tool_on_unknown,
            default_not_applied=default_not_applied,
            not_applied=not_applied,
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
            ("key_policy", self.policies),
            ("on_unknown", self.on_unknown),
            ("not_applied_errors", self.not_applied),
        ):
            unknown = set(mapping) - names
            if unknown:
                raise ConfigError(f"{what} names tools this node does not have: {sorted(unknown)}")

    def policy_for(self, tool_name: str) -> KeyPolicy:
        return self.policies.get(tool_name, self.default_policy)

    def on_unknown_for(self, tool_name: str) -> OnUnknown:
        return self.on_unknown.get(tool_name, self.default_on_unknown)

    def not_applied_for(self, tool_name: str) -> ExceptionTypes:
        return self.not_applied.get(tool_name, self.default_not_applied)

    def is_read_only(self, tool_name: str, tool: Any = None) -> bool:
        """Named read-only, or the tool declares it in its metadata (``read_only`` or
        ``idempotent_read_only``)."""
        return tool_name in self.read_only or (tool is not None and declares_read_only(tool))


def declares_read_only(tool: Any) -> bool:
    """``metadata={"read_only": True}`` (or ``{"idempotent_read_only": True}``) on a tool."""
    metadata = getattr(tool, "metadata", None) or {}
    return bool(metadata.get(READ_ONLY_METADATA_KEY) or metadata.get("read_only"))
