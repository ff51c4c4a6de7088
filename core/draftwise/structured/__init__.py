"""Structured output: a request's output constrained by a JSON schema, regex or grammar.

``params.py`` says what a request asks (vLLM's ``StructuredOutputsParams``), ``compiler.py``
turns it into a matcher over the model's vocabulary (llguidance, cached), ``matcher.py``
keeps a request's grammar state at its committed tokens, and ``masks.py`` computes a
step's masks at every verified position (through the drafts, rolled back) and applies
them to the target's logits in ``spec/verify.py``, so speculation keeps the output
lossless. Cutting a draft at a refused token is speculation's (``spec/grammar_trim.py``).
"""

from draftwise.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
