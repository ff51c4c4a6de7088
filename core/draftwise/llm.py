"""``LLM``: the offline library surface, shaped like vLLM's.

    from draftwise import LLM, SamplingParams
    llm = LLM()                                   # the embedded default model
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
    print(out[0].outputs[0].text)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from draftwise.engine import LLMEngine, PromptType
from draftwise.engine_args import EngineArgs
from draftwise.request import RequestOutput
from draftwise.sampling_params import SamplingParams
from draftwise.spec.params import SpeculativeParams

Message = dict[str, Any]


class LLM:
    """Load a model (default: the embedded SmolLM2) and generate in batches."""

    def __init__(
        self,
        model: str | None = None,
        speculative_config: str | dict[str, Any] | None = None,
        dtype: str = "auto",
        progress: Callable[..., Any] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        args = EngineArgs(
            model=model, speculative_config=speculative_config, dtype=dtype, **engine_kwargs
        )
        self.engine = LLMEngine(args, progress=progress)

    def get_tokenizer(self) -> Any:
        """The tokenizer the engine uses."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        speculative: SpeculativeParams | Sequence[SpeculativeParams | None] | None = None,
        isolation_key: str | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs in input order.

        ``speculative``: per-request speculation settings, one for all or one per prompt.
        ``isolation_key``: these requests may draft from the outputs of others with the
        same key (suffix decoding); None: each from its own tokens only.
        """
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompt_list = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"{len(params_list)} sampling params for {len(prompt_list)} prompts"
                )
        if speculative is None or isinstance(speculative, SpeculativeParams):
            spec_list: list[SpeculativeParams | None] = [speculative] * len(prompt_list)
        else:
            spec_list = list(speculative)
            if len(spec_list) != len(prompt_list):
                raise ValueError(f"{len(spec_list)} speculative params for {len(prompt_list)} "
                                 "prompts")
        ids = [
            self.engine.add_request(p, sp, speculative=s, isolation_key=isolation_key)
            for p, sp, s in zip(prompt_list, params_list, spec_list)
        ]
        return self._run(ids)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        speculative: SpeculativeParams | Sequence[SpeculativeParams | None] | None = None,
        isolation_key: str | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate."""
        conversations: list[list[Message]]
        if messages and isinstance(messages[0], dict):
            conversations = [messages]  # type: ignore[list-item]
        else:
            conversations = messages  # type: ignore[assignment]
        prompts: list[PromptType] = [
            {"prompt_token_ids": self.engine.apply_chat_template(c, add_generation_prompt)}
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, speculative, isolation_key)

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        """Step until the given requests finish; other queued requests keep running too."""
        final: dict[str, RequestOutput] = {}
        wanted = set(request_ids)
        while wanted - final.keys():
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
            if not self.engine.has_unfinished_requests():
                break
        return [final[r] for r in request_ids if r in final]
