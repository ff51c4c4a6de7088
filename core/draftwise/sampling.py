"""Sampling parameters and the one place logits become token choices.

``SamplingParams`` mirrors vLLM's fields. Everything that turns target logits into a
distribution lives here (:func:`process_logits`, :func:`probs_from_logits`), so
verification (``draftwise.spec.verify``) and probabilistic drafters use exactly the same
temperature / min-p / top-k / top-p processing as plain sampling.

Randomness: a request with a seed owns a ``torch.Generator``; each row draws its
uniforms from its own generator only (:func:`draw_uniforms`), so a seeded request
samples the same tokens whatever else is in the batch. A token is drawn from a
distribution by inverse CDF with ONE uniform (:func:`categorical`): one draw per token,
no per-vocabulary noise (49152 exponentials per row would cost ~0.7 ms on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationInfo, field_validator

from draftwise.models import kernels
from draftwise.models.backend import ARGMAX
from draftwise.structured.params import StructuredOutputsParams
from draftwise.text import describe_invalid, invalid_text_at

#: temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``)
GREEDY_TEMPERATURE_EPS = 1e-5
#: top-p first looks for its nucleus among this many most likely tokens (exact; falls
#: back to a full sort only when they hold less than ``top_p`` of the mass)
TOP_P_CANDIDATES = 1024
#: the "keep every token" top-k of rows without a top-k limit (clamped to the vocab size)
_TOP_K_ALL = 2**62
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


def make_generator(seed: int) -> torch.Generator:
    """The private CPU generator of a seeded request."""
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    """Per-row sampling settings of a batch as tensors, built once per step.

    A field is None when no row needs it, so an all-greedy batch carries nothing but
    the greedy mask. Rows without a limit hold the identity value (top-k >= vocab,
    top-p 1, min-p 0); greedy rows hold temperature 1 (never used to sample).
    """

    greedy: np.ndarray  # [num_rows] bool
    temperature: torch.Tensor | None = None  # [num_rows] float32; None: all 1 (no scaling)
    top_k: torch.Tensor | None = None  # [num_rows] int64
    top_p: torch.Tensor | None = None  # [num_rows] float32
    min_p: torch.Tensor | None = None  # [num_rows] float32

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams]) -> SamplingMetadata:
        """Gather one batch's settings; cheap (no tensors) when every row is greedy."""
        greedy = np.fromiter((p.is_greedy for p in params), dtype=bool, count=len(params))
        if greedy.all():
            return cls(greedy)
        temps = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_k = top_p = min_p = None
        if any(p.top_k is not None for p in params):
            top_k = torch.tensor([_TOP_K_ALL if p.top_k is None else p.top_k for p in params])
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        temperature = (
            None if all(t == 1.0 for t in temps) else torch.tensor(temps, dtype=torch.float32)
        )
        return cls(greedy, temperature, top_k, top_p, min_p)

    @property
    def num_rows(self) -> int:
        """Rows in the batch."""
        return int(self.greedy.shape[0])

    @property
    def all_greedy(self) -> bool:
        """True when the whole batch is an argmax (no probabilities needed)."""
        return bool(self.greedy.all())

    def select(self, rows: np.ndarray) -> SamplingMetadata:
        """The settings of a subset of rows, in the given order."""
        idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return SamplingMetadata(
            self.greedy[rows], *(None if t is None else t[idx] for t in self._tensors())
        )

    def repeat(self, counts: np.ndarray) -> SamplingMetadata:
        """Row ``i``'s settings repeated ``counts[i]`` times (one per verified position)."""
        reps = torch.from_numpy(np.asarray(counts, dtype=np.int64))
        return SamplingMetadata(
            np.repeat(self.greedy, counts),
            *(None if t is None else t.repeat_interleave(reps) for t in self._tensors()),
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:  # [num_rows, V] -> [num_rows, V]
        """The target distribution of each (non-greedy) row after all processing."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The per-row tensors, in constructor order (for select / repeat)."""
        return (self.temperature, self.top_k, self.top_p, self.min_p)


def process_logits(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor | None,  # [N] float32 (> 0)
    top_k: torch.Tensor | None = None,  # [N] int64; >= V keeps every token
    top_p: torch.Tensor | None = None,  # [N] float32 in (0, 1]
    min_p: torch.Tensor | None = None,  # [N] float32 in [0, 1]
) -> torch.Tensor:  # [N, V] float32, removed tokens at -inf
    """Temperature, then min-p, top-k, top-p (vLLM's order); never edits ``logits`` in place."""
    out = logits.float()
    if temperature is not None:
        out = out / temperature.to(out.dtype).unsqueeze(1)
    if min_p is not None:
        rows = torch.nonzero(min_p > 0).squeeze(1)
        if rows.numel():
            sub = _rows(out, rows)
            probs = sub.softmax(-1)
            keep = probs >= probs.amax(-1, keepdim=True) * min_p[rows].unsqueeze(1)
            out = _put_rows(out, logits, rows, sub.masked_fill(~keep, float("-inf")))
    if top_k is not None:
        k = top_k.clamp(1, out.shape[1])
        rows = torch.nonzero(k < out.shape[1]).squeeze(1)
        if rows.numel():
            sub, kr = _rows(out, rows), k[rows]
            kth = sub.topk(int(kr.max()), dim=-1).values.gather(1, (kr - 1).unsqueeze(1))
            out = _put_rows(out, logits, rows, sub.masked_fill(sub < kth, float("-inf")))
    if top_p is not None:
        rows = torch.nonzero(top_p < 1).squeeze(1)
        if rows.numel():
            out = _put_rows(out, logits, rows, _apply_top_p(_rows(out, rows), top_p[rows]))
    return out


def _rows(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # [N, V] -> [M, V]
    """The selected rows; no gather when every row is selected."""
    return out if rows.numel() == out.shape[0] else out[rows]


def _put_rows(
    out: torch.Tensor, original: torch.Tensor, rows: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:  # [N, V]
    """Write processed rows (a fresh tensor), copying first only if ``out`` is the caller's."""
    if rows.numel() == out.shape[0]:
        return values
    if out is original:
        out = out.clone()
    out[rows] = values
    return out


def _apply_top_p(
    logits: torch.Tensor, top_p: torch.Tensor  # [M, V], [M]
) -> torch.Tensor:  # [M, V]
    """Keep the most likely tokens until their mass reaches top_p (ties at the edge kept)."""
    probs = logits.softmax(-1)
    n = min(TOP_P_CANDIDATES, probs.shape[1])
    ranked = probs.topk(n, dim=-1).values  # [M, n] descending
    short = torch.nonzero(ranked.sum(-1) < top_p).squeeze(1)
    if short.numel():  # the nucleus is wider than the candidates: rank everything
        full = probs[short].sort(dim=-1, descending=True).values
        ranked = torch.cat([ranked, ranked.new_zeros(ranked.shape[0], full.shape[1] - n)], 1)
        ranked[short] = full
    mass_before = ranked.cumsum(-1) - ranked  # mass of strictly more likely tokens
    num_keep = (mass_before < top_p.unsqueeze(1)).sum(-1).clamp(min=1)
    cutoff = ranked.gather(1, (num_keep - 1).unsqueeze(1))  # smallest kept probability
    return logits.masked_fill(probs < cutoff, float("-inf"))


def probs_from_logits(
    logits: torch.Tensor,  # [N, V]
    temperature: torch.Tensor | None,  # [N]
    top_k: torch.Tensor | None = None,  # [N]
    top_p: torch.Tensor | None = None,  # [N]
    min_p: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [N, V] float32, rows sum to 1
    """Processed probabilities: the p (and q) of rejection sampling."""
    return process_logits(logits, temperature, top_k, top_p, min_p).softmax(-1)


def draw_uniforms(
    generators: Sequence[torch.Generator | None], counts: Sequence[int]
) -> torch.Tensor:  # [sum(counts)] float64 in [0, 1), row after row
    """Row ``i`` draws ``counts[i]`` uniforms from its own generator (unseeded: torch's)."""
    total = int(sum(counts))
    seeded = [i for i, g in enumerate(generators) if g is not None and counts[i] > 0]
    if not seeded:
        return torch.rand(total, dtype=torch.float64)
    out = torch.empty(total, dtype=torch.float64)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    for i in seeded:
        out[starts[i] : starts[i + 1]] = torch.rand(
            counts[i], generator=generators[i], dtype=torch.float64
        )
    unseeded = [i for i, g in enumerate(generators) if g is None and counts[i] > 0]
    if unseeded:
        idx = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in unseeded])
        out[torch.from_numpy(idx)] = torch.rand(len(idx), dtype=torch.float64)
    return out


def categorical(
    weights: torch.Tensor,  # [N, V] >= 0, any positive total (need not be normalised)
    u: torch.Tensor,  # [N] float64 in [0, 1)
) -> torch.Tensor:  # [N] int64
    """Inverse-CDF draw, one uniform per row; a zero-weight token is never chosen."""
    cdf = weights.double().cumsum(-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    over = torch.nonzero(idx >= weights.shape[1]).squeeze(1)
    if over.numel():  # u * total rounded up to total: take the last positive token
        last = (weights[over] > 0).flip(-1).int().argmax(-1)
        idx[over] = weights.shape[1] - 1 - last
    return idx


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
    """``logits.argmax(-1)``, in one C pass per row where the kernels are built.

    Greedy decoding takes this every step: torch's single-thread CPU argmax costs ~30 us
    a 49k-vocab row here (~150 us for a 5-row verify), the kernel a few. Same answer,
    ties and NaN included (first index of the maximum; a NaN wins).
    """
    if (
        ARGMAX != "native"
        or logits.dtype != torch.float32
        or logits.ndim != 2
        or logits.device.type != "cpu"
        or not logits.is_contiguous()
        or logits.shape[1] == 0
    ):
        return logits.argmax(-1)
    return kernels.argmax_f32(logits)


def sample(
    logits: torch.Tensor,  # [N, V]
    metadata: SamplingMetadata,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:  # [N] int64
    """Plain sampling: argmax for greedy rows, one uniform per random row from its generator."""
    if logits.ndim != 2 or logits.shape[0] != metadata.num_rows:
        raise ValueError(
            f"logits must be [num_rows={metadata.num_rows}, vocab], got {tuple(logits.shape)}"
        )
    if len(generators) != metadata.num_rows:
        raise ValueError(f"{len(generators)} generators for {metadata.num_rows} rows")
    if metadata.all_greedy:
        return argmax_rows(logits)
    out = torch.empty(metadata.num_rows, dtype=torch.int64)
    greedy = np.flatnonzero(metadata.greedy)
    if greedy.size:
        gi = torch.from_numpy(greedy)
        out[gi] = argmax_rows(logits[gi])
    rand = np.flatnonzero(~metadata.greedy)
    ri = torch.from_numpy(rand)
    if greedy.size:
        probs = metadata.select(rand).probs(logits[ri])
    else:  # the whole batch samples: no gather
        probs = metadata.probs(logits)
    u = draw_uniforms([generators[i] for i in rand], [1] * len(rand))
    out[ri] = categorical(probs, u)
    return out
