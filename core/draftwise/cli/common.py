"""What the engine-driving commands share: building an engine with progress, failing cleanly."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click

# generate's and bench's reports: the process's own VmHWM (ru_maxrss inherits a parent's)
from draftwise.cli.state import Prefault
from draftwise.peak_rss import peak_rss_bytes as peak_rss_bytes

if TYPE_CHECKING:
    from draftwise.engine import LLMEngine
    from draftwise.models.prefault import Ahead
    from draftwise.sampling_params import SamplingParams


class RegularFile(click.Path):
    """An existing file the command will read (``--workload``): a FIFO, a device or a
    socket is a usage error naming it (exit 2), decided from ``stat`` before anything
    opens it (``formats.default_model.special_kind``), never a read that waits forever."""

    def __init__(self) -> None:
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """click's checks, then the file's kind."""
        from draftwise.formats.default_model import special_kind

        path = super().convert(value, param, ctx)
        kind = special_kind(path)
        if kind is not None:
            self.fail(f"{click.format_filename(path)!r} is {kind}, not a regular file; give "
                      "a JSONL file", param, ctx)
        return path


@contextmanager
def startup_gc(freeze: bool | None = None, keep_paused: bool = False) -> Iterator[None]:
    """No cyclic garbage collection while the process starts, then none of what it built.

    Start-up allocates ~10^6 long-lived objects (torch's modules, the vocabulary, the
    merges) and the collector walks all of them again at every threshold: measured on the
    default model, 12% of the start-up CPU (perf: ``gc_collect_main``). Nothing built
    then is garbage, so collection waits until it is done, and ``gc.freeze`` moves what
    survived out of the collector's sight: later collections (during decode) scan only
    new objects. Freezing is for a process the ``draftwise`` script owns (``freeze``
    None: whether the running command came through :func:`draftwise.cli.main`): frozen
    objects are never collected, so a test process invoking commands in-process (click's
    CliRunner) would keep every engine it built.

    The start-up spans two blocks: :func:`draftwise.cli.main` loading the plugins and
    the command building its engine (:func:`build_engine`), with the command's own
    imports between them (torch among them, since plugin loading no longer imports it).
    So ``main`` leaves the collector paused after its block (``keep_paused``, marked on
    ``CliState.gc_paused``) for the script's own process and a built-in command, and the
    engine's block resumes it.
    """
    from draftwise.cli.state import CliState

    ctx = click.get_current_context(silent=True)
    state = ctx.find_object(CliState) if ctx is not None else None
    if freeze is None:
        freeze = state is not None and state.own_process
    was_enabled = gc.isenabled()
    if state is not None and state.gc_paused:  # paused by main() for this block to end
        was_enabled, state.gc_paused = True, False
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled and not keep_paused:
            gc.enable()


def load_progress() -> Any:
    """A callback that shows weight loading on stderr (rich), or None when not a TTY
    (then rich, ~50 ms of imports, is not imported)."""
    if not sys.stderr.isatty():
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]loading[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
        console=None,
    )
    state: dict[str, Any] = {}

    def callback(done: int, total: int, what: str = "weights") -> None:
        if "task" not in state:
            progress.start()
            state["task"] = progress.add_task(what, total=total)
        progress.update(state["task"], completed=done, total=total, description=what)
        if done >= total:
            progress.stop()

    return callback


def prefault_weights(model: str | None, dtype: str) -> Ahead | None:
    """Start faulting in the memory the target's quantized weights will be packed into,
    on a thread, so the kernel does it while this process imports (``models.arena``).

    Called first thing by a command that builds an engine, before its imports (torch,
    ~1 s on one core). Only where the weights will stay quantized, as far as can be told
    without torch: a GGUF file, dtype ``auto`` or ``bfloat16``, the C kernels built. A
    path that does not resolve gets None here and its refusal from the load, by name.
    """
    if dtype not in ("auto", "bfloat16"):
        return None
    import importlib.util
    import os

    from draftwise.formats.default_model import resolve_model_path
    from draftwise.formats.errors import FormatError
    from draftwise.models.prefault import prefault_for_gguf

    try:
        path = resolve_model_path(model)
    except FormatError:
        return None
    if os.path.isdir(path) or importlib.util.find_spec("draftwise._cpu_kernels") is None:
        return None
    return prefault_for_gguf(path)


#: the commands whose engine :func:`draftwise.cli.main` starts faulting in for (their
#: ``--model`` and ``--dtype`` read from the command line, :func:`prefault_from_argv`)
PREFAULT_COMMANDS = frozenset({"generate", "serve"})


def prefault_from_argv(args: Sequence[str]) -> Prefault:
    """:func:`prefault_weights` for the ``--model`` and ``--dtype`` of a command line,
    read before click parses it: :func:`draftwise.cli.main` starts it before the plugins'
    imports (numpy, pydantic: ~0.2-0.3 s on the 2-core machine), which the command itself
    only runs after. A value read wrongly (another option's value spelled ``--model``)
    costs the head start only: the command compares (:func:`claim_prefault`)."""
    model, dtype = _last_value(args, "--model"), _last_value(args, "--dtype") or "auto"
    if _last_value(args, "--device") not in (None, "cpu"):  # weights on a device: no CPU arena
        return model, dtype, None
    return model, dtype, prefault_weights(model, dtype)


def _last_value(args: Sequence[str], option: str) -> str | None:
    """The value of ``option`` (``--option V`` or ``--option=V``), the last one given, as
    click takes it."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1 :]
    return value


def claim_prefault(model: str | None, dtype: str) -> Ahead | None:
    """The arena :func:`draftwise.cli.main` started for these options, or one started now
    (:func:`prefault_weights`); one started for other options is handed back first."""
    from draftwise.cli.state import CliState

    ctx = click.get_current_context(silent=True)
    state = ctx.find_object(CliState) if ctx is not None else None
    early = state.prefault if state is not None else None
    if state is not None:
        state.prefault = None
    if early is not None:
        if early[:2] == (model, dtype):
            return early[2]
        if early[2] is not None:
            early[2].finish()
    return prefault_weights(model, dtype)


def build_engine(
    model: str | None, speculative_config: str | None, dtype: str,
    reserved: Ahead | None = None, **kwargs: Any,
) -> LLMEngine:
    """An engine with a progress display while weights load (the command then prints its
    backend line, :func:`announce_backend`, where its output allows). ``reserved``: from
    :func:`prefault_weights`, called before the command's imports.

    The engine's imports (torch, the model code) run here, inside :func:`startup_gc`:
    plugin loading no longer imports torch (``speculator.LazyLoader``), so this is where
    the command first pays for it.
    """
    with startup_gc():
        from draftwise.engine import LLMEngine
        from draftwise.engine_args import EngineArgs

        args = EngineArgs(model=model, speculative_config=speculative_config, dtype=dtype,
                          **kwargs)
        engine = LLMEngine(args, progress=load_progress(), reserved=reserved)
    return engine


def announce_backend(engine: LLMEngine) -> None:
    """The start-up lines on stderr: the kernels that run (``models.backend``) and, with
    speculation, the depth rule in force; unless logging shows INFO, where bootstrap has
    logged them already."""
    import logging

    if not logging.getLogger("draftwise.bootstrap").isEnabledFor(logging.INFO):
        click.echo(engine.loaded.model.backend.line(), err=True)
        if engine.spec_config is not None:  # which depth rule is in force, and the switch
            click.echo(engine.spec_config.depth_line(), err=True)


def sampling_params(**fields: Any) -> SamplingParams:
    """SamplingParams from option values; a refused value is a usage error naming its option.

    Built before any weights load, so ``--top-k 9223372036854775808`` fails at once with
    the bound (the same one the server and the Python API apply), never inside a step.
    """
    from pydantic import ValidationError

    from draftwise.sampling_params import SamplingParams

    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err.get("loc") else "sampling"
        message = str(err.get("msg", exc)).removeprefix("Value error, ")
        raise click.BadParameter(message, param_hint=f"--{field.replace('_', '-')}") from None


def check_text_option(option: str, value: str | None) -> None:
    """A text option must be valid Unicode (a non-UTF-8 argv byte arrives as a surrogate)."""
    from draftwise.text import describe_invalid, invalid_text_at

    if value is not None:
        index = invalid_text_at(value)
        if index is not None:
            raise click.BadParameter(describe_invalid(value, index), param_hint=option)


def process_started() -> float:
    """When this process began, on the ``time.monotonic()`` clock.

    What a user waits for starts at the command, before the interpreter and ``site`` run
    (~50-200 ms before :data:`draftwise.cli.STARTED`). Linux gives the process's start
    in clock ticks since boot (``/proc/self/stat``, field 22, on the boot-time clock);
    elsewhere, or if that cannot be read, it is :data:`draftwise.cli.STARTED`.
    """
    import os
    import time

    from draftwise.cli.state import STARTED

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # starttime: field 22; the split starts at field 3
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return STARTED
    started = time.monotonic() - since_start
    # a tick is 10 ms; never later than the module's own clock reading
    return min(started, STARTED)


def fail(exc: BaseException) -> NoReturn:
    """Print a refusal or load error on stderr and exit 2 (no traceback for our own errors)."""
    from draftwise.errors import DraftwiseError

    known: tuple[type[BaseException], ...] = (DraftwiseError,)
    try:
        from draftwise.config.errors import ConfigError

        known = (*known, ConfigError)
    except ImportError:  # pragma: no cover
        pass
    try:
        from draftwise.formats.errors import FormatError

        known = (*known, FormatError)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, known):
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2)
    raise exc
