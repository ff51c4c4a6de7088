"""Drives a KVCacheManager the way the scheduler and engine do, writing fake K/V.

The fake K/V of a slot is the exact token prefix it encodes (K/V at position p depends on
tokens 0..p), so any prefix hit can be checked for content, and any write into a block
someone else can read (shared or cached) is caught at the moment it happens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from draftwise.cache.manager import KVCacheManager


@dataclass(slots=True)
class SimRequest:
    #: verified tokens; the last one (sampled, not yet fed) has no K/V
    tokens: list[int]
    #: tokens whose K/V is written (== len(tokens) - 1 while running)
    computed: int


class Sim:
    """A tiny scheduler + model over one manager, checking contents at every hit."""

    def __init__(
        self, kv: KVCacheManager, vocab: int = 3, seed: int = 0, as_numpy: bool = False
    ) -> None:
        self.kv = kv
        #: pass token ids as int64 arrays, as ``Request.all_token_ids`` does
        self.as_numpy = as_numpy
        self.bs = kv.block_size
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.fake: dict[int, tuple[int, ...]] = {}
        self.running: dict[str, SimRequest] = {}
        #: preempted requests, to be readmitted with all their tokens as the prompt
        self.waiting: dict[str, list[int]] = {}
        #: looked up (blocks attached) but not admitted for lack of blocks
        self.stalled: dict[str, list[int]] = {}
        self.hits = 0

    def ids(self, tokens: list[int]) -> list[int] | np.ndarray:
        return np.asarray(tokens, dtype=np.int64) if self.as_numpy else tokens

    def slot(self, rid: str, pos: int) -> int:
        return self.kv.block_table(rid)[pos // self.bs] * self.bs + pos % self.bs

    def write(self, rid: str, pos: int, prefix: list[int]) -> None:
        slot = self.slot(rid, pos)
        block = slot // self.bs
        assert block != 0, "wrote into the null block"
        assert self.kv.pool.ref_count(block) == 1, f"wrote into shared block {block}"
        assert self.kv.pool.entry(block) is None, f"wrote into cached block {block}"
        self.fake[slot] = tuple(prefix)

    def check_contents(self, rid: str, tokens: list[int], n: int) -> None:
        for p in range(n):
            got = self.fake.get(self.slot(rid, p))
            assert got == tuple(tokens[: p + 1]), f"{rid} position {p}: K/V of {got}"

    def check_table(self, rid: str) -> None:
        req = self.running[rid]
        assert len(self.kv.block_table(rid)) == -(-req.computed // self.bs)
        self.check_contents(rid, req.tokens, req.computed)

    # -- operations ---------------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int], keep_on_failure: bool = False) -> bool:
        """Look up, allocate the whole prompt, 'prefill' it and sample one token."""
        cached = self.kv.get_computed_blocks(rid, self.ids(prompt))
        assert cached % self.bs == 0 and cached < len(prompt)
        self.hits += cached
        self.check_contents(rid, prompt, cached)
        return self._prefill(rid, prompt, cached, keep_on_failure)

    def _prefill(self, rid: str, prompt: list[int], cached: int, keep_on_failure: bool) -> bool:
        if not self.kv.allocate_slots(rid, len(prompt)):
            if keep_on_failure:
                self.stalled[rid] = prompt
            else:
                self.kv.free(rid)
            return False
        for p in range(cached, len(prompt)):
            self.write(rid, p, prompt[: p + 1])
        tokens = [*prompt, self.rng.randrange(self.vocab)]
        self.running[rid] = SimRequest(tokens, len(prompt))
        self.kv.truncate(rid, len(prompt))
        self.kv.cache_blocks(rid, self.ids(tokens), len(prompt))
        self.check_table(rid)
        return True

    def retry_stalled(self, rid: str) -> bool:
        prompt = self.stalled.pop(rid)
        cached = self.kv.num_cached_tokens(rid)
        return self._prefill(rid, prompt, cached, keep_on_failure=True)

    def decode(self, rid: str, drafts: list[int], accepted: int, bonus: int) -> bool:
        """One verify step: feed the last token and drafts, keep ``accepted`` of them."""
        req = self.running[rid]
        c = req.computed
        if not self.kv.allocate_slots(rid, c + 1 + len(drafts)):
            self.preempt(rid)
            return False
        self.write(rid, c, req.tokens[: c + 1])
        for i in range(len(drafts)):
            self.write(rid, c + 1 + i, req.tokens[: c + 1] + drafts[: i + 1])
        req.tokens += [*drafts[:accepted], bonus]
        req.computed = c + 1 + accepted
        self.kv.truncate(rid, req.computed)
        self.kv.cache_blocks(rid, self.ids(req.tokens), req.computed)
        self.check_table(rid)
        return True

    def preempt(self, rid: str) -> None:
        self.kv.free(rid)
        self.waiting[rid] = self.running.pop(rid).tokens

    def finish(self, rid: str) -> None:
        self.kv.free(rid)
        del self.running[rid]

    def abort_stalled(self, rid: str) -> None:
        self.kv.free(rid)
        del self.stalled[rid]

    def check(self) -> None:
        self.kv.check_invariants()
        assert self.kv.num_requests == len(self.running) + len(self.stalled)
        assert self.kv.num_free_blocks + self.kv.num_used_blocks == self.kv.capacity
        for rid in self.running:
            self.check_table(rid)

    def random_op(self, next_id: int) -> None:
        """One random scheduler action (used by the seeded op-sequence tests)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.25 or not (self.running or self.waiting or self.stalled):
            prompt = [rng.randrange(self.vocab) for _ in range(rng.randint(1, 12))]
            self.admit(f"r{next_id}", prompt, keep_on_failure=rng.random() < 0.3)
        elif roll < 0.7 and self.running:
            rid = rng.choice(sorted(self.running))
            drafts = [rng.randrange(self.vocab) for _ in range(rng.randint(0, 4))]
            self.decode(rid, drafts, rng.randint(0, len(drafts)), rng.randrange(self.vocab))
        elif roll < 0.8 and self.running:
            self.finish(rng.choice(sorted(self.running)))
        elif roll < 0.87 and self.running:
            self.preempt(rng.choice(sorted(self.running)))
        elif roll < 0.95 and self.waiting:
            rid = rng.choice(sorted(self.waiting))
            self.admit(rid, self.waiting.pop(rid))
        elif self.stalled:
            rid = rng.choice(sorted(self.stalled))
            if rng.random() < 0.5:
                self.retry_stalled(rid)
            else:
                self.abort_stalled(rid)
