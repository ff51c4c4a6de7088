"""Sampling parameters: what one request asks of sampling, checked field by field.

``SamplingParams`` mirrors vLLM's fields, with the bounds every surface shares (the
Python API, the CLI and the server refuse the same values by the same field's name).
What the settings do to logits is ``draftwise.sampling``: this module is the request's
data and its limits, that one the math (split at 606 lines, issue 42: one idea each).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationInfo, field_validator

from draftwise.structured.params import StructuredOutputsParams
from draftwise.text import describe_invalid, invalid_text_at

#: temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``)
GREEDY_TEMPERATURE_EPS = 1e-5
_SEED_RANGE = (-(2**63), 2**64)

# Bounds every surface shares (Python API, CLI, server): a value past them is refused
# here, by its field's name, before it can reach a step. The numeric ones are what the
# step's tensors hold; the list ones keep per-token work (stop matching) small.
#: int64, the dtype of the per-row top-k tensor (any top_k >= the vocabulary keeps every token)
INT64_MAX = 2**63 - 1
#: the largest float32 (the per-row temperature tensor's dtype)
TEMPERATURE_MAX = float(np.finfo(np.float32).max)
#: stop strings a request may give; each is searched for after every step
MAX_STOP_STRINGS = 64
#: characters in one stop string (streams also hold back up to this many minus one)
MAX_STOP_STRING_CHARS = 1024
#: stop token ids a request may give
MAX_STOP_TOKEN_IDS = 1024
#: completions one request may ask for (``n``): each is a request of its own in the batch
MAX_N = 128
#: OpenAI's (and vLLM's) range of presence / frequency penalties
PENALTY_RANGE = (-2.0, 2.0)
#: OpenAI's range of a logit bias; a value outside is refused, never clamped
LOGIT_BIAS_RANGE = (-100.0, 100.0)
#: token ids a request may bias, allow or ban (per-token work each verified position)
MAX_TOKEN_LIST = 4096
#: bad words a request may give (each is matched at every verified position)
MAX_BAD_WORDS = 256
#: top log-probabilities per position (vLLM's default ``max_logprobs``)
MAX_LOGPROBS = 20



def _shown(v: Any) -> str:
    """A value for an error message; a huge integer is described, not printed."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**30:
        return f"an integer of {len(str(abs(v))) if abs(v) < 10**4000 else 'over 4000'} digits"
    return repr(v)


