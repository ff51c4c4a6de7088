"""Recurrent-state slots for linear-attention layers, and their speculative checkpoints.

A recurrent layer (Gated DeltaNet, short conv) keeps O(1) state per sequence that, unlike
K/V, cannot be truncated: verifying ``[x_last, d_1..d_k]`` advances it by k+1 tokens, and
after ``j`` accepted drafts it must equal the state after verify token ``j``. The pool is
generic: named per-layer state shapes (for GDN ``{"conv": (C, K-1), "ssm": (H_v, d_k,
d_v)}``), each stored as one tensor ``[num_layers, num_slots, *shape]``.

The verify-step contract (the model's side) for a row of ``q = 1 + n`` tokens, n drafts:

- read the initial state from ``state(name, layer)[slot]``;
- write the state after verify token ``t`` into ``spec_states(name, layer)[slot, t]`` for
  ``t < q - 1`` (every token but the last);
- write the state after the last token into ``state(name, layer)[slot]``, exactly as a
  plain decode or prefill row does.

Then ``commit`` (via ``cache.rollback``) copies ``spec_states[slot, j]`` into the live state
when ``j < n`` drafts were accepted; a full accept needs no copy. This is vLLM's k+1
scheme in memory (live + k spec positions = (k+1)x the state per slot; drafter-formats
§4.3's example of 144 MiB per copy becomes 576 MiB per sequence at k=3), with one copy on
partial accepts instead of an indirection in the kernel. With ``max_spec_positions=0`` no
spec memory is allocated. Spec positions hold stale data until the model writes them.

``snapshot``/``restore`` are the replay alternative: copy the live states before verify,
restore them on a partial accept, and re-run the accepted tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import torch

from draftwise.cache.errors import (
    CacheArgumentError,
    DuplicateRequestError,
    OutOfSlotsError,
    UnknownRequestError,
)


@dataclass(frozen=True, slots=True)
class RecurrentSnapshot:
    """Copies of some requests' live states, taken before a step that may need undoing."""

    req_ids: tuple[str, ...]
    slots: tuple[int, ...]
    #: name -> [num_layers, len(slots), *shape]
    states: dict[str, torch.Tensor]


