"""``GET /kv_events``: the contract external routers rely on (draftwise.server.block_events).

A tiny engine with a 6-block pool (block 0 reserved), block size 4 and 16-token context: a 12-token prompt
stores its full verified blocks; enough other prompts later force those blocks out. The
stream must start with a snapshot, number events without gaps, report each stored block
with its tokens and parent, and report the eviction of exactly the blocks it stored.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs
from draftwise.server.block_events import BlockEventLog
from server_fakes import serving
from tiny_checkpoints import TINY, save_tiny, write_wordlevel_tokenizer

PROMPT = [5, 9, 13, 2, 7, 11, 4, 8, 12, 3, 6, 10]  # three full blocks of 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("llama", tmp_path_factory.mktemp("events-llama"), seed=5)
    write_wordlevel_tokenizer(path, ["[UNK]"] + [f"w{i}" for i in range(1, TINY["vocab_size"])])
    return path


def complete(url: str, prompt: list[int], headers: dict[str, str] | None = None) -> None:
    reply = httpx.post(f"{url}/v1/completions", timeout=60, headers=headers, json={
        "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text


class Reader:
    """Reads ``/kv_events`` on a thread into a list of (event name, data)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.got = threading.Condition()
        self.url, self.headers = url, headers or {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._read()
        except httpx.HTTPError:  # the server stopped under the open stream: test over
            pass

    def _read(self) -> None:
        with httpx.stream("GET", f"{self.url}/kv_events", headers=self.headers,
                          timeout=30) as reply:
            name = None
            for line in reply.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    with self.got:
                        self.events.append((name or "", json.loads(line[6:])))
                        self.got.notify_all()

    def wait(self, pred: Any, timeout: float = 30) -> None:
        with self.got:
            assert self.got.wait_for(lambda: pred(self.events), timeout), self.events


def test_stream_reports_stored_then_evicted_blocks(tiny: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", block_size=4,
                                  num_kv_blocks=7, max_model_len=16))
    with serving(engine) as url:
        complete(url, PROMPT)  # stored before anyone listens: it is in the snapshot
        reader = Reader(url)
        reader.wait(lambda ev: len(ev) >= 1)
        name, snap = reader.events[0]
        assert name == "snapshot" and snap["block_size"] == 4
        held = {tuple(b["token_ids"]): b for b in snap["blocks"]}
        assert {tuple(PROMPT[0:4]), tuple(PROMPT[4:8]), tuple(PROMPT[8:12])} <= set(held)
        first, second = held[tuple(PROMPT[0:4])], held[tuple(PROMPT[4:8])]
        assert first["parent_hash"] is None and second["parent_hash"] == first["block_hash"]
        mine = {b["block_hash"] for b in snap["blocks"]}
        # other prompts need the pool's blocks: the LRU cached ones are evicted
        for k in range(4):
            complete(url, [20 + k + i % 3 for i in range(12)])
        reader.wait(lambda ev: mine <= {d["block_hash"] for n, d in ev if n == "evicted"})
        seqs = [d["seq"] for _, d in reader.events]
        assert seqs == list(range(snap["seq"], snap["seq"] + len(seqs)))  # no gap, no dup
        stored = [d for n, d in reader.events if n == "stored"]
        assert stored and all(len(d["token_ids"]) == 4 for d in stored)
        evicted = {d["block_hash"] for n, d in reader.events if n == "evicted"}
        # nothing is evicted that was never reported held
        assert evicted <= mine | {d["block_hash"] for d in stored}


def test_stream_is_behind_the_api_key(tiny: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", block_size=4))
    with serving(engine, api_key="k") as url:
        assert httpx.get(f"{url}/kv_events", timeout=10).status_code == 401
        reader = Reader(url, {"Authorization": "Bearer k"})
        reader.wait(lambda ev: ev and ev[0][0] == "snapshot")


def test_a_subscriber_too_far_behind_is_cut_off() -> None:
    import asyncio

    async def run() -> list[str]:
        log = BlockEventLog(block_size=4, max_backlog=2)
        events = log.events()
        assert (await events.__anext__())["type"] == "snapshot"
        for h in range(5):  # from another thread, as the engine's would
            await asyncio.to_thread(log.stored, h, None, (1, 2, 3, 4))
        await asyncio.sleep(0.05)
        return [e["type"] async for e in events]

    assert asyncio.run(run()) == ["stored", "stored", "overflow"]
