"""The collector stays paused from the script's start until the command's engine is built.

Plugin loading imports no torch any more, so a command's own imports (``draftwise.sampling``
for its sampling options, the engine's modules) are start-up too: with the collector on
they cost ~0.1 s CPU of ``generate``'s start-up on the default model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

#: the console script's own call with spies: whether the collector runs while generate
#: checks its sampling options, and once build_engine is done (it refuses a missing model)
SCRIPT = textwrap.dedent("""
    import atexit, gc, os, sys
    import draftwise.cli.common as common
    check, build = common.sampling_params, common.build_engine
    def sampling_params(**kw):
        os.write(2, b"options: gc %s\\n" % str(gc.isenabled()).encode())
        return check(**kw)
    def build_engine(*a, **kw):
        try:
            return build(*a, **kw)
        finally:
            os.write(2, b"built: gc %s\\n" % str(gc.isenabled()).encode())
    common.sampling_params, common.build_engine = sampling_params, build_engine
    if os.environ.get("PLUGIN"):
        import click
        import draftwise.cli as cli
        make = cli.make_cli
        def make_cli():
            group = make()
            group.add_command(click.Command(
                "sentinel", callback=lambda: print("plugin: gc", gc.isenabled())))
            return group
        cli.make_cli = make_cli
    sys.argv = ["draftwise", *sys.argv[1:]]
    from draftwise.cli import main
    main()
""")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env))


def test_paused_through_the_command_start_and_resumed_once_the_engine_is_built(tmp_path) -> None:
    out = run("generate", "--model", str(tmp_path / "missing.gguf"), "--prompt", "hi")
    assert out.returncode == 2, out.stderr
    assert "options: gc False" in out.stderr
    assert "built: gc True" in out.stderr


def test_a_plugin_command_runs_with_the_collector_on() -> None:
    out = run("sentinel", PLUGIN="1")
    assert out.returncode == 0, out.stderr
    assert "plugin: gc True" in out.stdout