class RecurrentStatePool:
    """Fixed slots of per-layer recurrent state, one per running request."""

    def __init__(
        self,
        num_slots: int,
        layer_shapes: Mapping[str, tuple[int, ...]],
        num_layers: int,
        dtype: torch.dtype | Mapping[str, torch.dtype] = torch.float32,
        max_spec_positions: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_slots < 1 or num_layers < 1 or max_spec_positions < 0:
            raise CacheArgumentError(
                f"need num_slots >= 1, num_layers >= 1, max_spec_positions >= 0; got "
                f"{num_slots}, {num_layers}, {max_spec_positions}"
            )
        if not layer_shapes:
            raise CacheArgumentError("layer_shapes names no state")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.max_spec_positions = max_spec_positions
        self.shapes = {name: tuple(shape) for name, shape in layer_shapes.items()}
        self.dtypes: dict[str, torch.dtype] = {}
        for name, shape in self.shapes.items():
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise CacheArgumentError(f"state {name!r} has a bad shape {shape}")
            if isinstance(dtype, torch.dtype):
                self.dtypes[name] = dtype
            elif name in dtype:
                self.dtypes[name] = dtype[name]
            else:
                raise CacheArgumentError(f"no dtype given for state {name!r}")
        self._live = {
            name: torch.zeros(
                (num_layers, num_slots, *shape), dtype=self.dtypes[name], device=device
            )
            for name, shape in self.shapes.items()
        }
        self._spec = {
            name: torch.zeros(
                (num_layers, num_slots, max_spec_positions, *shape),
                dtype=self.dtypes[name],
                device=device,
            )
            for name, shape in self.shapes.items()
        }
        self._free: deque[int] = deque(range(num_slots))
        self._slot_of: dict[str, int] = {}

    # -- sizes ------------------------------------------------------------------------------

    @property
    def num_free_slots(self) -> int:
        """Slots ``allocate`` can still hand out (check before admitting)."""
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        """Slots held by requests."""
        return len(self._slot_of)

    @property
    def bytes_per_slot(self) -> int:
        """Live state of one request over all layers."""
        return sum(
            prod(shape) * self.dtypes[name].itemsize * self.num_layers
            for name, shape in self.shapes.items()
        )

    @property
    def spec_bytes_per_slot(self) -> int:
        """Spec-position memory of one request: ``max_spec_positions`` extra copies of its state."""
        return self.bytes_per_slot * self.max_spec_positions

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._slot_of

    # -- slots ------------------------------------------------------------------------------

    def allocate(self, req_id: str) -> int:
        """Give a request a zeroed slot (a fresh sequence starts from zero state)."""
        if req_id in self._slot_of:
            raise DuplicateRequestError(req_id, "recurrent-state pool")
        if not self._free:
            raise OutOfSlotsError(self.num_slots)
        slot = self._free.popleft()
        for live in self._live.values():
            live[:, slot].zero_()
        self._slot_of[req_id] = slot
        return slot

    def free(self, req_id: str) -> bool:
        """Release a request's slot; unknown ids are a no-op (returns whether one was held)."""
        slot = self._slot_of.pop(req_id, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def slot(self, req_id: str) -> int:
        """The request's slot index into every state tensor."""
        slot = self._slot_of.get(req_id)
        if slot is None:
            raise UnknownRequestError(req_id, "recurrent-state pool")
        return slot

    def slots(self, req_ids: Sequence[str]) -> list[int]:
        """Slots of a batch's rows, in row order."""
        return [self.slot(r) for r in req_ids]

    # -- what the model reads and writes ----------------------------------------------------

    def state(self, name: str, layer: int) -> torch.Tensor:
        """Live state of one layer, a view ``[num_slots, *shape]`` the model updates in place."""
        return self._live[name][layer]

    def spec_states(self, name: str, layer: int) -> torch.Tensor:
        """Per-position states of one layer, a view ``[num_slots, max_spec_positions, *shape]``."""
        return self._spec[name][layer]

    # -- speculative commit -----------------------------------------------------------------

    def commit(
        self,
        req_ids: Sequence[str],
        num_accepted: Sequence[int],
        num_drafts: Sequence[int],
    ) -> None:
        """After verify: make each row's live state the one after its last accepted token."""
        if not len(req_ids) == len(num_accepted) == len(num_drafts):
            raise CacheArgumentError("req_ids, num_accepted and num_drafts differ in length")
        slots: list[int] = []
        positions: list[int] = []
        for req_id, accepted, drafts in zip(req_ids, num_accepted, num_drafts, strict=True):
            if not 0 <= accepted <= drafts <= self.max_spec_positions:
                raise CacheArgumentError(
                    f"request {req_id!r}: need 0 <= accepted ({accepted}) <= drafts "
                    f"({drafts}) <= max_spec_positions ({self.max_spec_positions})"
                )
            slot = self.slot(req_id)
            if accepted < drafts:  # a full accept already left the right state live
                slots.append(slot)
                positions.append(accepted)
        self.commit_positions(slots, positions)

    def commit_positions(self, slots: Sequence[int], positions: Sequence[int]) -> None:
        """Copy ``spec_states[slot, position]`` into the live state, for every state and layer."""
        if len(slots) != len(positions):
            raise CacheArgumentError("slots and positions differ in length")
        if not slots:
            return
        if len(set(slots)) != len(slots):
            raise CacheArgumentError(f"a slot appears twice in {list(slots)}")
        for slot, pos in zip(slots, positions, strict=True):
            if not (0 <= slot < self.num_slots and 0 <= pos < self.max_spec_positions):
                raise CacheArgumentError(f"no spec state at slot {slot}, position {pos}")
        any_live = next(iter(self._live.values()))
        idx_slot = torch.tensor(slots, dtype=torch.long, device=any_live.device)
        idx_pos = torch.tensor(positions, dtype=torch.long, device=any_live.device)
        for name, live in self._live.items():
            live[:, idx_slot] = self._spec[name][:, idx_slot, idx_pos]

    # -- snapshot and replay ----------------------------------------------------------------

    def snapshot(self, req_ids: Sequence[str]) -> RecurrentSnapshot:
        """Copy the requests' live states (all names, all layers) before a risky step."""
        slots = self.slots(req_ids)
        any_live = next(iter(self._live.values()))
        idx = torch.tensor(slots, dtype=torch.long, device=any_live.device)
        states = {name: live[:, idx].clone() for name, live in self._live.items()}
        return RecurrentSnapshot(tuple(req_ids), tuple(slots), states)

    def restore(self, snap: RecurrentSnapshot) -> None:
        """Put a snapshot back; refuses if a request has since lost or changed its slot."""
        for req_id, slot in zip(snap.req_ids, snap.slots, strict=True):
            if self._slot_of.get(req_id) != slot:
                raise UnknownRequestError(req_id, f"recurrent-state pool at slot {slot}")
        if not snap.slots:
            return
        any_live = next(iter(self._live.values()))
        idx = torch.tensor(snap.slots, dtype=torch.long, device=any_live.device)
        for name, live in self._live.items():
            live[:, idx] = snap.states[name]
