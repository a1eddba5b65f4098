"""Generate docs/reference/operator-coverage.md: every operator a corpus of model families calls
on the
simulated DirectML device (torch-directml 0.2.5's profile, dmlpatch's fixes installed), in a
training step and in inference, and how the device serves it: natively, fixed on the device by
dmlpatch, or through DirectML's CPU fallback.

    .venv/bin/python scripts/operator_coverage.py [--check]

``--check`` regenerates the table and fails when docs/reference/operator-coverage.md differs (the
test suite runs it); under another torch than the table's, it fails where an operator falls
back for want of a fix. Models are built from configurations with random weights (no download).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "reference" / "operator-coverage.md"
PROFILE = "torch-directml-0.2.5"
HOW = ("native", "fixed", "fallback")

Step = Callable[[torch.device, bool], Any]  # (device, training) -> output


def _train_or_infer(model: torch.nn.Module, training: bool, run: Callable[[], Any]) -> None:
    model.train(training)
    if training:
        out = run()
        loss = out if isinstance(out, torch.Tensor) else sum(o.float().mean() for o in out)
        loss.float().mean().backward()
    else:
        with torch.no_grad():
            run()


def resnet(dev: torch.device, training: bool) -> None:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).to(dev)
    images = torch.randn(2, 3, 64, 64, device=dev)
    _train_or_infer(model, training, lambda: model(images))


def mobilenet(dev: torch.device, training: bool) -> None:
    import torchvision

    model = torchvision.models.mobilenet_v3_small(num_classes=10).to(dev)
    images = torch.randn(2, 3, 64, 64, device=dev)
    _train_or_infer(model, training, lambda: model(images))


def vit(dev: torch.device, training: bool) -> None:
    import torchvision

    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    ).to(dev)
    images = torch.randn(2, 3, 32, 32, device=dev)
    _train_or_infer(model, training, lambda: model(images))


def faster_rcnn(dev: torch.device, training: bool) -> None:
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).to(dev)
    images = [torch.rand(3, 128, 160, device=dev)]
    boxes = torch.tensor([[10.0, 20, 80, 90]], device=dev)
    targets = [{"boxes": boxes, "labels": torch.tensor([1], device=dev)}]
    if training:
        model.train()
        sum(model(images, targets).values()).backward()
    else:
        model.eval()
        with torch.no_grad():
            model(images)


def deeplab(dev: torch.device, training: bool) -> None:
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=4
    ).to(dev)
    images = torch.randn(2, 3, 64, 64, device=dev)
    _train_or_infer(model, training, lambda: model(images)["out"])


def bert(dev: torch.device, training: bool) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    model = BertForSequenceClassification(config).to(dev)
    ids = torch.randint(0, 100, (2, 12), device=dev)
    mask = torch.ones_like(ids)
    _train_or_infer(model, training, lambda: model(input_ids=ids, attention_mask=mask).logits)


def gpt2(dev: torch.device, training: bool) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
    model = GPT2LMHeadModel(config).to(dev)
    ids = torch.randint(0, 100, (2, 12), device=dev)
    if training:
        model.train()
        model(ids, labels=ids).loss.backward()
    else:
        model.eval()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)


def t5(dev: torch.device, training: bool) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
        decoder_start_token_id=0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config).to(dev)
    ids = torch.randint(1, 100, (2, 10), device=dev)
    if training:
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
    else:
        model.eval()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=3, do_sample=False)


def unet(dev: torch.device, training: bool) -> None:
    from diffusers import UNet2DModel

    model = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), layers_per_block=1, norm_num_groups=8,
    ).to(dev)  # fmt: skip
    sample = torch.randn(2, 3, 16, 16, device=dev)
    step = torch.tensor([10, 500], device=dev)
    _train_or_infer(model, training, lambda: model(sample, step).sample)


def vae(dev: torch.device, training: bool) -> None:
    from diffusers import AutoencoderKL

    model = AutoencoderKL(
        block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
    ).to(dev)  # fmt: skip
    images = torch.randn(1, 3, 32, 32, device=dev)
    _train_or_infer(model, training, lambda: model(images).sample)


def dit(dev: torch.device, training: bool) -> None:
    from diffusers import DiTTransformer2DModel

    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2,
        sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=8,
    ).to(dev)  # fmt: skip
    latents = torch.randn(2, 4, 8, 8, device=dev)
    step = torch.tensor([1, 5], device=dev)
    labels = torch.tensor([0, 3], device=dev)
    _train_or_infer(
        model, training, lambda: model(latents, timestep=step, class_labels=labels).sample
    )


def whisper_tiny(dev: torch.device, training: bool) -> None:
    import whisper
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(
        n_mels=80, n_audio_ctx=50, n_audio_state=32, n_audio_head=2, n_audio_layer=2,
        n_vocab=100, n_text_ctx=16, n_text_state=32, n_text_head=2, n_text_layer=2,
    )  # fmt: skip
    model = Whisper(dims).to(dev)
    audio = torch.randn(16000, device=dev)
    mel = whisper.log_mel_spectrogram(audio)[None, :, :100]
    tokens = torch.randint(0, 100, (1, 8), device=dev)
    _train_or_infer(model, training, lambda: model(mel, tokens))


def demucs_htdemucs(dev: torch.device, training: bool) -> None:
    from demucs.htdemucs import HTDemucs

    model = HTDemucs(sources=["drums", "bass"], audio_channels=2, channels=8, depth=2,
                     t_layers=1, segment=1, samplerate=8000).to(dev)  # fmt: skip
    mix = torch.randn(1, 2, 8000, device=dev)
    _train_or_infer(model, training, lambda: model(mix))


def encodec(dev: torch.device, training: bool) -> None:
    from transformers import EncodecConfig, EncodecModel

    config = EncodecConfig(
        target_bandwidths=[24.0], sampling_rate=8000, audio_channels=1, num_filters=4,
        num_residual_layers=1, upsampling_ratios=[4, 2], hidden_size=16, codebook_size=32,
        codebook_dim=16, num_lstm_layers=1,
    )  # fmt: skip
    model = EncodecModel(config).to(dev)
    audio = torch.randn(1, 1, 800, device=dev)
    _train_or_infer(model, training, lambda: model(audio).audio_values)


def hifigan(dev: torch.device, training: bool) -> None:
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    config = SpeechT5HifiGanConfig(
        model_in_dim=16, upsample_initial_channel=32, upsample_rates=[4, 4],
        upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
    )  # fmt: skip
    model = SpeechT5HifiGan(config).to(dev)
    mel = torch.randn(20, 16, device=dev)
    _train_or_infer(model, training, lambda: model(mel))


def _timm(name: str, size: int, **options: Any) -> Step:
    def step(dev: torch.device, training: bool) -> None:
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=5, **options).to(dev)
        images = torch.randn(2, 3, size, size, device=dev)
        _train_or_infer(model, training, lambda: model(images))

    return step


def lstm(dev: torch.device, training: bool) -> None:
    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.lstm = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = torch.nn.GRU(64, 16, batch_first=True)
            self.out = torch.nn.Linear(16, 5)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            hidden, _ = self.lstm(self.embed(ids))
            hidden, _ = self.gru(hidden)
            return self.out(hidden)

    model = Tagger().to(dev)
    ids = torch.randint(0, 50, (3, 7), device=dev)
    _train_or_infer(model, training, lambda: model(ids))


def graph_convolution(dev: torch.device, training: bool) -> None:
    class MessagePassing(torch.nn.Module):
        """Mean aggregation over edges with index_add and scatter_add, as graph libraries do."""

        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

        def propagate(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
            source, target = edges
            summed = torch.zeros_like(x).index_add(0, target, x[source])
            degree = torch.zeros(x.shape[0], device=x.device).scatter_add(
                0, target, torch.ones_like(target, dtype=x.dtype)
            )
            return summed / degree.clamp(min=1)[:, None]

        def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
            hidden = torch.relu(self.first(self.propagate(x, edges)))
            return torch.log_softmax(self.second(self.propagate(hidden, edges)), -1)

    model = MessagePassing().to(dev)
    x = torch.randn(20, 8, device=dev)
    edges = torch.randint(0, 20, (2, 60), device=dev)
    _train_or_infer(model, training, lambda: model(x, edges))


CORPUS: dict[str, tuple[str, Step]] = {
    "ResNet-18": ("torchvision classification", resnet),
    "MobileNetV3-small": ("torchvision classification", mobilenet),
    "ViT": ("torchvision classification", vit),
    "Faster R-CNN": ("torchvision detection", faster_rcnn),
    "DeepLabV3": ("torchvision segmentation", deeplab),
    "ConvNeXt-atto": ("timm classification", _timm("convnext_atto", 64)),
    "EfficientNet-B0": ("timm classification", _timm("efficientnet_b0", 64)),
    "ViT-tiny": ("timm classification", _timm("vit_tiny_patch16_224", 32, img_size=32)),
    "BERT": ("transformers encoder", bert),
    "GPT-2": ("transformers decoder (generate)", gpt2),
    "T5": ("transformers seq2seq (generate)", t5),
    "UNet2D": ("diffusers UNet", unet),
    "AutoencoderKL": ("diffusers VAE", vae),
    "DiT": ("diffusers DiT", dit),
    "Whisper": ("audio: speech recognition (log-mel on the device)", whisper_tiny),
    "HTDemucs": ("audio: source separation (STFT)", demucs_htdemucs),
    "EnCodec": ("audio codec (transformers)", encodec),
    "HiFi-GAN": ("vocoder (transformers SpeechT5)", hifigan),
    "LSTM/GRU tagger": ("recurrent", lstm),
    "message passing": ("graph: index_add, scatter_add", graph_convolution),
}


def measure() -> dict[str, dict[str, dict[str, set[str]]]]:
    """{model: {"training"/"inference": {how: operators}}}."""
    import dmlpatch.sim as sim
    from dmlpatch import opfix

    sim.load(PROFILE)
    opfix.install("sim", PROFILE)
    dev = torch.device("privateuseone:0")
    found: dict[str, dict[str, dict[str, set[str]]]] = {}
    for name, (_, step) in CORPUS.items():
        found[name] = {}
        for mode in ("training", "inference"):
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim.reset_counters()
                step(dev, mode == "training")
                ops = sim.counters()["ops"]
            found[name][mode] = {how: set(ops.get(how, {})) for how in HOW}
    return found


def render(found: dict[str, dict[str, dict[str, set[str]]]]) -> str:
    from dmlpatch.gaps import catalogue

    lines = [
        "# Operator coverage",
        "",
        "<!-- generated by scripts/operator_coverage.py; tests/e2e/test_operator_coverage.py "
        "keeps it current -->",
        "",
        "Every operator each model calls on the simulated DirectML device (torch-directml "
        f"0.2.5's profile, `{PROFILE}`) with dmlpatch's fixes, in one training step (forward, "
        "loss, backward) and in inference, by how the device serves it: **native** (a DirectML "
        "kernel, or PyTorch's composition of them), **fixed** (a dmlpatch kernel on the "
        "device) or **fallback** (DirectML's CPU fallback: copies out and back). Models are "
        f"built from configurations with random weights. Measured with torch {_torch()}: "
        "another release composes some operators of others.",
        "",
        "| model | family | mode | native | fixed | CPU fallback |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    fallbacks: dict[str, set[str]] = {}
    for name, (family, _) in CORPUS.items():
        for mode in ("training", "inference"):
            served = found[name][mode]
            fixed = ", ".join(f"`{op}`" for op in sorted(served["fixed"])) or "—"
            fell = ", ".join(f"`{op}`" for op in sorted(served["fallback"])) or "none"
            lines.append(
                f"| {name} | {family} | {mode} | {len(served['native'])} operators | "
                f"{fixed} | {fell} |"
            )
            for op in served["fallback"]:
                fallbacks.setdefault(op, set()).add(name)
    lines += ["", "## CPU fallbacks left in the corpus", ""]
    if not fallbacks:
        lines.append("None.")
    else:
        from dmlpatch.opfix import registry

        # A fix that prices its composition above the fallback for these calls' shapes sends
        # them through the CPU on purpose (docs/reference/performance.md); the rest are gaps.
        priced = {operator for fix in registry.fixes() for operator in fix.costs}
        lines += [
            "| operator | models | why | catalogue entry |",
            "| --- | --- | --- | --- |",
        ]
        for op in sorted(fallbacks):
            known = "/".join(f.key for f in catalogue.for_gap(op, "fallback")) or "—"
            models = ", ".join(sorted(fallbacks[op]))
            why = (
                "the cost model's choice: its fix is priced above the fallback for these calls"
                if op.split(".")[0] in priced
                else "no fix"
            )
            lines.append(f"| `{op}` | {models} | {why} | {known} |")
    return "\n".join(lines) + "\n"


def _torch() -> str:
    return torch.__version__.split("+")[0]


def _gaps_left(text: str) -> list[str]:
    """The rows of operators that fall back for want of a fix."""
    left = text.split("## CPU fallbacks left in the corpus", 1)[-1]
    return [line for line in left.splitlines() if "| no fix |" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the document is stale")
    options = parser.parse_args()
    text = render(measure())
    if options.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if f"Measured with torch {_torch()}:" not in current:
            # The table is another torch's: here no operator may fall back for want of a fix.
            gaps = _gaps_left(text)
            for row in gaps:
                sys.stderr.write(f"on torch {_torch()}, no fix: {row}\n")
            return 1 if gaps else 0
        if current != text:
            sys.stderr.write(
                f"{DOC.relative_to(REPO)} is stale: run .venv/bin/python "
                "scripts/operator_coverage.py\n"
            )
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
