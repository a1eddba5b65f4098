"""PyTorch's attention fast path (``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
in eval): DirectML sends it to the CPU; with dmlpatch it runs on the device, every mask variant,
equal to the CPU, with no fallback and no copy."""

from __future__ import annotations

import itertools
import warnings
from typing import Optional

import pytest
import torch
from tests.e2e.opfix.helpers import close, no_copies, without_fixes
from torch import nn

import dmlpatch.sim as sim

BATCH, LENGTH, WIDTH, HEADS = 3, 6, 32, 4


def _masks() -> dict[str, tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]:
    """(attn_mask, key_padding_mask) for each of the fast path's mask types."""
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[1, 4:] = True
    padding[2, :] = True  # every key excluded: NaN rows, as on the CPU
    causal = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), 1)
    generator = torch.Generator().manual_seed(5)
    per_head = torch.rand(BATCH * HEADS, LENGTH, LENGTH, generator=generator) > 0.7
    per_head[..., 0] = False
    return {
        "no mask": (None, None),
        "attention mask (type 0 -> 2)": (causal, None),
        "key padding mask (type 1)": (None, padding),
        "both (type 2)": (causal, padding),
        "per-head 3-D mask": (per_head, None),
    }


@pytest.mark.parametrize("mask_name", sorted(_masks()))
def test_multihead_attention_fast_path_equals_the_cpu(dev: torch.device, mask_name: str) -> None:
    attn_mask, padding_mask = _masks()[mask_name]
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True).eval()
    x = torch.randn(BATCH, LENGTH, WIDTH)
    for need_weights, average in itertools.product((True, False), (True, False)):
        options = {"need_weights": need_weights, "average_attn_weights": average}
        with torch.no_grad():
            expected = attention(
                x, x, x, attn_mask=attn_mask, key_padding_mask=padding_mask, **options
            )
            attention.to(dev)
            on_device = x.to(dev)
            masks = [None if m is None else m.to(dev) for m in (attn_mask, padding_mask)]
            sim.reset_counters()
            got = attention(
                on_device,
                on_device,
                on_device,
                attn_mask=masks[0],
                key_padding_mask=masks[1],
                **options,
            )
            counters = sim.counters()
            attention.cpu()
        assert no_copies(counters), counters
        assert counters["ops"]["fixed"] == {"aten::_native_multi_head_attention": 1}
        assert close(got[0], expected[0]), (options, got[0].cpu(), expected[0])
        if need_weights:
            assert close(got[1], expected[1]), options
        else:
            assert got[1] is None and expected[1] is None


@pytest.mark.parametrize(
    ("activation", "norm_first"), list(itertools.product(("relu", "gelu"), (False, True)))
)
def test_transformer_encoder_in_eval_equals_the_cpu(
    dev: torch.device, activation: str, norm_first: bool
) -> None:
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(
        WIDTH, HEADS, 64, batch_first=True, activation=activation, norm_first=norm_first
    )
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(BATCH, LENGTH, WIDTH)
    causal = nn.Transformer.generate_square_subsequent_mask(LENGTH)
    with torch.no_grad():
        expected = [encoder(x), encoder(x, mask=causal.bool())]
        encoder.to(dev)
        sim.reset_counters()
        got = [encoder(x.to(dev)), encoder(x.to(dev), mask=causal.bool().to(dev))]
        counters = sim.counters()
    assert counters["ops"]["fallback"] == {}, counters["ops"]
    assert counters["ops"]["fixed"] == {"aten::_transformer_encoder_layer_fwd": 4}
    for device_result, cpu_result in zip(got, expected):
        assert close(device_result, cpu_result)


