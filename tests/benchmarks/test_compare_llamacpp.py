"""benchmarks/compare_llamacpp.py without llama.cpp: mode parsing, the report arithmetic, and
the server lifecycle against a stand-in ``llama-server`` (a tiny HTTP script)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare_llamacpp as cl  # noqa: E402
import llamacpp  # noqa: E402
import llamacpp_report as lr  # noqa: E402
from side_by_side import identity  # noqa: E402


def test_mode_labels() -> None:
    assert cl.ours_mode('{"method": "ngram", "num_speculative_tokens": 4}')[0] == "ngram k=4"
    label, cfg = cl.ours_mode('mine={"method": "ngram"}')
    assert (label, cfg) == ("mine", {"method": "ngram"})
    assert cl.llama_mode("--spec-type ngram-mod") == ("ngram-mod", ["--spec-type", "ngram-mod"])
    label, flags = cl.llama_mode("-md 'a b.gguf' --spec-type draft-simple --spec-draft-n-max 4")
    assert label == "draft-simple n-max=4" and flags[1] == "a b.gguf"
    assert cl.llama_mode("d8=-md x --spec-draft-n-max 8")[0] == "d8"
    with pytest.raises(SystemExit):
        cl.ours_mode("[1, 2]")


def test_identity_names_each_prompt() -> None:
    a = [{"id": "p", "token_ids": [1, 2, 3]}, {"id": "q", "token_ids": [1, 2, 3]}]
    b = [{"id": "p", "token_ids": [1, 2, 3]}, {"id": "q", "token_ids": [1, 9, 3]}]
    r = identity(a, b)
    assert r["identical"] == 1 and r["per_prompt"] == {"p": True, "q": False}
    assert r["first_divergence"] == {"q": 1}


def _run(tps: float, tokens: list[list[int]], **extra: Any) -> dict[str, Any]:
    per = [{"id": f"p{i}", "token_ids": t} for i, t in enumerate(tokens)]
    return {"summary": {"all": {"tok_per_s": tps}, "open": {"tok_per_s": tps}},
            "per_prompt": per, **extra}


def test_comparisons_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    same, other = [[1, 2], [3, 4]], [[1, 2], [3, 5]]
    rec: dict[str, Any] = {
        "runs": {
            "draftwise plain": _run(20.0, same, forward_bench={
                "prefill": {"tok_per_s": 300.0}, "decode": {"tok_per_s": 30.0}},
                rounds=[{"tokens": 10, "seconds": 1.0}, {"tokens": 10, "seconds": 0.5},
                        {"tokens": 10, "seconds": 0.4}]),
            "draftwise ngram k=4": _run(30.0, same, spec_decode={"num_draft_tokens": 8,
                                                                 "draft_acceptance_rate": 0.5}),
            "draftwise draft_model k=4": {"error": "RefusedError: not yet"},
            "llama.cpp plain": _run(40.0, other, startup={
                "startup_to_first_token_s": 1.5, "peak_rss_mib": 1800.0},
                rounds=[{"tokens": 8, "seconds": 1.0}, {"tokens": 8, "seconds": 0.2},
                        {"tokens": 8, "seconds": 0.4}]),
            "llama.cpp ngram-mod": _run(44.0, same, spec_decode={"draft_n": 0}),
        },
        "llama_bench": {"prefill": {"tok_per_s": 200.0, "n_tokens": 256},
                        "decode": {"tok_per_s": 40.0, "n_tokens": 64}},
        "draftwise_startup": {"startup_to_first_token_s": 30.0, "peak_rss_mib": 9000.0},
        "loadavg": {"start": [1.0, 1.0, 1.0]},
        "concurrency": {"concurrency": 8, "llama.cpp plain": {"output_tok_per_s": 100.0},
                        "draftwise plain": {"output_tok_per_s": 250.0},
                        "draftwise draft_model k=4": {"error": "RefusedError: not yet"}},
    }
    lr.add_comparisons(rec, ["draftwise ngram k=4", "draftwise draft_model k=4"],
                       ["llama.cpp ngram-mod"])
    r = rec["ratios"]
    assert r["draftwise plain / llama.cpp plain"]["all"] == pytest.approx(0.5)
    # the same rounds' ratios: (10/1)/(8/1), (10/.5)/(8/.2), (10/.4)/(8/.4)
    assert r["draftwise plain / llama.cpp plain"]["paired"] == pytest.approx(
        {"median": 1.25, "min": 0.5, "max": 1.25})
    assert "paired" not in r["draftwise ngram k=4 / draftwise plain"]  # no rounds recorded
    assert r["draftwise ngram k=4 / draftwise plain"]["all"] == pytest.approx(1.5)
    assert r["llama.cpp ngram-mod / llama.cpp plain"]["all"] == pytest.approx(1.1)
    assert r["best draftwise / best llama.cpp"]["draftwise"] == "draftwise ngram k=4"
    assert "draftwise draft_model k=4 / draftwise plain" not in r  # errored: no ratio
    ident = rec["identity"]
    assert ident["draftwise ngram k=4 vs draftwise plain"]["identical"] == 2
    assert ident["draftwise plain vs llama.cpp plain"]["per_prompt"] == {"p0": True, "p1": False}
    f = rec["figures"]
    assert f["prefill_tok_per_s"]["draftwise/llama.cpp"] == pytest.approx(1.5)
    assert f["decode_tok_per_s"]["draftwise/llama.cpp"] == pytest.approx(0.75)
    assert f["startup_to_first_token_s"]["draftwise"] == 30.0
    assert f["served c=8 tok/s, draftwise plain"]["draftwise/llama.cpp"] == pytest.approx(2.5)
    assert f["served c=8 tok/s, draftwise draft_model k=4"]["draftwise"] is None

    report = {"model": "m.gguf", "num_prompts": 2, "max_tokens": 2, "repeat": 1,
              "llama_cpp": {"version": "version: 1 (abc)"}, "by_threads": {"2": rec}}
    lr.print_markdown(report)
    out = capsys.readouterr().out
    assert "### 2 threads" in out and "pure prefill pp256 tok/s" in out
    assert "| draftwise ngram k=4 | 30.0 | 30.0 | 0.75x | - | 1.50x | - | 2/2 | 0.50 |" in out
    assert "| draftwise plain | 20.0 | 20.0 | 0.50x | 1.25x [0.50, 1.25] | 1.00x | - | - | - |" in out
    assert "error: RefusedError: not yet" in out
    assert "| served c=8 tok/s, draftwise plain | 100.0 | 250.0 | 2.50x |" in out
    assert "| llama.cpp plain | 40.0 | 40.0 | 1.00x | - | 1.00x | - | - | - |" in out
    assert "| llama.cpp ngram-mod | 44.0 | 44.0 | 1.10x | - | 1.10x | - | 1/2 | none drafted |" in out


FAKE_SERVER = r'''#!PYTHON
"""Stand-in llama-server: /health, then /completion echoing the prompt's last token."""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
if "--version" in argv:
    print("version: 0 (fake)", file=sys.stderr)
    sys.exit(0)
