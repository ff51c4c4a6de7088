"""Chat templates render as transformers renders them, inside a sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from draftwise.formats.chat import ChatTemplate, chat_template_from_dir, render_chat
from draftwise.formats.default_model import DEFAULT_MODEL_FILE, default_model_path
from draftwise.formats.errors import ChatTemplateError
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.formats.tokenizer import Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a prime > 10 ✨"},
    ],
]


@pytest.mark.default_model
def test_default_template_matches_transformers() -> None:
    from transformers import AutoTokenizer

    path = default_model_path()
    meta = GGUFCheckpoint(path).metadata
    template = ChatTemplate(meta["tokenizer.chat_template"])
    ours = Tokenizer.from_gguf_metadata(meta, path)
    theirs = AutoTokenizer.from_pretrained(Path(path).parent, gguf_file=DEFAULT_MODEL_FILE)
    for messages in CONVERSATIONS:
        for gen in (True, False):
            text = template.render(messages, add_generation_prompt=gen)
            assert text == theirs.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen
            )
            ids = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert template.encode(ours, messages, add_generation_prompt=gen) == list(ids)
    # no system message given: the template adds SmolLM's default one
    text = template.render(CONVERSATIONS[0])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>assistant\n")


def test_helpers_and_sandbox() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}"
        "{{ raise_exception('bad role: ' + m.role) }}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% if ns.n > 1 %}{% break %}{% endif %}{% endfor %}[{{ ns.n }}]"
        "{{ strftime_now('%Y') | length }}",
        {"bos_token": "<s>"},
    )
    out = t.render([{"role": "user", "content": "<b>é</b>"}, {"role": "user", "content": "x"}])
    assert out == '<s>"<b>é</b>""x"[2]4'  # tojson does not HTML-escape or ASCII-escape
    with pytest.raises(ChatTemplateError, match="bad role: bad"):
        t.render([{"role": "bad", "content": ""}])
    with pytest.raises(ChatTemplateError):
        render_chat("{{ ''.__class__.__mro__ }}", [])
    with pytest.raises(ChatTemplateError):
        render_chat("{% set ns = namespace() %}{% set ns._x = 1 %}", [])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_template_sources_in_a_directory(tmp_path: Path) -> None:
    assert chat_template_from_dir(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "T"},
                    {"name": "default", "template": "D"},
                ]
            }
        )
    )
    assert chat_template_from_dir(str(tmp_path)) == "D"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "S"}))
    assert chat_template_from_dir(str(tmp_path)) == "S"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert chat_template_from_dir(str(tmp_path)) == "J"
