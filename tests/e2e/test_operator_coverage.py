"""docs/reference/operator-coverage.md is what scripts/operator_coverage.py generates today: every
operator a corpus of model families (torchvision classification, detection and segmentation,
timm's ConvNeXt, EfficientNet and ViT, transformers encoder, decoder and seq2seq, diffusers UNet,
VAE and DiT, speech recognition, source separation, an audio codec and a vocoder, recurrent and
graph models) calls on the simulated device in training and
inference, and how the device serves it. The target holds: no operator of the corpus goes
through the CPU for want of a fix (those that do, go by the cost model's choice), and a
fallback that comes back is named by its catalogue entry."""

from __future__ import annotations

from pathlib import Path

from support import run_python

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reference" / "operator-coverage.md"


def test_the_coverage_table_is_current() -> None:
    """On the table's torch, the table is what the corpus measures; on another (torch-directml's
    2.4.1 under .ci/compat), no operator falls back for want of a fix."""
    result = run_python([str(REPO / "scripts" / "operator_coverage.py"), "--check"], timeout=600)
    assert result.code == 0, result.err[-3000:]


def test_no_gap_is_left_in_the_corpus() -> None:
    """Every operator the corpus sends through the CPU goes there by the cost model's choice (a
    fix that prices its composition above the fallback for those calls), none for want of a
    fix."""
    from dmlpatch.opfix import registry

    priced = {operator for fix in registry.fixes() for operator in fix.costs}
    text = DOC.read_text(encoding="utf-8")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]
    measured = [row for row in rows if len(row) == 6 and row[2] in ("training", "inference")]
    assert len(measured) == 40, "20 models, each in training and in inference"
    for row in measured:
        fell = row[5].removesuffix(" |")
        if fell != "none":
            operators = [name.strip(" `") for name in fell.split(",")]
            assert all(name.split(".")[0] in priced for name in operators), row
    left = text.split("## CPU fallbacks left in the corpus", 1)[1].strip()
    assert left == "None." or "| no fix |" not in left, left
