"""``draftwise doctor``: pairing checks, offline acceptance, speedup per k, a recommendation."""

from __future__ import annotations

from typing import Any

import click

from draftwise.cli.common import RegularFile


@click.command("doctor")
@click.option("--model", default=None, help="Target checkpoint (default: the embedded model).")
@click.option("--speculative-config", "-sc", required=True, help="vLLM-style JSON.")
@click.option("--workload", required=True, type=RegularFile(),
              help="JSONL prompts (the bench format).")
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(2))
@click.option("--dtype", default="auto", show_default=True)
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1))
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="Also time each k online (the same engine, depth set per request).")
@click.option("--ignore-eos", is_flag=True, help="Generate max-tokens per prompt regardless.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def doctor(
    model: str | None,
    speculative_config: str,
    workload: str,
    max_tokens: int,
    dtype: str,
    num_threads: int | None,
    measure: bool,
    ignore_eos: bool,
    as_json: bool,
) -> None:
    """Check a target + speculative config and recommend what to serve."""
    from draftwise import doctor as dr
    from draftwise.bench import load_workload, prompt_ids
    from draftwise.cli.common import build_engine, fail
    from draftwise.spec.cost_model import measure_costs

    try:
        engine = build_engine(model, speculative_config, dtype, max_num_seqs=1,
                              num_threads=num_threads)
        spec = engine.spec
        if spec is None:
            raise dr.DoctorError("the speculative config turns speculation off: nothing to check")
        findings = dr.pairing_checks(engine)
        estimate = None if dr.walkable(spec) else dr.training_estimate(engine)
        if estimate is None:
            dr.check_walkable(spec)
        items = load_workload(workload)
        prompts = [prompt_ids(engine, i) for i in items]
        if estimate is not None:
            _report_estimate(engine, estimate, findings, prompts, max_tokens, ignore_eos,
                             measure, as_json)
            return
        conts = dr.greedy_continuations(engine, prompts, max_tokens, ignore_eos)
        ks = list(range(1, spec.k + 1))
        per_prompt = {k: [dr.simulate_walk(spec, [p], [c], max_tokens, k, engine.max_model_len)
                          for p, c in zip(prompts, conts)] for k in ks}
        walks = [dr.merge_walks(per_prompt[k]) for k in ks]
        cost = spec.policy.cost if spec.policy is not None else measure_costs(
            engine.runner, engine.kv, spec.k, 1)
        predicted = {w.k: dr.predicted_speedup(w, cost) for w in walks}
        best_each = set()
        for n in range(len(prompts)):
            pp = {k: dr.predicted_speedup(per_prompt[k][n], cost) for k in ks}
            k_best = max(pp, key=lambda k: pp[k])
            best_each.add(k_best if pp[k_best] >= 1.0 else 0)
        measured = dr.measured_speedup(engine, prompts, max_tokens, ks, ignore_eos) if measure \
            else {}
        basis = measured or predicted
        rec = dr.recommend(engine.spec_config.to_json(), basis, best_each)
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    if as_json:
        doc: dict[str, Any] = {
            "pairing": [_finding(f) for f in findings],
            "num_prompts": len(prompts),
            "max_tokens": max_tokens,
            "per_k": [{"k": w.k, **w.stats.summary(), "predicted_speedup": predicted[w.k],
                       "measured_speedup": measured.get(w.k)} for w in walks],
            "cost_model": cost.summary(),
            "recommended": rec,
        }
        click.echo(dr.as_json(doc))
        return
    click.echo("pairing:")
    for f in findings:
        click.echo(f"  [{f.status:>4}] {f.member}: {f.check}: {f.detail}")
    click.echo(f"offline acceptance over {len(prompts)} prompts, {max_tokens} tokens each "
               "(teacher-forced on the target's greedy output):")
    click.echo(dr.table(walks, predicted, measured))
    click.echo(f"recommended: {dr.as_json(rec['speculative_config'])}")
    click.echo(f"  because {rec['why']}")


def _report_estimate(engine: Any, est: Any, findings: list[Any], prompts: list[list[int]],
                     max_tokens: int, ignore_eos: bool, measure: bool, as_json: bool) -> None:
    """A drafter the walk cannot run (it reads the target's hidden states), predicted from
    the held-out estimate its trainer saved and this machine's measured costs."""
    from draftwise import doctor as dr
    from draftwise.spec.cost_model import measure_costs

    spec = engine.spec
    ks = list(range(1, min(spec.k, len(est.through_slot)) + 1))
    cost = spec.policy.cost if spec.policy is not None else measure_costs(
        engine.runner, engine.kv, spec.k, 1)
    draft = dr.draft_step_seconds(engine, prompts[0], max_tokens)
    predicted = {k: dr.estimate_speedup(est, k, cost, draft) for k in ks}
    measured = dr.measured_speedup(engine, prompts, max_tokens, ks, ignore_eos) if measure \
        else {}
    basis = measured or predicted
    best = max(basis, key=lambda k: basis[k])
    rec = dr.recommend(engine.spec_config.to_json(), basis, {best if basis[best] >= 1 else 0})
    if as_json:
        click.echo(dr.as_json({
            "pairing": [_finding(f) for f in findings],
            "training_estimate": est.as_dict(),
            "draft_step_seconds": draft,
            "per_k": [{"k": k, "expected_tokens_per_step": est.expected_tokens(k),
                       "predicted_speedup": predicted[k],
                       "measured_speedup": measured.get(k)} for k in ks],
            "cost_model": cost.summary(),
            "recommended": rec,
        }))
        return
    click.echo("pairing:")
    for f in findings:
        click.echo(f"  [{f.status:>4}] {f.member}: {f.check}: {f.detail}")
    click.echo(f"held-out estimate saved by `draftwise train` ({est.steps} draft steps over "
               f"{est.sequences} greedy rows of its data; the walk matches online acceptance):")
    click.echo(f"a drafting step costs {draft * 1e3:.1f} ms here, a 1-token target step "
               f"{cost.step_seconds(1, 1) * 1e3:.1f} ms")
    click.echo(f"{'k':>3} {'tokens/step':>12} {'predicted':>10} {'measured':>9}")
    for k in ks:
        meas = measured.get(k)
        click.echo(f"{k:>3} {est.expected_tokens(k):>12.2f} {predicted[k]:>9.2f}x "
                   f"{(f'{meas:.2f}x' if meas else '-'):>9}")
    click.echo(f"recommended: {dr.as_json(rec['speculative_config'])}")
    click.echo(f"  because {rec['why']}")


def _finding(f: Any) -> dict[str, Any]:
    """A slotted Finding as a dict."""
    return {"member": f.member, "check": f.check, "status": f.status, "detail": f.detail}
