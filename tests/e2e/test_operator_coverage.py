"""docs/reference/operator-coverage.md is what scripts/operator_coverage.py generates today: every
operator a corpus of model families (torchvision classification, detection and segmentation,
timm's ConvNeXt, EfficientNet and ViT, transformers encoder, decoder and seq2seq, diffusers UNet,
VAE and DiT, speech recognition, source separation, an audio codec and a vocoder, recurrent and
graph models) calls on the simulated device in training and
inference, and how the device serves it. The target holds: no CPU fallback in the corpus,
and a fallback that comes back is named by its catalogue entry."""

from __future__ import annotations

from pathlib import Path

from support import run_python

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reference" / "operator-coverage.md"


def test_the_coverage_table_is_current() -> None:
    result = run_python([str(REPO / "scripts" / "operator_coverage.py"), "--check"], timeout=600)
    assert result.code == 0, result.err[-3000:]


def test_no_cpu_fallback_is_left_in_the_corpus() -> None:
    text = DOC.read_text(encoding="utf-8")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]
    measured = [row for row in rows if len(row) == 6 and row[2] in ("training", "inference")]
    assert len(measured) == 40, "20 models, each in training and in inference"
    assert all(row[5] == "none |" for row in measured), [r for r in measured if r[5] != "none |"]
    left = text.split("## CPU fallbacks left in the corpus", 1)[1].strip()
    assert left == "None."
