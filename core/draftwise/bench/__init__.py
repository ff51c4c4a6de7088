"""The harness behind ``draftwise bench``: workloads in, a JSON report out.

Ratios matter, absolute times do not (shared 2-core machines are noisy): every figure a
comparison needs is measured in the same process run, peers included.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise.peak_rss import peak_rss_mib as peak_rss_mib  # re-exported for the reports

if TYPE_CHECKING:
    from draftwise.engine import LLMEngine


@dataclass(slots=True)
class WorkloadItem:
    """One prompt of a workload: chat ``messages``, a raw ``prompt`` or ``prompt_token_ids``."""

    id: str
    kind: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None


@dataclass(slots=True)
class PromptResult:
    """Per-prompt measurements of one engine run."""

    id: str
    kind: str
    num_prompt_tokens: int
    num_output_tokens: int
    seconds: float
    ttft: float | None
    itl: float | None
    tok_per_s: float
    token_ids: list[int] = field(default_factory=list)
    speculative_decoding: dict[str, Any] | None = None


def load_workload(path: str | Path) -> list[WorkloadItem]:
    """Read a JSONL workload (``id``, ``kind``, ``messages`` or ``prompt`` per line)."""
    items: list[WorkloadItem] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from exc
        if not {"messages", "prompt", "prompt_token_ids"} & obj.keys():
            raise ValueError(f"{path}:{lineno}: needs 'messages', 'prompt' or 'prompt_token_ids'")
        items.append(
            WorkloadItem(
                id=str(obj.get("id", lineno)),
                kind=str(obj.get("kind", "unknown")),
                messages=obj.get("messages"),
                prompt=obj.get("prompt"),
                prompt_token_ids=obj.get("prompt_token_ids"),
            )
        )
    return items


def prompt_ids(engine: LLMEngine, item: WorkloadItem) -> list[int]:
    """Token ids of a workload item, through the chat template when it has messages."""
    if item.prompt_token_ids is not None:
        return [int(t) for t in item.prompt_token_ids]
    if item.messages is not None:
        return engine.apply_chat_template(item.messages)
    return engine.tokenize_prompt(item.prompt or "")[1]


def summarize(results: list[PromptResult], wall: float | None = None) -> dict[str, Any]:
    """Totals overall and per kind: tok/s = output tokens / seconds spent on them."""

    def agg(rs: list[PromptResult]) -> dict[str, Any]:
        toks = sum(r.num_output_tokens for r in rs)
        secs = sum(r.seconds for r in rs)
        ttfts = [r.ttft for r in rs if r.ttft is not None]
        itls = [r.itl for r in rs if r.itl is not None]
        return {
            "num_prompts": len(rs),
            "output_tokens": toks,
            "seconds": secs,
            "tok_per_s": toks / secs if secs else 0.0,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "mean_itl_s": sum(itls) / len(itls) if itls else None,
        }

    out = {"all": agg(results)}
    for kind in sorted({r.kind for r in results}):
        out[kind] = agg([r for r in results if r.kind == kind])
    if wall is not None:
        toks = out["all"]["output_tokens"]
        out["all"]["wall_seconds"] = wall
        out["all"]["wall_tok_per_s"] = toks / wall if wall else 0.0
    return out


def to_json(obj: Any) -> Any:
    """Dataclasses to dicts, for the report."""
    if isinstance(obj, list):
        return [to_json(o) for o in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    return obj


def now() -> float:
    """The clock every measurement uses."""
    return time.perf_counter()
