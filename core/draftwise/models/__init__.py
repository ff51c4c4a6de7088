"""Target models in torch, and loading them.

- :mod:`draftwise.models.batch`: the forward contract (ForwardBatch, KVCache, ModelOutput);
- :mod:`draftwise.models.loader`: ``load_model(path, dtype, device, progress) -> LoadedModel``;
- :mod:`draftwise.models.llama`: the llama family (Llama, Mistral, Qwen2, Qwen3);
- :mod:`draftwise.models.attention`: paged, bitwise batch-invariant attention;
- :mod:`draftwise.models.rope`, :mod:`draftwise.models.config`, :mod:`draftwise.models.registry`.

Nothing is imported here: torch loads only when a model module is used.
"""
