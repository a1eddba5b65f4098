"""diffusers in float16 on the simulated DirectML device, as programs written for CUDA run it.

- Training with ``torch.autocast("cuda")`` and a GradScaler (a UNet2DConditionModel, DDPM's
  noise-prediction loss): float16 activations on the device, loss by loss within float16's
  tolerance of the CPU's float32 run and of the CPU's own float16 autocast.
- Inference of a whole pipeline in float16 (``from_pretrained(torch_dtype=torch.float16)``), an
  SDXL pipeline whose VAE overflows float16 in its decoder (one convolution's weights scaled up,
  as the SDXL VAE overflows): with ``force_upcast`` (its config's default) diffusers decodes in
  float32 and the image is finite on the device as on the CPU; without it the image is NaN on
  the device exactly where the CPU's float16 makes it NaN, as on CUDA: float16's own overflow,
  neither hidden nor added.
- A float32 pipeline called inside ``torch.autocast("cuda")``: finite and close to the CPU's
  float32; with the overflowing VAE, NaN where the CPU's float16 autocast is NaN (diffusers
  upcasts a float16 VAE, not an autocast region).

Models are random-init, built with diffusers' classes and saved with ``save_pretrained``; the
pipeline's text encoders are left out (prompt embeddings given), so nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from support import Result, clean_env, run_python

TRAIN = """
import json, sys
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DConditionModel

mode = sys.argv[1] if len(sys.argv) > 1 else "cuda"
cuda = torch.cuda.is_available()
device = torch.device("cuda" if cuda else "cpu")
torch.manual_seed(0)
unet = UNet2DConditionModel(
    sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
    block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32, attention_head_dim=8,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
).to(device)
seen = []
for block in (unet.conv_in, unet.mid_block, unet.up_blocks[-1]):
    block.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
scheduler = DDPMScheduler(num_train_timesteps=1000)
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=cuda)
generator = torch.Generator().manual_seed(1)
if mode == "cuda":
    region = lambda: torch.autocast("cuda", enabled=cuda)
else:  # the CPU's own float16 autocast
    region = lambda: torch.autocast("cpu", dtype=torch.float16)
losses, scales = [], []
for step in range(6):
    latents = torch.randn(2, 4, 16, 16, generator=generator).to(device)
    noise = torch.randn(2, 4, 16, 16, generator=generator).to(device)
    text = torch.randn(2, 7, 32, generator=generator).to(device)
    timesteps = torch.randint(0, 1000, (2,), generator=generator).to(device)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    optimizer.zero_grad()
    with region():
        prediction = unet(noisy, timesteps, encoder_hidden_states=text).sample
        loss = F.mse_loss(prediction.float(), noise.float())
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
    scales.append(scaler.get_scale())
print(json.dumps({"device": str(prediction.device), "losses": losses, "scales": scales,
                  "dtypes": sorted(set(seen)), "prediction": str(prediction.dtype)}))
"""

#: A tiny SDXL pipeline (the UNet of diffusers' own SDXL tests), saved twice: as built, and
#: with its VAE's last decoder convolution scaled so that its float16 output overflows.
MAKE_PIPELINE = """
import sys, torch
from diffusers import (AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline,
                       UNet2DConditionModel)

for out, overflow in ((sys.argv[1], 1.0), (sys.argv[2], 30000.0)):
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=8,
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4,
        norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, sample_size=32, force_upcast=True,
    )
    with torch.no_grad():
        vae.decoder.up_blocks[-1].resnets[-1].conv2.weight *= overflow
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        timestep_spacing="leading", steps_offset=1,
    )
    StableDiffusionXLPipeline(
        vae=vae, text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None,
        unet=unet, scheduler=scheduler,
    ).save_pretrained(out)
