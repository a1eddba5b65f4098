"""A fix torch refuses to register is named in one line and left out alone: the other fixes
stay installed and serve their operators (``dmlpatch.opfix.installer``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.e2e.opfix.helpers import PROFILE

import dmlpatch.sim as sim
from dmlpatch import log
from dmlpatch.opfix import _kernel, installer, registry


def test_a_fix_torch_refuses_is_named_and_the_others_stay(
    dev: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = registry.Fix(
        "tensors.refused_for_the_test",
        (
            _kernel.Kernel(
                "bucketize.Tensor", lambda *args: None, "fallback", key="NoSuchDispatchKey"
            ),
        ),
    )
    real = registry.fixes

    def with_the_refused_one() -> list[registry.Fix]:
        return [*real(), refused]

    said: list[str] = []
    monkeypatch.setattr(registry, "fixes", with_the_refused_one)
    monkeypatch.setattr(log, "_said", set())
    installer.uninstall()
    log.divert(said.append)
    try:
        installed = installer.install("sim", PROFILE)
    finally:
        log.divert(None)
    try:
        assert installed.failed == ("tensors.refused_for_the_test",)
        assert "aten::_upsample_bilinear2d_aa.out" in installed.fixes
        assert "aten::bucketize.Tensor" not in installed.fixes
        assert said == [said[0]] and said[0].startswith(
            "dmlpatch: warning: operator fix tensors.refused_for_the_test not installed ("
        )
        assert said[0].endswith(
            "(could not parse dispatch key: NoSuchDispatchKey); DirectML's own behaviour "
            "stands for its operators"
        )
        x = torch.randn(1, 1, 8, 8).to(dev)
        sim.reset_counters()
        F.interpolate(x, size=(4, 4), mode="bilinear", antialias=True)
        assert sim.counters()["ops"]["fixed"] == {"aten::_upsample_bilinear2d_aa.out": 1}
    finally:
        installer.uninstall()
        monkeypatch.undo()
        installer.install("sim", PROFILE)  # as the module's fixture left it
