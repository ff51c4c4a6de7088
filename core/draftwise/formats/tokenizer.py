"""Tokenizers from ``tokenizer.json`` or from GGUF metadata, plus streaming detokenization.

A GGUF carries the vocabulary, merges and token types but not the pre-tokenizer: only
its name (``tokenizer.ggml.pre``). The name is mapped to the split llama.cpp uses for it,
which is also what the model's own HF ``tokenizer.json`` does (for SmolLM: digits one at a
time, then GPT-2's byte-level regex). transformers' GGUF loader does not know ``smollm``
and falls back to plain GPT-2 splitting, which differs on text like ``"a  5"``.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from draftwise.formats.errors import TokenizerError
from draftwise.formats.jsonfile import read_json
from draftwise.formats.values import ConfigValues

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: llama.cpp pre-tokenizer names whose first pass isolates every digit (\p{N})
_DIGIT_SPLIT_PRE = frozenset(
    {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva-7b"}
)
_REGEX_PRE = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}

# llama.cpp token types
_CONTROL = 3
_USER_DEFINED = 4


#: llama.cpp names whose split is GPT-2's own regex (LLAMA_VOCAB_PRE_TYPE_GPT2)
_GPT2_PRE = frozenset(
    {"gpt-2", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
     "gigachat", "a.x-4.0", "mellum"}
)


def gguf_pre_tokenizer(pre: str | None, path: str = "model.gguf") -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp applies for ``tokenizer.ggml.pre``.

    A file without the key gets GPT-2's split (what older converters meant). A name this
    table does not know is refused, as llama.cpp refuses it: splitting it the GPT-2 way
    would tokenize digits and spaces differently from the model's own tokenizer.
    """
    if pre is not None and pre not in (*_DIGIT_SPLIT_PRE, *_REGEX_PRE, *_GPT2_PRE):
        known = ", ".join(sorted({*_DIGIT_SPLIT_PRE, *_REGEX_PRE, *_GPT2_PRE}))
        raise TokenizerError(
            path,
            f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not known, so its split "
            f"cannot be reproduced; known: {known}. Use the model's HF directory instead",
            key="tokenizer.ggml.pre",
        )
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _REGEX_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_REGEX_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


