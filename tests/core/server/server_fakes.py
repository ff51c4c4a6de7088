"""A fake step-level engine with the LLMEngine surface the server drives.

Deterministic and fast: one token per character, a greedy "model" whose next token is
a function of the whole sequence so far (so batching cannot change it), a KV-block
count that goes to zero only if every request is finished or aborted, and fault
switches (a step that raises, a chat template that raises, a prompt whose tokenizing
takes seconds). Like LLMEngine, every step builds the batch's sampling tensors, so a
value that passes validation but cannot be held by them fails the step here too.
Tokenizing may run on any thread (as LLMEngine's may); everything else must run on one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from draftwise.errors import RequestError
from draftwise.metrics import SpecDecodingStats
from draftwise.models.backend import decide_backend
from draftwise.request import CompletionOutput, RequestOutput
from draftwise.sampling import SamplingMetadata, SamplingParams
from draftwise.server import ServerConfig, create_app
from draftwise.server.runner import ServerThread

MODEL = "fake-model"
ALPHABET = "the quick brown fox jumps over the lazy dog. "
EOS = 3
BLOCK = 16
#: a prompt containing this takes SLOW_TOKENIZE_S to tokenize (a huge prompt, simulated;
#: the sleep releases the GIL as the real tokenizer does)
SLOW = "!slow"
SLOW_TOKENIZE_S = 2.0


class FakeTokenizer:
    """One token per character (code point)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


@dataclass
class FakeSpecConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 2

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}


@dataclass
class FakeSpec:
    k: int = 2
    metrics: SpecDecodingStats = field(default_factory=lambda: SpecDecodingStats(2))


@dataclass
class _Req:
    req_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    out: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    arrival: float = field(default_factory=time.monotonic)


