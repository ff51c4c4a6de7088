"""Tensor parallel over gloo with two local processes (``draftwise.models.tp``).

One tiny fp32 llama checkpoint (biases on every projection, so column-parallel biases are
split and row-parallel ones added once; tied embeddings; an odd vocabulary, so the last
rank's vocabulary rows are padding) serves every test. TP=2 is checked against TP=1
(logits and hidden-state taps), against itself (the same bits run to run), and for
greedy n-gram speculation against speculation off; the refusals run before any process
starts; a killed rank and a stopped one fail their requests by name within the timeout.
Every test is bounded by an alarm (no pytest-timeout here) and by the group's timeout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import save_tiny

from draftwise.config import RefusedValueError
from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs
from draftwise.models.tp.errors import TensorParallelConfigError
from draftwise.request import RequestOutput
from draftwise.sampling_params import SamplingParams
from draftwise.spec.params import SpeculativeParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}
#: a repetitive prompt, so n-gram drafts are proposed and some are accepted
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]


@pytest.fixture(autouse=True)
def _bounded() -> Iterator[None]:
    """Each test gets 90 s at most: a hang fails it instead of stalling the suite."""
    def expire(*_: object) -> None:
        raise TimeoutError("tensor-parallel test ran past 90 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(90)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("tp-llama"), seed=5, vocab_size=509,
                     tie_word_embeddings=True, attention_bias=True, mlp_bias=True)


def engine(path: Path, tp: int, **kwargs: object) -> LLMEngine:
    args = EngineArgs(model=str(path), dtype="float32", tensor_parallel_size=tp,
                      max_num_seqs=4, num_kv_blocks=64, num_threads=1,
                      **{"tensor_parallel_timeout_s": 20.0, **kwargs})  # type: ignore[arg-type]
    return LLMEngine(args)


def close(eng: LLMEngine) -> None:
    eng.runner.model.driver.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def tp2(checkpoint: Path) -> Iterator[LLMEngine]:
    eng = engine(checkpoint, 2, speculative_config=NGRAM)
    yield eng
    close(eng)


def run_all(eng: LLMEngine, prompts: list[list[int]], max_tokens: int = 24,
            speculative: SpeculativeParams | None = None, rid: str = "r"
            ) -> list[RequestOutput]:
    """Every prompt as one request, all in the same steps; their final outputs in order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{rid}{i}" for i in range(len(prompts))]
    for req_id, prompt in zip(ids, prompts):
        eng.add_request({"prompt_token_ids": prompt}, params, request_id=req_id,
                        speculative=speculative)
    last: dict[str, RequestOutput] = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            last[out.request_id] = out
    assert all(last[i].finished for i in ids)
    return [last[i] for i in ids]


def run(eng: LLMEngine, prompt: list[int], max_tokens: int = 24,
        speculative: SpeculativeParams | None = None, rid: str = "r") -> RequestOutput:
    return run_all(eng, [prompt], max_tokens, speculative, rid)[0]


