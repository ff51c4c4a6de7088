"""Compare grammar libraries for draftwise's structured output, on CPU, at the default vocab.

Run: ``python3 benchmarks/grammar_libs.py [--xgrammar-path DIR]``. Builds each library's
tokenizer view from the embedded SmolLM2-135M GGUF through draftwise's own tokenizer (no
hub), compiles one JSON schema, then walks a valid token sequence computing the full
next-token mask before every token (what one verified position costs) and rolls back.
Prints one JSON line per library. xgrammar is not a draftwise dependency: point
``--xgrammar-path`` at a ``pip install --no-deps --target DIR xgrammar apache-tvm-ffi``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
TEXT = '{"name": "Alice Smith", "age": 30, "tags": ["admin", "ops", "on-call"]}'


def load_tokenizer():  # -> (draftwise Tokenizer, vocab_size)
    from draftwise.formats.default_model import default_model_path
    from draftwise.models.loader import plan_gguf

    plan = plan_gguf(default_model_path())
    return plan.tokenizer, plan.config.vocab_size


def token_bytes(tok, vocab: int) -> list[bytes]:
    """Each id's raw bytes (byte-level spelling decoded); specials as their text."""
    from tokenizers import pre_tokenizers

    from draftwise.formats.tokenizer import byte_chars

    inv = {c: b for b, c in byte_chars().items()}
    out = []
    for i in range(vocab):
        s = tok.id_to_token(i) or ""
        out.append(bytes(inv[c] for c in s) if set(s) <= set(inv) else s.encode())
    del pre_tokenizers
    return out


def bench_llguidance(tok, vocab, ids):
    import llguidance
    import llguidance.numpy as lln

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=vocab,
                                   eos_token=list(tok.eos_token_ids))
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": True})
    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    t2 = time.perf_counter()
    if m.is_error():
        raise RuntimeError(m.get_error())
    mask = lln.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        s = time.perf_counter()
        lln.fill_next_token_bitmask(m, mask, 0)
        times.append(time.perf_counter() - s)
        if not m.consume_token(t):
            raise RuntimeError(f"llguidance refused {t}: {m.get_error()}")
    s = time.perf_counter()
    m.rollback(len(ids) // 2)
    rb = time.perf_counter() - s
    return t1 - t0, t2 - t1, times, rb


def bench_xgrammar(tok, vocab, ids, raw):
    import xgrammar as xgr

    t0 = time.perf_counter()
    spelled = [tok.id_to_token(i) or "" for i in range(vocab)]
    info = xgr.TokenizerInfo(spelled, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=vocab,
                             stop_token_ids=list(tok.eos_token_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    m = xgr.GrammarMatcher(compiled, max_rollback_tokens=64)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        s = time.perf_counter()
        m.fill_next_token_bitmask(mask, 0)
        times.append(time.perf_counter() - s)
        if not m.accept_token(t):
            raise RuntimeError(f"xgrammar refused {t}")
    s = time.perf_counter()
    m.rollback(len(ids) // 2)
    rb = time.perf_counter() - s
    return t1 - t0, t2 - t1, times, rb


def bench_outlines(tok, vocab, ids, raw):
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    eos = tok.eos_token_ids[0]
    table: dict[bytes, list[int]] = {}
    for i, b in enumerate(raw):
        if i in tok.eos_token_ids or not b:
            continue
        table.setdefault(b, []).append(i)
    voc = oc.Vocabulary(eos, table)
    t1 = time.perf_counter()
    index = oc.Index(build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?"), voc)
    g = oc.Guide(index, max_rollback=64)
    t2 = time.perf_counter()
    mask = np.zeros((vocab + 31) // 32, dtype=np.int32)
    times = []
    for t in ids:
        s = time.perf_counter()
        g.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
        times.append(time.perf_counter() - s)
        if t not in tok.eos_token_ids:  # its Guide ends on the final state, not on EOS
            g.advance(t)
    s = time.perf_counter()
    g.rollback_state(len(ids) // 2)
    rb = time.perf_counter() - s
    return t1 - t0, t2 - t1, times, rb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xgrammar-path", default=None)
    a = ap.parse_args()
    if a.xgrammar_path:
        sys.path.insert(0, a.xgrammar_path)
    tok, vocab = load_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False) + [tok.eos_token_ids[0]]
    raw = token_bytes(tok, vocab)
    print(json.dumps({"vocab": vocab, "tokens": len(ids), "loadavg": os.getloadavg()}))
    runs = {"llguidance": lambda: bench_llguidance(tok, vocab, ids),
            "xgrammar": lambda: bench_xgrammar(tok, vocab, ids, raw),
            "outlines-core": lambda: bench_outlines(tok, vocab, ids, raw)}
    for name, fn in runs.items():
        try:
            tok_s, comp_s, times, rb = fn()
        except Exception as exc:  # noqa: BLE001 - a report, not a library
            print(json.dumps({"lib": name, "error": f"{type(exc).__name__}: {exc}"}))
            continue
        ms = np.array(times) * 1e3
        print(json.dumps({
            "lib": name, "tokenizer_s": round(tok_s, 3), "compile_s": round(comp_s, 3),
            "mask_ms_mean": round(float(ms.mean()), 4), "mask_ms_p50": round(float(np.median(ms)), 4),
            "mask_ms_max": round(float(ms.max()), 4), "rollback_ms": round(rb * 1e3, 4),
        }))


if __name__ == "__main__":
    main()
