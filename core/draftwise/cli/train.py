"""``draftwise train``: drafters from the target's own generations.

``train data``: the target answers a prompt mix (built in, or ``--prompts``) and its
hidden states at the drafter's taps are recorded into resumable shards. ``train dflash``:
a DFlash drafter trained on such a folder, saved in z-lab's layout, resumable
(``draftwise.train``). ``train dspark``: a DSpark drafter with a reduced draft
vocabulary, its shape from the measured cost model, saved in speculators' layout.
``train export``: a DFlash drafter as llama.cpp's ``dflash`` GGUF
(``draftwise.train.llamacpp_export``), or a DSpark drafter in DeepSpec's
``Qwen3DSparkModel`` layout (``draftwise.train.deepspec_export``). ``train mtp``: an MTP
head for a target that ships none, saved in the DeepSeek ``nextn`` layout the mtp plugin
loads by ``"model"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from draftwise.cli.common import RegularFile
from draftwise.train.loop import RunPlan

RunPlanT = TypeVar("RunPlanT", bound=RunPlan)


@click.group("train")
def train() -> None:
    """Make drafter training data from the target's own generations, and train drafters."""


def _taps(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        taps = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"comma-separated layer numbers, got {value!r}") from None
    return taps


@train.command("data")
@click.option("--model", default=None, help="Target checkpoint (default: the embedded model).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for the shards (an existing one is resumed).")
@click.option("--prompts", default=None, type=RegularFile(),
              help='JSONL: {"prompt": ...} or {"messages": [...]} per line '
                   "(default: the built-in mix).")
@click.option("--tokens", default=None, type=click.IntRange(1),
              help="Stop once this many tokens are recorded (all runs together).")
@click.option("--minutes", default=None, type=click.FloatRange(0, min_open=True),
              help="Stop after this long (this run).")
@click.option("--max-gb", default=None, type=click.FloatRange(0, min_open=True),
              help="Stop before the folder passes this size.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1),
              help="Tokens per response.")
@click.option("--taps", default=None,
              help="Target layers to record, e.g. 7,15,23,29 (default: four across the depth).")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(1),
              help="Prompts per engine call (continuous batching inside it).")
@click.option("--sampled-share", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="Share of prompts answered by sampling (the rest greedy).")
@click.option("--temperature", default=0.7, show_default=True,
              type=click.FloatRange(0, min_open=True))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--limit", default=None, type=click.IntRange(1),
              help="Use only the first N prompts.")
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary at the end.")
def data(model: str | None, out: str, prompts: str | None, tokens: int | None,
         minutes: float | None, max_gb: float | None, max_tokens: int, taps: str | None,
         batch: int, sampled_share: float, temperature: float, seed: int, limit: int | None,
         num_threads: int | None, as_json: bool) -> None:
    """Record the target's answers and hidden states (resumable: run it again to go on)."""
    from pathlib import Path

    from draftwise.cli.common import fail
    from draftwise.train.data import DataPlan, Progress, generate_data
    from draftwise.train.prompts import builtin_prompts, read_prompts

    plan = DataPlan(model=model, out=Path(out), taps=_taps(taps), max_tokens=max_tokens,
                    batch=batch, tokens=tokens, minutes=minutes,
                    max_bytes=None if max_gb is None else int(max_gb * 2**30),
                    sampled_share=sampled_share, temperature=temperature, seed=seed,
                    threads=num_threads)

    def show(p: Progress) -> None:
        eta = "" if p.eta_seconds is None else f", ETA {p.eta_seconds / 60:.1f} min"
        click.echo(f"data: prompts {p.prompts_done}/{p.prompts_total}, {p.tokens:,} tokens "
                   f"recorded, {p.tokens_per_second:.1f} generated tok/s, "
                   f"{p.bytes / 2**20:.1f} MiB{eta}", err=True)

    try:
        items = read_prompts(prompts) if prompts else builtin_prompts(seed)
        items = items[:limit] if limit else items
        report = generate_data(plan, items, show)
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    p = report.progress
    summary = {"out": str(report.out), "taps": list(report.taps), "stopped": report.stopped,
               "prompts_done": p.prompts_done, "prompts_total": p.prompts_total,
               "tokens": p.tokens, "bytes": p.bytes, "skipped_prompts": p.skipped,
               "seconds": round(p.seconds, 2),
               "generated_tokens_per_second": round(p.tokens_per_second, 2)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"data: {p.tokens:,} tokens from {p.prompts_done} prompts in {report.out} "
                   f"(taps {list(report.taps)}, {p.bytes / 2**20:.1f} MiB; stopped by "
                   f"{report.stopped})")


