"""The dtype wall on DirectML, end to end, as users' programs meet it: a bfloat16 causal LM
(transformers, loaded each way its model card shows), a bfloat16 diffusers pipeline, Demucs'
``apply_model``, whisper's log-Mel spectrogram on the device, an iSTFT vocoder head trained a
step beside rotary embeddings and an FFT convolution written with complex numbers, and numpy's
float64 data on an adapter without float64.

Each program runs unmodified under ``python -m dmlpatch --device sim`` and as plain python on
the CPU; the device's results equal the CPU's (bfloat16 weights on the CPU in float32, the
policy's dtype), with no operator sent to the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import clean_env, run_python


def _run(tmp_path: Path, program: str, *args: str, **env: str) -> tuple[Any, Any, Any, str]:
    """The program on the CPU (plain python), then on the simulated device; both print JSON."""
    script = tmp_path / "program.py"
    script.write_text(program)
    environment = clean_env(HF_HUB_OFFLINE="1", **env)
    plain = run_python([str(script), "cpu", *args], cwd=tmp_path, env=environment)
    assert plain.code == 0, plain.err[-3000:]
    report = tmp_path / "report.json"
    runner = ["-m", "dmlpatch", "--device", "sim", f"--report={report}"]
    patched = run_python([*runner, str(script), "device", *args], cwd=tmp_path, env=environment)
    assert patched.code == 0, patched.err[-3000:]
    return (
        json.loads(plain.out),
        json.loads(patched.out),
        json.loads(report.read_text()),
        patched.err,
    )


def _close(got: Any, expected: Any, tolerance: float) -> None:
    import torch

    got_t, expected_t = torch.tensor(got), torch.tensor(expected)
    assert got_t.shape == expected_t.shape
    scale = max(1.0, float(expected_t.abs().max()))
    assert float((got_t - expected_t).abs().max()) <= tolerance * scale


def _no_fallback(report: dict[str, Any]) -> None:
    assert report["ops"]["fallback"] == {} and report["ops"]["refused"] == {}, report["ops"]


MAKE_LLAMA = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""

# The ways a model card loads a bfloat16 checkpoint, and safetensors' own loader.
LLAMA = """
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

path = sys.argv[2]
ids = [[1, 5, 9, 13]]


def run(model, autocast=False):
    tokens = torch.tensor(ids, device=model.device)
    out = model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=8,
                         do_sample=False, pad_token_id=0)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens).logits
    return {"device": str(model.device), "dtype": str(model.dtype), "tokens": out.tolist(),
            "logits": logits.flatten().tolist()}


if sys.argv[1] == "cpu":
    reference = run(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    ways = {way: reference for way in ("device_map", "to", "auto", "float16")}
    ways["float16"] = run(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16))
    weight = load_file(f"{path}/model.safetensors")["lm_head.weight"].float()
else:
    ways = {
        "device_map": run(AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, device_map="cuda")),
        "to": run(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda"),
                  autocast=True),
        "auto": run(AutoModelForCausalLM.from_pretrained(path, device_map="auto")),
        "float16": run(AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float16, device_map="cuda")),
    }
    weight = load_file(f"{path}/model.safetensors", device="cuda")["lm_head.weight"]
print(json.dumps({"ways": ways, "weight": [str(weight.device), str(weight.dtype),
                                           weight.cpu().flatten().tolist()]}))
"""


def test_a_bfloat16_causal_lm_loaded_every_way_generates_as_on_the_cpu(tmp_path: Path) -> None:
    saved = tmp_path / "tiny-llama"
    made = run_python(["-c", MAKE_LLAMA, str(saved)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert made.code == 0, made.err[-3000:]
    expected, got, report, err = _run(tmp_path, LLAMA, str(saved))
    for way, result in got["ways"].items():
        reference = expected["ways"][way]
        assert result["device"] == "privateuseone:0", way
        assert result["dtype"] == ("torch.float16" if way == "float16" else "torch.float32"), way
        assert result["tokens"] == reference["tokens"], way
        _close(result["logits"], reference["logits"], 1e-6 if way != "float16" else 2e-3)
    assert got["weight"][:2] == ["privateuseone:0", "torch.float32"]
    assert got["weight"][2] == expected["weight"][2]
    _no_fallback(report)
    said = [line for line in err.splitlines() if "bfloat16" in line]
    assert said == [
        "dmlpatch: bfloat16 runs as float32 on DirectML, which has no bfloat16 (exact: every "
        "bfloat16 value is a float32 one); DMLPATCH_BF16=float16 halves the memory",
        # the "to" way's bfloat16 autocast region: float32, as its logits above show
        "dmlpatch: DirectML has no bfloat16 arithmetic: the program's bfloat16 autocast runs in "
        "float32 (DMLPATCH_BF16=float16 runs it in float16)",
    ]


MAKE_PIPELINE = """
import sys, torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

