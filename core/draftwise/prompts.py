"""Prompts into checked token ids: text, token ids or chat messages, refused by name.

One place decides what a prompt may be before the engine queues it: valid text, no
longer than the context could hold (checked by length before the tokenizer runs, so a
huge prompt costs nothing), token ids that are integers, and room for at least one
generated token. The server calls it on its tokenizer threads: it reads only the
tokenizer, whose ``encode`` releases the GIL.
"""

from __future__ import annotations

import operator
from typing import Any

from draftwise.errors import RequestError
from draftwise.text import check_text

#: what ``LLMEngine.add_request`` takes as a prompt
PromptType = str | list[int] | dict[str, Any]


class PromptReader:
    """Tokenizes and checks prompts for one model (its tokenizer and context length)."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        #: the longest text prompt that could fit the context (see :func:`prompt_char_limit`)
        self.max_chars = prompt_char_limit(tokenizer, max_model_len)

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """A string is tokenized; ``{"prompt_token_ids": [...]}`` or a list is taken as is."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("prompt", "this checkpoint has no tokenizer: pass token ids")
            self.check_text("prompt", prompt, len(prompt))
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(str(prompt["prompt"]))
            raise RequestError("prompt", "a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, list | tuple):
            return None, self._ids(prompt)
        raise RequestError("prompt", f"unsupported prompt type {type(prompt).__name__}")

    def check_tokens(self, num_tokens: int) -> None:
        """The prompt must leave room for at least one generated token."""
        if num_tokens >= self.max_model_len:
            raise RequestError(
                "prompt",
                f"the prompt has {num_tokens} tokens; the context is {self.max_model_len} "
                "and at least one token must be generated",
            )

    def check_text(self, field: str, text: str, num_chars: int) -> None:
        """Refuse invalid text, and text too long to fit the context, before tokenizing."""
        check_text(field, text)
        limit = self.max_chars
        if limit is not None and num_chars > limit:
            raise RequestError(
                field,
                f"the prompt has {num_chars} characters; no more than {limit} can fit the "
                f"context of {self.max_model_len} tokens (a token of this vocabulary covers "
                f"at most {limit // self.max_model_len} characters)",
            )

    def check_messages(self, messages: list[dict[str, Any]]) -> None:
        """Chat messages' text is valid and, all together, not longer than could fit."""
        total = 0
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                check_text(f"messages[{i}].content", content)
                total += len(content)
        if self.tokenizer is not None:
            self.check_text("messages", "", total)

    def _ids(self, values: Any) -> list[int]:
        """Given token ids as ints, refused by length before anything scans them."""
        if hasattr(values, "__len__"):
            self.check_tokens(len(values))
        try:
            return [operator.index(t) for t in values]
        except TypeError:
            raise RequestError("prompt_token_ids", "token ids must be integers") from None


def prompt_char_limit(tokenizer: Any, max_model_len: int) -> int | None:
    """Characters beyond which a text prompt cannot fit ``max_model_len`` tokens.

    Each token of a byte-level or SentencePiece vocabulary covers at most as many input
    characters as its longest vocabulary entry has (a byte-level entry spells one
    character per byte, and a character is at least one byte), so a prompt of more than
    ``max_model_len * longest`` characters needs more tokens than the context holds. The
    check is a length comparison, run before the tokenizer ever sees the text.
    """
    if tokenizer is None:
        return None
    return max_model_len * max(1, int(tokenizer.max_token_chars))


__all__ = ["PromptReader", "PromptType", "prompt_char_limit"]
