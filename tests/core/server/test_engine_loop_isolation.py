"""Through the server's engine loop, a request that fails inside a step fails alone.

The real engine on a tiny llama, with a fault injected in verify for one request: its
client gets ``RequestFailed`` naming the fault, a concurrent stream finishes with the
tokens it gives alone, and the KV pool is empty afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny

import draftwise.spec.verify
from draftwise import LLMEngine, SamplingParams
from draftwise.engine_args import EngineArgs
from draftwise.server.engine_loop import EngineLoop, RequestFailed

CULPRIT_MAX_TOKENS = 9
PROMPT = [5, 9, 13, 2, 7, 11, 3]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("loop-isolation"), seed=3)


def test_the_culprit_gets_an_error_and_the_victim_its_tokens(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_llama), dtype="bfloat16"))
    victim_params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    engine.add_request({"prompt_token_ids": PROMPT}, victim_params, request_id="solo")
    want = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                want = out.outputs[0].token_ids

    real = draftwise.spec.verify.verify

    def verify(logits, flat, num_draft, params, generators, **kw):  # type: ignore[no-untyped-def]
        if any(p.max_tokens == CULPRIT_MAX_TOKENS for p in params):
            raise RuntimeError("injected fault")
        return real(logits, flat, num_draft, params, generators, **kw)

    monkeypatch.setattr(draftwise.spec.verify, "verify", verify)

    async def consume(loop: EngineLoop, rid: str, params: SamplingParams) -> list[int]:
        stream = await loop.submit(rid, lambda _e: ({"prompt_token_ids": PROMPT}, params))
        try:
            final = None
            async for out in stream:
                final = out
            return final.outputs[0].token_ids
        finally:
            stream.close()

    async def main() -> tuple[object, object]:
        loop = EngineLoop(engine)
        loop.start(asyncio.get_running_loop())
        try:
            victim = asyncio.create_task(consume(loop, "victim", victim_params))
            await asyncio.sleep(0.05)
            culprit = consume(loop, "culprit", SamplingParams(
                temperature=0.0, max_tokens=CULPRIT_MAX_TOKENS, ignore_eos=True))
            results = await asyncio.wait_for(
                asyncio.gather(victim, culprit, return_exceptions=True), 60)
            return results[0], results[1]
        finally:
            await asyncio.to_thread(loop.stop)

    victim_out, culprit_out = asyncio.run(main())
    assert victim_out == want
    assert isinstance(culprit_out, RequestFailed)
    assert "injected fault" in str(culprit_out)
    assert engine.kv.num_used_blocks == 0
