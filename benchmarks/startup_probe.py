"""Start-up to first token and peak RSS of draftwise, as a fresh process meets them.

A user waits for imports, weight loading and the first token's prefill. This script does
exactly that once and prints one JSON line the moment the first token is out, then exits;
``compare_llamacpp.py`` spawns it and times the line's arrival from just before the spawn
(the same clock it uses for ``llama-server``: spawn to first ``/completion`` token). Its
``peak_rss_mib`` is this process's own ``VmHWM`` (``draftwise.peak_rss``): the comparison's
own process holds several engines over its life, and ``ru_maxrss``, which an exec'd child
inherits from its parent, once read 8668 MiB here for a run of 1.4 GB.

    python benchmarks/startup_probe.py --model M.gguf --threads 2 --prompt-ids '[1, 2, 3]'
"""

from __future__ import annotations

import time

T_START = time.perf_counter()  # before the heavy imports: they are part of the wait

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--speculative-config", default=None)
    parser.add_argument("--prompt-ids", required=True, help="JSON list of prompt token ids")
    args = parser.parse_args()
    ids = [int(t) for t in json.loads(args.prompt_ids)]

    # as ``draftwise generate`` does: the weights' arena faults in while torch imports
    from draftwise.cli.common import prefault_weights

    reserved = prefault_weights(args.model, args.dtype)
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs
    from draftwise.peak_rss import peak_rss_mib
    from draftwise.sampling_params import SamplingParams

    t_imports = time.perf_counter()
    engine = LLMEngine(
        EngineArgs(
            model=args.model,
            speculative_config=args.speculative_config,
            dtype=args.dtype,
            max_num_seqs=1,
            enable_prefix_caching=False,
            num_threads=args.threads,
        ),
        reserved=reserved,
    )
    t_loaded = time.perf_counter()
    engine.add_request({"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=1))
    token: list[int] = []
    while engine.has_unfinished_requests() and not token:
        for out in engine.step():
            token = list(out.outputs[0].token_ids)
    t_first = time.perf_counter()
    print(
        json.dumps(
            {
                "first_token_ids": token,
                "imports_s": t_imports - T_START,
                "load_s": t_loaded - t_imports,
                "first_token_s": t_first - t_loaded,
                "in_process_total_s": t_first - T_START,
                "peak_rss_mib": peak_rss_mib(),
            }
        ),
        flush=True,
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
