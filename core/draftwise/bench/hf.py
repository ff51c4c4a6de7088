"""HF transformers as the in-process peer: plain ``generate`` and prompt lookup.

transformers is a test/bench-only dependency: imported here lazily, with a clear error
naming the extra to install when it is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftwise.bench import PromptResult, now


def load_hf_model(path: str, dtype: torch.dtype = torch.float32) -> Any:
    """The same checkpoint through transformers (GGUF files are dequantized by it)."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "--compare-hf needs transformers: pip install 'draftwise[test]'"
        ) from exc
    p = Path(path)
    if p.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype)
    model.eval()
    return model


@torch.inference_mode()
def run_hf(
    model: Any,
    items: list[tuple[str, str, list[int]]],
    max_tokens: int,
    eos_token_ids: list[int],
    prompt_lookup_num_tokens: int | None = None,
) -> list[PromptResult]:
    """Greedy ``generate`` per prompt, one at a time; ``items`` are (id, kind, prompt ids)."""
    results: list[PromptResult] = []
    for item_id, kind, ids in items:
        input_ids = torch.tensor([ids], dtype=torch.long)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "do_sample": False,
            "eos_token_id": eos_token_ids,
            "pad_token_id": eos_token_ids[0],
            "attention_mask": torch.ones_like(input_ids),
        }
        if prompt_lookup_num_tokens:
            kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        t0 = now()
        out = model.generate(input_ids, **kwargs)
        secs = now() - t0
        new = out[0, len(ids) :].tolist()
        results.append(
            PromptResult(
                id=item_id,
                kind=kind,
                num_prompt_tokens=len(ids),
                num_output_tokens=len(new),
                seconds=secs,
                ttft=None,
                itl=None,
                tok_per_s=len(new) / secs if secs else 0.0,
                token_ids=new,
            )
        )
    return results
