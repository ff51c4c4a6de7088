"""The grammar worker: off the event loop, a budget, a queue bound, a deep stack.

Deterministic: the work is a function that blocks on an event the test controls, so the
budget, the queue bound and the event loop's freedom are shown without timing a grammar.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from draftwise.server.errors import APIError
from draftwise.server.grammar_worker import STACK_BYTES, GrammarWorker


def test_work_runs_on_a_worker_thread_and_its_errors_pass_through() -> None:
    worker = GrammarWorker(threads=1)

    async def main() -> None:
        name = await worker.run(lambda: threading.current_thread().name)
        assert name.startswith("draftwise-grammar-")
        with pytest.raises(ValueError, match="bad schema"):
            await worker.run(lambda: (_ for _ in ()).throw(ValueError("bad schema")))

    try:
        asyncio.run(main())
    finally:
        worker.stop()


def test_the_event_loop_stays_free_and_the_budget_is_a_400() -> None:
    release = threading.Event()
    worker = GrammarWorker(threads=1, budget=0.3)

    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        with pytest.raises(APIError) as info:
            await worker.run(lambda: release.wait(30))
        task.cancel()
        assert info.value.status == 400 and info.value.code == "grammar_too_slow"
        assert "structured_outputs" in info.value.message
        assert ticks >= 5  # the loop ran while the grammar "compiled"

    try:
        asyncio.run(main())
    finally:
        release.set()
        worker.stop()


def test_past_the_queue_bound_is_a_503_and_slots_come_back() -> None:
    release = threading.Event()
    worker = GrammarWorker(threads=1, budget=30, max_pending=2)

    async def main() -> None:
        first = asyncio.ensure_future(worker.run(lambda: release.wait(30)))
        second = asyncio.ensure_future(worker.run(lambda: "queued"))
        await asyncio.sleep(0.05)
        assert worker.pending == 2
        with pytest.raises(APIError) as info:
            await worker.run(lambda: "refused")
        assert info.value.status == 503 and info.value.code == "grammar_queue_full"
        release.set()
        assert await first is True and await second == "queued"
        assert worker.pending == 0
        assert await worker.run(lambda: "again") == "again"

    try:
        asyncio.run(main())
    finally:
        release.set()
        worker.stop()


def test_threads_have_the_deep_stack_and_leave_the_default_alone() -> None:
    before = threading.stack_size()
    worker = GrammarWorker(threads=1)
    worker.start()

    def deep(n: int) -> int:  # ~10 MiB of C stack through Python frames would not fit 8 MiB
        return 0 if n == 0 else 1 + deep(n - 1)

    import sys

    async def main() -> int:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(200_000)
        try:
            return await worker.run(lambda: deep(60_000))
        finally:
            sys.setrecursionlimit(old)

    try:
        assert asyncio.run(main()) == 60_000
        assert threading.stack_size() == before
        assert STACK_BYTES >= 32 * 1024 * 1024
    finally:
        worker.stop()
