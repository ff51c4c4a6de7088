"""lanewise: an element's bits do not depend on the size or offset of the tensor it is in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from draftwise.models.pointwise import lanewise

FNS = {
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "silu": F.silu,
    "rsqrt": lambda v: torch.rsqrt(v.abs() + 1e-3),
}


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_slice_gets_the_bits_of_the_whole(name: str, dtype: torch.dtype) -> None:
    fn = FNS[name]
    x = (torch.randn(700, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    whole = lanewise(fn, x)
    torch.testing.assert_close(whole, fn(x), atol=0, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    for n in (*range(1, 40), 63, 64, 65, 129):
        for start in (0, 1, 7, 33):
            assert torch.equal(lanewise(fn, x[start : start + n]), whole[start : start + n])
    assert lanewise(fn, x.view(7, 100)).shape == (7, 100)
