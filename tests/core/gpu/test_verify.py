"""The device verify kernel: the CPU verify's tokens, token for token, on random mixed
batches; the CPU verify's own chi-square test on its output; a seeded request's tokens
independent of the batch; block verification refused by name."""

from __future__ import annotations

import pytest
import torch

from draftwise.gpu.verify import DeviceVerifyError, verify_on_device
from draftwise.sampling import SamplingParams, make_generator
from draftwise.spec.verify import verify
from tests.core.spec.test_verify import (
    GREEDY,
    LENGTH,
    chain_tables,
    chi_square,
    gens,
    generate,
    processed,
    random_batch,
    run_greedy,
)


#: sequences per chi-square run (the CPU test's 30,000 costs the interpreter too long)
NUM_SEQS = 10_000


def on(device: torch.device):
    """``verify_on_device`` with CPU-made inputs moved to ``device``."""
    def run(logits, drafts, nd, params, generators, dp=None, method="standard", *rest):
        return verify_on_device(logits.to(device), drafts, nd, params, generators,
                                None if dp is None else dp.to(device), method, *rest)
    return run


@pytest.mark.parametrize("probs", [False, True])
def test_equals_the_cpu_verify_token_for_token(device, probs):
    for seed in range(2):
        logits, drafts, nd, params, dp = random_batch(seed, 12, probs=probs)
        cpu = verify(logits, drafts, nd, params, gens(params), dp)
        dev = on(device)(logits, drafts, nd, params, gens(params), dp)
        assert dev.output_token_ids == cpu.output_token_ids
        assert dev.num_accepted == cpu.num_accepted


def test_greedy_tables(device):
    """Perfect match (bonus), early mismatch, empty draft, in one batch, as the CPU does."""
    drafts, targets = [[1, 2, 3], [1, 5, 3], []], [[1, 2, 3, 4], [1, 2, 3, 4], [7]]
    expected = run_greedy(drafts, targets)
    logits = torch.full((9, 100), -100.0)
    logits[torch.arange(9), torch.tensor([t for s in targets for t in s])] = 100.0
    res = on(device)(logits, [t for d in drafts for t in d], [3, 3, 0], [GREEDY] * 3,
                     [None] * 3)
    assert res.output_token_ids == expected.output_token_ids == [[1, 2, 3, 4], [1, 2], [7]]


@pytest.mark.parametrize(("probabilistic", "setting"), [
    (False, (SamplingParams(), 1.0, None)),
    (True, (SamplingParams(temperature=0.7, top_k=4), 0.7, 4)),
])
def test_output_distribution_is_the_target(device, probabilistic, setting):
    """tests/core/spec/test_verify.py's chi-square test (which fails for each wrong rule in its
    WRONG_RULES table) with the device kernel as the verify."""
    target, draft = chain_tables()
    params, temperature, top_k = setting
    samples = generate(target, draft, "standard", probabilistic, params, NUM_SEQS, 3, LENGTH,
                       0, verify_fn=on(device))
    stat, threshold, tv = chi_square(samples, processed(target, temperature, top_k))
    assert stat < threshold, f"chi2={stat:.1f} >= {threshold:.1f} (TV {tv:.4f})"


#: one-line mutations of the kernel's rule -> (probabilistic drafts?, original, mutant)
WRONG_KERNEL_RULES = {
    "accept_q_over_p": (True, "px / tl.where(qx > 0, qx, 1.0)", "qx / tl.where(px > 0, px, 1.0)"),
    "recover_from_p": (True, "resid = tl.maximum(p - q, 0.0)", "resid = p"),
    "recover_from_p_one_hot": (
        False, "resid = tl.where(cols[None, :] == x[:, None], 0.0, p)", "resid = p"),
}


@pytest.mark.parametrize("rule", sorted(WRONG_KERNEL_RULES))
def test_a_wrong_kernel_rule_fails_the_same_test(device, rule, tmp_path, monkeypatch):
    """The chi-square test has power against the kernel itself: the kernel's source with
    one rule changed (imported from a copy) must fail it."""
    import importlib.util
    import inspect

    from draftwise.gpu import triton_verify

    probabilistic, original, mutant = WRONG_KERNEL_RULES[rule]
    source = inspect.getsource(triton_verify)
    assert source.count(original) == 1, "the mutation no longer matches the kernel"
    path = tmp_path / f"mutant_{rule}.py"
    path.write_text(source.replace(original, mutant))
    spec = importlib.util.spec_from_file_location(f"mutant_{rule}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(triton_verify, "verify_kernel", module.verify_kernel)
    target, draft = chain_tables()
    samples = generate(target, draft, "standard", probabilistic, SamplingParams(), NUM_SEQS, 3,
                       LENGTH, 0, verify_fn=on(device))
    stat, threshold, _ = chi_square(samples, processed(target, 1.0, None))
    assert stat > threshold, f"{rule} not detected: chi2={stat:.1f} < {threshold:.1f}"


@pytest.mark.parametrize("probs", [False, True])
def test_seeded_request_ignores_batch_composition(device, probs):
    vocab = 30
    g = torch.Generator().manual_seed(0)
    mine_logits = torch.randn(4, vocab, generator=g)
    mine_q = torch.rand(3, vocab, generator=g).softmax(-1)
    mine = SamplingParams(temperature=0.9, seed=1234)
    run = on(device)
    alone = run(mine_logits, [3, 4, 5], [3], [mine], [make_generator(1234)],
                mine_q if probs else None)
    for others in (1, 5, 40):
        logits = torch.cat([torch.randn(3 * others, vocab, generator=g), mine_logits])
        drafts = torch.randint(0, vocab, (2 * others,), generator=g).tolist() + [3, 4, 5]
        q = torch.cat([torch.rand(2 * others, vocab, generator=g).softmax(-1), mine_q])
        together = run(logits, drafts, [2] * others + [3], [SamplingParams()] * others + [mine],
                       [None] * others + [make_generator(1234)], q if probs else None)
        assert together.output_token_ids[-1] == alone.output_token_ids[0]


def test_block_verification_is_refused_by_name(device):
    with pytest.raises(DeviceVerifyError, match="use method 'standard'"):
        on(device)(torch.zeros(2, 5), [1], [1], [SamplingParams(seed=1)],
                   [make_generator(1)], None, "block")
