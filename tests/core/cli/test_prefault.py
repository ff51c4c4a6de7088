"""The CLI starts faulting in the weights' arena before its imports (``cli.common``).

``main`` reads ``--model`` and ``--dtype`` from the command line before the plugins'
imports; the command claims that arena when its parsed options are the same, and hands
it back and starts its own when they are not.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from draftwise.cli import CliState
from draftwise.cli import common
from draftwise.cli.common import _last_value, claim_prefault, prefault_from_argv
from draftwise.models.arena import libc_madvise
from gguf import GGMLQuantizationType as Q
from tiny_gguf import tiny_gguf  # noqa: F401 - the fixture

SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512}


@pytest.mark.parametrize(("args", "model", "dtype"), [
    (["generate", "--prompt", "hi"], None, None),
    (["generate", "--model", "m.gguf", "--dtype", "float32"], "m.gguf", "float32"),
    (["serve", "--model=a.gguf", "--model", "b.gguf", "--dtype=bfloat16"], "b.gguf", "bfloat16"),
    (["generate", "--prompt", "x", "--model"], None, None),  # no value: click refuses it
])
def test_the_options_are_read_as_click_takes_them(args, model, dtype) -> None:
    assert _last_value(args, "--model") == model
    assert _last_value(args, "--dtype") == dtype


def test_no_arena_for_what_is_dequantized(tiny_gguf) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, **SHAPE)
    assert prefault_from_argv(["generate", "--model", str(t.path), "--dtype", "float32"]) == (
        str(t.path), "float32", None)


class Arena:
    """A stand-in arena that records being handed back."""

    def __init__(self) -> None:
        self.finished = False

    def finish(self) -> None:
        self.finished = True


def claim_in_context(state: CliState, model: str | None, dtype: str) -> object:
    with click.Context(click.Command("generate"), obj=state):
        return claim_prefault(model, dtype)


def test_the_command_claims_the_arena_started_for_its_options(monkeypatch) -> None:
    started: list[tuple[str | None, str]] = []
    monkeypatch.setattr(common, "prefault_weights",
                        lambda model, dtype: started.append((model, dtype)) or "fresh")
    early = Arena()
    state = CliState(prefault=("m.gguf", "auto", early))
    assert claim_in_context(state, "m.gguf", "auto") is early
    assert state.prefault is None and started == [] and not early.finished

    state = CliState(prefault=("m.gguf", "auto", early))  # read wrongly from argv
    assert claim_in_context(state, "other.gguf", "auto") == "fresh"
    assert early.finished and started == [("other.gguf", "auto")]

    assert claim_prefault("x.gguf", "auto") == "fresh"  # no click context: started here


@pytest.mark.skipif(libc_madvise() is None, reason="madvise through libc (Linux)")
def test_main_starts_it_before_the_plugins_and_generate_loads_into_it(tiny_gguf, monkeypatch,
                                                                       capsys) -> None:
    """Through ``main`` as the console script runs it: the arena main started is the one
    the model's weights were packed into."""
    from draftwise.cli import main
    from draftwise.models import gguf_weights

    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, **SHAPE)
    started: list[object] = []
    real = common.prefault_from_argv

    def spy(args):
        started.append(real(args))
        return started[-1]

    taken: list[object] = []
    load = gguf_weights.load_quantized

    def load_spy(*args, **kwargs):
        taken.append(args[-1] if len(args) > 6 else kwargs.get("reserved"))
        return load(*args, **kwargs)

    monkeypatch.setattr(common, "prefault_from_argv", spy)
    monkeypatch.setattr("draftwise.models.loader.load_quantized", load_spy)
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", str(t.path), "--prompt-token-ids", "1,2,3",
              "--max-tokens", "1", "--json"])
    assert exit_.value.code in (0, None), capsys.readouterr().err
    assert len(started) == 1 and started[0][0] == str(t.path)
    arena = started[0][2]
    assert arena is not None and taken == [arena] and arena.taken > 0
    assert Path(t.path).stat().st_size == arena.capacity