def forward(eng: LLMEngine, ids: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    batch = eng.runner.build([ids], [0], [[1, 2]], [list(range(len(ids)))], hidden_layers=(0, 2))
    out = eng.runner.forward(batch)
    return out.logits, out.hidden_states


def test_logits_and_taps_equal_tp1(checkpoint: Path, tp2: LLMEngine) -> None:
    tp1 = engine(checkpoint, 1)
    ids = PROMPT + [500, 508, 254, 255, 0]  # ids in both ranks' vocabulary halves
    want_logits, want_hidden = forward(tp1, ids)
    logits, hidden = forward(tp2, ids)
    assert logits.shape == want_logits.shape == (len(ids), 509)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert hidden.keys() == {0, 2}
    for layer in (0, 2):  # the taps are the whole residual stream on rank 0
        torch.testing.assert_close(hidden[layer], want_hidden[layer], rtol=1e-4, atol=1e-4)
    again, _ = forward(tp2, ids)  # reductions in rank order: the same bits run to run
    assert torch.equal(again, logits)


def test_greedy_ngram_equals_off_at_tp2(tp2: LLMEngine) -> None:
    prompts = [PROMPT, [40, 41, 42, 40, 41, 42, 40, 41], [300, 7, 300, 7, 300]]
    on = run_all(tp2, prompts, speculative=SpeculativeParams(return_provenance=True), rid="on")
    off = run_all(tp2, prompts, speculative=SpeculativeParams(enabled=False), rid="off")
    for a, b in zip(on, off):  # three rows per step, drafts and prefill chunks mixed
        assert a.error is None and b.error is None
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(a.outputs[0].token_ids) == 24
    # drafts were accepted, so the speculative path really ran at TP=2
    accepted = sum(o.metrics["token_provenance"].count("accepted:ngram") for o in on)
    assert accepted >= 4, [o.metrics for o in on]


@pytest.mark.parametrize("size, match", [
    (3, r"tensor_parallel_size=3 is refused: the model's 4 attention heads do not divide "
        r"into 3 ranks .* Instead: tensor_parallel_size in \{1, 2\}"),
    (0, r"tensor_parallel_size=0 is refused: it must be a positive integer"),
])
def test_split_refused_by_name(checkpoint: Path, size: int, match: str) -> None:
    with pytest.raises(TensorParallelConfigError, match=match):
        engine(checkpoint, size)


def test_kv_heads_refused_by_name(tmp_path: Path) -> None:
    path = save_tiny("llama", tmp_path, num_attention_heads=4, num_key_value_heads=1)
    with pytest.raises(TensorParallelConfigError,
                       match=r"the model's 1 KV heads do not divide into 2 ranks.*"
                             r"Instead: tensor_parallel_size in \{1\}"):
        engine(path, 2)


def test_gguf_refused_by_name(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not read: refused by its kind first")
    with pytest.raises(TensorParallelConfigError, match=r"tensor_parallel_size=2 is refused "
                       r"for a GGUF target .*quantized tensor parallel is not built"):
        engine(fake, 2)


@pytest.mark.parametrize("spec, tp, match", [
    ({**NGRAM, "draft_tensor_parallel_size": 3}, 2,
     r"draft_tensor_parallel_size=3 is refused: vLLM allows 1 or the target's "
     r"tensor_parallel_size \(2\)"),
    ({**NGRAM, "draft_tensor_parallel_size": 2}, 1,
     r"draft_tensor_parallel_size=2 is refused: draftwise runs the draft on one device"),
    ({"method": "draft_model", "model": "/nonexistent", "num_speculative_tokens": 2}, 2,
     r'method="draft_model" is refused at tensor_parallel_size=2: .*drafters run on rank 0 '
     r"alone\. Instead: a model-free method"),
])
def test_draft_placement_refused_by_name(checkpoint: Path, spec: dict[str, object], tp: int,
                                         match: str) -> None:
    with pytest.raises(RefusedValueError, match=match):
        engine(checkpoint, tp, speculative_config=spec)


def test_draft_tensor_parallel_equal_to_target_runs(checkpoint: Path, tp2: LLMEngine) -> None:
    from draftwise.bootstrap import check_tensor_parallel
    from draftwise.config import parse_speculative_config

    spec = parse_speculative_config({**NGRAM, "draft_tensor_parallel_size": 2})
    args = EngineArgs(model=str(checkpoint), tensor_parallel_size=2)
    from draftwise.plugins.manager import load_speculators

    assert check_tensor_parallel(args, spec, load_speculators()) == 2


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_lost_rank_fails_requests_by_name(checkpoint: Path, how: signal.Signals) -> None:
    eng = engine(checkpoint, 2, tensor_parallel_timeout_s=3.0)
    worker = eng.runner.model.driver.procs[0]  # type: ignore[union-attr]
    try:
        assert run(eng, PROMPT, max_tokens=2, rid="before").error is None
        os.kill(worker.pid, how)
        if how == signal.SIGKILL:
            worker.wait(timeout=10)
        start = time.monotonic()
        out = run(eng, PROMPT, max_tokens=4, rid="during")
        took = time.monotonic() - start
        assert out.error is not None and out.error.startswith("TensorParallelRankError: "), out
        assert "rank" in out.error and "restart it" in out.error
        assert took < 3.0 + 5.0  # the timeout, plus a little; never a hang
        start = time.monotonic()  # the next request fails at once
        later = run(eng, PROMPT, max_tokens=4, rid="after")
        assert later.error is not None and "TensorParallelRankError" in later.error
        assert time.monotonic() - start < 1.0
    finally:
        if how == signal.SIGSTOP:
            os.kill(worker.pid, signal.SIGCONT)
        close(eng)
