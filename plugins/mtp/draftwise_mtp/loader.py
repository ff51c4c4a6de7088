"""The draft stage's loader for method ``mtp``: cheap to import, heavy work in ``head.py``.

``detect`` reads the checkpoint's tensor names and config.json (no weights) and completes
the config with the head depth when it declares none, so k defaults to it (vLLM's
n_predict rule) whether the head is in the target or named by ``model``.
``check_target`` compares the head's hidden and vocabulary sizes with the target's
header before the target loads. ``load``
builds the head for the target and reports the KV layout the core allocates for it (one
KV layer per MTP layer, the target's heads and dtype) and the hidden layer it reads
(the target's last).
"""

from __future__ import annotations

from typing import Any

from draftwise.kit import DraftCheckpoint, KVLayout, LoadedDraft, TargetHeader
from pydantic import BaseModel

from draftwise_mtp.options import head_count


class MtpLoader:
    """``Loader`` for MTP heads in safetensors checkpoints (GGUF heads refused by name)."""

    def detect(self, path: str) -> DraftCheckpoint:
        """The head's layout from tensor names; config completed with ``n_predict``."""
        from draftwise_mtp.head import detect_layout

        layout, n, config = detect_layout(path)
        if head_count(config) is None:
            config["n_predict"] = n
        return DraftCheckpoint(path, "safetensors", f"safetensors:{layout}", config)

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """A head named by ``model`` was trained on one target's hidden states and tokens:
        its config's sizes must be the target's (a head inside the target always fits)."""
        from draftwise_mtp.head import MtpHeadError

        config = dict(checkpoint.config.get("text_config") or checkpoint.config)
        for key, want in (("hidden_size", target.hidden_size),
                          ("vocab_size", target.vocab_size)):
            got = config.get(key)
            if got is not None and int(got) != want:
                raise MtpHeadError(
                    checkpoint.path,
                    f"the MTP head's {key} is {got} and the target's {want}: the head reads "
                    "the target's hidden states and drafts its token ids. Instead: the MTP "
                    "head of this target (drop 'model' to use the one inside it).",
                    key=key,
                )

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The head for ``target`` (a ``LoadedModel``); its KV lives in the core's pool."""
        from draftwise_mtp.head import load_head

        model = target.model
        head = load_head(checkpoint.path, model, model.device)
        return LoadedDraft(
            weights=head,
            kv_layout=KVLayout(head.num_layers, model.num_kv_heads, model.head_dim, model.dtype),
            hidden_layers=(model.config.num_hidden_layers - 1,),
            summary=f"MTP head ({head.layout}, {head.num_layers} layer(s))",
        )
