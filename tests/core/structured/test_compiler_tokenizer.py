"""The tokenizer view handed to llguidance: non-special added tokens are plain vocabulary.

Regression: on Qwen2.5's tokenizer the non-special added token ``<tool_call>`` was allowed
by the mask (forced text tokenized through it) and then refused by the matcher (which
treats every added token as special), failing the request with a GrammarStateError.
"""

from __future__ import annotations

import json

import llguidance

from draftwise.structured.compiler import _text_added_tokens_as_vocab


def _tokenizer_json() -> str:
    vocab = {chr(c): i for i, c in enumerate(range(97, 123))}  # a..z
    vocab.update({"<tool_call>": 26, "<eos>": 27})
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": 26, "content": "<tool_call>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False},
            {"id": 27, "content": "<eos>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
        ],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": [], "dropout": None,
                  "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False},
    })


def test_only_special_added_tokens_stay_added() -> None:
    view = json.loads(_text_added_tokens_as_vocab(_tokenizer_json()))
    assert [t["content"] for t in view["added_tokens"]] == ["<eos>"]
    assert view["model"]["vocab"]["<tool_call>"] == 26


def test_the_text_token_is_text_to_llguidance() -> None:
    before = llguidance.LLTokenizer(_tokenizer_json(), n_vocab=28, eos_token=27)
    after = llguidance.LLTokenizer(_text_added_tokens_as_vocab(_tokenizer_json()),
                                   n_vocab=28, eos_token=27)
    assert before.is_special_token(26)  # what made mask and matcher disagree
    assert not after.is_special_token(26) and after.decode_bytes([26]) == b"<tool_call>"
    assert after.is_special_token(27)
