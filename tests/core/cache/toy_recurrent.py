"""A toy recurrent layer that follows ``RecurrentStatePool``'s verify-step contract.

Per layer: a causal conv over the last K inputs (state: the last K-1 inputs, like GDN's
conv state) feeding ``h_t = a * h_{t-1} + W u_t`` (fp32). Each row is run with the same
per-token op on the same shapes as the sequential reference, so committed states can be
compared bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftwise.cache.recurrent import RecurrentStatePool

HIDDEN = 6
IN_DIM = 5
KERNEL = 4


def state_shapes() -> dict[str, tuple[int, ...]]:
    """The pool's named per-layer state shapes for this layer."""
    return {"h": (HIDDEN,), "conv": (IN_DIM, KERNEL - 1)}


@dataclass(slots=True)
class ToyRecurrent:
    """Weights for ``num_layers`` independent toy layers (each sees the same input)."""

    a: torch.Tensor  # [L, HIDDEN]
    w: torch.Tensor  # [L, HIDDEN, IN_DIM]
    conv_w: torch.Tensor  # [L, IN_DIM, KERNEL]

    @classmethod
    def make(cls, num_layers: int, seed: int = 0) -> ToyRecurrent:
        """Random weights with a decay below 1 so states stay bounded."""
        g = torch.Generator().manual_seed(seed)
        return cls(
            a=torch.rand(num_layers, HIDDEN, generator=g) * 0.9,
            w=torch.randn(num_layers, HIDDEN, IN_DIM, generator=g),
            conv_w=torch.randn(num_layers, IN_DIM, KERNEL, generator=g),
        )

    @property
    def num_layers(self) -> int:
        return self.a.shape[0]

    def step(
        self, layer: int, h: torch.Tensor, conv: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: h [HIDDEN], conv [IN_DIM, KERNEL-1], x [IN_DIM]."""
        window = torch.cat([conv, x[:, None]], dim=1)  # [IN_DIM, KERNEL]
        u = (window * self.conv_w[layer]).sum(dim=1)
        h = self.a[layer] * h + self.w[layer] @ u
        return h, window[:, 1:].clone()

    def forward(
        self,
        pool: RecurrentStatePool,
        req_ids: Sequence[str],
        inputs: Sequence[torch.Tensor],
        verify: bool = True,
    ) -> None:
        """Run rows of ``q`` tokens ([q, IN_DIM] each); verify rows also write spec states."""
        for layer in range(self.num_layers):
            live_h, live_c = pool.state("h", layer), pool.state("conv", layer)
            spec_h, spec_c = pool.spec_states("h", layer), pool.spec_states("conv", layer)
            for req_id, xs in zip(req_ids, inputs, strict=True):
                slot = pool.slot(req_id)
                h, c = live_h[slot].clone(), live_c[slot].clone()
                for t in range(xs.shape[0]):
                    h, c = self.step(layer, h, c, xs[t])
                    if verify and t < xs.shape[0] - 1:
                        spec_h[slot, t] = h
                        spec_c[slot, t] = c
                live_h[slot] = h
                live_c[slot] = c

    def reference(self, xs: torch.Tensor) -> dict[str, torch.Tensor]:
        """States after ``xs`` [n, IN_DIM] from zero, token by token: name -> [L, *shape]."""
        hs, cs = [], []
        for layer in range(self.num_layers):
            h = torch.zeros(HIDDEN)
            c = torch.zeros(IN_DIM, KERNEL - 1)
            for t in range(xs.shape[0]):
                h, c = self.step(layer, h, c, xs[t])
            hs.append(h)
            cs.append(c)
        return {"h": torch.stack(hs), "conv": torch.stack(cs)}


def live_states(pool: RecurrentStatePool, req_id: str) -> dict[str, torch.Tensor]:
    """A request's live states: name -> [L, *shape]."""
    slot = pool.slot(req_id)
    return {
        name: torch.stack([pool.state(name, layer)[slot] for layer in range(pool.num_layers)])
        for name in ("h", "conv")
    }


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Exact equality, dtype and bits."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a
    )
