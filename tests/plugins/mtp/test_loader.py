"""MTP head detection in GGUF files: ``blk.N.nextn.*`` found, or its absence refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from draftwise_mtp.head import MtpHeadError, detect


def write_gguf(path: Path, nextn_layers: int, head_tensors: bool) -> str:
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_block_count(2)
    w.add_uint32("qwen35.nextn_predict_layers", nextn_layers)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, np.float32))
    if head_tensors:  # the MTP block is appended as block n_layer
        w.add_tensor("blk.1.nextn.eh_proj.weight", np.zeros((8, 16), np.float32))
        w.add_tensor("blk.1.nextn.enorm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize(("layers", "tensors"), [(0, False), (1, False), (0, True)])
def test_gguf_without_a_head_is_refused_by_name(tmp_path: Path, layers: int, tensors: bool) -> None:
    path = write_gguf(tmp_path / "m.gguf", layers, tensors)
    with pytest.raises(MtpHeadError, match=r"this GGUF \(qwen35\) has no MTP head"):
        detect(path)


def test_gguf_with_a_head_is_detected_then_refused_as_not_loadable_yet(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", 1, True)
    with pytest.raises(MtpHeadError, match=r"found an MTP head in this GGUF \(blk\.1\.nextn\.\*"):
        detect(path)
