"""openai-whisper on DirectML, as its README uses it: ``whisper.load_model`` then ``transcribe``.

Without dmlpatch the model cannot even be moved: its sparse ``alignment_heads`` buffer has no
DirectML kernel (microsoft/DirectML#414). Under ``python -m dmlpatch --device sim`` the program
below, which names no device at all (whisper picks ``cuda`` when available), loads and
transcribes on ``privateuseone:0`` with the same tokens, text and word timings as a plain CPU
run. The checkpoint is whisper's own format (``dims`` + ``model_state_dict``) of a small
random-init model: nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import clean_env, run_python

TRANSCRIBE = """
import json, sys
import numpy as np
import whisper

model = whisper.load_model(sys.argv[1])
audio = (np.random.default_rng(0).standard_normal(16000 * 3) * 0.1).astype(np.float32)
result = model.transcribe(
    audio, temperature=0.0, fp16=False, language="en", condition_on_previous_text=False,
    word_timestamps=True,
)
segment = result["segments"][0]
print(json.dumps({
    "device": str(model.device),
    "alignment_heads": str(model.alignment_heads.device),
    "tokens": segment["tokens"],
    "text": result["text"],
    "words": [[w["word"], w["start"], w["end"]] for w in segment.get("words", [])],
}))
"""


def _checkpoint(path: Path) -> Path:
    import torch
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(
        n_mels=80,
        n_audio_ctx=1500,
        n_audio_state=64,
        n_audio_head=2,
        n_audio_layer=2,
        n_vocab=51865,
        n_text_ctx=448,
        n_text_state=64,
        n_text_head=2,
        n_text_layer=2,
    )
    torch.manual_seed(0)
    model = Whisper(dims)
    torch.save({"dims": dims.__dict__, "model_state_dict": model.state_dict()}, path)
    return path


def test_load_model_and_transcribe_on_the_device_equal_to_cpu(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "tiny-random.pt")
    script = tmp_path / "transcribe.py"
    script.write_text(TRANSCRIBE)
    plain = run_python([str(script), str(checkpoint)], cwd=tmp_path, timeout=600)
    assert plain.code == 0, plain.err[-3000:]
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(script), str(checkpoint)],
        cwd=tmp_path,
        timeout=600,
    )
    assert patched.code == 0, patched.err[-3000:]
    expected, got = json.loads(plain.out), json.loads(patched.out)
    assert expected["device"] == "cpu"
    assert got["device"] == "privateuseone:0"
    assert got["alignment_heads"] == "cpu"  # no sparse tensor can live on DirectML
    assert got["tokens"] == expected["tokens"] and got["text"] == expected["text"]
    assert [w[0] for w in got["words"]] == [w[0] for w in expected["words"]]
    for (_, start, end), (_, cpu_start, cpu_end) in zip(got["words"], expected["words"]):
        assert (start, end) == pytest.approx((cpu_start, cpu_end), abs=0.02)
    assert "a sparse tensor stays on the CPU" in patched.err


def test_without_dmlpatch_load_model_fails_on_the_sparse_buffer(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "tiny-random.pt")
    program = (
        "import sys, whisper, dmlpatch.sim as sim\n"
        "sim.load()\n"
        "whisper.load_model(sys.argv[1], device=sim.device(0))\n"
    )
    result = run_python(["-c", program, str(checkpoint)], env=clean_env())
    assert result.code == 1
    assert "'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the " in (
        result.err
    )


def test_without_dmlpatch_a_spectrogram_on_the_device_stops(tmp_path: Path) -> None:
    """DirectML has no complex type: ``log_mel_spectrogram(audio, device=dml)`` runs torch.stft
    there and stops (microsoft/DirectML#704). With dmlpatch it runs on the device
    (tests/e2e/libraries/test_type_wall.py)."""
    program = (
        "import numpy as np, whisper, dmlpatch.sim as sim\n"
        "sim.load()\n"
        "audio = np.zeros(16000, dtype=np.float32)\n"
        "print(whisper.log_mel_spectrogram(audio).shape)\n"
        "whisper.log_mel_spectrogram(audio, device=sim.device(0))\n"
    )
    result = run_python(["-c", program], env=clean_env(), cwd=tmp_path)
    assert result.code == 1
    assert result.out.strip() == "torch.Size([80, 100])"
    assert result.err.strip().endswith(
        "RuntimeError: Invalid or unsupported data type ComplexFloat."
    ), result.err[-2000:]