if "--die" in argv:
    print("cannot load model", file=sys.stderr)
    sys.exit(3)
port = int(argv[argv.index("--port") + 1])

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send(200, {"status": "ok"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["cache_prompt"] is False and body["temperature"] == 0
        n = body["n_predict"]
        self._send(200, {"tokens": [body["prompt"][-1]] * n, "stop_type": "limit",
                         "timings": {"draft_n": 2 * n, "draft_n_accepted": n}})

HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_server(tmp_path: Path) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(FAKE_SERVER.replace("PYTHON", sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_server_lifecycle(fake_server: Path, tmp_path: Path) -> None:
    server = llamacpp.LlamaServer(fake_server, "m.gguf", 2, [], tmp_path / "s.log")
    assert ["-t", "2"] == server.cmd[server.cmd.index("-t"):][:2]
    with server:
        pid = server.proc.pid
        reply = server.complete([5, 6, 7], 3)
        assert reply["tokens"] == [7, 7, 7] and reply["_seconds"] > 0
        assert server.peak_rss_mib() is not None
    assert server.proc is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # really gone, not left running
    assert llamacpp.binary_version(fake_server) == "version: 0 (fake)"


def test_server_that_dies_is_named(fake_server: Path, tmp_path: Path) -> None:
    server = llamacpp.LlamaServer(fake_server, "m.gguf", 1, ["--die"], tmp_path / "s.log")
    with pytest.raises(llamacpp.LlamaCppError, match="cannot load model"):
        server.start()
    server.stop()


def test_llama_mode_rounds_and_record(fake_server: Path, tmp_path: Path) -> None:
    import contextlib

    from draftwise.bench import WorkloadItem

    args = type("A", (), {"llama_bin": tmp_path, "model_path": "m.gguf", "startup_timeout": 30.0,
                          "max_tokens": 4})()
    items = [WorkloadItem(id="a", kind="open"), WorkloadItem(id="b", kind="grounded")]
    prompts = [{"id": "a", "kind": "open", "ids": [1, 2]}, {"id": "b", "kind": "grounded", "ids": [3]}]
    with contextlib.ExitStack() as stack:
        mode = cl.LlamaMode(args, ["--spec-type", "ngram-mod"], 1, items, prompts,
                            tmp_path / "l.log", stack)
        assert mode.server.proc is not None  # started, and left running for its rounds
        errors: dict[str, str] = {}
        cl.interleaved_rounds({"llama.cpp ngram-mod": mode}, 2, errors, {})
        rec = mode.record()
    assert mode.server.proc is None  # the stack stopped it
    assert not errors
    assert [p["token_ids"] for p in rec["per_prompt"]] == [[2] * 4, [3] * 4]
    assert [r["tokens"] for r in rec["rounds"]] == [8, 8] and all(r["seconds"] > 0 for r in rec["rounds"])
    assert rec["spec_decode"]["draft_acceptance_rate"] == pytest.approx(0.5)
    assert rec["startup"]["startup_to_first_token_s"] > 0 and "peak_rss_mib" in rec["startup"]
    assert json.dumps(rec)  # the report is JSON as it stands


class _Mode:
    """A stand-in mode: logs each round; fails on round ``fail_at``."""

    def __init__(self, name: str, seen: list[str], fail_at: int | None = None) -> None:
        self.name, self.seen, self.fail_at, self.n = name, seen, fail_at, 0

    def round(self) -> tuple[int, float]:
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError("server went away")
        self.seen.append(self.name)
        return 10, 1.0


def test_rounds_alternate_order_and_drop_a_failed_mode() -> None:
    seen: list[str] = []
    modes = {"a": _Mode("a", seen), "b": _Mode("b", seen, fail_at=2), "c": _Mode("c", seen)}
    errors: dict[str, str] = {}
    loads: dict[str, object] = {}
    cl.interleaved_rounds(modes, 3, errors, loads)
    # round 1 forward, round 2 reversed (b fails there), round 3 forward without b
    assert seen == ["a", "b", "c", "c", "a", "a", "c"]
    assert errors == {"b": "RuntimeError: server went away"}
    assert list(loads) == ["round 1", "round 2", "round 3"]
