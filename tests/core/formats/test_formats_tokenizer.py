"""Tokenizers from GGUF metadata and tokenizer.json, checked against transformers, plus
the streaming detokenizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from draftwise.formats.default_model import DEFAULT_MODEL_FILE, default_model_path
from draftwise.formats.errors import TokenizerError
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.formats.tokenizer import IncrementalDetokenizer, Tokenizer
from tokenizers import pre_tokenizers

#: varied text on which transformers' GGUF tokenizer and llama.cpp/HF's SmolLM split agree
STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nmany",
    "unicode: café naïve résumé — “quotes” ‘single’",
    "CJK: 你好，世界。日本語のテキスト",
    "emoji: 👍🏽 🚀🔥 👨‍👩‍👧‍👦",
    "code: def f(x):\n    return x**2 + 3  # comment\n",
    "numbers 12345 and 3.14159, 1e-5, 2024-11-29",
    "mixed   whitespace\t\t runs  \n  here",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "Ünïcödé ẞ Σσς ﬁ and It's they're we've I'm you'll he'd !!!???...",
]
#: a whitespace run before a digit: the only place the two splits differ
DIGIT_AFTER_SPACES = ["a  5", "x\t\t42", "total:   1,000", "[  3,  4]"]


def hf_smollm_split(tok: object) -> object:
    """transformers' GGUF tokenizer with SmolLM's real pre-tokenizer (tokenizer.json on the Hub)."""
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(  # type: ignore[attr-defined]
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return tok


@pytest.fixture(scope="module")
def default_tokenizers() -> tuple[Tokenizer, object]:
    """(ours from the default GGUF, transformers' from the same file)."""
    from transformers import AutoTokenizer

    path = default_model_path()
    ours = Tokenizer.from_gguf_metadata(GGUFCheckpoint(path).metadata, path)
    theirs = AutoTokenizer.from_pretrained(Path(path).parent, gguf_file=DEFAULT_MODEL_FILE)
    return ours, theirs


@pytest.mark.default_model
def test_default_ids_match_transformers(default_tokenizers) -> None:
    ours, theirs = default_tokenizers
    for s in STRINGS:
        for special in (True, False):
            assert ours.encode(s, special) == theirs.encode(s, add_special_tokens=special), s
    assert ours.encode("<|im_start|>") == [1] and ours.eos_token_ids == (2,)
    assert ours.bos_token_id == 1 and ours.vocab_size == 49152


@pytest.mark.default_model
def test_default_decode_round_trips(default_tokenizers) -> None:
    ours, theirs = default_tokenizers
    for s in STRINGS + DIGIT_AFTER_SPACES:
        ids = ours.encode(s)
        assert ours.decode(ids, skip_special_tokens=False) == s
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True
        )
    assert ours.decode([1, 9690, 2]) == "system"


@pytest.mark.default_model
def test_digits_split_like_llama_cpp_smollm(default_tokenizers) -> None:
    """``smollm`` isolates every digit first (llama.cpp, and the model's tokenizer.json);
    transformers' GGUF loader does not know the name and keeps GPT-2's split."""
    ours, theirs = default_tokenizers
    hub_like = hf_smollm_split(copy.deepcopy(theirs))
    for s in STRINGS + DIGIT_AFTER_SPACES:
        assert ours.encode(s) == hub_like.encode(s), s
    assert ours.encode("a  5") == [81, 256, 37]  # 'a', 'ĠĠ', '5'
    assert theirs.encode("a  5") == [81, 216, 216, 37]  # transformers-GGUF: 'a', 'Ġ', 'Ġ', '5'


def test_tiny_gguf_tokenizer_matches_transformers(tiny_gguf) -> None:
    from transformers import AutoTokenizer

    t = tiny_gguf()
    ours = Tokenizer.from_gguf_metadata(GGUFCheckpoint(t.path).metadata, str(t.path))
    theirs = AutoTokenizer.from_pretrained(t.path.parent, gguf_file=t.path.name)
    for s in STRINGS:
        assert ours.encode(s) == theirs.encode(s), s
        assert ours.decode(ours.encode(s), skip_special_tokens=False) == s
    assert ours.encode("hello world") == theirs.encode("hello world")
    assert len(ours.encode("hello world")) == 3  # merges applied: hello, Ġ, world
    # the bound the build is told equals the one read back from the vocabulary
    assert ours.max_token_chars == max(map(len, ours.backend.get_vocab(with_added_tokens=True)))


