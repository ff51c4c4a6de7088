"""The engine on a tiny random llama: batching, chunked prefill, preemption, abort, prefix cache.

bf16 is the dtype these identities hold for: its linear layers and our attention are
bitwise batch-invariant on CPU, so a request batched with others (or chunked, or
recomputed after preemption) gives exactly the tokens it gives alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_checkpoints import save_tiny

from draftwise import LLM, LLMEngine, SamplingParams
from draftwise.engine_args import EngineArgs
from draftwise.errors import EngineConfigError, RequestError

PROMPTS = [
    [5, 9, 13, 2, 7],
    list(range(20, 57)),
    [100, 101, 102],
    [(i * 37) % 500 + 3 for i in range(23)],
    [42] * 11,
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("engine-llama"), seed=3)


def greedy(max_tokens: int = 12, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run_alone(path: Path, prompts: list[list[int]], **engine_kw: object) -> list[list[int]]:
    llm = LLM(model=str(path), dtype="bfloat16", **engine_kw)
    return [
        llm.generate({"prompt_token_ids": p}, greedy())[0].outputs[0].token_ids for p in prompts
    ]


def test_batched_chunked_preempted_equals_alone(tiny_llama: Path) -> None:
    alone = run_alone(tiny_llama, PROMPTS)
    # a 16-token budget forces chunked prefill; 14 usable blocks of 4 cannot hold all five
    llm = LLM(
        model=str(tiny_llama),
        dtype="bfloat16",
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=15,
        max_model_len=52,
        enable_prefix_caching=False,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert llm.engine.stats.num_preemptions > 0, "the test must force a preemption"
    assert llm.engine.kv.num_used_blocks == 0
    llm.engine.kv.check_invariants()


def test_abort_anywhere_returns_blocks(tiny_llama: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_llama), dtype="bfloat16", max_num_batched_tokens=8,
                                  block_size=4))
    ids = [engine.add_request({"prompt_token_ids": p}, greedy(20)) for p in PROMPTS]
    engine.abort_request(ids[4])  # still waiting
    engine.step()
    engine.abort_request(ids[1])  # mid-prefill (37 tokens, 8-token budget)
    for _ in range(6):
        engine.step()
    engine.abort_request(ids[0])  # decoding
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) == {ids[2], ids[3]}
    assert engine.kv.num_used_blocks == 0
    assert not engine.abort_request(ids[0])  # already gone


def test_prefix_cache_hit_gives_same_tokens(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", block_size=4)
    prompt = {"prompt_token_ids": PROMPTS[1]}
    first = llm.generate(prompt, greedy())[0]
    second = llm.generate(prompt, greedy())[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens >= 32
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_stop_token_ids_and_length(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama), dtype="bfloat16")
    base = llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy(10))[0].outputs[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 10
    stop_at = base.token_ids[3]
    cut = llm.generate(
        {"prompt_token_ids": PROMPTS[0]}, greedy(10, stop_token_ids=[stop_at])
    )[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop_at
    assert cut.token_ids == base.token_ids[: base.token_ids.index(stop_at) + 1]


def test_seeded_sampling_is_reproducible(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama), dtype="bfloat16")
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    a = llm.generate({"prompt_token_ids": PROMPTS[2]}, p)[0].outputs[0].token_ids
    # batched with other requests, the seeded row still draws from its own generator
    outs = llm.generate([{"prompt_token_ids": q} for q in PROMPTS[:3]], [greedy(), greedy(), p])
    assert outs[2].outputs[0].token_ids == a


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], greedy(), "prompt"),
        ([1, 2, 99999], greedy(), "prompt_token_ids"),
        (list(range(3, 70)), greedy(), "prompt"),
        ([1, 2, 3], greedy(max_tokens=100), "max_tokens"),
        ([1, 2, 3], greedy(logit_bias={99999: 1.0}), "logit_bias"),
        ([1, 2, 3], greedy(allowed_token_ids=(5, 99999)), "allowed_token_ids"),
        ([1, 2, 3], greedy(bad_words=("hello",)), "bad_words"),  # no tokenizer
        ([1, 2, 3], greedy(n=3, stop_token_ids=(99999,)), "stop_token_ids"),
    ],
)
def test_bad_requests_are_refused_by_field(
    tiny_llama: Path, prompt: list[int], params: SamplingParams, field: str
) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_llama), dtype="bfloat16", max_model_len=64))
    with pytest.raises(RequestError) as err:
        engine.add_request({"prompt_token_ids": prompt}, params)
    assert err.value.field == field
    assert not engine.has_unfinished_requests() and not engine._parents


def test_engine_settings_refused_before_weights(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(EngineConfigError, match="max_num_seqs"):
        LLMEngine(EngineArgs(model=str(missing), max_num_seqs=0))
    with pytest.raises(EngineConfigError, match="logprobs_mode 'raw'"):
        LLMEngine(EngineArgs(model=str(missing), logprobs_mode="raw"))


def test_kv_cache_too_small_is_refused(tiny_llama: Path) -> None:
    with pytest.raises(EngineConfigError, match="cannot hold one request"):
        LLMEngine(EngineArgs(model=str(tiny_llama), num_kv_blocks=4, block_size=4,
                             max_model_len=64))


def test_a_kv_pool_past_the_machines_memory_is_refused_by_name(tiny_llama: Path) -> None:
    """`serve --num-kv-blocks 1000000000000` ended in an OSError traceback from the
    allocation; it is refused by name with the largest pool that fits."""
    with pytest.raises(EngineConfigError, match=r"num_kv_blocks=10{12} needs .* use at most"):
        LLMEngine(EngineArgs(model=str(tiny_llama), num_kv_blocks=10**12))


def test_bf16_is_default_dtype(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama))
    assert llm.engine.loaded.dtype == torch.bfloat16


def byte_level_tokenizer() -> object:
    """A byte-level BPE over ids 0..255 plus merges up to "aaaaaaaa" (8 characters)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    from draftwise.formats.tokenizer import Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("a", "a"), ("aa", "aa"), ("aaaa", "aaaa")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = Backend(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend)