def _target_options(out_help: str) -> Callable[[Any], Any]:
    """``--data``, ``--out``, ``--model``: the first options of every trainer."""
    options = [
        click.option("--data", required=True, type=click.Path(), help="A `train data` folder."),
        click.option("--out", required=True, type=click.Path(file_okay=False), help=out_help),
        click.option("--model", default=None, help="The target the data was recorded on "
                     "(default: the embedded model)."),
    ]
    return _stack(options)


def _loop_options(anchors_help: str) -> Callable[[Any], Any]:
    """The loop's options every trainer shares (``train.loop.RunPlan``'s fields, with its
    defaults: one place for them), after each method's own."""
    plan = RunPlan(data=Path(), out=Path())
    positive = click.FloatRange(0, min_open=True)
    options = [
        click.option("--steps", default=None, type=click.IntRange(1),
                     help="Stop at this step (every run into --out together)."),
        click.option("--minutes", default=None, type=positive,
                     help="Stop after this long (this run)."),
        click.option("--lr", default=plan.lr, show_default=True, type=positive),
        click.option("--warmup", default=plan.warmup, show_default=True,
                     type=click.IntRange(0)),
        click.option("--batch", default=plan.batch, show_default=True, type=click.IntRange(1),
                     help="Sequences per step."),
        click.option("--anchors", default=plan.anchors, show_default=True,
                     type=click.IntRange(1), help=anchors_help),
        click.option("--checkpoint-minutes", default=plan.checkpoint_minutes,
                     show_default=True, type=positive),
        click.option("--eval-minutes", default=plan.eval_minutes, show_default=True,
                     type=positive),
        click.option("--seed", default=plan.seed, show_default=True, type=int),
        click.option("--threads", "threads", default=None, type=click.IntRange(1)),
        click.option("--json", "as_json", is_flag=True, help="Print a JSON summary at the end."),
    ]
    return _stack(options)


