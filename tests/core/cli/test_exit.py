"""The ``draftwise`` script's process ends without the interpreter's teardown, and loses
nothing an ordinary exit keeps: exit status, atexit handlers, flushed output, live threads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

#: the console script's own call (``main()`` with no argv), with ``os._exit`` spied on
#: (it says "fast exit <status>" on stderr) and an atexit handler; with THREAD, a
#: non-daemon thread still runs when the command returns; with PLUGIN, a plugin command
#: (``sentinel``) is added as ``register_commands`` adds one
SCRIPT = textwrap.dedent("""
    import atexit, os, sys, threading, time
    real_exit = os._exit
    def spy(status):
        os.write(2, b"fast exit %d\\n" % status)
        real_exit(status)
    os._exit = spy
    atexit.register(lambda: print("atexit ran", flush=True))
    import draftwise.cli as cli
    if os.environ.get("THREAD"):  # still running after the command, whatever its speed
        done = threading.Event()
        def late():
            done.wait()
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        exit_now = cli.exit_without_teardown
        def exit_without_teardown(code):
            done.set()
            exit_now(code)
        cli.exit_without_teardown = exit_without_teardown
    if os.environ.get("PLUGIN"):
        import click
        make = cli.make_cli
        def make_cli():
            group = make()
            group.add_command(click.Command("sentinel", callback=lambda: print("plugin ran")))
            return group
        cli.make_cli = make_cli
    sys.argv = ["draftwise", *sys.argv[1:]]
    cli.main()
""")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env))


def test_success_skips_the_teardown_but_runs_atexit_and_flushes() -> None:
    out = run("check-config", '{"method": "ngram", "num_speculative_tokens": 3}')
    assert out.returncode == 0, out.stderr
    assert '"method": "ngram"' in out.stdout  # the command's output, flushed into a pipe
    assert out.stdout.rstrip().endswith("atexit ran")
    assert "fast exit 0" in out.stderr


def test_a_refusal_keeps_its_exit_status() -> None:
    out = run("check-config", '{"method": "nope"}')
    assert out.returncode == 2
    assert "nope" in out.stderr and "fast exit 2" in out.stderr and "atexit ran" in out.stdout


def test_a_usage_error_keeps_its_exit_status() -> None:
    out = run("generate", "--no-such-option")
    assert out.returncode == 2 and "no-such-option" in out.stderr and "fast exit 2" in out.stderr


def test_a_live_thread_gets_the_ordinary_exit() -> None:
    out = run("--version", THREAD="1")
    assert out.returncode == 0
    assert "thread done" in out.stdout and "atexit ran" in out.stdout
    assert "fast exit" not in out.stderr


def test_a_plugin_command_gets_the_ordinary_exit() -> None:
    """Plugin code may leave a file unclosed, which only the teardown flushes."""
    out = run("sentinel", PLUGIN="1")
    assert out.returncode == 0, out.stderr
    assert "plugin ran" in out.stdout and "fast exit" not in out.stderr


def test_a_caller_passing_argv_keeps_its_interpreter() -> None:
    code = ("from draftwise.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    print('still here', e.code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "still here 0" in out.stdout
