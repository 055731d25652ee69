"""The attention output's way to the output projection (trainer.model.llama._token_rows): a view
where SDPA wrote token rows in the matmul dtype (as CUDA's flash kernels write them), else one copy
that transposes and casts; the same values either way."""

from __future__ import annotations

import pytest
import torch

from trainer.model.llama import _token_rows

B, H, T, HD = 2, 3, 5, 4


def expected(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return y.transpose(1, 2).reshape(B, T, H * HD).to(dtype)


def test_token_rows_in_the_matmul_dtype_are_taken_as_a_view() -> None:
    y = torch.randn(B, T, H, HD, dtype=torch.bfloat16).transpose(1, 2)  # (B, H, T, hd), token-major
    rows = _token_rows(y, torch.bfloat16)
    assert rows.data_ptr() == y.data_ptr() and rows.shape == (B, T, H * HD)
    torch.testing.assert_close(rows, expected(y, torch.bfloat16), rtol=0, atol=0)


@pytest.mark.parametrize(
    "layout, dtype",
    [("heads first", torch.bfloat16), ("token rows", torch.float32)],  # CPU SDPA's; another dtype
)
def test_any_other_output_is_copied_once_into_token_rows(layout: str, dtype: torch.dtype) -> None:
    if layout == "heads first":
        y = torch.randn(B, H, T, HD, dtype=torch.bfloat16)
    else:
        y = torch.randn(B, T, H, HD, dtype=torch.bfloat16).transpose(1, 2)
    rows = _token_rows(y, dtype)
    assert rows.data_ptr() != y.data_ptr() and rows.is_contiguous() and rows.dtype == dtype
    torch.testing.assert_close(rows, expected(y, dtype), rtol=0, atol=0)


def test_one_decoded_token_is_a_view_whatever_the_layout() -> None:
    y = torch.randn(B, H, 1, HD, dtype=torch.bfloat16)  # a transpose that moves a singleton axis
    rows = _token_rows(y, torch.bfloat16)
    assert rows.data_ptr() == y.data_ptr() and rows.shape == (B, 1, H * HD)