torch.manual_seed(0)
unet = UNet2DModel(
    sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
    block_out_channels=(32, 64), norm_num_groups=8,
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
)
pipeline = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=50))
pipeline.to(torch.bfloat16).save_pretrained(sys.argv[1])
"""

PIPELINE = """
import json, sys, torch
from diffusers import DDPMPipeline

if sys.argv[1] == "cpu":  # the same bfloat16 weights, in float32: the policy's dtype
    pipeline = DDPMPipeline.from_pretrained(sys.argv[2], torch_dtype=torch.float32)
else:
    pipeline = DDPMPipeline.from_pretrained(sys.argv[2], torch_dtype=torch.bfloat16).to("cuda")
generator = torch.Generator().manual_seed(0)
images = pipeline(batch_size=1, num_inference_steps=3, generator=generator, output_type="np").images
print(json.dumps({"device": str(pipeline.device), "dtype": str(pipeline.unet.dtype),
                  "values": images.reshape(-1).tolist()}))
"""


def test_a_bfloat16_diffusers_pipeline_samples_as_on_the_cpu(tmp_path: Path) -> None:
    saved = tmp_path / "tiny-ddpm"
    made = run_python(["-c", MAKE_PIPELINE, str(saved)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert made.code == 0, made.err[-3000:]
    expected, got, report, _ = _run(tmp_path, PIPELINE, str(saved))
    assert got["device"] == "privateuseone:0" and got["dtype"] == "torch.float32"
    _close(got["values"], expected["values"], 1e-4)
    _no_fallback(report)


DEMUCS = """
import json, sys, torch
from demucs.apply import apply_model
from demucs.htdemucs import HTDemucs

torch.manual_seed(0)
model = HTDemucs(sources=["drums", "bass", "other", "vocals"], channels=8, depth=2, nfft=4096,
                 t_layers=1, bottom_channels=0, segment=2, samplerate=8000).eval()
mix = torch.randn(1, 2, 8000 * 3) * 0.1
device = "cuda" if sys.argv[1] == "device" else "cpu"
with torch.no_grad():
    stems = apply_model(model, mix, device=device, shifts=0, split=True, overlap=0.25,
                        progress=False)
print(json.dumps({"values": stems[0, :, :, ::50].flatten().tolist()}))
"""


def test_demucs_separates_on_the_device_as_on_the_cpu(tmp_path: Path) -> None:
    """Ultimate Vocal Remover's model family: HTDemucs' spectrogram branch is an STFT with
    n_fft 4096 and its iSTFT, Wiener-free (``apply_model``)."""
    expected, got, report, _ = _run(tmp_path, DEMUCS)
    _close(got["values"], expected["values"], 1e-5)
    fixed = report["ops"]["fixed"]
    assert fixed["aten::_fft_r2c"] and fixed["aten::_fft_c2r"]
    # Its attention's fast path, glu and std run on the device too (issue 27).
    _no_fallback(report)


WHISPER_MEL = """
import json, sys
import numpy as np
import torch
import whisper

audio = (np.random.default_rng(0).standard_normal(16000 * 5) * 0.1).astype(np.float32)
device = ("cuda" if torch.cuda.is_available() else "cpu") if sys.argv[1] == "device" else None
mel = whisper.log_mel_spectrogram(audio, n_mels=80, device=device)
print(json.dumps({"device": str(mel.device), "values": mel[:, ::7].flatten().tolist()}))
"""


def test_whisper_computes_its_spectrogram_on_the_device(tmp_path: Path) -> None:
    expected, got, report, _ = _run(tmp_path, WHISPER_MEL)
    assert got["device"] == "privateuseone:0"
    _close(got["values"], expected["values"], 1e-5)
    _no_fallback(report)


# A Vocos-style iSTFT head trained two steps, rotary embeddings as Meta's llama reference
# writes them, an FFT convolution of an image, and auraloss' multi-resolution STFT loss (what
# vocoders train with) training a small filter: complex numbers four ways.
SPECTRAL = """
import json, sys, torch
import auraloss
from torch import nn


