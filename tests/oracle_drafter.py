"""The oracle drafter: drafts speculation-off's own output, wrong at every fifth position.

Installed as a fake distribution (``install_oracle(make_dist)``), it reads a script of
(prompt, reference output) pairs and drafts the reference continuation of a row whose
tokens so far follow it, except where the position is 3 mod 5 (a wrong token there). So
accepted drafts sit in the middle of verified blocks and some drafts are rejected: a
penalty, mask or stop that did not see the drafts accepted before a position shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ORACLE = '''
import json
import numpy as np
from pydantic import BaseModel, ConfigDict
from draftwise import hookimpl
from draftwise.speculator import Capabilities, Drafts, Speculator


class OracleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    script_path: str


class OracleProposer:
    """Drafts the reference continuation of its prompt, wrong where position % 5 == 3."""

    def __init__(self, options, ctx):
        with open(options.script_path) as f:
            self.refs = [(tuple(p), o) for p, o in json.load(f)]
        self.k, self.vocab = ctx.num_speculative_tokens, ctx.vocab_size

    def propose(self, batch):
        ids, counts = [], []
        for row in batch.rows:
            toks = row.token_ids.tolist()
            n = 0
            for prompt, out in self.refs:
                done = toks[len(prompt):]
                if tuple(toks[:len(prompt)]) == prompt and out[:len(done)] == done:
                    for j in range(min(self.k, row.max_draft, len(out) - len(done))):
                        pos = len(done) + j
                        ids.append((out[pos] + 1) % self.vocab if pos % 5 == 3 else out[pos])
                        n += 1
                    break
            counts.append(n)
        return Drafts(np.asarray(ids, dtype=np.int64), counts)

    def on_verified(self, outcome):
        pass

    def release(self, req_id):
        pass


@hookimpl
def register_speculators(register):
    register(Speculator(method="oracle", options=OracleOptions,
                        make_proposer=lambda o, c: OracleProposer(o, c),
                        capabilities=Capabilities()))
'''


def install_oracle(make_dist: Any) -> None:
    """Install the oracle as distribution ``acme-oracle`` (method ``oracle``)."""
    make_dist("acme-oracle", "1.0", {"oracle": "acme_oracle"}, {"acme_oracle": ORACLE})


def oracle_spec(directory: Path, prompts: Sequence[list[int]], outs: Sequence[Any],
                k: int) -> dict[str, Any]:
    """The oracle's config drafting ``outs`` (RequestOutputs, first completion each), at
    fixed depth: the tests place stops, grammar cuts and rejections at known positions of
    k-deep drafts, which adaptive depth (the default) would make shallower."""
    script = directory / "oracle.json"
    script.write_text(json.dumps([[list(p), o.outputs[0].token_ids]
                                  for p, o in zip(prompts, outs)]))
    return {"method": "oracle", "num_speculative_tokens": k, "script_path": str(script),
            "draftwise": {"adaptive": False}}
