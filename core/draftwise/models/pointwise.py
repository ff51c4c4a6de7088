"""Elementwise torch ops whose every element's bits do not depend on the tensor's size.

torch's CPU kernels for transcendental elementwise ops (exp, sigmoid, softplus, silu,
rsqrt) run a SIMD loop over whole vectors and finish the tail with other code that
rounds differently on some machines (seen on AVX2: ``sigmoid(x)[0]`` differs between a
4-element and a 1-element tensor). A decode row and the same position inside a verify
or a batch then differ in the last bit, and greedy speculation drifts from speculation
off. :func:`lanewise` runs ``fn`` on a flat copy padded to a whole number of vectors, so
every element goes through the same vector code whatever the shape. Use it for every
transcendental op on a path whose size depends on the batch (the GDN gates, the output
gates, activations not done by a C kernel). Arithmetic (+, *, /) rounds the same either
way and needs no wrapper.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: elements per padded call: a multiple of every SIMD width and unroll torch uses on CPU
QUANTUM = 64


def lanewise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn``, each element computed by full-vector code."""
    flat = x.reshape(-1)
    n = flat.numel()
    pad = (-n) % QUANTUM
    buf = torch.cat((flat, flat.new_zeros(pad))) if pad else flat.contiguous()
    return fn(buf)[:n].view(x.shape)
