"""Tiny Qwen3 targets and DeepSpec native DSpark drafters in the published layout, and
the same weights in the SpecForge and speculators layouts (a full or reduced vocabulary).

DeepSpec's ``Qwen3DSparkModel`` (``shared/reference/drafter-formats.md`` §2.1) is the
DFlash body plus ``embed_tokens``, ``lm_head`` and ``markov_head.*``, with a config that
is a copy of the target's plus the DSpark keys at the top level. The body here is
z-lab's own ``DFlashDraftModel`` (the dflash test dependency, the same module layout),
randomly initialised; the extra tensors are drawn here; ``embed_tokens``/``lm_head``
are copies of the target's, as DeepSpec trains them frozen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import randomize_, save_tiny, write_wordlevel_tokenizer

TOKENS = [f"w{i}" for i in range(510)] + ["<|MASK|>", "[UNK]"]  # 512
MASK = 510
TARGET_LAYERS = 3


def save_dspark(
    directory: Path,
    target_dir: Path,
    *,
    kind: str = "vanilla",
    rank: int = 16,
    block_size: int = 7,
    layers: int = 2,
    target_layer_ids: tuple[int, ...] = (-1, 1),
    seed: int = 7,
    markov_std: float = 0.5,
    confidence_std: float = 0.1,
    trained: dict[str, torch.Tensor] | None = None,
    **overrides: Any,
) -> Path:
    """A random DeepSpec-layout drafter for the tiny target (config = target's + DSpark)."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    target_cfg = json.loads((target_dir / "config.json").read_text())
    cfg = dict(target_cfg)
    cfg.update(
        architectures=["Qwen3DSparkModel"], num_hidden_layers=layers,
        num_target_layers=target_cfg["num_hidden_layers"], block_size=block_size,
        mask_token_id=MASK, target_layer_ids=list(target_layer_ids), num_anchors=64,
        tie_word_embeddings=False, layer_types=["full_attention"] * layers,
        markov_rank=rank, markov_head_type=kind, enable_confidence_head=False,
        confidence_head_with_markov=False,
    )
    cfg.update(overrides)
    body_cfg = Qwen3Config(**{k: v for k, v in target_cfg.items()
                              if k not in ("architectures", "num_hidden_layers", "layer_types")},
                           num_hidden_layers=layers, num_target_layers=TARGET_LAYERS,
                           dflash_config={"mask_token_id": MASK, "block_size": block_size,
                                          "target_layer_ids": list(target_layer_ids)})
    torch.manual_seed(seed)
    body = DFlashDraftModel(body_cfg)
    randomize_(body, seed, std=0.15)
    tensors = {k: v.detach().clone().contiguous() for k, v in body.state_dict().items()
               if not k.startswith("rotary")}
    if trained is not None:  # a trained body and head replace the random draws
        tensors = {}
    target = _target_tensors(target_dir)
    tensors["embed_tokens.weight"] = target["model.embed_tokens.weight"].clone()
    tensors["lm_head.weight"] = target["lm_head.weight"].clone()
    if trained is not None:
        tensors.update(trained)
    g = torch.Generator().manual_seed(seed + 1)
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]

    def draw(*shape: int, std: float = markov_std) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    if trained is None and rank:
        tensors["markov_head.markov_w1.weight"] = draw(v, rank)
        tensors["markov_head.markov_w2.weight"] = draw(v, rank)
        if kind == "gated":
            tensors["markov_head.gate_proj.weight"] = draw(rank, h + rank, std=0.2)
            tensors["markov_head.gate_proj.bias"] = draw(rank, std=0.2)
        elif kind == "rnn":
            tensors["markov_head.joint_proj.weight"] = draw(3 * rank, 2 * rank + h, std=0.2)
            tensors["markov_head.joint_proj.bias"] = draw(3 * rank, std=0.2)
    if cfg.get("enable_confidence_head"):
        width = h + (rank if cfg.get("confidence_head_with_markov") else 0)
        tensors["confidence_head.proj.weight"] = draw(1, width, std=confidence_std)
        tensors["confidence_head.proj.bias"] = draw(1, std=confidence_std)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return directory


DSPARK_KEYS = ("block_size", "mask_token_id", "markov_rank", "markov_head_type",
               "enable_confidence_head", "confidence_head_with_markov")


