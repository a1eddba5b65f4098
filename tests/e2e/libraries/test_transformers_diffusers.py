"""A transformers encoder (inference) and a diffusers UNet (a training step) on DirectML: with
dmlpatch they run with no CPU fallback, equal to the CPU; without it, the encoder dies in
``torch.inference_mode`` (microsoft/DirectML#602) and the UNet's every step sends its group
norms' backward, SiLU's backward and (from torch 2.5 on) the attention mask to the CPU.

Models are random-init, saved with ``save_pretrained`` beside a hand-built WordPiece vocabulary;
``dmlpatch check --json`` runs each program on the simulated device and reports every operator
that was fixed, fell back or was refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from support import clean_env, run_python

#: Attention's math path, which DirectML runs, takes its softmax through ``_safe_softmax`` from
#: torch 2.5 on: it finds the rows an attention mask sets to -inf with ``isneginf``, which
#: torch-directml 0.2.5 runs on the CPU. torch 2.4.1 (torch-directml's own) calls ``_softmax``,
#: and nothing in these programs reaches ``isneginf`` there.
ATTENTION_CALLS_ISNEGINF = hasattr(torch.ops.aten, "_safe_softmax")

MAKE_BERT = """
import sys, torch
from pathlib import Path
from transformers import BertConfig, BertModel, BertTokenizerFast

out = Path(sys.argv[1])
words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a",
         "dog", "ran", "."]
out.mkdir(parents=True)
(out / "vocab.txt").write_text("\\n".join(words) + "\\n")
BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(out)
torch.manual_seed(0)
config = BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
BertModel(config).save_pretrained(out)
"""

ENCODE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer

device = "cuda" if torch.cuda.is_available() else "cpu"
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModel.from_pretrained(sys.argv[1]).to(device).eval()
batch = tokenizer(["the cat sat on the mat .", "a dog ran ."], padding=True,
                  return_tensors="pt").to(device)
with torch.inference_mode():
    hidden = model(**batch).last_hidden_state
mask = batch["attention_mask"].unsqueeze(-1)
embeddings = (hidden * mask).sum(1) / mask.sum(1)
print(json.dumps({"device": str(hidden.device), "values": embeddings.cpu().tolist()}))
"""

UNET_STEP = """
import json, torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = UNet2DModel(
    sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
    block_out_channels=(32, 64), norm_num_groups=8,
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
).to(device)
scheduler = DDPMScheduler(num_train_timesteps=100)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
generator = torch.Generator().manual_seed(1)
losses = []
for step in range(2):
    clean = torch.randn(2, 3, 16, 16, generator=generator).to(device)
    noise = torch.randn(2, 3, 16, 16, generator=generator).to(device)
    timesteps = torch.randint(0, 100, (2,), generator=generator).to(device)
    loss = F.mse_loss(model(scheduler.add_noise(clean, noise, timesteps), timesteps).sample, noise)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({"device": str(next(model.parameters()).device), "values": [losses]}))
"""


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
scheduler = DDPMScheduler(num_train_timesteps=50)
DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(sys.argv[1])
"""

# As diffusers' README shows it: from_pretrained, .to("cuda"), call.
SAMPLE = """
import json, sys, torch
from diffusers import DDPMPipeline