"""

# As a CUDA program runs a pipeline: from_pretrained (float16 or float32), .to("cuda"), call;
# or a float32 pipeline inside torch.autocast("cuda"). "cpu16" runs the autocast regions as the
# CPU's float16 autocast instead (the reference for what float16 overflows).
SAMPLE = """
import json, sys
import numpy as np
import torch
from diffusers import StableDiffusionXLPipeline

normal, overflowing, region = sys.argv[1], sys.argv[2], sys.argv[3]
cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
embeds = torch.randn(2, 1, 7, 64, generator=torch.Generator().manual_seed(1))
pooled = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(2))


def sample(path, dtype, upcast=True, autocast=False):
    pipe = StableDiffusionXLPipeline.from_pretrained(path, torch_dtype=dtype).to(device)
    if not upcast:
        pipe.vae.register_to_config(force_upcast=False)
    # The pipeline's noise, drawn in float32 as it is for a float32 pipeline: torch 2.4's CPU
    # draws other numbers in float16 than in float32 (2.14's draws the same, rounded).
    side = 32 // pipe.vae_scale_factor
    noise = torch.randn(1, pipe.unet.config.in_channels, side, side,
                        generator=torch.Generator().manual_seed(0))
    call = dict(
        prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1],
        pooled_prompt_embeds=pooled[0], negative_pooled_prompt_embeds=pooled[1],
        num_inference_steps=2, guidance_scale=5.0, height=32, width=32,
        generator=torch.Generator().manual_seed(0), output_type="np", latents=noise,
    )
    call = {k: v.to(device, dtype) if torch.is_tensor(v) else v for k, v in call.items()}
    if not autocast:
        image = pipe(**call).images
    elif region == "cpu16":
        with torch.autocast("cpu", dtype=torch.float16):
            image = pipe(**call).images
    else:
        with torch.autocast("cuda"):
            image = pipe(**call).images
    return {"device": str(pipe.device), "nan": np.isnan(image).reshape(-1).tolist(),
            "values": np.nan_to_num(image, nan=0.0).reshape(-1).tolist()}


