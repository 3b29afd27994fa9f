"""``ScriptedChatModel``: the base of the tests' scripted chat models.

What such a model answers is its ``_generate`` (derived from the conversation, so a re-run
model step after a crash asks for the same things); the tools an agent binds to it change
nothing, so ``bind_tools`` returns the model itself. Each subclass names itself with
``llm_type`` (LangChain's ``_llm_type``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from langchain_core.language_models.chat_models import BaseChatModel
from typing_extensions import Self


class ScriptedChatModel(BaseChatModel):
    llm_type: ClassVar[str] = "scripted"

    @property
    def _llm_type(self) -> str:
        return self.llm_type

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Self:
        return self