class SamplingParams(BaseModel):
    """vLLM-compatible per-request sampling settings; every bad value names its field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    #: None = no top-k limit (users may also pass vLLM's 0 or -1)
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    #: stop strings (a single string is accepted and wrapped)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # logits processing (vLLM's semantics, ``draftwise.logits_process``): applied at every
    # verified position with the tokens accepted before it, so speculation changes nothing
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    #: token id -> bias added to its logit (OpenAI's ``logit_bias``)
    logit_bias: dict[int, float] | None = None
    #: only these tokens may be generated
    allowed_token_ids: tuple[int, ...] | None = None
    #: words never generated (tokenized by the engine, with and without a leading space)
    bad_words: tuple[str, ...] = ()
    #: EOS and stop token ids are excluded (and stop strings unchecked) before this many
    min_tokens: int = 0
    #: top log-probabilities to return per generated token (0: only the chosen one's)
    logprobs: int | None = None
    #: top log-probabilities per prompt token (the first prompt token has none)
    prompt_logprobs: int | None = None
    #: structured output (vLLM's field): the output must match this schema / regex / grammar
    structured_outputs: StructuredOutputsParams | None = None

    _stop_ids: frozenset[int] = PrivateAttr(default_factory=frozenset)

    def model_post_init(self, __context: Any) -> None:
        """Precompute the stop-id set the engine checks on every token."""
        self._stop_ids = frozenset(self.stop_token_ids)

    @field_validator("n")
    @classmethod
    def _check_n(cls, v: int) -> int:
        if not 1 <= v <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {_shown(v)}")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _check_penalty(cls, v: float, info: ValidationInfo) -> float:
        lo, hi = PENALTY_RANGE
        if not lo <= v <= hi:
            raise ValueError(f"{info.field_name} must be in [{lo}, {hi}], got {v}")
        return v

    @field_validator("repetition_penalty")
    @classmethod
    def _check_repetition_penalty(cls, v: float) -> float:
        if not 0.0 < v <= TEMPERATURE_MAX:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {v}")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _int_keys(cls, v: Any) -> Any:
        if isinstance(v, dict):  # OpenAI sends token ids as JSON object keys (strings)
            out: dict[Any, Any] = {}
            for key, bias in v.items():
                tok = _token_id_key(key)
                if tok in out:  # "5" and "05": one would silently replace the other
                    raise ValueError(f"logit_bias keys name token {tok} twice (key {key!r})")
                out[tok] = bias
            return out or None
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        if v is None:
            return v
        if len(v) > MAX_TOKEN_LIST:
            raise ValueError(f"at most {MAX_TOKEN_LIST} logit_bias entries, got {len(v)}")
        lo, hi = LOGIT_BIAS_RANGE
        for tok, bias in v.items():
            _check_token_id("logit_bias", tok)
            if not lo <= bias <= hi:
                raise ValueError(f"logit_bias values must be in [{lo}, {hi}], got {bias}")
        return v

    @field_validator("allowed_token_ids")
    @classmethod
    def _check_allowed(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("allowed_token_ids must not be empty (omit it to allow every token)")
        if len(v) > MAX_TOKEN_LIST:
            raise ValueError(f"at most {MAX_TOKEN_LIST} allowed_token_ids, got {len(v)}")
        for tok in v:
            _check_token_id("allowed_token_ids", tok)
        return v

    @field_validator("bad_words", mode="before")
    @classmethod
    def _wrap_bad_words(cls, v: Any) -> Any:
        if v is None:
            return ()
        return (v,) if isinstance(v, str) else v

    @field_validator("bad_words")
    @classmethod
    def _check_bad_words(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_BAD_WORDS:
            raise ValueError(f"at most {MAX_BAD_WORDS} bad_words, got {len(v)}")
        for word in v:
            if not word.strip():
                raise ValueError("bad_words must be non-empty words")
            if len(word) > MAX_STOP_STRING_CHARS:
                raise ValueError(
                    f"a bad word may have at most {MAX_STOP_STRING_CHARS} characters, got {len(word)}"
                )
            bad = invalid_text_at(word)
            if bad is not None:
                raise ValueError(f"a bad word is {describe_invalid(word, bad)}")
        return v

    @field_validator("min_tokens")
    @classmethod
    def _check_min_tokens(cls, v: int, info: ValidationInfo) -> int:
        top = info.data.get("max_tokens", INT64_MAX)  # absent: max_tokens was refused itself
        if not 0 <= v <= top:
            raise ValueError(f"min_tokens must be in [0, max_tokens={top}], got {_shown(v)}")
        return v

    @field_validator("logprobs", "prompt_logprobs")
    @classmethod
    def _check_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not 0 <= v <= MAX_LOGPROBS:
            raise ValueError(
                f"{info.field_name} must be in [0, {MAX_LOGPROBS}] (the top log-probabilities "
                f"per token; 0 = only the chosen token's), got {_shown(v)}"
            )
        return v

    @field_validator("temperature")
    @classmethod
    def _check_temperature(cls, v: float) -> float:
        if not (0.0 <= v <= TEMPERATURE_MAX):  # NaN fails every comparison
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 = greedy) that fits float32 "
                f"(<= {TEMPERATURE_MAX:.4g}), got {v}"
            )
        return v

    @field_validator("top_p")
    @classmethod
    def _check_top_p(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {v}")
        return v

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool) and v in (0, -1):
            return None  # vLLM's "disabled" values
        return v

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"top_k must be at least 1, or 0 / -1 to disable it; got {_shown(v)}")
        if v is not None and v > INT64_MAX:
            raise ValueError(
                f"top_k must be at most {INT64_MAX} (int64; any value >= the vocabulary size "
                f"keeps every token), got {_shown(v)}"
            )
        return v

    @field_validator("min_p")
    @classmethod
    def _check_min_p(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {v}")
        return v

    @field_validator("seed")
    @classmethod
    def _check_seed(cls, v: int | None) -> int | None:
        if v is not None and not _SEED_RANGE[0] <= v < _SEED_RANGE[1]:
            raise ValueError(f"seed must fit in 64 bits, got {_shown(v)}")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _check_max_tokens(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"max_tokens must be at least 1, got {_shown(v)}")
        if v > INT64_MAX:
            raise ValueError(f"max_tokens must be at most {INT64_MAX} (int64), got {_shown(v)}")
        return v

    @field_validator("stop", mode="before")
    @classmethod
    def _wrap_stop(cls, v: Any) -> Any:
        if v is None:
            return ()
        return (v,) if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(v)}")
        for s in v:
            if not s:
                raise ValueError("stop strings must be non-empty")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise ValueError(
                    f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, "
                    f"got {len(s)}"
                )
            bad = invalid_text_at(s)
            if bad is not None:
                raise ValueError(f"a stop string is {describe_invalid(s, bad)}")
        return v

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _wrap_stop_token_ids(cls, v: Any) -> Any:
        return () if v is None else v

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_token_ids(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {len(v)}")
        bad = [t for t in v if not 0 <= t <= INT64_MAX]
        if bad:
            raise ValueError(
                f"stop_token_ids must be token ids >= 0 (and <= {INT64_MAX}), got {_shown(bad[0])}"
            )
        return v

    @property
    def is_greedy(self) -> bool:
        """Greedy requests take the argmax and never touch a random generator."""
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def needs_history(self) -> bool:
        """Whether a position's logits depend on the tokens before it (or on a bias/mask)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.logit_bias or self.allowed_token_ids is not None or self.bad_words
            or self.min_tokens
        )

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings (alias of ``stop``, normalised to a tuple)."""
        return self.stop

    @property
    def stop_token_ids_set(self) -> frozenset[int]:
        """``stop_token_ids`` as a set, for the per-token check."""
        return self._stop_ids


def _token_id_key(key: object) -> object:
    """A ``logit_bias`` key as a token id: JSON sends ids as object keys (strings), so a
    string must be ASCII decimal digits, nothing else. ``int()`` alone also takes
    ``"\u0663"`` (an Arabic-Indic 3), ``" 5 "`` and ``"5_0"``: each a token the client did
    not write. An int key (the Python API) passes to the range check as it is."""
    if isinstance(key, str):
        if key.isascii() and key.isdigit():
            try:
                return int(key)
            except ValueError:  # more digits than int() parses: no token id either
                pass
        shown = repr(key) if len(key) <= 40 else f"{key[:40]!r}... ({len(key):,} characters)"
        raise ValueError(f"logit_bias keys must be token ids in ASCII decimal digits, got "
                         f"{shown}")
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    raise ValueError(f"logit_bias keys must be token ids, got {_shown(key)}")


def _check_token_id(field: str, tok: int) -> None:
    """A token id in a list field: >= 0 and int64 (the vocabulary is checked by the engine)."""
    if not 0 <= tok <= INT64_MAX:
        raise ValueError(f"{field} must hold token ids >= 0, got {_shown(tok)}")
