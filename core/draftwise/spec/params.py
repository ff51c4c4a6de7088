"""Per-request speculation settings: off, fewer drafts, one chain member, provenance.

The same strict object is the Python API's per-request argument
(``LLMEngine.add_request(..., speculative=SpeculativeParams(...))``) and the OpenAI
server's ``"speculative": {...}`` body field: unknown keys and wrong types are refused by
name. It can only narrow what the server was started with: :func:`check_against` refuses
more drafts than the server's k, a method that is not in its chain, and any speculation at
all on a server running without it.

Precedence, per decode row and step: ``enabled: false`` -> no drafts (no probes either);
otherwise the cap is the smallest of the server's k, the batch-size schedule's k
(``num_speculative_tokens_per_batch_size``) and the request's ``num_speculative_tokens``;
adaptive depth (when the server has it and the request does not set ``adaptive: false``)
then picks a depth in 0..cap, else the row drafts up to the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from draftwise.errors import RequestError


class ServerSpeculation(Protocol):
    """What :func:`check_against` reads of the server's speculation
    (``draftwise.spec.speculation.Speculation`` is one): its k, its chain's members (each
    with a ``method``), and its adaptive-depth policy, if any."""

    k: int
    drafters: Sequence[Any]
    policy: Any


class SpeculativeParams(BaseModel):
    """What one request asks of speculation; every field narrows the server's setting."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    #: false: this request never drafts (plain decoding inside a speculating batch)
    enabled: bool = True
    #: at most this many drafts per step (at most the server's k); 0 is like enabled=false
    num_speculative_tokens: int | None = Field(None, ge=0, le=128)
    #: draft only with this member of the server's drafter chain (its method name)
    method: str | None = Field(None, min_length=1, max_length=64)
    #: false: fixed depth (the cap) even when the server runs adaptive depth; true needs
    #: a server started with ``"draftwise": {"adaptive": ...}``
    adaptive: bool | None = None
    #: report each output token's provenance (accepted draft / recovered / bonus / plain)
    return_provenance: bool = False

    @property
    def drafts(self) -> bool:
        """Whether this request may draft at all."""
        return self.enabled and self.num_speculative_tokens != 0

    def cap(self, k: int) -> int:
        """The most drafts per step this request allows under a step cap of ``k``."""
        if not self.drafts:
            return 0
        n = self.num_speculative_tokens
        return k if n is None else min(k, n)


def check_against(params: SpeculativeParams, spec: ServerSpeculation | None) -> None:
    """Refuse what the server cannot honour, naming the field (a 400 over the API)."""
    where = "speculative"
    if spec is None:
        asks = params.method is not None or params.adaptive or (
            params.enabled and params.num_speculative_tokens not in (None, 0)
        )
        if asks:
            raise RequestError(
                where, "this server runs without speculation; only {\"enabled\": false} "
                "(or no 'speculative' field) is accepted",
            )
        return
    n = params.num_speculative_tokens
    if n is not None and n > spec.k:
        raise RequestError(
            f"{where}.num_speculative_tokens",
            f"{n} is more than the server was started with ({spec.k}); ask for at most {spec.k}",
        )
    methods = [d.method for d in spec.drafters]
    if params.method is not None and params.method not in methods:
        raise RequestError(
            f"{where}.method",
            f"{params.method!r} is not in the server's drafter chain; choose one of "
            f"{', '.join(repr(m) for m in methods)}",
        )
    if params.adaptive and spec.policy is None:
        raise RequestError(
            f"{where}.adaptive",
            "the server runs fixed-depth speculation; adaptive depth needs it started with "
            "'\"draftwise\": {\"adaptive\": true}' in its speculative config",
        )


__all__ = ["SpeculativeParams", "check_against"]
