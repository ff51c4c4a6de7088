"""``"draftwise": {"adaptive": ...}``: the settings of acceptance-driven adaptive depth.

Opt-in: ``true`` takes every default, an object sets some of them, ``false`` (or no key)
is fixed depth. Each key is checked by name like the rest of the config: an unknown key
is refused with a did-you-mean, a bad value names the key and the bound. What the
settings do is :mod:`draftwise.spec.adaptive`'s business; this module only checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftwise.config.errors import InvalidValueError, UnknownKeyError, show

#: where the settings live, for messages and error keys
ADAPTIVE_KEY = "draftwise.adaptive"


class AdaptiveConfig(BaseModel):
    """Adaptive depth: how acceptance is tracked, and when a request at k = 0 is probed."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    #: weight of the newest observation in each request's running acceptance per position
    ew_weight: float = Field(0.25, gt=0.0, le=1.0)
    #: acceptance per position assumed before anything was observed (engine-wide
    #: estimates then take over: a new request starts from the population's rates)
    prior: float = Field(0.6, ge=0.0, le=1.0)
    #: observations a fresh request's starting rates (the population's) count as: its own
    #: first outcomes weigh 1 / (n + 1 + prior_strength) until that falls to ew_weight
    prior_strength: float = Field(1.0, ge=0.0, le=1_000.0)
    #: steps a request spends at k = 0 before it is given a probe draft again
    probe_interval: int = Field(16, ge=1, le=1_000_000)
    #: each probe whose drafts were all rejected multiplies the interval by this (1: never
    #: back off); an accepted draft resets it
    probe_backoff: float = Field(2.0, ge=1.0, le=16.0)
    #: the longest the backed-off interval grows (never below probe_interval)
    max_probe_interval: int = Field(256, ge=1, le=1_000_000)
    #: drafts a probe verifies (cut to the request's limit); one is enough to see whether
    #: the text turned predictable, and the rule takes it deeper from there
    probe_depth: int = Field(1, ge=1, le=128)
    #: what a batch of several rows maximises: "throughput" (expected tokens per second
    #: of the whole batch), "fair" (the sum of the log of each row's expected rate: a
    #: row's drafts must buy it more, in ratio, than they slow all its batch-mates), or
    #: "auto": throughput while requests wait for a slot (finishing one early lets the
    #: next in), fair while none waits (finishing one early frees a slot nobody takes,
    #: and the rows left pay for its verify tokens). One row: the same choice either way
    objective: Literal["auto", "throughput", "fair"] = "auto"
    #: rest a batch whose lookups verified no draft for probe_interval steps in a row:
    #: nobody drafts for a while, backed off like a probe (``draftwise.spec.batch_rest``)
    batch_rest: bool = True
    #: keep the measured cost model in a file cache (per model, dtype, threads, k grid)
    cost_cache: bool = True
    #: batch sizes the cost model times beyond which it extrapolates linearly
    max_measured_rows: int = Field(32, ge=1, le=1024)


def parse_adaptive(value: Any) -> AdaptiveConfig | None:
    """``true`` / an object -> settings; ``false`` / null -> None; anything else refused."""
    if value is None or value is False:
        return None
    if value is True:
        return AdaptiveConfig()
    if not isinstance(value, Mapping):
        raise InvalidValueError(
            f"{ADAPTIVE_KEY}={show(value)} is invalid: give true, false, or an object of "
            f"its settings ({', '.join(AdaptiveConfig.model_fields)}).",
            key=ADAPTIVE_KEY, value=value, reason="not a boolean or an object",
        )
    from draftwise.config.keys import normalize_keys, suggest

    data = normalize_keys(value, prefix=f"{ADAPTIVE_KEY}.")
    known = tuple(AdaptiveConfig.model_fields)
    for key, item in data.items():
        if key not in known:
            close = suggest(key, known)
            hint = f"; did you mean '{close}'?" if close else "."
            raise UnknownKeyError(
                f"unknown key '{ADAPTIVE_KEY}.{key}'{hint} Keys accepted under "
                f"'{ADAPTIVE_KEY}': {', '.join(known)}.",
                key=f"{ADAPTIVE_KEY}.{key}", value=item, reason="not a known key",
                instead=f"use '{close}'" if close else "",
            )
    try:
        return AdaptiveConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        msg = str(err["msg"])
        msg = msg[:1].lower() + msg[1:]
        raise InvalidValueError(
            f"{ADAPTIVE_KEY}.{key}={show(data.get(key))} is invalid: {msg}.",
            key=f"{ADAPTIVE_KEY}.{key}", value=data.get(key), reason=msg,
        ) from None


__all__ = ["ADAPTIVE_KEY", "AdaptiveConfig", "parse_adaptive"]
