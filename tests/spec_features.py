"""The feature checks every column of docs/sampling.md's feature matrix runs.

Each check takes a target checkpoint, a speculative config and prompts, and proves one
feature lossless under that config: greedy spec-on token-identical to spec-off with the
feature active, logprobs within float tolerance, a stop that falls inside an accepted
block truncates there, seeded ``n > 1`` reproducible under speculation. A method's test
module binds its own fixtures (target, drafter) and calls these, so the rule each cell
states is written once. ``accepted=True`` asserts drafts were accepted, so a check cannot
pass because every draft was rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM, SamplingParams
from spec_sampling import fixed_depth


def generate(target: Path, config: dict[str, Any] | None, prompts: Sequence[list[int]],
             params: SamplingParams, **llm_kw: Any) -> tuple[list[Any], LLM]:
    """Every prompt through one engine; no request fails and every block comes back."""
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, **llm_kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert llm.engine.kv.num_used_blocks == 0
    assert llm.engine.spec is None or llm.engine.spec.num_tracked_requests == 0
    if llm.engine.spec is not None:  # a proposer's own per-request state (n-gram's indexes)
        assert all(getattr(p, "num_indexed_requests", 0) == 0 for p in llm.engine.spec.proposers)
    return outs, llm


def token_ids(outs: list[Any]) -> list[list[int]]:
    """The first completion's tokens of each output."""
    return [o.outputs[0].token_ids for o in outs]


def greedy(**kw: Any) -> SamplingParams:
    """Greedy, 20 tokens, EOS ignored unless the caller says otherwise."""
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 20, "ignore_eos": True, **kw})


def assert_accepted(llm: LLM, *, some_rejected: bool = False) -> None:
    """Drafts were accepted (and, if asked, some rejected): the check ran inside blocks."""
    m = llm.engine.spec.metrics
    assert m.num_accepted_tokens > 0, "no draft was accepted: the check would be vacuous"
    if some_rejected:
        assert m.num_accepted_tokens < m.num_draft_tokens, "some drafts must be rejected"


def assert_identical(target: Path, config: dict[str, Any], prompts: Sequence[list[int]],
                     extra: dict[str, Any], *, changes: bool = True, accepted: bool = True,
                     **llm_kw: Any) -> LLM:
    """Greedy spec-on == spec-off with ``extra`` active (which must change the output)."""
    off, _ = generate(target, None, prompts, greedy(**extra), **llm_kw)
    if changes:
        plain, _ = generate(target, None, prompts, greedy(), **llm_kw)
        assert token_ids(off) != token_ids(plain), "the feature must change the output"
    on, llm = generate(target, config, prompts, greedy(**extra), **llm_kw)
    assert token_ids(on) == token_ids(off)
    if accepted:
        assert_accepted(llm)
    else:
        assert llm.engine.spec.metrics.num_draft_tokens > 0
    return llm


