"""Grammar matchers for requests: the model's vocabulary seen by llguidance, and a cache.

Why llguidance (the comparison is in ``docs/structured-output.md``): a 3 MB wheel with no
dependencies, JSON schema + regex + Lark/GBNF grammars, rollback, and a mask call that
takes a draft list (every verified position's mask in one call, rolled back inside).

The library's tokenizer view is built from draftwise's own :class:`Tokenizer` (the
``tokenizers`` backend that ``formats/tokenizer.py`` builds from GGUF metadata or
``tokenizer.json``), serialised to JSON: no hub, no transformers. Building it takes
~0.3 s on the default model, so it happens on the first structured request, not at
startup. A compiled grammar is kept (LRU, :data:`CACHE_SIZE`) as a template matcher;
each request gets a ``deep_copy`` of it, which is cheaper than parsing the grammar again.
"""

from __future__ import annotations

import json

import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from draftwise.errors import RequestError
from draftwise.structured.bounds import library_limits
from draftwise.structured.matcher import GrammarMatcher

if TYPE_CHECKING:
    from draftwise.formats.tokenizer import Tokenizer
    from draftwise.structured.params import StructuredOutputsParams

#: compiled grammars kept for reuse (a template matcher each)
CACHE_SIZE = 64
#: threads computing a step's masks (one matcher's positions run in order on one thread)
MASK_THREADS = 2


class GrammarCompiler:
    """Turns a request's :class:`StructuredOutputsParams` into its own matcher."""

    def __init__(
        self, tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: Collection[int]
    ) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        #: what a completed grammar allows: the engine's EOS ids (config + tokenizer)
        self._eos = sorted(eos_token_ids)
        self._ll_tokenizer: Any = None
        self._executor: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        # the server builds requests on tokenizer threads: one lock for the lazy parts
        self._lock = threading.Lock()

    @property
    def executor(self) -> Any:
        """llguidance's thread pool for mask computation (built with the tokenizer view)."""
        if self._executor is None:  # built once; every later step reads it without the lock
            self._tokenizer_view()
        return self._executor

    def matcher(self, params: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher for one request; a grammar that does not compile names its field."""
        return GrammarMatcher(self._template(params).deep_copy())

    def prepare(self, params: StructuredOutputsParams) -> None:
        """Compile into the cache now: the server does it on a tokenizer thread, so the
        engine thread's :meth:`matcher` only copies (the first call also builds the
        ~0.3 s tokenizer view there)."""
        self._template(params)

    def _template(self, params: StructuredOutputsParams) -> Any:
        """The cached template matcher of a grammar, compiled and checked on a miss.

        Compiling runs outside the lock (llguidance drops the GIL while it parses, up to
        ~1 s for a huge grammar), so it never holds up a step that only copies. The first
        token mask is computed here too (:func:`_check_first_mask`): a grammar that admits
        no output, or whose lexer or parser outgrows the library's limits at the first
        token, is the request's 400, not an empty 200 or a failure inside a step.
        """
        import llguidance

        text = params.grammar_text()
        with self._lock:
            template = self._cache.get(text)
            if template is not None:
                self._cache.move_to_end(text)
                return template
        template = llguidance.LLMatcher(self._tokenizer_view(), text, log_level=0,
                                        limits=library_limits())
        _check_first_mask(template, params.kind)
        with self._lock:
            self._cache[text] = template
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return template

    def _tokenizer_view(self) -> Any:
        with self._lock:
            return self._tokenizer_view_locked()

    def _tokenizer_view_locked(self) -> Any:
        """llguidance's LLTokenizer over the model's vocabulary, built once."""
        if self._ll_tokenizer is None:
            import llguidance

            tok = self._tokenizer
            if tok is None:
                raise RequestError(
                    "structured_outputs",
                    "this checkpoint has no tokenizer, so a grammar cannot be matched to "
                    "its tokens; load a model with a tokenizer",
                )
            if not self._eos:
                raise RequestError(
                    "structured_outputs",
                    "the model declares no EOS token, so a finished grammar could not end "
                    "the output",
                )
            try:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    _text_added_tokens_as_vocab(tok.backend.to_str()), n_vocab=self.vocab_size,
                    eos_token=self._eos,
                )
            except Exception as exc:  # noqa: BLE001 - the library says what it cannot read
                raise RequestError(
                    "structured_outputs",
                    f"the grammar library (llguidance) cannot read this model's tokenizer: "
                    f"{exc}; structured output needs a byte-level BPE or SentencePiece one",
                ) from None
            self._executor = llguidance.LLExecutor(num_threads=MASK_THREADS)
        return self._ll_tokenizer


def _check_first_mask(template: Any, kind: str) -> None:
    """Refuse a grammar that fails or admits nothing before its first token.

    The mask is computed on the template (its state does not move: only consuming a token
    does), so each request's copy starts with it already checked. A grammar that accepts
    only the empty output still allows EOS; an all-zero mask means no output at all can
    match (``[^\\s\\S]``, a rule with no base case, a ``$ref`` cycle).
    """
    from draftwise.structured.params import short_message

    if not template.is_error():
        mask = template.compute_bitmask()
        if not template.is_error() and any(mask):
            return
        # llguidance's stop reason when no token can extend the output
        if not template.is_error() or "NoExtensionBias" in template.get_error():
            raise RequestError(
                "structured_outputs",
                f"{kind}: the constraint admits no output at all (not even an empty one); "
                "check for a rule or $ref with no base case, or a character class that "
                "matches nothing")
    raise RequestError(
        "structured_outputs",
        f"{kind}: the grammar does not compile: {short_message(template.get_error())}")


def _text_added_tokens_as_vocab(tokenizer_json: str) -> str:
    """The tokenizer as llguidance should see it: only special added tokens stay "added".

    llguidance treats every added token as special (never text) when it matches tokens,
    yet tokenizes forced text through the tokenizer, which maps e.g. Qwen's non-special
    ``<tool_call>`` (id 151657) to that one token: the mask then allowed a token the
    matcher refused to consume. Left in the vocabulary only, such a token is ordinary
    text on both sides, so a grammar that spells ``<tool_call>`` accepts the model's own
    token for it.
    """
    spec = json.loads(tokenizer_json)
    added = spec.get("added_tokens") or []
    kept = [t for t in added if t.get("special", True)]
    if len(kept) == len(added):
        return tokenizer_json
    spec["added_tokens"] = kept
    return json.dumps(spec)


__all__ = ["CACHE_SIZE", "GrammarCompiler"]
