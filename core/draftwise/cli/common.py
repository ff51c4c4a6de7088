"""What the engine-driving commands share: building an engine with progress, failing cleanly."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from draftwise.engine import LLMEngine


def load_progress() -> Any:
    """A callback that shows weight loading on stderr (rich), or None when not a TTY."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]loading[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
        console=None,
        disable=not sys.stderr.isatty(),
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


def build_engine(
    model: str | None, speculative_config: str | None, dtype: str, **kwargs: Any
) -> LLMEngine:
    """An engine with a progress display while weights load."""
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs

    args = EngineArgs(model=model, speculative_config=speculative_config, dtype=dtype, **kwargs)
    return LLMEngine(args, progress=load_progress())


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


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
