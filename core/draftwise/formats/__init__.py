"""Reading what a model ships as: weights, tokenizer, chat template.

- :mod:`draftwise.formats.gguf`: GGUF metadata and dequantized tensors (gguf-py), under
  HF names, with llama.cpp's Q/K permutation undone for llama-family files;
- :mod:`draftwise.formats.gguf_header`: a GGUF's header, metadata and tensor infos, read
  and checked against the file before any tensor is mapped;
- :mod:`draftwise.formats.safetensors_dir`: HF directories, sharded or not;
- :mod:`draftwise.formats.safetensors_header`: one shard's header, checked as the
  safetensors crate checks it;
- :mod:`draftwise.formats.jsonfile`, :mod:`draftwise.formats.values`: the JSON files
  around a checkpoint, and typed, ranged reads of the values the engine uses;
- :mod:`draftwise.formats.tokenizer`: :class:`Tokenizer` from ``tokenizer.json`` or GGUF
  metadata, and :class:`IncrementalDetokenizer` for streaming;
- :mod:`draftwise.formats.chat`: :class:`ChatTemplate`, sandboxed Jinja as transformers
  renders it;
- :mod:`draftwise.formats.default_model`: where the default model's GGUF lives;
- :mod:`draftwise.formats.errors`: the typed errors, all under :class:`FormatError`.

Nothing is imported here, so ``import draftwise.formats.errors`` stays cheap.
"""