def to_speculators(src: Path, out: Path, keep: list[int] | None = None, **overrides: Any
                   ) -> Path:
    """A DeepSpec drafter directory in speculators 0.9.0's DSpark layout
    (``models/dspark/config.py``, ``models/dflash/core.py``'s save rules): the config as
    ``DSparkSpeculatorConfig`` serialises it (``transformer_layer_config``,
    ``aux_hidden_state_layer_ids`` = DeepSpec ids + 1, every DSpark field), the state dict
    without ``embed_tokens`` (never saved) and, for a full vocabulary, without
    ``lm_head``. ``keep`` (ascending target ids): a reduced draft vocabulary as
    speculators saves one (``DraftVocabMixin``): ``lm_head`` and ``markov_w2`` cut to
    those rows, ``d2t`` int64 offsets (target = draft + d2t), ``t2d`` a bool mask over the
    verifier's vocabulary; ``markov_w1`` keeps every row."""
    cfg = json.loads((src / "config.json").read_text())
    tl = {k: v for k, v in cfg.items() if k not in (
        "architectures", "target_layer_ids", "num_target_layers", "num_anchors", *DSPARK_KEYS)}
    tl.update(model_type="qwen3", architectures=None)
    spec = {
        "speculators_model_type": "dspark", "architectures": ["DSparkSpeculator"],
        "speculators_version": "0.9.0", "transformer_layer_config": tl,
        "draft_vocab_size": cfg["vocab_size"] if keep is None else len(keep),
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg["target_layer_ids"]],
        "sliding_window_non_causal": False, "sample_from_anchor": True,
        **{k: cfg[k] for k in DSPARK_KEYS},
        "speculators_config": {"algorithm": "dspark", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy",
                                                     "speculative_tokens": cfg["block_size"]}],
                               "verifier": {"name_or_path": "tiny", "architectures":
                                            ["Qwen3ForCausalLM"]}},
    }
    spec.update(overrides)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(spec, indent=1))
    t = load_file(str(src / "model.safetensors"))
    head = t.pop("lm_head.weight")
    del t["embed_tokens.weight"]
    if keep is not None:
        ids = torch.tensor(keep, dtype=torch.int64)
        t["lm_head.weight"] = head[ids].contiguous()
        if "markov_head.markov_w2.weight" in t:
            t["markov_head.markov_w2.weight"] = t["markov_head.markov_w2.weight"][ids].contiguous()
        t["d2t"] = ids - torch.arange(len(keep))
        t["t2d"] = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
        t["t2d"][ids] = True
    save_file(t, str(out / "model.safetensors"))
    return out


def random_keep(vocab: int, share: float, seed: int) -> list[int]:
    """A reduced draft vocabulary: ``share`` of the ids, drawn at random, ascending (so
    most draft indices differ from their target ids)."""
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(vocab, generator=g)[: int(vocab * share)].tolist())


def _target_tensors(target_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("qwen3", tmp_path_factory.mktemp("ds-target"), seed=3, std=0.25,
                     num_hidden_layers=TARGET_LAYERS)
    return write_wordlevel_tokenizer(path, TOKENS)


@pytest.fixture(scope="session")
def dspark_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_dspark(tmp_path_factory.mktemp("ds-vanilla") / "b7", target_dir)


#: prompts the trained drafter memorises the target's continuation of (equal lengths)
TRAIN_PROMPTS = [[7, 3, 11, 5, 2, 9, 14, 1], [20, 21, 22, 23, 24, 25, 26, 27],
                 [100, 101, 102, 40, 41, 42, 43, 44], [310, 47, 12, 9, 9, 81, 6, 250]]


def train_dspark(target_dir: Path, directory: Path, *, steps: int = 120, block_size: int = 7,
                 rank: int = 16, seed: int = 0, new_tokens: int = 24) -> Path:
    """A vanilla DSpark drafter trained briefly (as DeepSpec: frozen embed/lm_head, body
    and Markov head trained with cross-entropy, next-token labels, teacher-forced previous
    tokens) on the tiny target's greedy continuations, so acceptance is far from zero."""
    import transformers
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    ids = [-1, 1]
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target.eval().requires_grad_(False)
    tcfg = json.loads((target_dir / "config.json").read_text())
    body_cfg = Qwen3Config(**{k: v for k, v in tcfg.items()
                              if k not in ("architectures", "num_hidden_layers", "layer_types")},
                           num_hidden_layers=2, num_target_layers=TARGET_LAYERS,
                           dflash_config={"mask_token_id": MASK, "block_size": block_size,
                                          "target_layer_ids": ids})
    torch.manual_seed(seed + 11)
    body = DFlashDraftModel(body_cfg)
    randomize_(body, seed + 11, std=0.15)
    v = tcfg["vocab_size"]
    w1 = torch.nn.Parameter(torch.randn(v, rank) * 0.1)
    w2 = torch.nn.Parameter(torch.randn(v, rank) * 0.1)
    with torch.no_grad():
        seqs = target.generate(torch.tensor(TRAIN_PROMPTS), max_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
        hs = target(seqs, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in ids], -1)
        embed, head = target.get_input_embeddings(), target.lm_head.weight
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([*body.parameters(), w1, w2], lr=3e-3)
    body.train()
    p = len(TRAIN_PROMPTS[0])
    for _ in range(steps):
        start = int(torch.randint(p - 1, seqs.shape[1] - block_size, (1,), generator=gen))
        block = seqs[:, start : start + block_size].clone()
        prev = block.clone()  # prev_j: the true token at start + j
        block[:, 1:] = MASK
        h = body(target_hidden=feats[:, :start], noise_embedding=embed(block),
                 position_ids=torch.arange(start + block_size)[None], use_cache=False)
        logits = h @ head.T + w1[prev] @ w2.T
        labels = seqs[:, start + 1 : start + block_size + 1].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, v), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    trained = {k: t.detach().clone().contiguous() for k, t in body.state_dict().items()
               if not k.startswith("rotary")}
    trained["markov_head.markov_w1.weight"] = w1.detach().clone()
    trained["markov_head.markov_w2.weight"] = w2.detach().clone()
    return save_dspark(directory, target_dir, rank=rank, block_size=block_size,
                       target_layer_ids=tuple(ids), trained=trained)