pipeline = DDPMPipeline.from_pretrained(sys.argv[1])
pipeline = pipeline.to("cuda" if torch.cuda.is_available() else "cpu")
generator = torch.Generator().manual_seed(0)
images = pipeline(batch_size=2, num_inference_steps=4, generator=generator, output_type="np").images
print(json.dumps({"device": str(pipeline.device), "values": images.reshape(2, -1).tolist()}))
"""


def _run_both(tmp_path: Path, program: str, *args: str) -> tuple[dict, dict, dict[str, Any]]:
    script = tmp_path / "program.py"
    script.write_text(program)
    env = clean_env(HF_HUB_OFFLINE="1")
    plain = run_python([str(script), *args], cwd=tmp_path, env=env)
    assert plain.code == 0, plain.err[-3000:]
    report = tmp_path / "check.json"
    checked = run_python(
        ["-m", "dmlpatch", "check", "--json", str(report), str(script), *args],
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert checked.code == 0, checked.err[-3000:]
    return json.loads(plain.out), json.loads(checked.out), json.loads(report.read_text())


def _close(got: list, expected: list, rel: float) -> None:
    for row, expected_row in zip(got, expected):
        assert row == pytest.approx(expected_row, rel=rel, abs=1e-6)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bert") / "tiny-bert"
    made = run_python(["-c", MAKE_BERT, str(directory)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert made.code == 0, made.err[-3000:]
    return directory


def test_transformers_encoder_under_inference_mode_with_no_fallback(
    tmp_path: Path, bert: Path
) -> None:
    expected, got, report = _run_both(tmp_path, ENCODE, str(bert))
    assert expected["device"] == "cpu" and got["device"] == "privateuseone:0"
    _close(got["values"], expected["values"], rel=1e-5)
    hows = {row["op"]: row["how"] for row in report["ops"]}
    assert "fallback" not in hows.values() and "refused" not in hows.values(), hows
    # The attention mask, on the device, where torch's attention reaches isneginf.
    assert ("aten::isneginf.out" in hows) == ATTENTION_CALLS_ISNEGINF, hows
    assert hows.get("aten::isneginf.out", "fixed") == "fixed"
    assert report["status"] == "runs"


def test_transformers_encoder_without_dmlpatch_dies_in_inference_mode(
    tmp_path: Path, bert: Path
) -> None:
    by_hand = "import dmlpatch.sim as sim\nsim.load()\n" + ENCODE.replace(
        'device = "cuda" if torch.cuda.is_available() else "cpu"', "device = sim.device(0)"
    )
    result = run_python(["-c", by_hand, str(bert)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert result.code == 1
    assert result.err.rstrip().splitlines()[-1] == (
        "RuntimeError: Cannot set version_counter for inference tensor"
    )


def test_diffusers_unet_training_step_with_no_fallback(tmp_path: Path) -> None:
    expected, got, report = _run_both(tmp_path, UNET_STEP)
    assert expected["device"] == "cpu" and got["device"] == "privateuseone:0"
    _close(got["values"], expected["values"], rel=1e-4)
    hows = {row["op"]: row["how"] for row in report["ops"]}
    assert "fallback" not in hows.values() and "refused" not in hows.values(), hows
    for op in ("aten::native_group_norm_backward", "aten::silu_backward.grad_input"):
        assert hows[op] == "fixed", hows


def test_diffusers_unet_without_dmlpatch_falls_back_every_step(tmp_path: Path) -> None:
    by_hand = (
        "import warnings, dmlpatch.sim as sim\nsim.load()\nwarnings.simplefilter('ignore')\n"
        + UNET_STEP.replace(
            'device = "cuda" if torch.cuda.is_available() else "cpu"', "device = sim.device(0)"
        )
        + "print(json.dumps(sorted(sim.counters()['ops']['fallback'])))\n"
    )
    result = run_python(["-c", by_hand], env=clean_env(HF_HUB_OFFLINE="1"))
    assert result.code == 0, result.err[-3000:]
    fallbacks = json.loads(result.out.splitlines()[-1])
    for op in ("aten::native_group_norm_backward", "aten::silu_backward.grad_input"):
        assert op in fallbacks, fallbacks
    assert ("aten::isneginf.out" in fallbacks) == ATTENTION_CALLS_ISNEGINF, fallbacks


def test_diffusers_pipeline_samples_on_the_device_equal_to_cpu(tmp_path: Path) -> None:
    saved = tmp_path / "tiny-ddpm"
    made = run_python(["-c", MAKE_PIPELINE, str(saved)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert made.code == 0, made.err[-3000:]
    expected, got, report = _run_both(tmp_path, SAMPLE, str(saved))
    assert expected["device"] == "cpu" and got["device"] == "privateuseone:0"
    _close(got["values"], expected["values"], rel=1e-4)
    hows = {row["op"]: row["how"] for row in report["ops"]}
    assert "fallback" not in hows.values() and "refused" not in hows.values(), hows
    assert report["compute"]["device_share"] == 1.0


# transformers 4.57's Bloom builds its causal mask with `causal_mask *= arange > position`, a
# float mask times a bool one, which DirectML makes bool (microsoft/DirectML#686, #702).
BLOOM = """
import json, sys, torch
from transformers import BloomConfig, BloomForCausalLM

torch.manual_seed(0)
model = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)).eval()


def run(device):
    model.to(device)
    ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]], device=device)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]], device=device)
    with torch.no_grad():
        tokens = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
        )
        logits = model(input_ids=ids, attention_mask=mask).logits
    return {"device": str(logits.device), "tokens": tokens.tolist(),
            "logits": logits.flatten().tolist()}


if sys.argv[1] == "cpu-then-plain-sim":  # then DirectML as it ships, without dmlpatch
    import dmlpatch.sim as sim

    results = [run("cpu")]
    sim.load()
    results.append(run(sim.device(0)))
else:
    results = [run("cuda" if torch.cuda.is_available() else "cpu")]
print(json.dumps(results))
"""


def test_bloom_causal_mask_on_the_device_equal_to_cpu(tmp_path: Path) -> None:
    script = tmp_path / "bloom.py"
    script.write_text(BLOOM)
    env = clean_env(HF_HUB_OFFLINE="1")
    reference = run_python([str(script), "cpu-then-plain-sim"], cwd=tmp_path, env=env)
    assert reference.code == 0, reference.err[-3000:]
    cpu, plain = json.loads(reference.out.splitlines()[-1])
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(script), "runner"],
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.code == 0, result.err[-3000:]
    (patched,) = json.loads(result.out.splitlines()[-1])
    assert patched["device"] == plain["device"] == "privateuseone:0"
    assert patched["tokens"] == cpu["tokens"]
    assert patched["logits"] == pytest.approx(cpu["logits"], rel=1e-5, abs=1e-6)
    # As DirectML ships, the mask turned bool and lets the padded row attend where the CPU
    # does not: the logits are silently different.
    assert max(abs(a - b) for a, b in zip(plain["logits"], cpu["logits"])) > 1e-4
