"""A request's n-gram index: the prompt lookup in a few dict probes, kept as it grows.

:func:`~draftwise_ngram.proposer.longest_earlier_match` scans the whole context with
numpy every step: about a dozen small array operations, each a few microseconds warm but
5-10x that right after a target forward has streamed the weights through the caches
(measured in the engine on the default model: ~95 us a step, the largest single part of
adaptive depth's per-step cost on open text, where the drafts net about nothing).

The context only grows, so this index keeps, for every length ``n <= max_n``, the
earliest end position of each n-gram seen (ends before the context's last token, as the
lookup requires), and adds the few new ends each step. The lookup is then:

- the longest earlier match: probe lengths 1, 2, ... while the suffix's n-gram is in the
  index (an occurrence of the suffix's ``n+1``-gram is one of its ``n``-gram too, so the
  first miss ends the search: open text usually stops after two probes);
- its earliest occurrence: the position stored for that length.

Both are the numpy lookup's answers exactly (tested against it on random contexts).
Memory is ``max_n`` dict entries a context token (~0.1 KB each), so the proposer indexes
only for ``prompt_lookup_max <= INDEX_MAX_N`` (vLLM's default is 5) and contexts of at
most :data:`INDEX_MAX_TOKENS` (a few MB a request), and scans otherwise: past that length
a scan's tens of microseconds are small beside the forward over such a context.
"""

from __future__ import annotations

import numpy as np

#: the longest ``prompt_lookup_max`` indexed (entries a token grow with it, and keys of
#: length n cost O(n) each: past this the numpy scan's O(len) a step is the better buy)
INDEX_MAX_N = 8
#: the longest context indexed; a longer one drops its index and is scanned
INDEX_MAX_TOKENS = 8192


class NgramIndex:
    """The earliest end of every n-gram (``n <= max_n``) of one request's context."""

    __slots__ = ("_first", "_indexed", "max_n", "seq")

    def __init__(self, max_n: int) -> None:
        if not 1 <= max_n <= INDEX_MAX_N:
            raise ValueError(f"an n-gram index covers max_n 1..{INDEX_MAX_N}, got {max_n}")
        self.max_n = max_n
        #: the context indexed so far (a copy, as the Python ints its keys are made of)
        self.seq: list[int] = []
        #: ``_first[n - 1]``: n-gram (the token itself for n = 1, else a tuple) -> the
        #: earliest index it ends at
        self._first: list[dict[object, int]] = [{} for _ in range(max_n)]
        #: end positions ``0 .. _indexed - 1`` are in ``_first``
        self._indexed = 0

    def sync(self, tokens: np.ndarray) -> bool:
        """Bring the index up to ``tokens`` (``[num_tokens]``, the row's context).

        False, with nothing changed, when ``tokens`` does not extend the context indexed
        so far (shorter, or a different token where they overlap at the last indexed
        position and the first): the caller builds a fresh index. The core only appends
        to a request's tokens, so this is a guard, not a path a request takes.
        """
        seq = self.seq
        old, n = len(seq), int(tokens.shape[0])
        if n < old:
            return False
        if old:  # (the overlap and the new tokens in one conversion: this runs every step)
            new = tokens[old - 1 :].tolist()
            if new[0] != seq[-1] or int(tokens[0]) != seq[0]:
                return False
            seq.extend(new[1:])
        else:
            seq.extend(tokens.tolist())
        first, max_n = self._first, self.max_n
        for end in range(self._indexed, n - 1):  # an occurrence ends before the last token
            first[0].setdefault(seq[end], end)
            for m in range(2, min(max_n, end + 1) + 1):
                first[m - 1].setdefault(tuple(seq[end - m + 1 : end + 1]), end)
        self._indexed = max(self._indexed, n - 1)
        return True

    def following(self, end: int, k: int) -> list[int]:
        """Up to ``k`` tokens of the context after index ``end`` (a draft, as ints)."""
        return self.seq[end + 1 : end + 1 + k]

    def longest_match(self) -> tuple[int, int] | None:
        """(length <= max_n, end index) of the earliest occurrence of the longest suffix
        that occurred before; None when the last token never did (as the numpy lookup)."""
        seq, first = self.seq, self._first
        n = len(seq)
        if n < 2:
            return None
        end = first[0].get(seq[-1])
        if end is None:
            return None
        length = 1
        for m in range(2, min(self.max_n, n - 1) + 1):
            longer = first[m - 1].get(tuple(seq[n - m :]))
            if longer is None:
                break
            length, end = m, longer
        return length, end


__all__ = ["INDEX_MAX_N", "INDEX_MAX_TOKENS", "NgramIndex"]
