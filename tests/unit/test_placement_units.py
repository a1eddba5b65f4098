"""The placement accounting's pieces in one process: families, FLOP estimates, the operator
counter's attribution of CPU calls to source lines, data loading and modules being built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmlpatch.placement import families, ledger, operators


class Custom(nn.Linear):
    pass


def test_layer_families_cover_subclasses_and_nothing_else() -> None:
    assert families.layer_family(Custom) == families.MATMUL
    assert families.layer_family(nn.Conv1d) == families.CONVOLUTION
    assert families.layer_family(nn.ConvTranspose2d) == families.CONVOLUTION
    assert families.layer_family(nn.BatchNorm2d) == families.NORMALIZATION
    assert families.layer_family(nn.GroupNorm) == families.NORMALIZATION
    assert families.layer_family(nn.GRU) == families.RECURRENT
    assert families.layer_family(nn.MultiheadAttention) == families.ATTENTION
    for other in (nn.ReLU, nn.Sequential, nn.MaxPool2d, nn.Embedding, nn.Dropout):
        assert families.layer_family(other) is None


def test_layer_flops_from_shapes() -> None:
    conv = nn.Conv2d(3, 8, 3)
    x = torch.zeros(2, 3, 10, 10)
    out = conv(x)
    assert families.layer_flops(families.CONVOLUTION, conv, (x,), out) == 2 * out.numel() * 27
    up = nn.ConvTranspose2d(8, 4, 2, stride=2)
    y = up(out)
    assert families.layer_flops(families.CONVOLUTION, up, (out,), y) == 2 * out.numel() * 4 * 4
    linear = nn.Linear(16, 4)
    z = torch.zeros(5, 7, 16)
    flops = families.layer_flops(families.MATMUL, linear, (z,), linear(z))
    assert flops == 2 * 35 * (16 * 4 + 4)
    norm = nn.LayerNorm(16)
    assert families.layer_flops(families.NORMALIZATION, norm, (z,), norm(z)) == 5 * z.numel()


def _counted(run) -> ledger.Ledger:
    with operators.Counter() as counter:
        run()
    return counter.ledger


def test_operator_counter_attributes_cpu_calls_to_their_lines() -> None:
    a, b = torch.ones(4, 8), torch.ones(8, 3)
    book = _counted(
        lambda: (
            a @ b,
            torch.bmm(a[None], b[None]),
            F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(6, 2, 3, 3)),
        )
    )
    assert book.counted == "operators"
    calls, flops = book.totals(ledger.CPU)
    assert calls == 3
    assert flops == 2 * 4 * 8 * 3 * 2 + 2 * (6 * 3 * 3) * (2 * 3 * 3)
    sites = book.heaviest_cpu_sites()
    assert {(site.file, site.function) for site, _ in sites if site} == {(__file__, "<lambda>")}
    found = set().union(*(entry["families"] for _, entry in sites))
    assert found == {families.MATMUL, families.CONVOLUTION}


def test_attention_and_non_heavy_operators() -> None:
    q = torch.ones(2, 4, 6, 8)
    book = _counted(lambda: (F.scaled_dot_product_attention(q, q, q), q.relu(), q.sum()))
    calls, flops = book.totals(ledger.CPU)
    assert calls == 1 and flops == 4 * (2 * 4 * 6) * 6 * 8


class _Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3)
        self.size = self.conv(torch.zeros(1, 1, 8, 8)).shape[-1]


def test_data_loading_and_building_are_apart_from_model_compute() -> None:
    def load() -> None:
        for _ in torch.utils.data.DataLoader(_Squares(), batch_size=2):
            pass
        _Probe()

    book = _counted(load)
    assert book.totals(ledger.CPU) == (0, 0) and not book.model_compute()
    assert book.totals(ledger.LOADING)[0] == 4
    assert book.totals(ledger.BUILDING)[0] == 1


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(3, 3) @ torch.ones(3, 3)


def test_the_accounting_says_what_it_dropped_under_debug_and_nothing_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dmlpatch import log
    from dmlpatch.environment_variables import DMLPATCH_DEBUG
    from dmlpatch.placement import fallbacks

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("a count that cannot be made")

    said: list[str] = []
    monkeypatch.setattr(log, "_said", set())
    log.divert(said.append)
    monkeypatch.setattr(fallbacks, "_count", broken)
    monkeypatch.setattr(operators.Counter, "_count", broken)
    try:
        for debug in ("0", "1", "1"):
            monkeypatch.setenv(DMLPATCH_DEBUG, debug)
            fallbacks._observe("aten::addbmm", (), None, 2, 64, 0.0)
            with operators.Counter():
                assert torch.ones(3).sum().item() == 3.0  # the program goes on
            ledger.stop()
    finally:
        log.divert(None)
    assert said == [
        "dmlpatch: debug: the count of a CPU fallback dropped a call: TypeError: a count that "
        "cannot be made",
        "dmlpatch: debug: the count of an operator dropped a call: TypeError: a count that "
        "cannot be made",
    ]
