"""DSpark's greedy Markov pass (``core/csrc/markov.c``): the kit's one method-specific
C primitive, checked and wrapped here.

Why in the core and not in ``draftwise_dspark``: ``markov.c`` runs on the core's packed
bf16 GEMM tiles (``gemm_bf16.h``: ``dw_gemm_bf16_block``) and its worker pool
(``threadpool.h``), linked into the one extension ``draftwise._cpu_kernels``. A plugin
extension of its own would need those exported across shared objects (a C-API capsule)
or copied, and ``install.sh``'s ``pip install -e plugins/dspark`` a C build of its own
(with its own fallback when no compiler is there). So the C stays where its GEMM is,
and the kit declares the pass by name (``draftwise.kit``: :func:`markov_kernel_head`,
:func:`markov_pass`, :class:`MarkovKernelHead`, :func:`markov_pass_built`), where it
used to hand plugins the whole ``models.kernels`` module.

Like every wrapper in ``models.kernels`` (whose ``_kernel`` lookup and checks this
shares), a head is checked once where it is made and a call checks only its
activations; a wrong input is a :class:`~draftwise.models.kernels.KernelInputError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from draftwise.models.kernels import BF16, KernelInputError, _kernel, available, kernel_threads

if TYPE_CHECKING:
    from draftwise.models.packed_types import PackedBf16


def markov_pass_built() -> bool:
    """Whether this install built the pass (else the plugin runs its torch pass)."""
    return available("markov_pass")


#: markov.c's head types
MARKOV_KINDS = {"vanilla": 0, "gated": 1, "rnn": 2}
#: markov.c's counters, in its order: lanes screened, kept picks the screen certified, W2
#: products and their lanes, guesses checked and held, picks kept; wall ns per phase
MARKOV_STATS = ("screened", "certified", "products", "product_lanes", "guesses",
                "guesses_held", "kept", "ns_latent", "ns_screen", "ns_guess", "ns_product")


@dataclass(frozen=True, slots=True)
class MarkovKernelHead:
    """A DSpark Markov head's tensors, checked by :func:`markov_kernel_head` (kept alive:
    the addresses are theirs)."""

    kind: int
    vocab: int  # W2's rows: the draft vocabulary
    rank: int
    hidden_size: int
    tensors: tuple[object, ...]
    #: w1, packed W2, norms (or 0), packed gate/joint (or 0), its bias (or 0), tables,
    #: d2t (or 0)
    addresses: tuple[int, int, int, int, int, int, int]
    #: W1's rows: the verifier vocabulary (``vocab`` unless the draft's is reduced)
    w1_rows: int


def _markov_tensor(what: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype = BF16
                 ) -> None:
    if t.dtype != dtype or not t.is_contiguous() or not t.is_cpu or tuple(t.shape) != shape:
        raise KernelInputError(f"markov_pass: {what} must be contiguous {dtype} {list(shape)} "
                               f"on the CPU, got {t.dtype} {list(t.shape)} on {t.device}")


def markov_kernel_head(
    kind: str, w1: torch.Tensor, w2: PackedBf16, tables: torch.Tensor, hidden_size: int,
    latent: tuple[PackedBf16, torch.Tensor] | None = None, norms: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
) -> MarkovKernelHead:
    """Check a head for :func:`markov_pass`: ``w1`` bf16 [V1, r], ``w2`` packed [V, r],
    ``tables`` int16 [2, 65536] (torch's bf16 sigmoid and tanh of each bf16 bit pattern),
    ``latent`` the packed ``gate_proj`` [r, H + r] (gated) or ``joint_proj`` [3r, 2r + H]
    (rnn) with its bf16 bias, ``norms`` fp32 [V] ``|W2[v]|`` (the screen; None: none),
    ``d2t`` int64 [V] the W1 row (verifier id) of each draft index, each in [0, V1), for a
    reduced draft vocabulary (None: V1 = V, the identity)."""
    if kind not in MARKOV_KINDS:
        raise KernelInputError(f"markov_pass: kind {kind!r} is not one of {list(MARKOV_KINDS)}")
    v1, r = (int(n) for n in w1.shape) if w1.dim() == 2 else (0, 0)
    _markov_tensor("w1", w1, (v1, r))
    v = int(w2.out_features) if d2t is not None else v1
    if (w2.out_features, w2.in_features) != (v, r) or not 0 < v < 2**31 or v1 >= 2**31:
        raise KernelInputError(f"markov_pass: W2 is [{w2.out_features}, {w2.in_features}], "
                               f"W1 [{v1}, {r}]" + ("" if d2t is None else f", d2t [{v}]"))
    if d2t is not None:
        _markov_tensor("d2t", d2t, (v,), torch.int64)
        if bool(((d2t < 0) | (d2t >= v1)).any()):
            raise KernelInputError(f"markov_pass: d2t holds ids outside W1's {v1} rows")
    _markov_tensor("tables", tables, (2, 65536), torch.int16)
    want = {"vanilla": None, "gated": (r, hidden_size + r), "rnn": (3 * r, 2 * r + hidden_size)}
    shape = want[kind]
    if (shape is None) != (latent is None):
        raise KernelInputError(f"markov_pass: a {kind} head takes "
                               f"{'no latent projection' if shape is None else 'its projection'}")
    lat_w = lat_b = 0
    if latent is not None and shape is not None:
        weight, bias = latent
        if (weight.out_features, weight.in_features) != shape:
            raise KernelInputError(f"markov_pass: the {kind} projection must be {list(shape)}, "
                                   f"got [{weight.out_features}, {weight.in_features}]")
        _markov_tensor("projection bias", bias, (shape[0],))
        lat_w, lat_b = weight.address, bias.data_ptr()
    if norms is not None:
        _markov_tensor("row norms", norms, (v,), torch.float32)
    return MarkovKernelHead(
        MARKOV_KINDS[kind], v, r, hidden_size, (w1, w2, tables, latent, norms, d2t),
        (w1.data_ptr(), w2.address, 0 if norms is None else norms.data_ptr(), lat_w, lat_b,
         tables.data_ptr(), 0 if d2t is None else d2t.data_ptr()), v1)


def markov_pass(
    head: MarkovKernelHead,
    hidden: torch.Tensor,  # [N, H] bf16, the slots' hidden states, row-major
    base: torch.Tensor,  # [N, V] fp32 base logits
    counts: Sequence[int],  # [R] drafts per row (row r's slots follow the earlier rows')
    anchors: Sequence[int],  # [R] each row's previous token at its first slot (W1's row)
    *, depth: int, lanes: int, screen: bool, give_up: int, max_blocks: int, guess_tokens: int,
    w2_rows: torch.Tensor | None = None,  # [V, r] bf16 dense W2, for the guesses
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:  # tokens [N], previous tokens [N]
    """DSpark's greedy Markov pass (``core/csrc/markov.c``): per row, ``argmax(base_j +
    W2 u_j)`` left to right. Tokens are W2's row indices, previous tokens W1's rows (the
    head's ``d2t`` of the pick before, or the anchor). ``depth``: guessed positions per
    window past the first, ``lanes``: lanes per round, ``screen``: try the certified pick,
    given up after ``give_up`` misses in a row or past ``max_blocks`` blocks;
    ``guess_tokens``: the base tokens a guess scores. These move time only, never a token."""
    kern = _kernel("markov_pass")
    v, r, h = head.vocab, head.rank, head.hidden_size
    n = base.shape[0] if base.dim() == 2 else -1
    _markov_tensor("base", base, (n, v), torch.float32)
    _markov_tensor("hidden", hidden, (n, h))
    if w2_rows is not None:
        _markov_tensor("W2 rows", w2_rows, (v, r))
    rows = len(counts)
    cnt = torch.tensor(list(counts), dtype=torch.int64)
    anc = torch.tensor(list(anchors), dtype=torch.int64)
    if anc.numel() != rows:
        raise KernelInputError(f"markov_pass: {rows} counts but {anc.numel()} anchors")
    tok, prev = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
    stats = torch.zeros(len(MARKOV_STATS), dtype=torch.int64)
    w1, w2, norms, lat_w, lat_b, tables, d2t = head.addresses
    try:
        kern.markov_pass(
            w1, w2, 0 if w2_rows is None else w2_rows.data_ptr(), norms, lat_w, lat_b, tables,
            hidden.data_ptr(), base.data_ptr(), cnt.data_ptr(), anc.data_ptr(), tok.data_ptr(),
            prev.data_ptr(), stats.data_ptr(), d2t, head.kind, v, r, h, rows, n, depth, lanes,
            int(screen and norms != 0), give_up, max_blocks, guess_tokens, kernel_threads(),
            head.w1_rows)
    except ValueError as e:  # counts that do not sum to N, an anchor outside the vocabulary
        raise KernelInputError(str(e)) from None
    return tok, prev, dict(zip(MARKOV_STATS, stats.tolist()))