@pytest.fixture
def text_engine(tiny_llama: Path) -> LLMEngine:
    """The tiny llama (no tokenizer of its own) given the byte-level tokenizer above."""
    from draftwise.prompts import PromptReader

    engine = LLMEngine(EngineArgs(model=str(tiny_llama), dtype="bfloat16", max_model_len=64))
    engine.tokenizer = byte_level_tokenizer()
    engine.prompts = PromptReader(engine.tokenizer, engine.max_model_len)
    return engine


def test_prompt_char_limit_is_context_times_longest_token(text_engine: LLMEngine) -> None:
    assert text_engine.tokenizer.max_token_chars == 8
    assert text_engine.prompts.max_chars == 64 * 8


def test_too_long_text_is_refused_before_tokenizing(text_engine: LLMEngine, monkeypatch) -> None:
    # at the bound the prompt still tokenizes (64 tokens of 8 characters) and is refused
    # by its token count: the bound is tight, not a guess
    with pytest.raises(RequestError, match="has 64 tokens"):
        text_engine.add_request("a" * 512, greedy(1))
    monkeypatch.setattr(text_engine.tokenizer, "encode", lambda *a, **k: pytest.fail("encoded"))
    with pytest.raises(RequestError, match="513 characters; no more than 512") as err:
        text_engine.add_request("a" * 513, greedy(1))
    assert err.value.field == "prompt"
    with pytest.raises(RequestError) as err:
        text_engine.apply_chat_template([{"role": "user", "content": "a" * 600}])
    assert err.value.field == "messages"
    assert not text_engine.has_unfinished_requests()


@pytest.mark.parametrize("text", ["a\ud800b", b"caf\xe9".decode("utf-8", "surrogateescape")])
def test_invalid_text_is_refused_by_field(text_engine: LLMEngine, text: str) -> None:
    with pytest.raises(RequestError, match="lone surrogate") as err:
        text_engine.add_request(text, greedy(1))
    assert err.value.field == "prompt"
    with pytest.raises(RequestError) as err:
        text_engine.apply_chat_template([{"role": "system", "content": "ok"},
                                         {"role": "user", "content": text}])
    assert err.value.field == "messages[1].content"


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([1, "2"], greedy(), "prompt_token_ids"),
        ([1, 2.0], greedy(), "prompt_token_ids"),
        ([1, 2, 3], greedy(stop_token_ids=[600]), "stop_token_ids"),
        (list(range(10**6)), greedy(), "prompt"),  # refused by length before any scan
    ],
)
def test_more_bad_requests_are_refused_by_field(
    tiny_llama: Path, prompt: list, params: SamplingParams, field: str
) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_llama), dtype="bfloat16", max_model_len=64))
    with pytest.raises(RequestError) as err:
        engine.add_request({"prompt_token_ids": prompt}, params)
    assert err.value.field == field


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_request_finishing_in_its_prefill_step_leaves_its_prompt_cached(
    tiny_llama: Path, max_tokens: int
) -> None:
    """A request that ends in the step its prefill completes (max_tokens=1) or soon after
    registers its full prompt blocks before they are freed, so the same prompt hits."""
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", block_size=4)
    prompt = {"prompt_token_ids": PROMPTS[1]}
    first = llm.generate(prompt, greedy(max_tokens))[0]
    second = llm.generate(prompt, greedy(max_tokens))[0]
    assert first.num_cached_tokens == 0
    full = (len(PROMPTS[1]) - 1) // 4 * 4  # the last prompt token is always recomputed
    assert second.num_cached_tokens == full
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.engine.kv.num_used_blocks == 0


def test_a_second_thread_stepping_the_engine_is_refused_by_name(tiny_llama: Path) -> None:
    """One thread drives an engine: a second ``step()`` while one runs raises
    EngineBusyError instead of interleaving two steps (a benchmark once drove a served
    engine in-process while the server's loop woke and stepped it too: rows went missing
    from verify). The first step finishes normally and the engine goes on."""
    import threading

    from draftwise.errors import EngineBusyError

    llm = LLM(model=str(tiny_llama), dtype="bfloat16")
    engine = llm.engine
    engine.add_request({"prompt_token_ids": PROMPTS[0]}, greedy(4))
    inside, release = threading.Event(), threading.Event()
    real = engine._step

    def slow_step():  # type: ignore[no-untyped-def]
        inside.set()
        release.wait(10)
        return real()

    engine._step = slow_step  # type: ignore[method-assign]
    first = threading.Thread(target=engine.step)
    first.start()
    assert inside.wait(10)
    with pytest.raises(EngineBusyError, match="already running in another thread"):
        engine.step()
    release.set()
    first.join(10)
    engine._step = real  # type: ignore[method-assign]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv.num_used_blocks == 0