def test_masked_softmax_forward_and_backward_equal_the_cpu(dev: torch.device) -> None:
    scores = torch.randn(2, 3, 5, 5)  # (B, H, L, L): a padding mask is (B, L)
    mask = torch.rand(2, 3, 5, 5) > 0.6
    mask[0, 0, 0] = True  # a row with every entry excluded
    padding = torch.rand(2, 5) > 0.5

    def run(x: torch.Tensor, m: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaf = x.detach().requires_grad_()
        out = torch._masked_softmax(leaf, m, 3, 2)
        out.nan_to_num(0.0).sum().backward()
        return out.detach(), leaf.grad, torch._masked_softmax(x, p, 3, 1)

    expected = run(scores, mask, padding)
    sim.reset_counters()
    got = run(scores.to(dev), mask.to(dev), padding.to(dev))
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {}, counters["ops"]
    assert counters["ops"]["fixed"]["aten::_masked_softmax"] == 2
    assert counters["ops"]["fixed"]["aten::_masked_softmax_backward"] == 1
    for device_result, cpu_result in zip(got, expected):
        assert close(device_result, cpu_result), (device_result.cpu(), cpu_result)


def test_masked_softmax_refuses_what_the_cpu_refuses(dev: torch.device) -> None:
    scores, padding = torch.randn(2, 3, 5, 5), torch.rand(2, 5) > 0.5
    wrong = {
        "no mask type": (scores, padding, 3, None),
        "float mask": (scores, padding.float(), 3, 1),
        "padding mask of the wrong batch": (scores, padding[:1], 3, 1),
        "type 2 of the wrong shape": (scores, padding, 3, 2),
        "type 0 not (L, L)": (scores, padding, 3, 0),
        "unknown type": (scores, torch.rand(5, 5) > 0.5, 3, 7),
    }
    for name, (x, mask, dim, mask_type) in wrong.items():
        with pytest.raises(RuntimeError) as on_cpu:
            torch._masked_softmax(x, mask, dim, mask_type)
        with pytest.raises(RuntimeError) as on_device:
            torch._masked_softmax(x.to(dev), mask.to(dev), dim, mask_type)
        assert str(on_device.value) == str(on_cpu.value).splitlines()[0], name


def test_without_dmlpatch_the_fast_path_falls_back(dev: torch.device) -> None:
    attention = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True).eval().to(dev)
    encoder = (
        nn.TransformerEncoder(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 64, batch_first=True),
            1,
            enable_nested_tensor=False,
        )
        .eval()
        .to(dev)
    )
    x = torch.randn(BATCH, LENGTH, WIDTH, device=dev)
    with without_fixes(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        attention(x, x, x)
        encoder(x)
        counters = sim.counters()
    assert counters["ops"]["fallback"] == {
        "aten::_native_multi_head_attention": 1,
        "aten::_transformer_encoder_layer_fwd": 1,
    }
    assert counters["copies"]["aten::_native_multi_head_attention"]["count"] == 7


@pytest.mark.parametrize("float_mask", [False, True], ids=["bool mask", "float mask"])
def test_nested_tensor_encoder_runs_padded_and_equals_the_cpu(
    dev: torch.device, float_mask: bool
) -> None:
    """With a padding mask in eval, ``nn.TransformerEncoder`` packs its sequences into a nested
    tensor, which DirectML cannot hold: the device's packing raises dmlpatch's one line, and the
    torch spec's wrapper runs the same layers on the padded batch, equal to the CPU everywhere
    (padded positions zeroed before the final norm, as the nested path leaves them), with no
    fallback."""
    from dmlpatch.patches.torch.transformer import encoder_forward

    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(WIDTH)).eval()
    x = torch.randn(BATCH, LENGTH, WIDTH)
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[1, 3:] = True
    padding[2, 5:] = True
    if float_mask:
        padding = torch.zeros(BATCH, LENGTH).masked_fill(padding, float("-inf"))
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=padding)
        encoder.to(dev)
        with pytest.raises(RuntimeError, match=r"^aten::_nested_tensor_from_mask: DirectML has no"):
            encoder(x.to(dev), src_key_padding_mask=padding.to(dev))
        sim.reset_counters()
        got = encoder_forward(
            encoder.forward, encoder, (x.to(dev),), {"src_key_padding_mask": padding.to(dev)}
        )
        counters = sim.counters()
    assert got.device == dev and encoder.use_nested_tensor and encoder.norm is not None
    assert counters["ops"]["fallback"] == {}, counters["ops"]
    assert counters["ops"]["fixed"]["aten::_nested_tensor_from_mask_left_aligned"] == 1
    assert close(got.cpu(), expected)


@pytest.mark.parametrize(
    "rows",
    [
        [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]],
        [[0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]],
        [[1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]],
        [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    ],
)
def test_left_aligned_mask_check_answers_as_the_cpu(dev: torch.device, rows: list) -> None:
    t, mask = torch.randn(3, 4, 2), torch.tensor(rows, dtype=torch.bool)
    expected = torch._nested_tensor_from_mask_left_aligned(t, mask)
    sim.reset_counters()
    assert torch._nested_tensor_from_mask_left_aligned(t.to(dev), mask.to(dev)) is expected
    assert sim.counters()["ops"]["fallback"] == {}
