"""Per-step cost of a DSpark draft against one target decode step, per Markov type.

As ``dflash_step.py`` (whose random-drafter writer and step timer it reuses): no trained
DSpark drafter exists for the models on this machine, so this times a RANDOM DeepSpec
``Qwen3DSparkModel`` drafter of the published shape (``--draft-layers`` layers of the
target's width, its own embedding and LM head, ``markov_rank`` 256) on the default model,
one request, greedy, a prompt of ``--context`` tokens. Per block size B (k = B) and Markov
type, in two modes interleaved step by step with a plain decode step (the machine's
load moves): ``full`` (the whole ``W2 u`` product at every position) and ``certified``
(what the engine runs: the certified greedy pick, ``MarkovHead.certified_argmax``, and
for rnn the look-ahead windows, ``draftwise_dspark.lookahead``), plus for rnn
``sequential`` (the pass before the windows: certification tried, one position per
product): ``draft_ms`` (propose), ``draft_context_ms``,
``draft_layers_ms``, ``draft_markov_ms`` (the whole sequential pass,
``DSparkProposer._markov_pass``: latents, biases or certified picks, picks and indexing),
``verify_ms``; the Markov pass's share of the draft step (the
median of the per-step ratios, in wall time and in process CPU time, which a loaded
machine's descheduling does not inflate), the share of Markov steps certified, ``W2``
products per Markov step, the break-even ``a*`` accepted drafts per step
(``1 + a* = (draft + verify) / decode``); the load average before and after.

    python benchmarks/dspark_step.py --blocks 7 15 --kinds vanilla gated rnn --steps 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_step import Timed, write_random_drafter


def write_random_dspark(directory: Path, target: Any, block: int, layers: int, kind: str,
                        rank: int) -> Path:
    """The DFlash body of ``dflash_step`` plus DeepSpec's own tensors and config keys."""
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
    cfg.update(architectures=["Qwen3DSparkModel"], block_size=block, mask_token_id=0,
               target_layer_ids=sub["target_layer_ids"], markov_rank=rank,
               markov_head_type=kind, tie_word_embeddings=False)
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def main() -> None:
    import os

    from draftwise import LLM
    from draftwise_dspark.markov import MarkovHead

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--blocks", type=int, nargs="+", default=[7, 15])
    ap.add_argument("--kinds", nargs="+", default=["none", "vanilla", "gated", "rnn"])
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8, help="steps per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds; in each, plain/full/certified steps alternate one by one")
    args = ap.parse_args()
    markov = {"ms": 0.0, "cpu": 0.0}
    prompt = [(i * 37) % 4000 + 100 for i in range(args.context)]
    plain = LLM(model=args.model, max_num_seqs=1)
    report: dict[str, Any] = {
        "model": plain.engine.loaded.path, "context": args.context,
        "threads": torch.get_num_threads(), "draft_layers": args.draft_layers,
        "markov_rank": args.rank, "load_before": os.getloadavg(), "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for block in args.blocks:
            for kind in args.kinds:
                rank = 0 if kind == "none" else args.rank
                d = write_random_dspark(Path(tmp) / f"b{block}-{kind}", plain.engine.loaded,
                                        block, args.draft_layers,
                                        "vanilla" if kind == "none" else kind, rank)
                cfg = {"method": "dspark", "model": str(d), "num_speculative_tokens": block}
                modes: tuple[str, ...] = ("full", "certified") if rank else ("full",)
                if kind == "rnn":
                    modes += ("sequential",)
                llms = {m: LLM(model=args.model, max_num_seqs=1, speculative_config=cfg)
                        for m in modes}
                head = llms["full"].engine.spec.proposers[0].draft.markov
                if head is not None:
                    head.row_norms = None  # the full W2 product at every position
                for m in ("full", "sequential"):  # one position per W2 product
                    if m in llms:
                        llms[m].engine.spec.proposers[0].look_ahead = False
                cpu = {"propose": 0.0}
                for m in modes:  # CPU time of propose: what the loaded machine's wall hides
                    prop = llms[m].engine.spec.proposers[0]

                    def propose(batch: Any, _real: Any = prop.propose,
                                _cpu: dict[str, float] = cpu) -> Any:
                        c0 = time.process_time()
                        out = _real(batch)
                        _cpu["propose"] += 1e3 * (time.process_time() - c0)
                        return out

                    prop.propose = propose

                    def markov_pass(*a: Any, _real: Any = prop._markov_pass) -> Any:
                        t0, c0 = time.perf_counter(), time.process_time()
                        out = _real(*a)
                        markov["ms"] += 1e3 * (time.perf_counter() - t0)
                        markov["cpu"] += 1e3 * (time.process_time() - c0)
                        return out

                    prop._markov_pass = markov_pass
                got: dict[str, dict[str, list[float]]] = {
                    m: {"propose": [], "forward": [], "context": [], "block": [], "markov": [],
                        "markov_cpu": [], "propose_cpu": []}
                    for m in ("plain", *modes)}
                for _ in range(args.rounds):
                    runs = {"plain": Timed(plain, prompt, args.steps)}
                    runs.update({m: Timed(llms[m], prompt, args.steps) for m in modes})
                    for _ in range(args.steps):  # one step each in turn: the same load
                        for m, t in runs.items():
                            markov["ms"] = markov["cpu"] = cpu["propose"] = 0.0
                            t.step()
                            got[m]["markov"].append(markov["ms"])
                            got[m]["markov_cpu"].append(markov["cpu"])
                            got[m]["propose_cpu"].append(cpu["propose"])
                    for m, t in runs.items():
                        t.finish()
                        for key in ("propose", "forward", "context", "block"):
                            got[m][key] += t.out[key]
                decode = statistics.median(got["plain"]["forward"])
                for mode in modes:
                    g = got[mode]
                    # steps that drafted (the first after prefill may not)
                    idx = [i for i, p in enumerate(g["propose"]) if p > 0 and g["markov"][i] > 0
                           or (p > 0 and not rank)]
                    draft = statistics.median(g["propose"][i] for i in idx)
                    verify = statistics.median(g["forward"][i] for i in idx)
                    mk = statistics.median(g["markov"][i] for i in idx)
                    share = statistics.median(g["markov"][i] / g["propose"][i] for i in idx)
                    share_cpu = statistics.median(g["markov_cpu"][i] / g["propose_cpu"][i]
                                                  for i in idx if g["propose_cpu"][i] > 0)
                    stats = llms[mode].engine.spec.proposer_stats()[0]
                    need = (draft + verify) / decode - 1
                    report["runs"][f"B{block}/{kind}/{mode}"] = {
                        "draft_ms": round(draft, 3), "verify_ms": round(verify, 3),
                        "decode_ms": round(decode, 3),
                        "draft_context_ms": round(statistics.median(g["context"]), 3),
                        "draft_layers_ms": round(statistics.median(g["block"]), 3),
                        "draft_markov_ms": round(mk, 3),
                        "markov_share_of_draft": round(share, 3),
                        "markov_cpu_ms": round(statistics.median(g["markov_cpu"][i]
                                                                 for i in idx), 3),
                        "draft_cpu_ms": round(statistics.median(g["propose_cpu"][i]
                                                                for i in idx), 3),
                        "markov_share_of_draft_cpu": round(share_cpu, 3),
                        "markov_steps_certified": round(
                            stats["markov_certified"] / max(stats["markov_steps"], 1), 3),
                        "w2_products_per_step": round(
                            stats["markov_w2_products"] / max(stats["markov_steps"], 1), 3),
                        "draft_over_decode": round(draft / decode, 3),
                        "break_even_accepted_per_step": round(need, 2),
                        "break_even_acceptance_rate": round(need / block, 3),
                    }
                del llms
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
