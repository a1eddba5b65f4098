"""Offline fixtures for the GFPGAN workflow: random-init weights in the loaders' exact formats.

The real weights are downloads (hundreds of MB each) that tests cannot fetch. Each
architecture is built with a fixed seed and saved where and how its loader expects it:

- ``gfpgan/weights/detection_Resnet50_Final.pth`` and ``parsing_parsenet.pth``: raw state dicts
  (``init_detection_model`` / ``init_parsing_model`` load them strictly), looked up by
  ``GFPGANer`` relative to the working directory;
- ``gfpgan/weights/<model>.pth`` for every ``-v`` of ``inference_gfpgan.py``:
  ``{'params_ema': state_dict}``;
- ``realesrgan/RealESRGAN_x2plus.pth``: ``{'params_ema': state_dict}``; the test copies it to
  where ``RealESRGANer`` resolves the script's URL (``<site-packages>/weights``).

A random RetinaFace reports over a thousand "faces" per image. Its three 1x1 heads are zeroed
instead, so every location scores the same: the biases make the first anchor of the coarsest
level (256 px, stride 32) a face with a plausible five-point landmark layout, and on a 64 px
image (a 2x2 grid of such boxes, IoU > 0.6) non-maximum suppression keeps exactly one.

Run as ``python -m dmlpatch --device cpu gfpgan_fixtures.py OUT``: importing basicsr needs the
``functional_tensor`` alias (torchvision >= 0.17), and dmlpatch is what provides it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import cv2
import numpy as np
import torch

#: ``-v`` of inference_gfpgan.py -> (weight file, GFPGANer arch, channel multiplier)
VERSIONS = {
    "1": ("GFPGANv1.pth", "original", 1),
    "1.2": ("GFPGANCleanv1-NoCE-C2.pth", "clean", 2),
    "1.3": ("GFPGANv1.3.pth", "clean", 2),
    "1.4": ("GFPGANv1.4.pth", "clean", 2),
    "RestoreFormer": ("RestoreFormer.pth", "RestoreFormer", 2),
}
WHOLE_SIZE = 64  # whole test image (px): one detection (see above) and a cheap background
ALIGNED_SIZE = 64  # aligned face input; GFPGANer resizes it to 512
#: Landmarks of the rigged face, as offsets from the box centre in units of 0.1 * box size
#: (RetinaFace's landmark variance): eyes, nose, mouth corners.
LANDMARK_OFFSETS = (-0.6, -0.4, 0.6, -0.4, 0.0, 0.2, -0.5, 0.7, 0.5, 0.7)
NOISE_STRENGTH = 0.05  # StyleGAN2 noise weights are zero at init; real ones are not
GFPGAN_SDIST = "gfpgan==1.3.8"  # ships the upstream inference_gfpgan.py


def build(out: Path) -> None:
    """Write every weight file and test image under ``out`` (see the module docstring)."""
    weights = out / "gfpgan" / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    _save(_retinaface(), weights / "detection_Resnet50_Final.pth", wrap=False)
    _save(_parsenet(), weights / "parsing_parsenet.pth", wrap=False)
    built: dict[tuple[str, int], Path] = {}
    for name, arch, multiplier in VERSIONS.values():
        path = weights / name
        if (arch, multiplier) in built:
            # 1.2, 1.3 and 1.4 share an architecture: one random model serves all three.
            os.link(built[arch, multiplier], path)
            continue
        _save(_gfpgan(arch, multiplier), path, wrap=True)
        built[arch, multiplier] = path
    esrgan = out / "realesrgan"
    esrgan.mkdir(exist_ok=True)
    _save(_rrdbnet(), esrgan / "RealESRGAN_x2plus.pth", wrap=True)
    _images(out / "inputs")


def upstream_script(directory: Path, env: dict[str, str] | None = None) -> Path:
    """inference_gfpgan.py from the gfpgan 1.3.8 sdist (``pip download``; never committed)."""
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            GFPGAN_SDIST,
            "-d",
            str(directory),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if fetched.returncode != 0:
        raise RuntimeError(f"pip download {GFPGAN_SDIST} failed:\n{fetched.stderr}")
    (archive,) = directory.glob("gfpgan-*.tar.gz")
    with tarfile.open(archive) as tar:
        source = tar.extractfile(tar.getmember("gfpgan-1.3.8/inference_gfpgan.py"))
        assert source is not None
        script = directory / "inference_gfpgan.py"
        script.write_bytes(source.read())
    return script


def _save(model: torch.nn.Module, path: Path, wrap: bool) -> None:
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    torch.save({"params_ema": state} if wrap else state, path)


def _retinaface() -> torch.nn.Module:
    from facexlib.detection.retinaface import RetinaFace

    torch.manual_seed(0)
    model = RetinaFace(network_name="resnet50", half=False, device="cpu")
    for heads in (model.ClassHead, model.BboxHead, model.LandmarkHead):
        for head in heads:
            torch.nn.init.zeros_(head.conv1x1.weight)
            torch.nn.init.zeros_(head.conv1x1.bias)
    # Two anchors per location: logits (background, face) at [2a, 2a+1], landmarks at [10a:].
    for level, head in enumerate(model.ClassHead):
        with torch.no_grad():
            head.conv1x1.bias.copy_(torch.tensor([5.0, -5.0, 5.0, -5.0]))
            if level == 2:
                head.conv1x1.bias[:2] = torch.tensor([-5.0, 5.0])
    with torch.no_grad():
        model.LandmarkHead[2].conv1x1.bias[:10] = torch.tensor(LANDMARK_OFFSETS)
    return model


def _parsenet() -> torch.nn.Module:
    from facexlib.parsing.parsenet import ParseNet

    torch.manual_seed(1)
    return ParseNet(in_size=512, out_size=512, parsing_ch=19)


def _gfpgan(arch: str, multiplier: int) -> torch.nn.Module:
    torch.manual_seed(2)
    options = dict(
        out_size=512,
        num_style_feat=512,
        channel_multiplier=multiplier,
        decoder_load_path=None,
        num_mlp=8,
        input_is_latent=True,
        different_w=True,
        narrow=1,
        sft_half=True,
    )
    model: torch.nn.Module
    if arch == "original":
        from gfpgan.archs.gfpganv1_arch import GFPGANv1

        model = GFPGANv1(fix_decoder=True, **options)
    elif arch == "clean":
        from gfpgan.archs.gfpganv1_clean_arch import GFPGANv1Clean

        model = GFPGANv1Clean(fix_decoder=False, **options)
    else:
        from gfpgan.archs.restoreformer_arch import RestoreFormer

        model = RestoreFormer()
    for name, parameter in model.named_parameters():
        # StyleConv's noise strength is a (1,)-shaped "weight" directly under a style conv.
        if name.endswith(".weight") and parameter.shape == (1,):
            with torch.no_grad():
                parameter.fill_(NOISE_STRENGTH)
    return model


def _rrdbnet() -> torch.nn.Module:
    from basicsr.archs.rrdbnet_arch import RRDBNet

    torch.manual_seed(3)
    return RRDBNet(num_in_ch=3, num_out_ch=3, num_feat=64, num_block=23, num_grow_ch=32, scale=2)


def _images(inputs: Path) -> None:
    """A smooth synthetic portrait-ish image and an "aligned face" crop, as PNG."""
    rng = np.random.default_rng(4)
    (inputs / "whole").mkdir(parents=True, exist_ok=True)
    (inputs / "aligned").mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:WHOLE_SIZE, 0:WHOLE_SIZE] / WHOLE_SIZE
    base = np.stack([120 + 80 * x, 100 + 60 * y, 140 + 50 * np.sin(6 * x * y)], axis=-1)
    noisy = base + rng.normal(0, 6, base.shape)
    whole = np.clip(noisy, 0, 255).astype(np.uint8)
    cv2.imwrite(str(inputs / "whole" / "portrait.png"), whole)
    aligned = cv2.resize(whole, (ALIGNED_SIZE, ALIGNED_SIZE), interpolation=cv2.INTER_AREA)
    cv2.imwrite(str(inputs / "aligned" / "face.png"), aligned)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
