"""Tensor parallel for llama-family targets over ``torch.distributed`` (``--tensor-parallel-size``).

Megatron's splits (``plan``: what divides, refused by name where it does not; ``shard``:
which slice of each checkpoint tensor a rank keeps), the model a rank runs (``model``:
column-parallel q/k/v and gate/up, row-parallel o_proj and down with one reduction each,
vocab-parallel embedding and LM head), the process group with its collectives in a fixed
order (``group``), loading a rank's shard (``load``), rank 0's driver that starts the
other ranks and sends each step's inputs (``driver``), and their loop (``worker``).
``docs/architecture.md`` (tensor parallel) has the picture.
"""
