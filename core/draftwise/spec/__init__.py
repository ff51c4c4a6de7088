"""Speculation: what makes a step's drafts, checks them, and learns from the verdict.

One idea: the engine side of speculative decoding, from the drafter chain to the rule that
keeps or rejects each draft and the policy that decides how many to make. The engine
(``draftwise.engine``) drives it; nothing in here drives the engine or imports it.

- one step's records: ``step`` (``StepDrafts``, ``StepOutcome``);
- proposing: ``speculation`` (the drafter chain, draft-KV frontiers, hidden-state
  buffers), ``grammar_trim`` (drafts cut at a grammar's first refused token) and
  ``draft_stage`` (bootstrap's detect / load / build of the drafters);
- verifying: ``verify`` (lossless greedy, standard and block verification) and
  ``verify_step`` (the step's verify phase around it);
- per request: ``params`` (``SpeculativeParams``, public as ``draftwise.SpeculativeParams``);
- adaptive depth: ``adaptive`` (the depth policy and each request's acceptance),
  ``depth_rule`` (the batch rule it calls), ``cost_model`` (what a step costs on this
  machine) and ``batch_rest`` (when a batch stops paying for the decision);
- a helper plugins share: ``drafting`` (draft-token and q picking), which plugins reach
  through ``draftwise.kit``, never by this path.

The plugin contract (``draftwise.speculator``) stays outside: ``config/``, ``plugins/``
and ``models/inspect`` read it, and this package imports those, so the contract inside
it would make the packages import each other. Importing ``draftwise.spec`` imports none
of its modules.
"""