class FakeKV:
    """Blocks in use = ceil(tokens / 16) per live request."""

    def __init__(self, engine: FakeEngine, capacity: int = 4096) -> None:
        self.engine = engine
        self.capacity = capacity

    @property
    def num_used_blocks(self) -> int:
        return sum(-(-(len(r.prompt_ids) + len(r.out)) // BLOCK)
                   for r in self.engine.requests.values())

    @property
    def num_free_blocks(self) -> int:
        return self.capacity - self.num_used_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.capacity


class FakeGrammars:
    """LLMEngine.grammars' face the server uses: compiling ahead is a no-op here."""

    def prepare(self, params: Any) -> None:
        pass


class FakeEngine:
    """Implements add_request / step / abort_request like LLMEngine, single-threaded."""

    def __init__(self, max_model_len: int = 256, max_num_seqs: int = 8,
                 step_delay: float = 0.002, speculative: bool = False) -> None:
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.step_delay = step_delay
        self.requests: dict[str, _Req] = {}
        self.kv = FakeKV(self)
        self.spec = FakeSpec() if speculative else None
        self.spec_config = FakeSpecConfig() if speculative else None
        #: what the CLI prints at start-up (``models.backend``): the torch paths
        self.loaded = SimpleNamespace(model=SimpleNamespace(backend=decide_backend(
            torch.float32, "cpu", 64)))
        self.fail_next_step = False
        self.aborted: list[str] = []
        self.owner: threading.Thread | None = None
        self.grammars = FakeGrammars()
        #: names of the threads that tokenized (never the engine thread)
        self.tokenize_threads: set[str] = set()

    def _check_thread(self) -> None:
        """The server must call the engine from one thread only."""
        me = threading.current_thread()
        if self.owner is None:
            self.owner = me
        assert self.owner is me, f"engine used from {me.name} and {self.owner.name}"

    # -- requests ---------------------------------------------------------------------

    def _tokenizing(self, text: str) -> None:
        self.tokenize_threads.add(threading.current_thread().name)
        if SLOW in text:
            time.sleep(SLOW_TOKENIZE_S)

    def tokenize_prompt(self, prompt: Any) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            self._tokenizing(prompt)
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        return None, [int(t) for t in prompt]

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True) -> list[int]:
        for m in messages:
            if m["role"] == "explode":
                raise KeyError("template exploded")
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        self._tokenizing(text)
        return self.tokenizer.encode(text + ("<assistant>" if add_generation_prompt else ""))

    def add_request(self, prompt: Any, params: SamplingParams | None = None,
                    request_id: str | None = None, isolation_key: str | None = None) -> str:
        self._check_thread()
        params = params or SamplingParams()
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise RequestError("prompt", "the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise RequestError("prompt", f"the prompt has {len(ids)} tokens; the context "
                               f"is {self.max_model_len}")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestError("max_tokens", f"prompt + max_tokens exceeds the context "
                               f"length {self.max_model_len}")
        assert request_id is not None and request_id not in self.requests
        self.requests[request_id] = _Req(request_id, text, ids, params)
        return request_id

    def abort_request(self, request_id: str) -> bool:
        self._check_thread()
        self.aborted.append(request_id)
        return self.requests.pop(request_id, None) is not None

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    # -- the step ---------------------------------------------------------------------

    @staticmethod
    def next_token(seq: list[int]) -> int:
        """The greedy 'model': depends on the whole sequence, never on the batch."""
        return ord(ALPHABET[(sum(seq) * 31 + len(seq)) % len(ALPHABET)])

    def step(self) -> list[RequestOutput]:
        self._check_thread()
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("injected step failure")
        time.sleep(self.step_delay)
        batch = list(self.requests.values())[: self.max_num_seqs]
        SamplingMetadata.from_params([r.params for r in batch])  # as LLMEngine's step does
        outputs = []
        for req in batch:
            new = self._advance(req)
            outputs.append(self._output(req, new))
            if req.finish is not None:
                del self.requests[req.req_id]
        return outputs

    def _advance(self, req: _Req) -> list[int]:
        n = 2 if self.spec is not None else 1
        if self.spec is not None:
            self.spec.metrics.observe_draft(2, 1)
        new: list[int] = []
        for _ in range(n):
            seq = req.prompt_ids + req.out
            tok = EOS if "!eos" in (req.prompt or "") and len(req.out) == 3 else \
                self.next_token(seq)
            req.out.append(tok)
            new.append(tok)
            if tok == EOS and not req.params.ignore_eos:
                req.finish = "stop"
                break
            req.text += chr(tok)
            for stop in req.params.stop:
                idx = req.text.find(stop)
                if idx != -1:
                    req.text = req.text[: idx + (len(stop) if
                                                 req.params.include_stop_str_in_output else 0)]
                    req.finish = "stop"
            if req.finish:
                break
            if len(req.out) >= req.params.max_tokens:
                req.finish = "length"
                break
        return new

    def _output(self, req: _Req, new: list[int]) -> RequestOutput:
        metrics: dict[str, Any] = {"arrival_time": req.arrival}
        if self.spec is not None:
            metrics["speculative_decoding"] = {"num_spec_steps": len(req.out) // 2,
                                               "num_draft_tokens": len(req.out),
                                               "num_accepted_draft_tokens": len(req.out) // 2}
        return RequestOutput(
            request_id=req.req_id, prompt=req.prompt, prompt_token_ids=list(req.prompt_ids),
            outputs=[CompletionOutput(0, req.text, list(req.out), req.finish)],
            finished=req.finish is not None, metrics=metrics, new_token_ids=new,
            new_text="",
        )

    def greedy_text(self, prompt_ids: list[int], max_tokens: int) -> str:
        """What a greedy request produces alone (the reference for batching tests)."""
        out: list[int] = []
        for _ in range(max_tokens):
            out.append(self.next_token(prompt_ids + out))
        return "".join(chr(t) for t in out)


@contextmanager
def serving(engine: Any, **config: Any) -> Iterator[str]:
    """Serve ``engine`` with uvicorn in a thread; yields the base URL, stops gracefully."""
    config.setdefault("served_model_names", (MODEL,))
    thread = ServerThread(create_app(engine, ServerConfig(**config)))
    url = thread.start()
    try:
        yield url
    finally:
        thread.stop()
