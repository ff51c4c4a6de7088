"""Per-step cost of a DSpark draft against one target decode step, per Markov type.

As ``dflash_step.py`` (whose random-drafter writer and step timer it reuses): no trained
DSpark drafter exists for the models on this machine, so this times a RANDOM DeepSpec
``Qwen3DSparkModel`` drafter, one request, greedy, a prompt of ``--context`` tokens, at
one of two shapes (``--shape``):

- ``tiny`` (default): the default model (SmolLM2-135M: H = 576, V = 49152) as the target
  and a drafter of its width (``--draft-layers`` layers of its heads and MLP, its own
  embedding and LM head, ``markov_rank`` 256). The rank is 44% of the width here, so the
  Markov pass weighs ~4x more against the draft step than on a published drafter.
- ``published``: DeepSpec's Qwen3-4B-class drafter proportions: a drafter of Qwen3-4B's
  shape (5 layers of H = 2560, 32 / 8 heads of 128, MLP 9728; V = 151936; rank 256, 10%
  of the width) on a random target written to a temp dir with that width and vocabulary
  (tied embeddings) and ``--target-layers`` narrow layers that only feed the drafter's
  taps 0..4 (:func:`write_random_target`). No plain engine is built beside it (memory),
  so decode, verify-based break-even and ``verify_ms`` say nothing about Qwen3-4B here.

Per block size B (k = B) and Markov type, ONE speculative engine runs its steps in turn
under each of these settings of the proposer's Markov pass (so every mode sees the same
weights, context lengths and machine load), interleaved with a plain decode step; each
mode keeps its own adaptive state (the screen's give-up count, the windows' hit rate):

- ``full``: the torch pass with the whole ``W2 u`` product at every position;
- ``torch``: the torch pass as the engine ran it before the native pass (the certified
  greedy pick, ``MarkovHead.certified_argmax``; for rnn the look-ahead windows);
- ``native``: what the engine runs now (``draftwise_dspark.native``: one C call);
- for rnn ``native-seq``: the native pass without its windows (one position per product).

Reported per mode: ``draft_ms`` (propose), ``draft_markov_ms`` (the whole pass,
``DSparkProposer._markov_pass``), ``verify_ms``, the Markov pass's share of the draft step
(median of per-step ratios) in wall time, in process CPU time (every thread, the kernel
pool's included) and in the calling thread's CPU time, the share of Markov picks
certified, ``W2`` products per pick, the native pass's own per-phase wall clock (latent,
screen, guesses, products), and the break-even ``a*`` accepted drafts per step
(``1 + a* = (draft + verify) / decode``); the load average before and after.
``--threads 1`` runs the engines on one thread: its CPU shares then hold all the work
(with two, the pool's worker is not on the calling thread's clock, and on a loaded
machine the caller spin-waits on a descheduled worker).

    python benchmarks/dspark_step.py --blocks 7 15 --kinds vanilla gated rnn --steps 6 --rounds 3
    python benchmarks/dspark_step.py --shape published --blocks 7 15 --kinds vanilla gated rnn
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_step import Timed, write_random_drafter

#: DeepSpec's Qwen3-4B drafter and target proportions (``--shape published``)
PUBLISHED = {"hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936}


def write_random_target(directory: Path, layers: int) -> Path:
    """A random Qwen3 target of the published width and vocabulary (H 2560, V 151936, tied
    embeddings) with ``layers`` narrow layers (4 / 1 heads of 128, MLP 512), bf16: its
    layers only feed the drafter's taps and never enter the draft step, and a full-width
    target would be a second 1.8 GB beside the 2.8 GB drafter."""
    from safetensors.torch import save_file

    h, d, v = PUBLISHED["hidden_size"], PUBLISHED["head_dim"], PUBLISHED["vocab_size"]
    heads, kv_heads, inter = 4, 1, 512
    gen = torch.Generator().manual_seed(2)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (std * torch.randn(shape, generator=gen)).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": torch.ones(h).bfloat16()}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rnd(heads * d, h)
        t[p + "self_attn.k_proj.weight"] = rnd(kv_heads * d, h)
        t[p + "self_attn.v_proj.weight"] = rnd(kv_heads * d, h)
        t[p + "self_attn.o_proj.weight"] = rnd(h, heads * d)
        t[p + "self_attn.q_norm.weight"] = torch.ones(d).bfloat16()
        t[p + "self_attn.k_norm.weight"] = torch.ones(d).bfloat16()
        t[p + "mlp.gate_proj.weight"] = rnd(inter, h)
        t[p + "mlp.up_proj.weight"] = rnd(inter, h)
        t[p + "mlp.down_proj.weight"] = rnd(h, inter)
        t[p + "input_layernorm.weight"] = torch.ones(h).bfloat16()
        t[p + "post_attention_layernorm.weight"] = torch.ones(h).bfloat16()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(t, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **PUBLISHED,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "intermediate_size": inter, "num_hidden_layers": layers,
           "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
           "torch_dtype": "bfloat16"}
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def write_random_dspark(directory: Path, target: Any, block: int, layers: int, kind: str,
                        rank: int) -> Path:
    """The DFlash body of ``dflash_step`` plus DeepSpec's own tensors and config keys
    (taps 0..layers-1 where the target has too few layers for z-lab's default)."""
    from safetensors.torch import load_file, save_file

    write_random_drafter(directory, target, block, layers)
    t = load_file(str(directory / "model.safetensors"))
    cfg = json.loads((directory / "config.json").read_text())
    c = target.config
    h, v = c.hidden_size, c.vocab_size
    gen = torch.Generator().manual_seed(1)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (std * torch.randn(shape, generator=gen)).to(torch.bfloat16)

    t["embed_tokens.weight"], t["lm_head.weight"] = rnd(v, h), rnd(v, h)
    if rank:
        t["markov_head.markov_w1.weight"] = rnd(v, rank)
        t["markov_head.markov_w2.weight"] = rnd(v, rank)
        if kind == "gated":
            t["markov_head.gate_proj.weight"], t["markov_head.gate_proj.bias"] = (
                rnd(rank, h + rank), rnd(rank))
        elif kind == "rnn":
            t["markov_head.joint_proj.weight"], t["markov_head.joint_proj.bias"] = (
                rnd(3 * rank, 2 * rank + h), rnd(3 * rank))
    save_file(t, str(directory / "model.safetensors"), metadata={"format": "pt"})
    sub = cfg.pop("dflash_config")
    taps = sub["target_layer_ids"]
    if len(set(taps)) < len(taps) or max(taps) >= c.num_hidden_layers:
        taps = list(range(len(taps)))
    cfg.update(architectures=["Qwen3DSparkModel"], block_size=block, mask_token_id=0,
               target_layer_ids=taps, markov_rank=rank, markov_head_type=kind,
               tie_word_embeddings=False)
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


class Modes:
    """The proposer's Markov-pass settings, switched between steps (module doc). Each mode
    keeps its own adaptive state (the certified pick's give-up count, the windows' hit
    rates): one mode's misses must not switch another's screen off."""

    def __init__(self, prop: Any) -> None:
        from draftwise_dspark.lookahead import HitRate

        self.prop, self.native = prop, prop.native
        self.head = prop.draft.markov
        self.norms = None if self.head is None else self.head.row_norms
        self.state: dict[str, tuple[Any, ...]] = {}
        self.fresh = lambda: (0, 0, HitRate(), HitRate())
        self.mode: str | None = None

    def names(self) -> tuple[str, ...]:
        if self.head is None:
            return ("full",)
        extra = ("native-seq",) if self.head.w.kind == "rnn" and self.native else ()
        return ("full", "torch", *(("native",) if self.native else ()), *extra)

    def set(self, mode: str) -> None:
        prop = self.prop
        if self.mode is not None:
            self.state[self.mode] = (prop._certify_misses, prop._certify_skipped, prop._hits,
                                     None if self.native is None else self.native.hits)
        self.mode = mode
        state = self.state.get(mode) or self.fresh()
        prop._certify_misses, prop._certify_skipped, prop._hits = state[:3]
        if self.native is not None:
            self.native.hits = state[3]
        prop.native = self.native if mode.startswith("native") else None
        if self.native is not None:
            self.native.windows = mode != "native-seq"
        prop.look_ahead = mode == "torch"
        if self.head is not None:
            self.head.row_norms = None if mode == "full" else self.norms


def main() -> None:
    from draftwise import LLM
    from draftwise.models.kernels import kernel_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="the target (tiny shape only)")
    ap.add_argument("--shape", choices=("tiny", "published"), default="tiny")
    ap.add_argument("--target-layers", type=int, default=5, help="published shape only")
    ap.add_argument("--blocks", type=int, nargs="+", default=[7, 15])
    ap.add_argument("--kinds", nargs="+", default=["none", "vanilla", "gated", "rnn"])
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6, help="steps per mode per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="the engines' num_threads (default: the engine's own choice)")
    args = ap.parse_args()
    timer = {"ms": 0.0, "cpu": 0.0, "thread": 0.0}
    prompt = [(i * 37) % 4000 + 100 for i in range(args.context)]
    with tempfile.TemporaryDirectory() as tmp:
        model, plain = args.model, None
        if args.shape == "published":  # no plain engine beside it (memory)
            model = str(write_random_target(Path(tmp) / "target", args.target_layers))
            target: Any = SimpleNamespace(config=SimpleNamespace(  # the drafter's shape
                **{**json.loads((Path(model) / "config.json").read_text()), **PUBLISHED}))
        else:
            plain = LLM(model=model, max_num_seqs=1, num_threads=args.threads)
            target = plain.engine.loaded
        cfg = target.config
        report: dict[str, Any] = {
            "shape": args.shape, "model": model or target.path,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "context": args.context, "draft_layers": args.draft_layers,
            "markov_rank": args.rank, "load_before": os.getloadavg(), "runs": {},
        }
        written: dict[str, Path] = {}  # per type: the drafter's weights, whatever the block
        for block in args.blocks:
            for kind in args.kinds:
                rank = 0 if kind == "none" else args.rank
                d = Path(tmp) / f"b{block}-{kind}"
                if kind in written:
                    with_block(written[kind], d, block)
                else:
                    written[kind] = write_random_dspark(d, target, block, args.draft_layers,
                                                        "vanilla" if kind == "none" else kind,
                                                        rank)
                spec = {"method": "dspark", "model": str(d), "num_speculative_tokens": block}
                llm = LLM(model=model, max_num_seqs=1, num_threads=args.threads,
                          speculative_config=spec)
                report.update(torch_threads=torch.get_num_threads(),
                              kernel_threads=kernel_threads())
                rows = run_kind(llm, plain, prompt, args, block, kind, timer)
                print(json.dumps(rows), file=sys.stderr, flush=True)  # kept if killed later
                report["runs"].update(rows)
                del llm
                gc.collect()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


