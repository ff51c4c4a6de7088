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


class GrammarLimitError(RequestError):
    """The request's grammar outgrew the library's limits, or left no way on, mid-output.

    The first token's mask is checked at admission (``compiler.py``); a grammar can still
    reach a parser row past 2,000 items, or lexer work past its fuel, later on. That is
    the request's own input, so it ends that request with a 4xx naming the constraint,
    never the library's state.
    """


#: llguidance stop reasons that mean the grammar, not the engine, stopped the matcher
_LIMIT_REASONS = {
    "ParserTooComplex": "its parser outgrew the matcher's limits (too many alternatives "
                        "in one place)",
    "LexerTooComplex": "its lexer outgrew the matcher's limits (regexes too large)",
    "NoExtension": "it admits no continuation of the output so far",
    "NoExtensionBias": "it admits no continuation of the output so far",
}


def limit_error(matcher: Any) -> GrammarLimitError | None:
    """The client-facing error of a matcher stopped by its grammar, or None.

    A committed token the mask allowed but the grammar refuses says "doesn't satisfy the
    grammar": that is a masking bug (None here). Anything else that stops the matcher is
    the grammar's doing: a stop reason above, or a parser/lexer error (llguidance reports
    its 2,000-item row limit as an ``InternalError`` "Parser Error: Current row has ...").
    """
    if not matcher.is_error():
        return None
    reason = _LIMIT_REASONS.get(str(matcher.stop_reason()))
    if reason is None:
        error = str(matcher.get_error())
        if "doesn't satisfy the grammar" in error:
            return None
        if error.startswith("Parser Error"):
            reason = _LIMIT_REASONS["ParserTooComplex"]
        elif error.lower().startswith("lexer error"):
            reason = _LIMIT_REASONS["LexerTooComplex"]
        else:
            return None
    return GrammarLimitError("structured_outputs", f"the output constraint failed: {reason}; "
                             "simplify the grammar or schema")


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
                limit = limit_error(self._m)
                if limit is not None:
                    raise limit
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
            limit = limit_error(self._m)
            if limit is not None:
                raise limit
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
    except GrammarLimitError:
        raise
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


__all__ = ["GrammarLimitError", "GrammarMatcher", "GrammarStateError", "consume_committed",
           "limit_error"]
