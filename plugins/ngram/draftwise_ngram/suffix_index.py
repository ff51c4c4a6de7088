"""Suffix decoding's index: token streams where the context's suffix is matched and continued.

Arctic Inference's suffix decoding (vLLM's ``suffix`` method) keeps suffix trees of depth
``D = max_tree_depth``: one over the request's own context, one over the outputs of
earlier (and running) requests. A tree of depth D holds every substring of length <= D
with its count (how many places it occurs). This module gives the same answers without
a tree, from the streams themselves and an inverted index:

- ``buf[p]`` the token at slot ``p``; ``prev[p]`` / ``nxt[p]`` the slots of the tokens
  before and after it in the same stream (``NONE`` at a stream's ends), and ``ptok[p]`` /
  ``ntok[p]`` those tokens themselves (so the large first steps over a common token's
  slots are one ordered gather each, not a pointer chase across the array). Streams grow
  interleaved (every running request appends each step), so each is a linked run of
  slots in one array, and a lookup over all streams is a few vectorised gathers;
- ``postings[t]``: the slots holding token ``t`` (``array('i')``, in slot order).

The occurrences of the context's last ``m`` tokens are the slots ``p`` holding its last
token whose ``m - 1`` predecessors match too: start from ``postings[last]`` and keep the
slots whose ``prev`` chain matches one more token per step (as the n-gram scan does).
The count of a substring is the number of its occurrences; the count of it followed by
token ``t`` is the number whose ``nxt`` holds ``t``. That is the tree's node count.

The proposal (:func:`speculate`, Arctic's ``SuffixTree::speculate`` with path drafts):

1. the pattern is the context's last ``min(len, D)`` tokens; match lengths ``m`` run from
   1 to ``len(pattern) - 1`` while the pattern's last ``m`` tokens occur at all;
2. for each ``m``, a draft walks from the occurrences: the next token is the most
   frequent continuation (ties: the smallest token id; Arctic's map order is unspecified),
   its probability the continuation's count over the match's count, multiplied along the
   path (``count(match + draft[:i]) / count(match)``); the draft stops before a token
   whose probability falls below ``min_token_prob``, at ``floor(m * max_spec_factor)``
   tokens, at ``max_spec_tokens``, where no occurrence continues, or at depth D
   (``m + len(draft) <= D``: the tree holds nothing deeper);
3. a draft's score is the sum of its probabilities; the highest score wins, a tie going to
   the longer match (Arctic walks ``m`` upwards and keeps ``>=``). Here ``m`` is walked
   downwards with a strict ``>``, skipping a length whose best possible score
   (``min(floor(m * factor), D - m, max_spec_tokens)``) cannot beat the best so far;
4. the request's own index and the global one each propose; the global draft is taken
   only when it scores strictly higher (Arctic: ``local if local.score >= global.score``).

Counts include the occurrence at the very end of a stream (the context's own suffix, in
the request's index): it has no continuation, so it lowers probabilities as in Arctic.

**Memory.** A slot costs 20 bytes in the five int32 arrays plus ~4.5 in the postings
(4 bytes and ``array``'s growth slack); each distinct token's postings array adds ~160
bytes. Measured: about 25 bytes per cached output token (``benchmarks/agentic.py``: 2.7
MB per 1,000 requests of ~107 tokens). :class:`GlobalIndex` keeps every isolation key's
streams within one budget in bytes (:data:`DEFAULT_BUDGET_BYTES`, 64 MiB: about 2.4M
tokens, vLLM's default of 10,000 cached requests at ~240 tokens each): past it, the
oldest cached outputs are evicted first, across keys, and the streams compacted, so
what is allocated stays under the budget.

**Cost.** A lookup is O(occurrences of the context's last token) in the first two
steps (one ordered gather over its slots for the match, one for the continuation
counts), then O(survivors). Measured on the 2-core test machine under load, 2M cached
tokens: ~0.8 ms for a random context, ~4-9 ms for one ending in a token that is 10% of
the corpus (190k slots). That, not memory, is why the default budget is 64 MiB rather
than room for vLLM's 10,000 requests at any length: the budget bounds the per-step
cost too. A larger one is a ``GlobalIndex(budget_bytes=...)`` away. An evicted stream's slots are marked dead
(``buf = NONE``) and skipped by every lookup; a key's streams are compacted (dead slots
dropped, postings rebuilt) once dead slots outnumber live ones, so the work is
amortised O(1) a token.

**Why not a library.** ``arctic-inference`` (what vLLM imports for ``suffix``) is a vLLM
plugin package; its tree is a compiled extension inside it, not a library of its own.
The suffix-tree packages on PyPI (``suffix-tree``, ``suffix-trees``, ``suffixtree``,
``csuffixtree``) and suffix-array ones (``pydivsufsort``, ``suffix-array``) build over
fixed strings: none appends to many growing sequences, limits depth, counts
continuations, or evicts, which is this index's whole job.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

#: no slot (a stream's first token has no ``prev``, its last no ``nxt``; a dead slot's token)
NONE = -1
#: bytes a slot costs: its five int32 entries plus its postings entry with slack
SLOT_BYTES = 25
_ARRAYS = ("buf", "prev", "nxt", "ptok", "ntok")
#: bytes a distinct token's postings array costs beyond its entries (object, dict slot)
POSTINGS_BYTES = 160
#: the global index's default budget across all isolation keys
DEFAULT_BUDGET_BYTES = 64 * 1024 * 1024
_MIN_GROW = 256


@dataclass(slots=True)
class Draft:
    """One index's proposal: the tokens, each one's estimated probability, and the match."""

    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0

    @property
    def score(self) -> float:
        """Expected accepted tokens, as Arctic scores a draft: the sum of probabilities."""
        return float(sum(self.probs))


class TokenStreams:
    """Streams of tokens in one slot array, with the inverted index a lookup needs."""

    __slots__ = ("buf", "prev", "nxt", "ptok", "ntok", "postings", "size", "dead", "_tail")

    def __init__(self) -> None:
        self.buf = np.full(0, NONE, dtype=np.int32)  # [capacity] token per slot
        self.prev = np.full(0, NONE, dtype=np.int32)  # [capacity] slot before, same stream
        self.nxt = np.full(0, NONE, dtype=np.int32)  # [capacity] slot after, same stream
        self.ptok = np.full(0, NONE, dtype=np.int32)  # [capacity] token before, same stream
        self.ntok = np.full(0, NONE, dtype=np.int32)  # [capacity] token after, same stream
        #: token -> its slots, ascending (dead ones included until compaction)
        self.postings: dict[int, array[int]] = {}
        #: slots used (live and dead)
        self.size = 0
        self.dead = 0
        #: stream handle -> [first slot, last slot, length]
        self._tail: dict[int, list[int]] = {}

    # -- building -------------------------------------------------------------------------

    @property
    def live(self) -> int:
        """Slots holding a token of a stream still kept."""
        return self.size - self.dead

    def _reserve(self, n: int) -> None:
        """Room for ``n`` more slots (grown by 1/8, so slack stays small beside a budget)."""
        need = self.size + n
        cap = self.buf.shape[0]
        if need <= cap:
            return
        new = max(need, cap + cap // 8, cap + _MIN_GROW)
        for name in _ARRAYS:
            old = getattr(self, name)
            grown = np.full(new, NONE, dtype=np.int32)
            grown[: self.size] = old[: self.size]
            setattr(self, name, grown)

    def extend(self, handle: int, tokens: list[int]) -> None:
        """Append ``tokens`` to stream ``handle`` (a new handle starts a stream)."""
        if not tokens:
            return
        self._reserve(len(tokens))
        n, start = len(tokens), self.size
        slots = np.arange(start, start + n, dtype=np.int32)
        self.buf[start : start + n] = tokens
        tail = self._tail.get(handle)
        self.prev[start + 1 : start + n] = slots[:-1]
        self.nxt[start : start + n - 1] = slots[1:]
        self.ptok[start + 1 : start + n] = tokens[:-1]
        self.ntok[start : start + n - 1] = tokens[1:]
        if tail is None:
            self._tail[handle] = [start, start + n - 1, n]
        else:
            self.prev[start] = tail[1]
            self.ptok[start] = self.buf[tail[1]]
            self.nxt[tail[1]] = start
            self.ntok[tail[1]] = tokens[0]
            tail[1], tail[2] = start + n - 1, tail[2] + n
        postings = self.postings
        for i, t in enumerate(tokens):
            p = postings.get(t)
            if p is None:
                p = postings[t] = array("i")
            p.append(start + i)
        self.size += n

    def remove(self, handle: int) -> int:
        """Mark stream ``handle``'s slots dead; returns how many it had."""
        tail = self._tail.pop(handle, None)
        if tail is None:
            return 0
        slot, nxt, buf = tail[0], self.nxt, self.buf
        while slot != NONE:  # (one pass over the stream's slots, in order)
            buf[slot] = NONE
            slot = int(nxt[slot])
        self.dead += tail[2]
        return tail[2]

    def stream_length(self, handle: int) -> int:
        """Tokens in stream ``handle`` (0: none)."""
        tail = self._tail.get(handle)
        return 0 if tail is None else tail[2]

    def compact(self) -> None:
        """Drop dead slots: renumber the live ones in order, rebuild the postings."""
        live = np.flatnonzero(self.buf[: self.size] != NONE).astype(np.int32)
        new_of = np.full(self.size + 1, NONE, dtype=np.int32)  # old slot -> new (NONE: -1 -> -1)
        new_of[live] = np.arange(live.shape[0], dtype=np.int32)
        n = live.shape[0]
        cap = n + max(_MIN_GROW, n // 8)
        new = {name: np.full(cap, NONE, dtype=np.int32) for name in _ARRAYS}
        for name in ("buf", "ptok", "ntok"):
            new[name][:n] = getattr(self, name)[live]
        # a live slot's neighbours are live (streams die whole); NONE maps to new_of[-1] = NONE
        new["prev"][:n] = new_of[self.prev[live]]
        new["nxt"][:n] = new_of[self.nxt[live]]
        for name in _ARRAYS:
            setattr(self, name, new[name])
        buf = self.buf
        self.postings = {}
        if n:
            order = np.argsort(buf[:n], kind="stable").astype(np.int32)
            toks = buf[:n][order]
            cuts = np.flatnonzero(np.diff(toks)) + 1
            for run in np.split(order, cuts):
                a = array("i")
                a.frombytes(run.tobytes())
                self.postings[int(buf[run[0]])] = a
        for tail in self._tail.values():
            tail[0], tail[1] = int(new_of[tail[0]]), int(new_of[tail[1]])
        self.size, self.dead = n, 0

    def nbytes(self) -> int:
        """Bytes allocated: the three arrays and the postings (objects included)."""
        arrays = sum(getattr(self, name).nbytes for name in _ARRAYS)
        postings = sys.getsizeof(self.postings) + sum(
            sys.getsizeof(a) + 32 for a in self.postings.values())  # (+ the key's int)
        return arrays + postings

    # -- lookup ---------------------------------------------------------------------------

    def occurrences(self, pattern: list[int]) -> list[np.ndarray]:
        """``out[m - 1]``: the slots ending an occurrence of ``pattern[-m:]``, for
        ``m = 1 .. len(pattern) - 1`` while there is one (rule 1)."""
        if len(pattern) < 2:
            return []
        p = self.postings.get(pattern[-1])
        if p is None:
            return []
        # (a view, dropped before anything appends: an exported array cannot grow)
        ends = np.frombuffer(p, dtype=np.int32)
        if self.dead:
            ends = ends[self.buf[ends] == pattern[-1]]
        if ends.size == 0:
            return []
        out = [ends]
        back = ends  # the slot of the earliest pattern token matched so far
        for j in range(1, len(pattern) - 1):
            keep = self.ptok[back] == pattern[-1 - j]  # (NONE, a stream's start, never is)
            ends = ends[keep]
            if ends.size == 0:
                break
            out.append(ends)
            back = self.prev[back[keep]]
        return out

    def walk(self, ends: np.ndarray, limit: int, min_prob: float) -> Draft:
        """Rule 2: the most frequent continuation of the occurrences ``ends``, token by
        token, while its probability stays >= ``min_prob`` (at most ``limit`` tokens)."""
        draft = Draft()
        total = ends.shape[0]
        cur = ends
        while len(draft.token_ids) < limit:
            following = self.ntok[cur]  # (NONE: nothing follows yet)
            toks = following[following != NONE]
            if toks.size == 0:
                break
            if toks.size <= 32:  # (a few: Python beats numpy's fixed costs)
                counts: dict[int, int] = {}
                for t in toks.tolist():
                    counts[t] = counts.get(t, 0) + 1
                tok, count = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
            else:  # (a count per token id: O(n + vocab), no sort of a common token's slots)
                nums = np.bincount(toks)
                tok = int(np.argmax(nums))  # (first max: the smallest token id)
                count = int(nums[tok])
            prob = count / total  # count(match + draft + tok) / count(match)
            if prob < min_prob:
                break
            draft.token_ids.append(tok)
            draft.probs.append(prob)
            cur = self.nxt[cur[following == tok]]
        return draft


def spec_limit(match_len: int, max_spec_tokens: int, max_spec_factor: float, depth: int) -> int:
    """The most tokens a draft after a match of ``match_len`` may have (rules 2 and 3)."""
    by_factor = int(match_len * max_spec_factor + 1e-6)  # (Arctic's rounding)
    return max(0, min(max_spec_tokens, by_factor, depth - match_len))


def speculate(
    streams: TokenStreams, context: list[int], max_spec_tokens: int,
    max_spec_factor: float, min_token_prob: float, depth: int,
) -> Draft:
    """The best-scoring draft ``streams`` give ``context`` (module docstring, rules 1-3)."""
    pattern = context[-depth:]
    occ = streams.occurrences(pattern)
    best: Draft | None = None
    for m in range(len(occ), 0, -1):
        limit = spec_limit(m, max_spec_tokens, max_spec_factor, depth)
        if best is not None and limit <= best.score:
            continue  # (its score is at most ``limit``: it cannot win)
        draft = streams.walk(occ[m - 1], limit, min_token_prob)
        draft.match_len = m
        if best is None or draft.score > best.score:
            best = draft
    return best if best is not None else Draft()


@dataclass(slots=True)
class _Cached:
    """One request's output in the global index."""

    key: str
    handle: int
    #: the request is running (its prompt index exists); its output still grows
    active: bool = True


class GlobalIndex:
    """Outputs of earlier and running requests, one :class:`TokenStreams` per isolation
    key, evicted oldest first past ``max_cached_requests`` or the byte budget.

    The budget is checked from counters every :data:`_CHECK_EVERY` appended tokens (so
    a step costs O(1) however many keys there are; the index may pass the budget by that
    many tokens' worth, ~70 KB, between checks)."""

    def __init__(self, max_cached_requests: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.max_cached_requests = max_cached_requests
        self.budget_bytes = budget_bytes
        self.streams: dict[str, TokenStreams] = {}
        #: req_id -> its cached output, oldest first (the FIFO eviction order)
        self.cached: OrderedDict[str, _Cached] = OrderedDict()
        self._handles = 0
        self._unchecked = 0
        self.num_evicted = 0

    def start(self, req_id: str, key: str) -> None:
        """A request starts recording its output under ``key`` (a cached output of the same
        id is dropped first, as Arctic's ``start_request``)."""
        if req_id in self.cached:
            self._evict(req_id)
        if self.max_cached_requests <= 0:
            return
        self._handles += 1
        self.cached[req_id] = _Cached(key, self._handles)
        while len(self.cached) > self.max_cached_requests:
            self._evict(next(iter(self.cached)))

    def is_recording(self, req_id: str) -> bool:
        """Whether ``req_id``'s output is still cached (eviction may have taken it)."""
        return req_id in self.cached

    def extend(self, req_id: str, tokens: list[int]) -> None:
        """Append output tokens of a running request, then keep within the budget."""
        entry = self.cached.get(req_id)
        if entry is None or not tokens:
            return
        streams = self.streams.get(entry.key)
        if streams is None:
            streams = self.streams[entry.key] = TokenStreams()
        streams.extend(entry.handle, tokens)
        self._unchecked += len(tokens)
        if self._unchecked >= _CHECK_EVERY or self.budget_bytes < _SMALL_BUDGET:
            self._unchecked = 0
            if self.estimated_bytes() > self.budget_bytes:
                self._shrink()

    def stop(self, req_id: str) -> None:
        """The request left the running set; its output stays cached."""
        entry = self.cached.get(req_id)
        if entry is not None:
            entry.active = False

    def speculate(self, key: str, context: list[int], max_spec_tokens: int,
                  max_spec_factor: float, min_token_prob: float, depth: int) -> Draft:
        """The best draft from ``key``'s outputs (empty for a key with none)."""
        streams = self.streams.get(key)
        if streams is None or streams.live == 0:
            return Draft()
        return speculate(streams, context, max_spec_tokens, max_spec_factor,
                         min_token_prob, depth)

    # -- budget ---------------------------------------------------------------------------

    def estimated_bytes(self) -> int:
        """What the streams hold, from counters (no walk over the postings)."""
        return sum(_allocated(s) for s in self.streams.values())

    def nbytes(self) -> int:
        """Bytes allocated by every key's streams, measured (slower: for tests, reports)."""
        return sum(s.nbytes() for s in self.streams.values())

    @property
    def num_tokens(self) -> int:
        """Live tokens across keys."""
        return sum(s.live for s in self.streams.values())

    def _evict(self, req_id: str) -> int:
        """Drop one cached output; a key's streams are compacted once mostly dead, and
        dropped once empty. Returns the tokens it held."""
        entry = self.cached.pop(req_id)
        self.num_evicted += 1
        streams = self.streams.get(entry.key)
        if streams is None:
            return 0
        n = streams.remove(entry.handle)
        if streams.live == 0:
            del self.streams[entry.key]  # (a later append makes a new one)
        elif streams.dead >= streams.live:
            streams.compact()
        return n

    def _shrink(self) -> None:
        """Evict oldest outputs until what stays fits 7/8 of the budget once compacted,
        then compact (each shrink frees 1/8 of the budget: amortised O(1) a token)."""
        target = self.budget_bytes * 7 // 8
        live = sum(_compacted(s) for s in self.streams.values())
        while self.cached and live > target:
            live -= self._evict(next(iter(self.cached))) * (SLOT_BYTES + 3)
        for streams in self.streams.values():
            if streams.dead:
                streams.compact()


#: tokens appended between budget checks (a check sums over the keys)
_CHECK_EVERY = 4096
#: below this budget (tests) every append is checked
_SMALL_BUDGET = 64 * 1024 * 1024


def _allocated(s: TokenStreams) -> int:
    """A key's streams' bytes as allocated: arrays by capacity, postings by entries."""
    return s.buf.shape[0] * 20 + s.size * (SLOT_BYTES - 20) + len(s.postings) * POSTINGS_BYTES


def _compacted(s: TokenStreams) -> int:
    """The same once compacted: live slots, 1/8 growth slack, the first block."""
    return (s.live * (SLOT_BYTES + 3) + _MIN_GROW * 20
            + len(s.postings) * POSTINGS_BYTES)


__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "Draft",
    "GlobalIndex",
    "TokenStreams",
    "spec_limit",
    "speculate",
]
