"""Tiny random checkpoints saved by transformers (the oracle), shared by every test folder.

Every checkpoint is a real ``save_pretrained`` directory (config.json + safetensors) with
all weights re-drawn (norms near 1, biases non-zero) so that no tensor is a no-op.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)

ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(rope_theta=10000.0)),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", dict(head_dim=48, rope_theta=1000000.0)),
    "mistral": ("MistralConfig", dict(sliding_window=None, rope_theta=10000.0)),
    "mistral_swa": ("MistralConfig", dict(sliding_window=6, rope_theta=10000.0)),
    "llama_tied_scaled": (
        "LlamaConfig",
        dict(
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
}


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.08) -> None:
    """Re-draw every parameter: matrices N(0, std), norms 1 + N(0, 0.1), biases N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(std * noise)


def save_tiny(
    kind: str, directory: Path, seed: int = 0, std: float = 0.08, **overrides: Any
) -> Path:
    """Save a randomly initialised tiny ``kind`` model with transformers."""
    import transformers

    cls_name, extra = ARCHS[kind]
    config = getattr(transformers, cls_name)(**{**TINY, **extra, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize_(model, seed, std)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def perturbed_copy(
    src: Path, dst: Path, scale: float, seed: int = 1, lm_head_scale: float = 1.0
) -> Path:
    """A copy of a saved checkpoint with every tensor jittered by ``scale`` (relative std),
    and the LM head multiplied by ``lm_head_scale`` (flatter or sharper logits, same order)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
        tensors[name] = (t.float() * (1 + scale * noise)).to(t.dtype)
    if lm_head_scale != 1.0:
        cfg = json.loads((dst / "config.json").read_text())
        if cfg.get("tie_word_embeddings"):
            raise ValueError("lm_head_scale needs an untied LM head")
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * lm_head_scale
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def write_wordlevel_tokenizer(directory: Path, tokens: list[str], unk: str = "[UNK]") -> Path:
    """A ``tokenizer.json`` whose token i is ``tokens[i]`` (whitespace-split words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if unk not in tokens:
        raise ValueError(f"the vocabulary must hold the unknown token {unk!r}")
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(directory / "tokenizer.json"))
    return directory


def write_byte_tokenizer(directory: Path) -> Path:
    """tokenizer.json: <unk> <s> </s> (ids 0-2, the tiny config's bos/eos) then 256 bytes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return directory


def save_tiny_hybrid(directory: Path, mtp: bool = True, **overrides: Any) -> Path:
    """The tiny Qwen3.5 GDN hybrid of ``scripts/build_tiny_hybrid.py`` (with its MTP head
    unless ``mtp`` is false); ``overrides`` change its config (e.g. a larger vocabulary)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("build_tiny_hybrid",
                                                  root / "scripts" / "build_tiny_hybrid.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    mod.TINY = {**mod.TINY, **overrides}
    return mod.build(directory, "qwen3_5", mtp=mtp)