runs = {
    "float32": sample(overflowing, torch.float32),
    "float16": sample(overflowing, torch.float16),
    "float16 without upcast": sample(overflowing, torch.float16, upcast=False),
    "autocast": sample(normal, torch.float32, autocast=True),
    "autocast, overflowing VAE": sample(overflowing, torch.float32, autocast=True),
}
print(json.dumps(runs))
"""


def _run(tmp_path: Path, program: str, *args: str, device: bool = False) -> tuple[dict, Result]:
    script = tmp_path / "program.py"
    script.write_text(program)
    report = tmp_path / "report.json"
    prefix = ["-m", "dmlpatch", "--device", "sim", f"--report={report}"] if device else []
    result = run_python(
        [*prefix, str(script), *args], cwd=tmp_path, env=clean_env(HF_HUB_OFFLINE="1"), timeout=600
    )
    assert result.code == 0, result.err[-3000:]
    out = json.loads(result.out.splitlines()[-1])
    if device:
        out["report"] = json.loads(report.read_text())
    return out, result


def _largest_difference(got: list[float], expected: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, expected, strict=True))


def test_unet_trains_with_cuda_autocast_and_a_grad_scaler_in_float16(tmp_path: Path) -> None:
    on_device, result = _run(tmp_path, TRAIN, device=True)
    cpu, _ = _run(tmp_path, TRAIN)
    cpu16, _ = _run(tmp_path, TRAIN, "cpu16")
    assert on_device["device"] == "privateuseone:0" and cpu["device"] == "cpu"
    # The UNet's activations are float16 on the device (its input convolution, middle block
    # and last up block), as under CUDA's autocast; the loss is computed in float32.
    assert on_device["dtypes"] == ["torch.float16"] and on_device["prediction"] == "torch.float16"
    assert cpu["dtypes"] == ["torch.float32"] and cpu16["dtypes"] == ["torch.float16"]
    # A GradScaler on the device: 2**16, no overflow in these six steps.
    assert on_device["scales"] == [65536.0] * 6 and cpu["scales"] == [1.0] * 6
    # Loss by loss, float16's tolerance of the CPU's float32 run and of its float16 autocast.
    assert len(on_device["losses"]) == 6
    assert on_device["losses"] == pytest.approx(cpu["losses"], rel=2e-3)
    assert on_device["losses"] == pytest.approx(cpu16["losses"], rel=2e-3)
    report = on_device["report"]
    assert report["autocast"]["float16"] > 0, report["autocast"]
    assert report["ops"]["fallback"] == {} and report["ops"]["refused"] == {}, report["ops"]
    assert (
        "dmlpatch: mixed precision: autocast computes in float16 on privateuseone:0 with "
        "CUDA's operator lists" in result.err_lines
    )


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sdxl")
    normal, overflowing = root / "tiny-sdxl", root / "tiny-sdxl-overflowing-vae"
    made = run_python(
        ["-c", MAKE_PIPELINE, str(normal), str(overflowing)], env=clean_env(HF_HUB_OFFLINE="1")
    )
    assert made.code == 0, made.err[-3000:]
    return normal, overflowing


@pytest.fixture(scope="module")
def samples(
    pipelines: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict]:
    """The pipeline program's runs on the device, on the CPU, and on the CPU with its float16
    autocast for the autocast regions."""
    paths = [str(path) for path in pipelines]
    runs = {}
    for name, region, device in (("device", "cuda", True), ("cpu", "cuda", False)):
        runs[name], _ = _run(tmp_path_factory.mktemp(name), SAMPLE, *paths, region, device=device)
    runs["cpu16"], _ = _run(tmp_path_factory.mktemp("cpu16"), SAMPLE, *paths, "cpu16")
    return runs


def test_float16_pipeline_decodes_in_float32_with_force_upcast_as_on_the_cpu(
    samples: dict[str, dict],
) -> None:
    device, cpu = samples["device"], samples["cpu"]
    got, expected = device["float16"], cpu["float16"]
    assert got["device"] == "privateuseone:0" and expected["device"] == "cpu"
    # The VAE overflows float16 (below), yet the image is finite: diffusers decoded in float32.
    assert not any(got["nan"]) and all(math.isfinite(v) for v in got["values"])
    assert not any(expected["nan"])
    # The CPU's float16 run within float16's rounding (pixels in [0, 1]), and its float32 run.
    assert _largest_difference(got["values"], expected["values"]) < 1e-2
    assert _largest_difference(got["values"], cpu["float32"]["values"]) < 1e-2


def test_float16_overflow_without_upcast_is_the_cpu_s_nan(samples: dict[str, dict]) -> None:
    """What force_upcast saves the image from: the float16 decode overflows, NaN (a black
    image once made 8-bit) on the CPU's float16 and on the device alike, pixel for pixel."""
    got = samples["device"]["float16 without upcast"]
    expected = samples["cpu"]["float16 without upcast"]
    assert all(expected["nan"])
    assert got["nan"] == expected["nan"]


def test_autocast_inference_is_finite_and_close_to_the_cpu_s_float32(
    samples: dict[str, dict],
) -> None:
    device, cpu, cpu16 = samples["device"], samples["cpu"], samples["cpu16"]
    got = device["autocast"]
    assert not any(got["nan"])
    # Plain python on the CPU has no CUDA: its autocast("cuda") region is float32.
    assert _largest_difference(got["values"], cpu["autocast"]["values"]) < 1e-2
    assert device["report"]["autocast"]["float16"] > 0
    # The overflowing VAE inside an autocast region computes its convolutions in float16 there,
    # as on CUDA: NaN where the CPU's float16 autocast makes it NaN.
    overflowing = device["autocast, overflowing VAE"]
    assert overflowing["nan"] == cpu16["autocast, overflowing VAE"]["nan"]
    assert any(overflowing["nan"])