def with_block(src: Path, dst: Path, block: int) -> Path:
    """``src``'s drafter (its weights hard-linked) with block size ``block``."""
    dst.mkdir(parents=True)
    os.link(src / "model.safetensors", dst / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["block_size"] = block
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def run_kind(llm: Any, plain: Any, prompt: list[int], args: Any, block: int, kind: str,
             timer: dict[str, float]) -> dict[str, Any]:
    """One engine's interleaved rounds over its modes; the report rows."""
    prop = llm.engine.spec.proposers[0]
    modes = Modes(prop)
    names = modes.names()
    cpu = {"propose": 0.0, "thread": 0.0}

    def propose(batch: Any, _real: Any = prop.propose) -> Any:
        c0, t0 = time.process_time(), time.thread_time()
        out = _real(batch)
        cpu["propose"] += 1e3 * (time.process_time() - c0)
        cpu["thread"] += 1e3 * (time.thread_time() - t0)
        return out

    def markov_pass(*a: Any, _real: Any = prop._markov_pass) -> Any:
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        out = _real(*a)
        timer["ms"] += 1e3 * (time.perf_counter() - t0)
        timer["cpu"] += 1e3 * (time.process_time() - c0)
        timer["thread"] += 1e3 * (time.thread_time() - h0)
        return out

    prop.propose, prop._markov_pass = propose, markov_pass
    phases = {"ns_latent": 0, "ns_screen": 0, "ns_guess": 0, "ns_product": 0}
    if modes.native is not None:  # the kernel's own per-phase clock

        def run_native(*a: Any, _real: Any = modes.native.run, **k: Any) -> Any:
            out = _real(*a, **k)
            for key in phases:
                phases[key] += out[2][key]
            return out

        modes.native.run = run_native
    keys = ("propose", "forward", "markov", "markov_cpu", "markov_thread", "propose_cpu",
            "propose_thread", "picks", "certified", "products", *phases)
    order = ("plain", *names) if plain is not None else names
    got: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in order}
    for _ in range(args.rounds):
        runs = {"spec": Timed(llm, prompt, args.steps * len(names))}
        if plain is not None:
            runs["plain"] = Timed(plain, prompt, args.steps)
        for _ in range(args.steps):  # one step of each in turn: the same load
            for m in order:
                t = runs["plain" if m == "plain" else "spec"]
                if m != "plain":
                    modes.set(m)
                for k in timer:
                    timer[k] = 0.0
                cpu["propose"] = cpu["thread"] = 0.0
                for key in phases:
                    phases[key] = 0
                before = dict(prop.counters)
                t.step()
                g = got[m]
                g["propose"].append(t.out["propose"][-1])
                g["forward"].append(t.out["forward"][-1])
                g["markov"].append(timer["ms"])
                g["markov_cpu"].append(timer["cpu"])
                g["markov_thread"].append(timer["thread"])
                g["propose_cpu"].append(cpu["propose"])
                g["propose_thread"].append(cpu["thread"])
                for key, counter in (("picks", "markov_steps"), ("certified", "markov_certified"),
                                     ("products", "markov_w2_products")):
                    g[key].append(prop.counters[counter] - before[counter])
                for key, ns in phases.items():
                    g[key].append(ns / 1e6)
        for t in runs.values():
            t.finish()
    modes.set("native" if "native" in names else "torch")
    decode = statistics.median(got["plain"]["forward"]) if plain is not None else None
    out = {}
    for mode in names:
        g = got[mode]
        idx = [i for i, p in enumerate(g["propose"]) if p > 0 and (g["markov"][i] > 0
                                                                     or kind == "none")]
        if not idx:
            continue

        def med(key: str, _g: dict[str, list[float]] = g, _idx: list[int] = idx) -> float:
            return statistics.median(_g[key][i] for i in _idx)

        def share(num: str, den: str, _g: dict[str, list[float]] = g,
                  _idx: list[int] = idx) -> float:
            return statistics.median(_g[num][i] / _g[den][i] for i in _idx if _g[den][i] > 0)

        draft, verify = med("propose"), med("forward")
        picks = sum(g["picks"][i] for i in idx)
        out[f"B{block}/{kind}/{mode}"] = {
            "draft_ms": round(draft, 3), "verify_ms": round(verify, 3),
            "draft_markov_ms": round(med("markov"), 3),
            "markov_share_of_draft": round(share("markov", "propose"), 3),
            "markov_cpu_ms": round(med("markov_cpu"), 3),
            "draft_cpu_ms": round(med("propose_cpu"), 3),
            "markov_share_of_draft_cpu": round(share("markov_cpu", "propose_cpu"), 3),
            "markov_share_of_draft_thread_cpu": round(share("markov_thread", "propose_thread"), 3),
            "markov_picks_certified": round(sum(g["certified"][i] for i in idx) / max(picks, 1), 3),
            "w2_products_per_pick": round(sum(g["products"][i] for i in idx) / max(picks, 1), 3),
            "steps_timed": len(idx),
        }
        if decode is not None:
            out[f"B{block}/{kind}/{mode}"].update(
                decode_ms=round(decode, 3), draft_over_decode=round(draft / decode, 3),
                break_even_accepted_per_step=round((draft + verify) / decode - 1, 2))
        if mode.startswith("native"):  # the kernel's phases, wall ms per draft step
            out[f"B{block}/{kind}/{mode}"]["native_phases_ms"] = {
                key[3:]: round(med(key), 3) for key in phases}
    return out


if __name__ == "__main__":
    main()