def _stack(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """``options`` applied so that ``--help`` lists them in this order."""
    def apply(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command
    return apply


def _plan(cls: type[RunPlanT], run: dict[str, Any], **own: Any) -> RunPlanT:
    """A method's plan from the shared options (``data``/``out`` as paths) and its own."""
    return cls(**{**run, "data": Path(run["data"]), "out": Path(run["out"])}, **own)


def _train(method: str, trainer: Callable[..., Any], plan: RunPlan, as_json: bool,
           extra: str = "") -> None:
    """Run ``trainer`` with progress on stderr; refusals become a clean exit."""
    from draftwise.cli.common import fail

    try:
        report = trainer(plan, lambda line: click.echo(line, err=True))
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    _summarise(method, report, as_json, extra)


@train.command("dflash")
@_target_options("The drafter folder (an existing run there is resumed).")
@click.option("--layers", default=1, show_default=True, type=int, help="Draft decoder layers.")
@click.option("--block-size", default=8, show_default=True, type=int,
              help="Anchor + drafted slots (num_speculative_tokens = block size - 1).")
@click.option("--gamma", default=None, type=click.FloatRange(0, min_open=True),
              help="Position weight exp(-(k-1)/gamma) (default: 7 for B=16, 4 for B=8, else B/2).")
@click.option("--mask-token-id", default=None, type=int,
              help="The mask slots' token (default: the target's last id).")
@_loop_options("Blocks per sequence per step.")
def dflash(layers: int, block_size: int, gamma: float | None, mask_token_id: int | None,
           as_json: bool, **run: Any) -> None:
    """Train a DFlash drafter on a data folder (resumable: run it again to go on)."""
    from draftwise.train.dflash import DFlashPlan, train_dflash

    plan = _plan(DFlashPlan, run, layers=layers, block_size=block_size, gamma=gamma,
                 mask_token_id=mask_token_id)
    _train("dflash", train_dflash, plan, as_json, f', "num_speculative_tokens": {block_size - 1}')


@train.command("dspark")
@_target_options("The drafter folder (an existing run there is resumed).")
@click.option("--layers", default=None, type=int,
              help="Draft decoder layers (default: chosen by the measured cost model).")
@click.option("--block-size", default=4, show_default=True, type=int,
              help="Drafts per step (num_speculative_tokens).")
@click.option("--draft-vocab", default=None, type=int,
              help="Draft vocabulary: the N most frequent target tokens of the data "
                   "(default: chosen by the measured cost model).")
@click.option("--markov-rank", default=64, show_default=True, type=int)
@_loop_options("Blocks per sequence per step.")
def dspark(layers: int | None, block_size: int, draft_vocab: int | None, markov_rank: int,
           as_json: bool, **run: Any) -> None:
    """Train a DSpark drafter with a reduced draft vocabulary (resumable: run it again)."""
    from draftwise.train.dspark import DSparkPlan, train_dspark

    plan = _plan(DSparkPlan, run, layers=layers, block_size=block_size,
                 draft_vocab=draft_vocab, markov_rank=markov_rank)
    _train("dspark", train_dspark, plan, as_json)


@train.command("mtp")
@_target_options("The head's folder (an existing run there is resumed).")
@click.option("--layers", default=1, show_default=True, type=int,
              help="MTP layers (the mtp plugin runs one).")
@click.option("--depth", default=2, show_default=True, type=int,
              help="Recursive steps the loss covers (the plugin loops the head for k > 1).")
@click.option("--eval-k", default=3, show_default=True, type=int,
              help="Drafts per step of the held-out walk (k = 1 .. this are reported).")
@_loop_options("Labelled positions per sequence per step.")
def mtp(layers: int, depth: int, eval_k: int, as_json: bool, **run: Any) -> None:
    """Train an MTP head for a target that has none (resumable: run it again to go on)."""
    from draftwise.train.mtp import MtpPlan, train_mtp

    plan = _plan(MtpPlan, run, layers=layers, depth=depth, eval_k=eval_k)
    _train("mtp", train_mtp, plan, as_json, f', "num_speculative_tokens": {eval_k}')


def _summarise(method: str, report: Any, as_json: bool, extra: str = "") -> None:
    """A finished (or budget-stopped) training run's last line, or its JSON summary."""
    from draftwise.train.loop import mean_text

    summary = {"out": str(report.out), "steps": report.step, "stopped": report.stopped,
               "loss": report.losses[-1] if report.losses else None,
               "acceptance": report.acceptance, "seconds": round(report.seconds, 1)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{method}: drafter in {report.out} after {report.step} steps (stopped by "
               f"{report.stopped}); held-out mean acceptance length "
               f"{mean_text(report.acceptance)}; use it with "
               f"--speculative-config '{{\"method\": \"{method}\", \"model\": "
               f"\"{report.out}\"{extra}}}'")


@train.command("estimate")
@click.option("--drafter", required=True, type=click.Path(file_okay=False),
              help="A drafter folder `train dflash` wrote.")
@click.option("--data", required=True, type=click.Path(), help="The data folder it was trained on.")
@click.option("--model", default=None, help="The target (default: the embedded model).")
@click.option("--anchors", default=4096, show_default=True, type=click.IntRange(1),
              help="Most anchor blocks drafted.")
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1))
@click.option("--save", is_flag=True,
              help="Also write it into the drafter's draftwise_train.json (what doctor reads).")
def estimate(drafter: str, data: str, model: str | None, anchors: int,
             num_threads: int | None, save: bool) -> None:
    """Print a saved DFlash drafter's held-out acceptance estimate as JSON."""
    import torch

    from draftwise.cli.common import fail
    from draftwise.train.dflash import estimate_saved

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        acc = estimate_saved(Path(drafter), Path(data), model, anchors)
        if save:
            save_estimate(Path(drafter), acc.as_dict())
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    click.echo(json.dumps(acc.as_dict(), indent=2))


def save_estimate(drafter: Path, acceptance: dict[str, object]) -> None:
    """``acceptance`` as the drafter's current estimate in its report (the one before it
    kept under ``acceptance_before``), written beside and renamed into place."""
    from draftwise.train.loop import REPORT

    path = drafter / REPORT
    doc = json.loads(path.read_text()) if path.is_file() else {"method": "dflash"}
    if "acceptance" in doc:
        doc["acceptance_before"] = doc["acceptance"]
    doc["acceptance"] = acceptance
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


@train.command("export")
@click.option("--drafter", required=True, type=click.Path(), help="A drafter folder "
              "`train dflash` (llamacpp-gguf) or `train dspark` (deepspec) wrote.")
@click.option("--format", "fmt", required=True,
              type=click.Choice(["llamacpp-gguf", "deepspec"]),
              help="llamacpp-gguf: llama.cpp's `dflash` architecture, for "
                   "`llama-server --spec-type draft-dflash -md FILE`. deepspec: DeepSpec's "
                   "Qwen3DSparkModel folder (a DSpark drafter over the whole vocabulary).")
@click.option("--out", required=True, type=click.Path(), help="The .gguf file "
              "(llamacpp-gguf) or the folder (deepspec) to write.")
@click.option("--target", default=None, help="llamacpp-gguf: the target's GGUF, whose "
              "tokenizer the file carries (default: the embedded model). deepspec: the "
              "target whose config and embedding/head the folder copies (default: the one "
              "the drafter records).")
@click.option("--type", "matrix_type", default=None,
              type=click.Choice(["f32", "f16", "bf16", "q8_0"]),
              help="llamacpp-gguf: stored type of the matrices (norms stay f32) [default: "
                   "f32].")
@click.option("--allow-final-tap", is_flag=True,
              help="llamacpp-gguf: write a drafter that taps the target's last layer: it "
                   "runs only on a llama.cpp built with benchmarks/llamacpp_final_tap.patch.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def export(drafter: str, fmt: str, out: str, target: str | None, matrix_type: str | None,
           allow_final_tap: bool, as_json: bool) -> None:
    """Write a trained drafter in another engine's format."""
    from pathlib import Path

    from draftwise.cli.common import fail
    from draftwise.train.llamacpp_export import DrafterExportError

    if fmt == "deepspec":
        for given, flag in ((matrix_type is not None, f"--type {matrix_type}"),
                            (allow_final_tap, "--allow-final-tap")):
            if given:
                fail(DrafterExportError(f"{flag} is a llamacpp-gguf option: DeepSpec's layout "
                                        "stores the drafter's own bf16 weights. Instead: drop "
                                        "it."))
        export_deepspec_cli(Path(drafter), Path(out), target, as_json)
        return
    from draftwise.train.llamacpp_export import export_llamacpp

    try:
        report = export_llamacpp(Path(drafter), Path(out), target, matrix_type or "f32",
                                 allow_final_tap)
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    summary = {"out": str(report.out), "format": fmt, "tensors": report.tensors,
               "bytes": report.bytes, "target_layers": list(report.target_layers),
               "block_size": report.block_size, "mask_token_id": report.mask_token_id,
               "type": report.matrix_type}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"export: {report.out} ({report.bytes / 2**20:.1f} MiB, {report.tensors} "
                   f"tensors); run it with llama-server -m TARGET.gguf -md {report.out} "
                   f"--spec-type draft-dflash --spec-draft-n-max {report.block_size - 1}")


def export_deepspec_cli(drafter: Path, out: Path, target: str | None, as_json: bool) -> None:
    """``train export --format deepspec``."""
    from draftwise.cli.common import fail
    from draftwise.train.deepspec_export import export_deepspec

    try:
        report = export_deepspec(drafter, out, target)
    except Exception as exc:  # noqa: BLE001 - refusals become a clean exit
        fail(exc)
        return
    summary = {"out": str(report.out), "format": "deepspec", "tensors": report.tensors,
               "bytes": report.bytes, "target_layer_ids": list(report.target_layer_ids),
               "block_size": report.block_size, "mask_token_id": report.mask_token_id}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"export: {report.out} ({report.bytes / 2**20:.1f} MiB, {report.tensors} "
                   "tensors, DeepSpec's Qwen3DSparkModel); run it with --speculative-config "
                   f"'{{\"method\": \"dspark\", \"model\": \"{report.out}\"}}'")