def test_sentencepiece_gguf_is_refused() -> None:
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>"]}
    with pytest.raises(TokenizerError, match="'llama' is not supported"):
        Tokenizer.from_gguf_metadata(meta, "x.gguf")


_MERGE_META = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
               "tokenizer.ggml.tokens": ["a", "b", "c", "ab", "abc"]}


@pytest.mark.parametrize("bad", ["a x", "x b", "a c", "ab", "a ", " b", ""])
def test_a_merge_tokenizers_would_refuse_is_named_by_index(bad: str) -> None:
    """Merges are checked by tokenizers' BPE build; a refusal names the merge at fault."""
    meta = {**_MERGE_META, "tokenizer.ggml.merges": ["a b", bad, "ab c"]}
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.merges\[1\]"):
        Tokenizer.from_gguf_metadata(meta, "x.gguf")


def test_good_merges_apply() -> None:
    meta = {**_MERGE_META, "tokenizer.ggml.merges": ["a b", "ab c"]}
    tok = Tokenizer.from_gguf_metadata(meta, "x.gguf")
    assert tok.encode("abc") == [4] and tok.encode("ab") == [3] and tok.encode("ba") == [1, 0]


def test_tokenizer_json_with_bos_from_config(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf()
    built = Tokenizer.from_gguf_metadata(GGUFCheckpoint(t.path).metadata)
    built.backend.save(str(tmp_path / "tokenizer.json"))
    cfg = {
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
        "add_bos_token": True,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"), cfg)
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    plain = tok.encode("hello", add_special_tokens=False)
    assert tok.encode("hello") == [1, *plain]
    with pytest.raises(TokenizerError):
        Tokenizer.from_file(str(tmp_path / "tokenizer_config.json"))


def stream(tok: Tokenizer, ids: list[int], **kw: object) -> list[str]:
    detok = IncrementalDetokenizer(tok, **kw)  # type: ignore[arg-type]
    pieces = [detok.step([i]) for i in ids]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.default_model
def test_incremental_detokenizer(default_tokenizers) -> None:
    ours, _ = default_tokenizers
    for s in STRINGS:
        ids = ours.encode(s)
        pieces = stream(ours, ids)
        assert "".join(pieces) == ours.decode(ids), s
        assert not any("\ufffd" in p for p in pieces), s
    rocket = ours.encode("🚀")
    assert len(rocket) > 1  # one character, several byte tokens
    pieces = stream(ours, rocket)
    assert pieces[0] == "" and "".join(pieces) == "🚀"
    # special tokens are skipped by default, kept on request
    ids = ours.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert "".join(stream(ours, ids)) == "assistant\nHi"
    assert "".join(stream(ours, ids, skip_special_tokens=False)) == ours.decode(ids, False)
    # with prompt context, a continuation keeps its leading space
    detok = IncrementalDetokenizer(ours, prompt_ids=ours.encode("Hello"))
    assert detok.step(ours.encode(" world")) + detok.flush() == " world"


def test_incremental_detokenizer_holds_split_characters(tiny_gguf) -> None:
    t = tiny_gguf()
    tok = Tokenizer.from_gguf_metadata(GGUFCheckpoint(t.path).metadata)
    ids = tok.encode("añ🚀b")
    pieces = stream(tok, ids)
    assert "".join(pieces) == "añ🚀b"
    assert not any("\ufffd" in p for p in pieces)
    assert pieces.count("") >= 3  # the 4-byte rocket and 2-byte ñ were held back
    cut = IncrementalDetokenizer(tok)
    assert cut.step(tok.encode("🚀")[:2]) == ""
    assert cut.flush() == "\ufffd"  # an unfinished character at the very end


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[" * 100_000 + "]" * 100_000, "cannot load tokenizer.json"),
        ('{"version": "1.0", "model": {"vocab": {"a": ' + "9" * 5000 + "}}}", "out of range"),
        ('{"version": "1.0", "x": "caf\xe9"}'.encode("latin-1"), "valid UTF-8"),
        # a merge whose result is not in the vocabulary: a Rust panic inside tokenizers
        (json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                     "normalizer": None, "pre_tokenizer": None, "post_processor": None,
                     "decoder": None, "model": {"type": "BPE", "dropout": None,
                     "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}), "cannot load"),
    ],
    ids=["deep", "digits", "latin-1", "panic"],
)
def test_broken_tokenizer_json_is_a_named_error(tmp_path, text, fragment: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TokenizerError, match=fragment):
        Tokenizer.from_file(str(path))


@pytest.mark.default_model
def test_encode_matches_the_backend_and_releases_the_gil(default_tokenizers) -> None:
    """``encode`` goes through ``encode_batch`` (same ids) so other threads run meanwhile."""
    import threading
    import time

    ours, _ = default_tokenizers
    for text in STRINGS:
        assert ours.encode(text) == ours.backend.encode(text).ids
    text = "hello world, this is a test of the tokenizer. " * 30000  # ~1.4M characters
    worst, done = [0.0], threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            worst[0], last = max(worst[0], now - last), now

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.perf_counter()
    ids = ours.encode(text)
    seconds = time.perf_counter() - t0
    done.set()
    ticker.join()
    assert len(ids) > 100_000
    # holding the GIL, the ticker would wait the whole encode (measured 0.8 s of 0.8 s)
    assert worst[0] < max(0.5 * seconds, 0.05), (worst[0], seconds)


@pytest.mark.default_model
def test_gguf_max_token_chars_is_the_vocabularys(default_tokenizers) -> None:
    """A GGUF build is told the bound from its token list: the backend's vocabulary
    (added tokens included) must give the same number."""
    ours, _ = default_tokenizers
    vocab = ours.backend.get_vocab(with_added_tokens=True)
    assert ours.max_token_chars == max(len(t) for t in vocab)


@pytest.mark.default_model
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=200))
def test_no_token_covers_more_than_max_token_chars(default_tokenizers, text: str) -> None:
    """The engine's prompt-length check before tokenizing rests on this bound.

    Control characters the vocabulary has no byte for are dropped by the tokenizer (as by
    transformers'), so they cover no token at all; they only make a prompt shorter in
    tokens, never longer, so the check can refuse too early only for text made of them.
    """
    ours, _ = default_tokenizers
    ids = ours.encode(text, add_special_tokens=False)
    assert len(ids) * ours.max_token_chars >= len(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab c", max_size=6), max_size=12))
def test_merges_split_at_the_first_space_on_either_path(merges: list[str]) -> None:
    """The one-split fast path gives what splitting each merge at its first space gives,
    and a merge that is not two non-empty parts is still refused by index."""
    from draftwise.formats.tokenizer import _split_merges
    from draftwise.formats.values import ConfigValues

    v = ConfigValues({"tokenizer.ggml.merges": merges}, "x.gguf")
    split = [m.partition(" ") for m in merges]
    if all(left and sep and right for left, sep, right in split):
        assert _split_merges(v, {}) == [(left, right) for left, _, right in split]
    else:
        with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.merges\[\d+\]"):
            _split_merges(v, {})


@pytest.mark.parametrize("types, fragment", [
    ([1, 1, 3, 1, 7], r"token_type\[4\] is 7"),
    ([1, True, 1, 1, 1], r"token_type\[1\] is True"),
    ([1, 1, -1, 1, 1], r"token_type\[2\] is -1"),
])
def test_token_types_outside_llama_cpps_are_named(types: list, fragment: str) -> None:
    meta = {**_MERGE_META, "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": types}
    with pytest.raises(TokenizerError, match=fragment):
        Tokenizer.from_gguf_metadata(meta, "x.gguf")


def test_a_token_that_is_not_a_string_is_named() -> None:
    meta = {**_MERGE_META, "tokenizer.ggml.tokens": ["a", "b", 3, "ab", "abc"]}
    with pytest.raises(Exception, match=r"tokenizer\.ggml\.tokens"):
        Tokenizer.from_gguf_metadata(meta, "x.gguf")