@pytest.fixture(scope="session")
def trained_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_dspark(target_dir, tmp_path_factory.mktemp("ds-trained") / "b7")


def save_specforge(
    directory: Path,
    target_dir: Path,
    *,
    kind: str = "vanilla",
    rank: int = 16,
    block_size: int = 7,
    layers: int = 2,
    target_layer_ids: tuple[int, ...] = (-1, 1),
    seed: int = 7,
    markov_std: float = 0.5,
    confidence: bool = False,
    with_markov: bool = False,
    weights: dict[str, torch.Tensor] | None = None,
    **dflash_overrides: Any,
) -> Path:
    """A tiny drafter as SpecForge saves a ``DSparkDraftModel`` (``specforge export --to
    hf``: ``save_pretrained`` of the module tree, sgl-project/SpecForge a6b6b02): a Qwen3
    config with ``block_size`` and ``num_target_layers`` at the top level and the DSpark
    keys under ``dflash_config`` (as ``configs/qwen3-4b-dspark.json``), bf16 safetensors
    of the DFlash body (z-lab's ``DFlashDraftModel``, SpecForge's module names) plus
    ``markov_head.*`` and ``confidence_head.proj``, no embedding and no LM head (the
    target's). ``weights`` (DeepSpec names) replace the random draws."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    target_cfg = json.loads((target_dir / "config.json").read_text())
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]
    dflash = {"attention_mode": "gqa", "mask_token_id": MASK,
              "target_layer_ids": list(target_layer_ids), "projector_type": "dspark",
              "markov_rank": rank, "markov_head_type": kind,
              "confidence_head_alpha": 1.0 if confidence else 0.0,
              "enable_confidence_head": confidence,
              "confidence_head_with_markov": with_markov, **dflash_overrides}
    cfg = Qwen3Config(**{k: v for k, v in target_cfg.items()
                         if k not in ("architectures", "num_hidden_layers", "layer_types",
                                      "tie_word_embeddings")},
                      num_hidden_layers=layers, num_target_layers=TARGET_LAYERS,
                      block_size=block_size, layer_types=["full_attention"] * layers,
                      tie_word_embeddings=False, dflash_config=dflash)
    torch.manual_seed(seed)
    model = DFlashDraftModel(cfg)
    randomize_(model, seed, std=0.15)
    if rank:
        head = torch.nn.Module()
        head.markov_w1 = torch.nn.Embedding(v, rank)
        head.markov_w2 = torch.nn.Linear(rank, v, bias=False)
        if kind == "gated":
            head.gate_proj = torch.nn.Linear(h + rank, rank)
        elif kind == "rnn":
            head.joint_proj = torch.nn.Linear(2 * rank + h, 3 * rank)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in head.named_parameters():
                std = markov_std if name.startswith("markov") else 0.2
                p.copy_(torch.randn(p.shape, generator=g) * std)
        model.markov_head = head
    if confidence:
        conf = torch.nn.Module()
        conf.proj = torch.nn.Linear(h + (rank if with_markov else 0), 1)
        with torch.no_grad():
            conf.proj.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + 2))
            conf.proj.bias.zero_()
        model.confidence_head = conf
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected or [m for m in missing if not m.startswith("rotary")]:
            raise ValueError(f"weights do not fit: {missing} {unexpected}")
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    d = json.loads((directory / "config.json").read_text())
    d.update(architectures=["DSparkDraftModel"], auto_map={"AutoModel": "dspark.DSparkDraftModel"})
    (directory / "config.json").write_text(json.dumps(d, indent=2))
    return directory


def to_specforge(native_dir: Path, directory: Path, target_dir: Path, **kw: Any) -> Path:
    """A DeepSpec drafter's weights in the SpecForge layout (its embedding and head are
    copies of the target's, so both must draft the same tokens)."""
    cfg = json.loads((native_dir / "config.json").read_text())
    t = load_file(str(native_dir / "model.safetensors"))
    t = {k: x.float() for k, x in t.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    return save_specforge(directory, target_dir, kind=cfg["markov_head_type"],
                          rank=cfg["markov_rank"], block_size=cfg["block_size"],
                          layers=cfg["num_hidden_layers"],
                          target_layer_ids=tuple(cfg["target_layer_ids"]), weights=t, **kw)


@pytest.fixture(scope="session")
def specforge_trained_dir(target_dir: Path, trained_dir: Path,
                          tmp_path_factory: pytest.TempPathFactory) -> Path:
    return to_specforge(trained_dir, tmp_path_factory.mktemp("sf-trained") / "b7", target_dir)