class ISTFTHead(nn.Module):
    def __init__(self, dim, n_fft, hop_length):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop_length
        self.out = nn.Linear(dim, n_fft + 2)
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, x):
        mag, p = self.out(x).transpose(1, 2).chunk(2, dim=1)
        mag = torch.exp(mag).clip(max=1e2)
        x, y = torch.cos(p), torch.sin(p)
        S = mag * (x + 1j * y)
        return torch.istft(S, self.n_fft, self.hop, self.n_fft, window=self.window, center=True)


def rotary(xq, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs_cis.view(1, xq_.shape[1], 1, -1)).flatten(3)


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
head = ISTFTHead(32, 64, 16).to(device)
optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
features = torch.randn(2, 50, 32).to(device)
for _ in range(2):
    loss = head(features).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
freqs = torch.outer(torch.arange(32).float(), 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))
freqs_cis = torch.polar(torch.ones_like(freqs), freqs).to(device)
q = rotary(torch.randn(2, 32, 4, 16).to(device), freqs_cis)
image = torch.randn(1, 3, 32, 24).to(device)
kernel = torch.full((1, 3, 5, 5), 1 / 25).to(device)
blurred = torch.fft.irfft2(torch.fft.rfft2(image) * torch.fft.rfft2(kernel, s=(32, 24)), s=(32, 24))
filter_ = nn.Conv1d(1, 1, 15, padding=7).to(device)
stft_loss = auraloss.freq.MultiResolutionSTFTLoss(
    fft_sizes=[128, 256], hop_sizes=[32, 64], win_lengths=[128, 256]).to(device)
adam = torch.optim.Adam(filter_.parameters(), lr=1e-2)
noisy = torch.randn(2, 1, 2000).to(device)
clean = torch.sin(torch.linspace(0, 200, 2000)).expand(2, 1, 2000).to(device)
stft_losses = []
for _ in range(2):
    step_loss = stft_loss(filter_(noisy), clean)
    adam.zero_grad()
    step_loss.backward()
    adam.step()
    stft_losses.append(step_loss.item())
print(json.dumps({"device": str(q.device), "loss": float(loss), "stft_losses": stft_losses,
                  "weight": head.out.weight.detach().cpu().flatten().tolist(),
                  "rotary": q.cpu().flatten().tolist(),
                  "blurred": blurred.cpu().flatten().tolist()}))
"""


def test_complex_numbers_in_a_program_of_ones_own(tmp_path: Path) -> None:
    expected, got, report, _ = _run(tmp_path, SPECTRAL)
    assert got["device"] == "privateuseone:0"
    _close(got["loss"], expected["loss"], 1e-5)
    for key in ("weight", "rotary", "blurred", "stft_losses"):
        _close(got[key], expected[key], 1e-5)
    _no_fallback(report)
    sites = {entry["module"]: entry["sites"] for entry in report["rewritten"]}
    assert sites["__main__"] >= 1  # 1j * y


FLOAT64 = """
import json, sys
import numpy as np
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
samples = np.linspace(-3.0, 3.0, 1001)
x = torch.from_numpy(samples).cuda() if torch.cuda.is_available() else torch.from_numpy(samples)
features = torch.tensor(np.stack([samples, samples ** 2]), device=device)
result = (x.cos() * features[1]).sum() / x.abs().max()
print(json.dumps({"dtype": str(x.dtype), "device": str(x.device), "result": float(result),
                  "features": features.double().cpu().flatten().tolist(), "shown": repr(x[:2])}))
"""


def test_numpy_float64_data_on_an_adapter_without_float64(tmp_path: Path) -> None:
    expected, got, report, err = _run(tmp_path, FLOAT64, DMLPATCH_SIM_FLOAT64="0")
    assert expected["dtype"] == "torch.float64" and got["dtype"] == "torch.float32"
    assert got["device"] == "privateuseone:0" and "device='privateuseone:0'" in got["shown"]
    assert got["result"] == pytest.approx(expected["result"], rel=1e-5)
    _close(got["features"], expected["features"], 1e-6)
    _no_fallback(report)
    assert [line for line in err.splitlines() if "float64" in line] == [
        "dmlpatch: float64 runs as float32 on privateuseone:0: the adapter has no float64 "
        "(torch_directml.has_float64_support() is False)"
    ]
