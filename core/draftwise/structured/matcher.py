"""One request's grammar state: the matcher after its committed output tokens.

The matcher only ever moves forward through COMMITTED tokens (:meth:`consume`, called
once a step's tokens are appended). The tentative walk through a step's drafts happens
inside the mask computation (``masks.py``) and is rolled back there before it returns,
so nothing about a step's drafts outlives the step: a step that fails before commit can
be re-run, and rejected drafts never need undoing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftwise.errors import DraftwiseError, RequestError


class GrammarStateError(DraftwiseError, RuntimeError):
    """A committed token the grammar does not allow (a masking bug, never user input)."""


class GrammarMatcher:
    """An llguidance ``LLMatcher`` that only committed tokens move.

    A completed grammar allows only EOS (llguidance's stop tokens are the model's EOS
    ids), so the engine's own EOS rule ends the request; ``ignore_eos`` with a grammar is
    refused at admission for that reason.
    """

    __slots__ = ("_m",)

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    @property
    def ll_matcher(self) -> Any:
        """The underlying llguidance matcher (for the batched mask call)."""
        return self._m

    def consume(self, tokens: Sequence[int]) -> None:
        """Advance through committed tokens; a token the grammar refuses raises."""
        for tok in tokens:
            if not self._m.consume_token(int(tok)):
                raise GrammarStateError(
                    f"token {tok} was committed but the grammar does not allow it: "
                    f"{self._m.get_error()}"
                )

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts from here (no state change)."""
        return int(self._m.validate_tokens([int(t) for t in tokens]))

    def check_usable(self) -> None:
        """Before masking: a matcher in an error state would mask every token."""
        if self._m.is_error():
            raise GrammarStateError(f"the grammar matcher failed: {self._m.get_error()}")


def consume_committed(grammar: GrammarMatcher, tokens: Sequence[int], params: Any,
                      position: int) -> None:
    """Advance ``grammar`` through a step's committed ``tokens`` (output tokens from
    ``position``); a refusal the request's own token constraints caused is named as that.

    The grammar's mask and ``allowed_token_ids`` / ``bad_words`` apply to the same logits:
    if together they leave no token, every logit is -inf and the argmax commits a token
    the grammar refuses. That is the request's contradiction, not a matcher failure.
    """
    try:
        grammar.consume(tokens)
    except GrammarStateError:
        fields = [name for name, on in (("allowed_token_ids", params.allowed_token_ids is not None),
                                        ("bad_words", bool(params.bad_words))) if on]
        if not fields:
            raise
        raise RequestError(
            fields[0],
            f"together with the request's structured output, {' and '.join(fields)} leave "
            f"no token the grammar allows after output token {position}; relax one of them",
        ) from None


__all__ = ["GrammarMatcher", "GrammarStateError", "consume_committed"]