class Tokenizer:
    """Text <-> ids for one model; a thin, typed face over a ``tokenizers`` backend."""

    def __init__(
        self,
        backend: Backend,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int | None = None,
        max_token_chars: int | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.pad_token_id = pad_token_id
        if max_token_chars is not None:  # known from the build (a GGUF's token list)
            self.__dict__["max_token_chars"] = max_token_chars

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary including added tokens."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def max_token_chars(self) -> int:
        """Characters in the longest vocabulary entry (added tokens included).

        A byte-level entry spells one character per byte, so this bounds the input
        characters one token can cover: the engine's prompt-length check before
        tokenizing (``draftwise.prompts.prompt_char_limit``) rests on it. Read from the
        backend's vocabulary unless the constructor was told (building that dict for 150k
        tokens is ~0.35 s of start-up; a GGUF's token list gives it for free).
        """
        vocab = self.backend.get_vocab(with_added_tokens=True)
        return max((len(token) for token in vocab), default=1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; ``add_special_tokens`` adds what the model's post-processor adds (BOS...).

        Goes through ``encode_batch``, which releases the GIL while it works (``encode``
        holds it: a 0.9 MB prompt stalled every other Python thread ~0.8 s), so a server
        tokenizing on a worker thread never freezes the engine thread. Same ids.
        """
        (encoding,) = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text for ids; invalid UTF-8 at the edges decodes to U+FFFD."""
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (its stored spelling), or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Stored spelling of a token id, or None."""
        return self.backend.id_to_token(token_id)

    @classmethod
    def from_file(
        cls,
        path: str,
        tokenizer_config: Mapping[str, Any] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> Tokenizer:
        """Load ``tokenizer.json``; ``tokenizer_config.json`` supplies BOS/EOS names."""
        try:
            backend = Backend.from_file(path)
        except BaseException as exc:  # see _is_tokenizers_failure
            if not _is_tokenizers_failure(exc):
                raise
            raise TokenizerError(path, f"cannot load tokenizer.json: {exc}") from None
        cfg = tokenizer_config or {}

        def token_id(key: str) -> int | None:
            tok = cfg.get(key)
            if isinstance(tok, Mapping):
                tok = tok.get("content")
            return backend.token_to_id(tok) if isinstance(tok, str) else None

        eos = tuple(eos_token_ids)
        cfg_eos = token_id("eos_token")
        if cfg_eos is not None and cfg_eos not in eos:
            eos = (*eos, cfg_eos)
        bos = token_id("bos_token")
        add_bos, add_eos = cfg.get("add_bos_token"), cfg.get("add_eos_token")
        if (add_bos or add_eos) and not _post_processor_adds(backend):
            backend.post_processor = _template(
                backend, bos if add_bos else None, eos[0] if add_eos and eos else None
            )
        return cls(backend, bos, eos, token_id("pad_token"))

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], path: str = "model.gguf") -> Tokenizer:
        """Build the byte-level BPE a GGUF describes (``tokenizer.ggml.model == "gpt2"``)."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(
                path,
                f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2', the "
                "byte-level BPE of Llama-3/Qwen/SmolLM); use the model's HF directory instead",
            )
        v = ConfigValues(meta, path)
        tokens: list[str] = v.texts("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError(path, "tokenizer.ggml.tokens is empty", key="tokenizer.ggml.tokens")
        types = _token_types(v, len(tokens))
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        chars = byte_chars()
        if set("".join(tokens)) <= alphabet:  # the usual case, checked in one pass
            spelled = tokens
        else:
            spelled = [
                t if set(t) <= alphabet else "".join(chars[b] for b in t.encode("utf-8"))
                for t in tokens
            ]
        vocab = dict(zip(spelled, range(len(spelled))))
        if len(vocab) < len(spelled):
            _refuse_duplicate(path, tokens, spelled)
        merges = _split_merges(v, vocab)
        pre = gguf_pre_tokenizer(v.text("tokenizer.ggml.pre", None), path)
        try:
            bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False)
        except BaseException as exc:  # see _is_tokenizers_failure
            if not _is_tokenizers_failure(exc):
                raise
            _check_merges(v, vocab)  # names the first merge at fault
            raise TokenizerError(path, f"the GGUF vocabulary does not build: {exc}") from None
        backend = Backend(bpe)
        backend.pre_tokenizer = pre
        backend.decoder = decoders.ByteLevel()
        # the few control and user-defined tokens, picked out in C (compress), not a
        # Python pass over every token
        control = [
            AddedToken(t, special=True, normalized=False)
            for t in compress(tokens, map(_CONTROL.__eq__, types))
            if set(t) <= alphabet
        ]
        backend.add_special_tokens(control)
        user = [
            AddedToken(t, special=False, normalized=False)
            for t in compress(tokens, map(_USER_DEFINED.__eq__, types))
            if t in vocab
        ]
        if user:
            backend.add_tokens(user)
        n = len(tokens)
        bos = v.optional_id("tokenizer.ggml.bos_token_id", below=n)
        eos = v.optional_id("tokenizer.ggml.eos_token_id", below=n)
        eot = v.optional_id("tokenizer.ggml.eot_token_id", below=n)
        add_bos = v.flag("tokenizer.ggml.add_bos_token", False) and bos is not None
        add_eos = v.flag("tokenizer.ggml.add_eos_token", False) and eos is not None
        if add_bos or add_eos:
            backend.post_processor = _template(
                backend, bos if add_bos else None, eos if add_eos else None
            )
        eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
        pad = v.optional_id("tokenizer.ggml.padding_token_id", below=n)
        # every vocabulary entry, added tokens included, is one of ``spelled``
        return cls(backend, bos, eos_ids, pad, max(map(len, spelled)))


def _is_tokenizers_failure(exc: BaseException) -> bool:
    """tokenizers raises a plain ``Exception``, or, on a Rust panic (a merge whose result is
    not in the vocabulary), pyo3's ``PanicException``, which derives from BaseException."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


#: llama.cpp token types: undefined, normal, unknown, control, user-defined, unused, byte
_TOKEN_TYPES = range(7)
_TOKEN_TYPE_SET = frozenset(_TOKEN_TYPES)


def _token_types(v: ConfigValues, n: int) -> list[int]:
    """``tokenizer.ggml.token_type``: one known type per token (all normal if absent)."""
    key = "tokenizer.ggml.token_type"
    types = v.data.get(key)
    if types is None:
        return [1] * n
    if not isinstance(types, list) or len(types) != n:
        raise v.error(key, f"a list of {n:,} token types (one per token)")
    if set(map(type, types)) <= {int} and set(types) <= _TOKEN_TYPE_SET:  # checked in C
        return types
    bad = next((i for i, t in enumerate(types) if t not in _TOKEN_TYPES or t is True), None)
    if bad is not None:
        raise TokenizerError(
            v.path,
            f"{key}[{bad}] is {types[bad]!r}, expected a llama.cpp token type 0..6",
            key=key,
        )
    return types


def _refuse_duplicate(path: str, tokens: Sequence[str], spelled: Sequence[str]) -> None:
    seen: dict[str, int] = {}
    for i, t in enumerate(spelled):
        if t in seen:
            raise TokenizerError(
                path,
                f"tokens {seen[t]} and {i} are both {tokens[i]!r} (tokenizer.ggml.tokens): "
                "one id would be unreachable",
                key="tokenizer.ggml.tokens",
            )
        seen[t] = i


_MERGES = "tokenizer.ggml.merges"


def _split_merges(v: ConfigValues, vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """BPE merges as (left, right) pairs, split at the first space.

    Each must join two tokens into a third, all in the vocabulary: tokenizers' BPE refuses
    a merge with a part or a result outside the vocabulary (an error, or a Rust panic in
    some versions), so those three lookups per merge (~0.2 s of Python for Qwen2.5's 151k
    merges, on the start-up path) are left to it and :func:`_check_merges` names the
    merge at fault only when it refuses. The shape (two non-empty parts) is checked here:
    with an empty token in the vocabulary tokenizers would accept ``"ab "``.
    """
    merges = v.texts(_MERGES, [])
    # the usual case in C-level passes: one join and one split give 2n parts exactly when
    # the merges hold n spaces in all, which with a space in each means one in each; and
    # no part may be empty
    parts = " ".join(merges).split(" ")
    if (len(parts) == 2 * len(merges) and "" not in parts
            and all(map(operator.contains, merges, repeat(" ")))):
        return list(zip(parts[::2], parts[1::2]))
    split = [m.partition(" ") for m in merges]  # a part may hold a space: split at the first
    if not all(left and sep and right for left, sep, right in split):
        _check_merges(v, vocab)
    return [(left, right) for left, _, right in split]


def _check_merges(v: ConfigValues, vocab: Mapping[str, int]) -> None:
    """Refuse the first merge that does not join two tokens into a third, by index."""
    key = _MERGES
    for i, merge in enumerate(v.texts(key, [])):
        left, sep, right = merge.partition(" ")
        if not (sep and left and right and left in vocab and right in vocab
                and left + right in vocab):
            raise TokenizerError(
                v.path,
                f"{key}[{i}] is {merge[:80]!r}, expected two tokens separated by one space "
                "whose concatenation is a token too",
                key=key,
            )


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies spell raw
    bytes with it; also what a grammar library's view of the vocab decodes)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _post_processor_adds(backend: Backend) -> bool:
    """Whether encoding with special tokens already adds any."""
    return len(backend.encode("a", add_special_tokens=True).ids) != len(
        backend.encode("a", add_special_tokens=False).ids
    )


def _template(backend: Backend, bos: int | None, eos: int | None) -> processors.PostProcessor:
    """A post-processor that prepends BOS and/or appends EOS."""
    specials: list[tuple[str, int]] = []
    single = "$A"
    if bos is not None:
        tok = str(backend.id_to_token(bos))
        specials.append((tok, bos))
        single = f"{tok} {single}"
    if eos is not None:
        tok = str(backend.id_to_token(eos))
        specials.append((tok, eos))
        single = f"{single} {tok}"
    return processors.TemplateProcessing(single=single, special_tokens=specials)


#: the tokenizer_config.json entries the engine reads
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def read_tokenizer_config(path: str) -> dict[str, Any]:
    """``tokenizer_config.json``, with the entries the engine reads checked by name.

    Special tokens must be a string or ``{"content": <string>, ...}``; ``add_bos_token``
    and ``add_eos_token`` true, false or null (``"false"`` would otherwise count as true).
    """
    cfg = read_json(path)
    v = ConfigValues(cfg, path)
    for key in _SPECIAL_KEYS:
        tok = cfg.get(key)
        if tok is None or isinstance(tok, str):
            continue
        if not (isinstance(tok, Mapping) and isinstance(tok.get("content"), str)):
            raise v.error(key, 'a token string or {"content": <string>}')
    for key in ("add_bos_token", "add_eos_token"):
        v.flag(key, None)
    return cfg


def find_tokenizer_file(directory: str) -> str | None:
    """``tokenizer.json`` in an HF directory, if present."""
    path = os.path.join(directory, "tokenizer.json")
    return path if os.path.isfile(path) else None


class IncrementalDetokenizer:
    """Streams text for generated ids, holding back bytes of an unfinished UTF-8 character.

    Each call decodes a short window (a few ids of context plus the new ones) and returns
    only the text the new ids added, so multi-byte characters split across tokens come out
    whole and SentencePiece-style leading spaces stay right.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        context: int = 5,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-context:]) if context else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def step(self, new_ids: Sequence[int]) -> str:
        """Text added by ``new_ids`` ("" while a character is incomplete)."""
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            del self.ids[: self.read_offset]  # keep only the window the next call needs
            self.prefix_offset, self.read_offset = 0, len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character decodes to U+FFFD)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
