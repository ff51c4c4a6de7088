"""The engine loop alone: one engine thread, many async requests, aborts and faults."""

from __future__ import annotations

import asyncio
import threading

import pytest
from draftwise.sampling_params import SamplingParams
from draftwise.server.engine_loop import EngineLoop, LoopClosed, RequestFailed
from server_fakes import FakeEngine


def _build(prompt: str, max_tokens: int):
    def build(engine):
        return prompt, SamplingParams(temperature=0, max_tokens=max_tokens)

    return build


async def _text(loop: EngineLoop, rid: str, prompt: str, max_tokens: int) -> str:
    stream = await loop.submit(rid, _build(prompt, max_tokens))
    try:
        final = None
        async for out in stream:
            final = out
        return final.outputs[0].text
    finally:
        stream.close()


def run(coro_fn, engine: FakeEngine, timeout: float = 20.0):
    """Run ``coro_fn(loop)`` with a started loop; stop it after."""

    async def main():
        loop = EngineLoop(engine)
        loop.start(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(coro_fn(loop), timeout)
        finally:
            await asyncio.to_thread(loop.stop)

    return asyncio.run(main())


def test_many_requests_batch_on_one_thread():
    engine = FakeEngine(max_num_seqs=4)
    prompts = [f"p{i}" for i in range(20)]

    async def go(loop):
        return await asyncio.gather(*(_text(loop, f"r{i}", p, 12) for i, p in enumerate(prompts)))

    texts = run(go, engine)
    assert texts == [engine.greedy_text([ord(c) for c in p], 12) for p in prompts]
    assert engine.owner is not threading.main_thread()  # every engine call on its thread
    assert engine.requests == {}


def test_bad_request_fails_alone():
    engine = FakeEngine()

    async def go(loop):
        good = asyncio.ensure_future(_text(loop, "good", "fine", 10))
        with pytest.raises(Exception, match="max_tokens"):
            await loop.submit("bad", _build("x", 10_000))
        with pytest.raises(ZeroDivisionError):
            await loop.submit("worse", lambda engine: 1 / 0)
        return await good

    assert run(go, engine) == engine.greedy_text([ord(c) for c in "fine"], 10)


def test_close_aborts_and_frees():
    engine = FakeEngine(step_delay=0.005)

    async def go(loop):
        stream = await loop.submit("r", _build("abc", 200))
        async for _ in stream:
            break
        stream.close()
        for _ in range(200):
            if loop.snapshot["kv_used_blocks"] == 0 and loop.snapshot["num_requests"] == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert run(go, engine)
    assert engine.aborted == ["r"] and engine.requests == {}


def test_cancelled_submit_does_not_leak():
    engine = FakeEngine(step_delay=0.005)

    async def go(loop):
        task = asyncio.ensure_future(loop.submit("r", _build("abc", 200)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if not engine.requests and loop.snapshot["num_requests"] == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert run(go, engine)


def test_step_failure_fails_requests_and_loop_survives():
    engine = FakeEngine(step_delay=0.005)

    async def go(loop):
        stream = await loop.submit("a", _build("abc", 100))
        async for _ in stream:
            engine.fail_next_step = True
        return stream

    with pytest.raises(RequestFailed, match="injected"):
        run(go, engine)

    async def after(loop):
        with pytest.raises(RequestFailed):
            stream = await loop.submit("a", _build("abc", 100))
            engine.fail_next_step = True
            async for _ in stream:
                pass
        assert loop.alive
        return await _text(loop, "b", "xyz", 5)

    engine.owner = None  # a new loop, a new engine thread
    # ``go`` may set the flag again from an output queued before the failing step
    engine.fail_next_step = False
    assert run(after, engine) == engine.greedy_text([ord(c) for c in "xyz"], 5)


def test_stop_fails_pending_and_refuses_new():
    engine = FakeEngine(step_delay=0.01)

    async def go(loop):
        stream = await loop.submit("r", _build("abc", 200))
        await asyncio.to_thread(loop.stop)
        with pytest.raises(RequestFailed) as info:
            async for _ in stream:
                pass
        assert info.value.status == 503
        with pytest.raises(LoopClosed):
            await loop.submit("s", _build("abc", 2))
        return engine.requests

    assert run(go, engine) == {}


def test_build_runs_on_a_tokenizer_thread():
    engine = FakeEngine()
    seen: list[str] = []

    def build(engine):
        seen.append(threading.current_thread().name)
        return "abc", SamplingParams(temperature=0, max_tokens=3)

    async def go(loop):
        stream = await loop.submit("r", build)
        async for _ in stream:
            pass
        return True

    assert run(go, engine)
    assert seen and seen[0].startswith("draftwise-tokenize")
    assert engine.owner is not None and engine.owner.name == "draftwise-engine"


def test_expire_ends_streams_and_refuses_queued_adds():
    engine = FakeEngine(step_delay=0.01)

    async def go(loop):
        stream = await loop.submit("r", _build("abc", 200))
        loop.expire()
        with pytest.raises(RequestFailed, match="shutdown timeout expired") as info:
            async for _ in stream:
                pass
        assert info.value.status == 503
        with pytest.raises(LoopClosed) as closed:
            await loop.submit("s", _build("abc", 2))
        assert closed.value.code == "shutting_down"
        return engine.requests

    assert run(go, engine) == {}