def logprob_table(outs: list[Any]) -> list[list[dict[int, tuple[float, int]]]]:
    """Per output, per position: token -> (logprob, rank)."""
    return [[{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in o.outputs[0].logprobs]
            for o in outs]


def assert_logprobs_close(a: list[Any], b: list[Any], tol: float = 1e-5) -> None:
    """Same tokens, same ranks, log-probabilities within ``tol``."""
    ta, tb = logprob_table(a), logprob_table(b)
    assert [len(r) for r in ta] == [len(o.outputs[0].token_ids) for o in a]
    assert [len(r) for r in ta] == [len(r) for r in tb]
    for ra, rb in zip(ta, tb):
        for pa, pb in zip(ra, rb):
            assert pa.keys() == pb.keys()
            for t in pa:
                assert pa[t][1] == pb[t][1]
                assert pa[t][0] == pytest.approx(pb[t][0], abs=tol)


#: the logprobs cell: top-5 under a penalty and a bias, so raw and processed differ
LOGPROB_EXTRA: dict[str, Any] = {"logprobs": 5, "presence_penalty": 0.5, "logit_bias": {7: 2.0}}


def assert_logprobs_match(target: Path, config: dict[str, Any], prompts: Sequence[list[int]],
                          mode: str, *, accepted: bool = True,
                          extra: dict[str, Any] | None = None, **llm_kw: Any) -> None:
    """Greedy logprobs (``mode``: raw or processed) spec-on == spec-off within 1e-5, with
    :data:`LOGPROB_EXTRA` and ``extra`` (sampling fields) active."""
    params = greedy(**{**LOGPROB_EXTRA, **(extra or {})})
    off, _ = generate(target, None, prompts, params, logprobs_mode=mode, **llm_kw)
    on, llm = generate(target, config, prompts, params, logprobs_mode=mode, **llm_kw)
    assert token_ids(on) == token_ids(off)
    assert_logprobs_close(on, off)
    if accepted:
        assert_accepted(llm)


# -- stops inside an accepted block -------------------------------------------------------

#: the stop kinds: a stop token id, a stop string, an EOS (the engine's EOS set to the token)
STOP_KINDS = ("stop_token_ids", "stop_string", "eos")


def _record_commits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(tokens offered, tokens kept) of every ``append_tokens`` call from now on."""
    import draftwise.engine as engine_mod

    cuts: list[tuple[int, int]] = []
    real = engine_mod.append_tokens

    def record(req, toks):  # type: ignore[no-untyped-def]
        kept = real(req, toks)
        cuts.append((len(toks), kept))
        return kept

    monkeypatch.setattr(engine_mod, "append_tokens", record)
    return cuts


def _stream(llm: LLM, prompt: list[int], params: SamplingParams,
            eos: int | None) -> tuple[Any, list[int], str]:
    """Step the engine by hand: the last output and the concatenated streamed deltas."""
    engine = llm.engine
    if eos is not None:
        engine.eos_token_ids = frozenset({eos})
    engine.add_request({"prompt_token_ids": prompt}, params)
    toks: list[int] = []
    text, last = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            toks += out.new_token_ids
            text += out.new_text
            last = out
    return last, toks, text


def _stop_at(commits: list[int], ref: list[int], words: list[str] | None,
             kind: str) -> tuple[int, dict[str, Any]]:
    """A position with at least two tokens after it in its committed block where a stop
    of ``kind`` fires first, and the sampling fields asking for it. A token id must be new
    there; a stop string is the shortest run of 2-5 words ending there seen nowhere
    before (n-gram drafts repeat earlier tokens, but not every longer run of them)."""
    start = 0
    text = " ".join(words or [])
    for n in commits:
        for p in range(max(start, 1), start + n - 2):
            if kind != "stop_string":
                if ref[p] not in ref[:p]:
                    return p, ({"stop_token_ids": (ref[p],)} if kind == "stop_token_ids"
                               else {"ignore_eos": False})
                continue
            end = len(" ".join(words[:p + 1]))  # type: ignore[index]
            for width in range(2, min(5, p + 1) + 1):
                stop = " ".join(words[p + 1 - width : p + 1])  # type: ignore[index]
                if text.find(stop) + len(stop) == end:
                    return p, {"stop": (stop,)}
        start += n
    raise AssertionError(f"no committed block of 3+ tokens to stop {kind} inside: {commits}")


def assert_stop_inside_accepted_block(target: Path, config: dict[str, Any], prompt: list[int],
                                      kind: str, monkeypatch: pytest.MonkeyPatch,
                                      **extra: Any) -> None:
    """A stop (``kind`` of :data:`STOP_KINDS`) on a token that speculation commits with two or
    more after it truncates there: tokens, text, finish and stop reasons, usage, metrics
    and the streamed deltas equal speculation off's, and every block comes back. ``extra``
    (sampling fields) is active throughout."""
    config = fixed_depth(config)  # the stop is placed inside a k-deep block of the free run
    cuts = _record_commits(monkeypatch)
    free, _ = generate(target, config, [prompt], greedy(**extra))
    ref = free[0].outputs[0].token_ids
    words = free[0].outputs[0].text.split() if kind == "stop_string" else None
    if words is not None:
        assert len(words) == len(ref), "stop strings need one word per token"
    p, stop = _stop_at([n for n, _ in cuts], ref, words, kind)
    params = greedy(**{"max_tokens": 20, **extra, **stop})
    eos = ref[p] if kind == "eos" else None
    want, want_toks, want_text = _stream(LLM(model=str(target), dtype="bfloat16"), prompt,
                                         params, eos)
    assert len(want.outputs[0].token_ids) == p + 1, "the stop must fire at position p"
    cuts.clear()
    on = LLM(model=str(target), dtype="bfloat16", speculative_config=config)
    got, got_toks, got_text = _stream(on, prompt, params, eos)
    assert any(kept < n - 1 for n, kept in cuts), f"no stop inside a block: {cuts}"
    assert got.outputs[0].token_ids == want.outputs[0].token_ids == got_toks == want_toks
    assert got.outputs[0].text == want.outputs[0].text
    # a stop string split across two steps was partly streamed before it completed: the
    # server holds those characters back (``serving.TextDelta``); the engine's text is cut
    assert got_text.startswith(got.outputs[0].text) and want_text.startswith(want.outputs[0].text)
    assert got.outputs[0].finish_reason == want.outputs[0].finish_reason
    assert got.outputs[0].stop_reason == want.outputs[0].stop_reason
    n_out = len(got.outputs[0].token_ids)
    assert got.metrics["num_output_tokens"] == n_out == on.engine.stats.num_generated_tokens
    assert got.metrics["speculative_decoding"]["num_accepted_draft_tokens"] <= n_out - 1
    assert on.engine.kv.num_used_blocks == 0


# -- n > 1 ------------------------------------------------------------------------------


def assert_seeded_samples(target: Path, config: dict[str, Any], prompt: list[int],
                          *, accepted: bool = True, temperature: float = 1.0,
                          **extra: Any) -> None:
    """Seeded ``n = 3`` under speculation: reproducible, independent, sample ``i`` is the
    single request with ``seed + i``; greedy ``n = 3`` equals speculation off."""
    # the config as given (adaptive depth by default): a seeded sampled row runs at fixed
    # depth anyway, since its draws follow its depth and adaptive depth's choices follow
    # this machine's timing (docs/sampling.md, [n]); without that rule this fails
    sampled = SamplingParams(n=3, seed=123, temperature=temperature, top_k=3, max_tokens=10,
                             ignore_eos=True, **extra)
    first, llm = generate(target, config, [prompt], sampled)
    again, _ = generate(target, config, [prompt], sampled)
    toks = [c.token_ids for c in first[0].outputs]
    assert toks == [c.token_ids for c in again[0].outputs]
    assert len({tuple(t) for t in toks}) > 1, "the samples must be independent"
    if accepted:
        assert_accepted(llm)
    for i, t in enumerate(toks):
        alone, _ = generate(target, config, [prompt],
                            sampled.model_copy(update={"n": 1, "seed": 123 + i}))
        assert alone[0].outputs[0].token_ids == t
    det = greedy(n=3, max_tokens=12, **extra)
    off, _ = generate(target, None, [prompt], det)
    on, llm = generate(target, fixed_depth(config), [prompt], det)  # drafts every step
    assert [c.token_ids for c in on[0].outputs] == [c.token_ids for c in off[0].outputs]
    if accepted:
        assert_accepted(llm)


# -- the tiny word-vocabulary Qwen3 target of the dflash and dspark tests ---------------

#: two tokens of the greedy continuations of the block drafters' training prompts (their
#: 9th and 10th), so a mask or grammar banning them changes the output after accepted drafts
BANNED = (354, 280)
#: one value per logits-processing parameter (and all together), for that target
WORD_PARAMS: dict[str, dict[str, Any]] = {
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "logit_bias": {"logit_bias": {42: 3.0, 7: 2.0}},
    "allowed_token_ids": {"allowed_token_ids": tuple(t for t in range(510) if t not in BANNED)},
    "bad_words": {"bad_words": tuple(f"w{t}" for t in BANNED)},
    "min_tokens": {"min_tokens": 6, "stop_token_ids": [0]},
    "mix": {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repetition_penalty": 1.1,
            "logit_bias": {3: 1.5}, "min_tokens": 4, "bad_words": ("w354",)},
}


def write_byte_level_words(directory: Path, texts: list[str], eos: int) -> Path:
    """Replace the tokenizer with a byte-level BPE whose token ``i`` is ``texts[i]`` (what
    llguidance reads: every byte must be a token) and declare ``eos``, for grammar tests."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(texts)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    cfg = json.loads((directory / "config.json").read_text())
    cfg["eos_token_id"] = eos
    if "text_config" in cfg:
        cfg["text_config"]["eos_token_id"] = eos
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


#: that target's token texts as a byte-level vocabulary: ids 0-10 become the digits and
#: "w" (llguidance needs every byte as a token; the greedy continuations use none of them)
WORD_TEXTS = [str(i) for i in range(10)] + ["w"] + [f"w{i}" for i in range(11, 510)] \
    + ["<|MASK|>", "[UNK]"]
#: words only, never a banned one: nearly a per-position token mask
WORD_GRAMMAR = "(" + "|".join(WORD_TEXTS[i] for i in range(11, 510) if i not in BANNED) + ")+"


def assert_grammar_identical(target: Path, config: dict[str, Any], prompts: Sequence[list[int]],
                             grammar: str, *, accepted: bool = True, max_tokens: int = 20,
                             eos_text: str = "", extra: dict[str, Any] | None = None,
                             **llm_kw: Any) -> LLM:
    """Greedy spec-on == spec-off under the regex ``grammar``, which changes the output;
    every output matches it (less ``eos_text``, an EOS the grammar allowed at its end).
    ``extra`` (sampling fields) is active in every run."""
    import re

    from draftwise.structured import StructuredOutputsParams

    params = greedy(max_tokens=max_tokens, ignore_eos=False, **(extra or {}),
                    structured_outputs=StructuredOutputsParams(regex=grammar))
    off, _ = generate(target, None, prompts, params, **llm_kw)
    free, _ = generate(target, None, prompts, greedy(max_tokens=max_tokens, **(extra or {})),
                       **llm_kw)
    assert token_ids(off) != token_ids(free), "the grammar must change the output"
    for o in off:
        text = o.outputs[0].text.removesuffix(eos_text) if eos_text else o.outputs[0].text
        assert re.fullmatch(grammar, text), text
    # fixed depth: the mask and the matcher's rollback are checked on accepted and rejected
    # k-deep drafts, which adaptive depth (the default) may not make on a loaded machine
    on, llm = generate(target, fixed_depth(config), prompts, params, **llm_kw)
    assert token_ids(on) == token_ids(off)
    if accepted:
        assert_accepted(llm, some_rejected=True)
    else:
        assert llm.engine.spec.metrics.num_draft_tokens > 0
    return llm


# -- forced tool calls ---------------------------------------------------------------------

#: Qwen2.5-Instruct's own chat template (renders tools, in the Hermes format)
QWEN_TEMPLATE = Path(__file__).parent / "core" / "server" / "data" / "qwen2.5_chat_template.jinja"
#: two functions whose arguments are enums, so a forced call is short on a random model
TOOLS = [{"type": "function", "function": {
    "name": name, "parameters": {"type": "object", "properties": {
        arg: {"type": "string", "enum": values}}, "required": [arg],
        "additionalProperties": False}}}
    for name, arg, values in (("set_unit", "unit", ["celsius", "fahrenheit"]),
                              ("set_mode", "mode", ["on", "off"]))]
#: (tool_choice fields, exactly one call)
TOOL_CHOICES: list[tuple[dict[str, Any], bool]] = [
    ({"tool_choice": "required"}, False),
    ({"tool_choice": "required", "parallel_tool_calls": False}, True),
    ({"tool_choice": {"type": "function", "function": {"name": "set_mode"}}}, True),
]


def make_tools_target(target: Path, directory: Path) -> Path:
    """A copy of ``target`` with a byte-level tokenizer, Qwen2.5's template and room for its
    tool prompt (about 970 byte tokens): a tools-capable tiny checkpoint."""
    import json
    import shutil

    from tiny_checkpoints import write_byte_tokenizer

    shutil.copytree(target, directory)
    for stale in ("tokenizer.json", "tokenizer_config.json"):
        (directory / stale).unlink(missing_ok=True)
    write_byte_tokenizer(directory)
    shutil.copy(QWEN_TEMPLATE, directory / "chat_template.jinja")
    cfg = json.loads((directory / "config.json").read_text())
    cfg["max_position_embeddings"] = 2048
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def tool_request(target: Path, choice: dict[str, Any]) -> tuple[list[int], SamplingParams, Any]:
    """Prompt ids, SamplingParams and tool plan of a chat request with :data:`TOOLS` and
    ``choice``, made as the server makes them (tool plan, call grammar, template)."""
    from draftwise.server.protocol import ChatCompletionRequest
    from draftwise.server.serving import sampling_params
    from draftwise.server.tools import chat_template_of, tool_plan

    ask = [{"role": "user", "content": "Use the tools."}]
    req = ChatCompletionRequest.model_validate(
        {"messages": ask, "temperature": 0, "max_tokens": 240, "tools": TOOLS, **choice})
    engine = LLM(model=str(target), dtype="bfloat16").engine
    plan = tool_plan(req, chat_template_of(engine))
    ids = engine.apply_chat_template(ask, True, tools=list(plan.tools))
    return ids, sampling_params(req, plan), plan


def assert_forced_calls_identical(target: Path, config: dict[str, Any], choice: dict[str, Any],
                                  one: bool, *, accepted: bool = False) -> None:
    """A chat request with :data:`TOOLS` and ``choice``, made as the server makes it (tool
    plan, call grammar, template): spec-on tokens == spec-off's and the calls parse, one
    exactly when ``one``."""
    import json

    ids, params, plan = tool_request(target, choice)
    off, _ = generate(target, None, [ids], params)
    on, llm = generate(target, config, [ids], params)
    assert on[0].outputs[0].token_ids == off[0].outputs[0].token_ids
    assert llm.engine.spec.metrics.num_drafts > 0 or not accepted
    if accepted:
        assert_accepted(llm)
    _, calls = plan.parse(on[0].outputs[0].text)
    assert calls, on[0].outputs[0].text
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        assert set(args) == ({"unit"} if call["function"]["name"] == "set_unit" else {"mode"})
    if one:
        assert len(calls) == 1 and on[0].outputs[0].finish_reason == "stop"
    if "function" in str(choice["tool_choice"]):
        assert calls[0]["function"]["name"] == "set_mode"
