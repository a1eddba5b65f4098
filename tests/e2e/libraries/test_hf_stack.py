"""transformers pipelines, ``from_pretrained(device_map=...)``, the ``Trainer`` (accelerate) and
sentence-transformers on DirectML, with no spec a user writes; transformers 4.57 (the venv's)
and the newest 5.x (beside it) alike.

Models are random-init BERTs saved with ``save_pretrained`` beside a hand-built WordPiece
vocabulary, and a SentenceTransformer (that BERT plus mean pooling) saved with ``save``. Each
program is the libraries' public API as their READMEs show it, with the devices CUDA users
write; plain python runs the same programs on the CPU (the device arguments say ``cpu``), and
that is the oracle. Without dmlpatch each CUDA form fails here (``Found no NVIDIA driver``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import REPO, Result, clean_env, linked_venv, run_python

MAKE_MODELS = """
import sys, torch
from pathlib import Path
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast
from sentence_transformers import SentenceTransformer, models

root = Path(sys.argv[1])
bert = root / "tiny-bert"
words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a",
         "dog", "ran", "."]
bert.mkdir(parents=True)
(bert / "vocab.txt").write_text("\\n".join(words) + "\\n")
BertTokenizerFast(vocab_file=str(bert / "vocab.txt")).save_pretrained(bert)
torch.manual_seed(0)
config = BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                    num_labels=2)
BertForSequenceClassification(config).save_pretrained(bert)
word = models.Transformer(str(bert), max_seq_length=32)
pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
SentenceTransformer(modules=[word, pooling], device="cpu").save(str(root / "tiny-st"))
"""

# argv: models root, then "cpu" (the oracle) or "cuda" (what CUDA users write), then "st" or
# "no-st" (sentence-transformers 5.1 requires transformers < 5).
INFERENCE = """
import json, sys, torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

root, cuda, st = sys.argv[1], sys.argv[2] == "cuda", sys.argv[3] == "st"
bert = root + "/tiny-bert"
texts = ["the cat sat on the mat .", "a dog ran ."]
out = {"transformers": transformers.__version__}

classify = pipeline("text-classification", model=bert, device=0 if cuda else -1)
named = pipeline("text-classification", model=bert, device="cuda" if cuda else "cpu")
out["pipeline_devices"] = [str(classify.device), str(named.device)]
out["scores"] = [r["score"] for r in classify(texts)] + [r["score"] for r in named(texts)]

tokenizer = AutoTokenizer.from_pretrained(bert)
batch = tokenizer(texts, padding=True, return_tensors="pt")
logits, map_devices = [], []
for device_map in (["cuda", 0, "auto", {"": "cuda:0"}] if cuda else ["cpu"]):
    model = AutoModelForSequenceClassification.from_pretrained(bert, device_map=device_map)
    device = next(model.parameters()).device
    map_devices.append(str(device))
    with torch.no_grad():
        logits.append(model(**batch.to(device)).logits.cpu().tolist())
out["map_devices"], out["logits"] = map_devices, logits

if st:
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(root + "/tiny-st") if cuda else SentenceTransformer(
        root + "/tiny-st", device="cpu")
    out["st_device"] = str(encoder.device)
    out["embeddings"] = encoder.encode(texts).tolist()
print(json.dumps(out))
"""

TRAIN = """
import json, sys, torch
from torch.utils.data import Dataset
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, Trainer,
                          TrainerCallback, TrainingArguments)

bert = sys.argv[1] + "/tiny-bert"
# argv 4 and 5: "fp32", "fp16" (TrainingArguments(fp16=True)) or "cpu-fp16"; the steps.
precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
tokenizer = AutoTokenizer.from_pretrained(bert)
model = AutoModelForSequenceClassification.from_pretrained(bert)
dtypes = set()
model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
    lambda module, inputs, output: dtypes.add(str(output.dtype)[6:]))
texts = ["the cat sat on the mat .", "a dog ran .", "the dog sat .", "a cat ran on the mat ."]
encoded = tokenizer(texts * 3, padding=True)
labels = [0, 1, 1, 0] * 3
computed, scales = [], []


class Sentences(Dataset):
    def __len__(self):
        return len(labels)

    def __getitem__(self, i):
        item = {key: torch.tensor(values[i]) for key, values in encoded.items()}
        return {**item, "labels": torch.tensor(labels[i])}


# Each step's loss as computed (the log rounds it to 4 places); with a GradScaler, the last
# step's gradients overflow float16 and the scaler skips that step.
class Recording(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        computed.append(loss.item())
        if self.accelerator.scaler is not None and self.state.global_step == steps - 1:
            return loss * 1e5
        return loss


class Scales(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        scaler = trainer.accelerator.scaler
        if scaler is not None:
            scales.append([scaler.get_scale(), str(scaler._scale.device)])


# float16 autocast around the loss on the CPU, where the Trainer offers bfloat16 only.
class CpuFloat16(Recording):
    def autocast_smart_context_manager(self, cache_enabled=True):
        return torch.autocast("cpu", dtype=torch.float16, cache_enabled=cache_enabled)


arguments = TrainingArguments(
    output_dir=sys.argv[2], max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-3,
    logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
    disable_tqdm=True, use_cpu=sys.argv[3] == "cpu", fp16=precision == "fp16",
)
trainer = (CpuFloat16 if precision == "cpu-fp16" else Recording)(
    model=model, args=arguments, train_dataset=Sentences(), callbacks=[Scales()])
trainer.train()
print(json.dumps({
    "device": str(next(model.parameters()).device),
    "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    "computed": computed,
    "dtypes": sorted(dtypes),
    "scales": scales,
}))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    made = run_python(["-c", MAKE_MODELS, str(root)], env=clean_env(HF_HUB_OFFLINE="1"))
    assert made.code == 0, made.err[-3000:]
    return root


@pytest.fixture(scope="module")
def venv() -> Iterator[tuple[str, Path]]:
    yield from linked_venv()


def _equal_to_cpu(got: dict, expected: dict) -> None:
    assert got["transformers"] == expected["transformers"]
    assert expected["pipeline_devices"] == ["cpu", "cpu"]
    assert got["pipeline_devices"] == ["privateuseone:0", "privateuseone:0"]
    assert got["scores"] == pytest.approx(expected["scores"], rel=1e-5)
    assert expected["map_devices"] == ["cpu"]
    assert got["map_devices"] == ["privateuseone:0"] * 4
    for logits in got["logits"]:
        for row, expected_row in zip(logits, expected["logits"][0]):
            assert row == pytest.approx(expected_row, rel=1e-5, abs=1e-6)
    if "st_device" not in expected:
        return
    assert (got["st_device"], expected["st_device"]) == ("privateuseone:0", "cpu")
    for row, expected_row in zip(got["embeddings"], expected["embeddings"]):
        assert row == pytest.approx(expected_row, rel=1e-5, abs=1e-6)


def test_pipelines_device_maps_and_sentence_transformers_under_the_runner(
    models: Path, tmp_path: Path
) -> None:
    script = tmp_path / "infer.py"
    script.write_text(INFERENCE)
    env = clean_env(HF_HUB_OFFLINE="1")
    plain = run_python([str(script), str(models), "cpu", "st"], env=env)
    assert plain.code == 0, plain.err[-3000:]
    assert json.loads(plain.out)["transformers"].startswith("4.57.")
    without = run_python([str(script), str(models), "cuda", "st"], env=env)
    assert without.code == 1 and "Found no NVIDIA driver" in without.err
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(script), str(models), "cuda", "st"], env=env
    )
    assert patched.code == 0, patched.err[-3000:]
    _equal_to_cpu(json.loads(patched.out), json.loads(plain.out))


def test_pipelines_device_maps_and_sentence_transformers_after_activate(
    models: Path, tmp_path: Path, venv: tuple[str, Path]
) -> None:
    python, _ = venv
    script = tmp_path / "infer.py"
    script.write_text(INFERENCE)
    env = clean_env(HF_HUB_OFFLINE="1")
    oracle = run_python([str(script), str(models), "cpu", "st"], env=env, python=python)
    expected = json.loads(oracle.out)
    activated = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
    assert activated.code == 0, activated.err
    try:
        result = run_python([str(script), str(models), "cuda", "st"], env=env, python=python)
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0, result.err[-3000:]
    _equal_to_cpu(json.loads(result.out), expected)


def test_trainer_trains_three_steps_on_the_device_equal_to_cpu(
    models: Path, tmp_path: Path
) -> None:
    _trainer_equal_to_cpu(models, tmp_path, clean_env(HF_HUB_OFFLINE="1"))


def _trainer_equal_to_cpu(models: Path, tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    plain = run_python([str(script), str(models), str(tmp_path / "cpu"), "cpu"], env=env)
    assert plain.code == 0, plain.err[-3000:]
    report = tmp_path / "check.json"
    program = [str(script), str(models), str(tmp_path / "dml"), "gpu"]
    checked = run_python(
        ["-m", "dmlpatch", "check", "--device", "sim", "--json", str(report), *program], env=env
    )
    assert checked.code == 0, checked.err[-3000:]
    # The Trainer prints its log dicts first; the program's JSON is the last line.
    expected, got = (json.loads(r.out.splitlines()[-1]) for r in (plain, checked))
    assert (expected["device"], got["device"]) == ("cpu", "privateuseone:0")
    assert len(got["losses"]) == 3
    assert got["losses"] == pytest.approx(expected["losses"], abs=2e-4)  # logged to 4 places
    data = json.loads(report.read_text())
    assert data["compute"]["device_share"] == 1.0
    assert [row["op"] for row in data["ops"] if row["how"] in ("fallback", "refused")] == []


#: float16's tolerance, step by step, for a run in float16 against one in float32.
FLOAT16 = {"rel": 1e-2, "abs": 1e-3}
#: Against the CPU's float16 autocast, whose operator lists are not CUDA's (the CPU's leaves
#: layer_norm and the softmax of attention in float16, CUDA's computes them in float32).
CPU_AUTOCAST = {"rel": 2e-3, "abs": 1e-4}


@pytest.mark.parametrize("version", ["4.57", "5"])
def test_trainer_fp16_trains_in_mixed_precision_on_the_device(
    models: Path, tmp_path: Path, request: pytest.FixtureRequest, version: str
) -> None:
    """``TrainingArguments(fp16=True)`` goes through accelerate: float16 autocast around the
    forward and a GradScaler on the device, as on CUDA. Six steps' losses are the CPU's float32
    ones within float16's tolerance, and close to those under the CPU's float16 autocast (the
    Trainer offers only bfloat16 there: the oracle asks for float16 itself, without a scaler);
    the last step's gradients overflow float16 and the scaler halves its scale; every operator
    runs on the device."""
    if version == "5":
        env: dict[str, str] = request.getfixturevalue("transformers_5")
    else:
        env = clean_env(HF_HUB_OFFLINE="1")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)

    def last_line(result: Result) -> dict[str, Any]:
        assert result.code == 0, result.err[-3000:]
        found: dict[str, Any] = json.loads(result.out.splitlines()[-1])
        return found

    float32, cpu_autocast = (
        last_line(run_python([str(script), str(models), str(tmp_path), "cpu", name, "6"], env=env))
        for name in ("fp32", "cpu-fp16")
    )
    assert (float32["dtypes"], cpu_autocast["dtypes"]) == (["float32"], ["float16"])
    report = tmp_path / "check.json"
    program = [str(script), str(models), str(tmp_path / "dml"), "gpu", "fp16", "6"]
    checked = run_python(
        ["-m", "dmlpatch", "check", "--device", "sim", "--json", str(report), *program], env=env
    )
    got = last_line(checked)
    assert got["device"] == "privateuseone:0"
    assert got["dtypes"] == ["float16"]
    losses = got["computed"]
    assert len(losses) == 6
    assert losses == pytest.approx(float32["computed"], **FLOAT16)
    assert losses != pytest.approx(float32["computed"], rel=1e-6)  # float16, not float32
    assert losses == pytest.approx(cpu_autocast["computed"], **CPU_AUTOCAST)
    assert got["scales"] == [[65536.0, "privateuseone:0"]] * 5 + [[32768.0, "privateuseone:0"]]
    data = json.loads(report.read_text())
    assert data["compute"]["device_share"] == 1.0
    assert [row["op"] for row in data["ops"] if row["how"] in ("fallback", "refused")] == []
    assert data["autocast"]["float16"] > 0 and data["autocast"]["float32"] > 0


def test_trainer_under_the_cpu_s_float16_autocast_is_untouched_by_device_cpu(
    models: Path, tmp_path: Path
) -> None:
    env = clean_env(HF_HUB_OFFLINE="1")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    program = [str(script), str(models), str(tmp_path / "out"), "cpu", "cpu-fp16", "4"]
    plain = run_python(program, env=env)
    found = run_python(["-m", "dmlpatch", "--device", "cpu", *program], env=env)
    assert plain.code == found.code == 0, (plain.err + found.err)[-3000:]
    expected, got = (json.loads(r.out.splitlines()[-1]) for r in (plain, found))
    assert expected["dtypes"] == ["float16"]
    assert got == expected
    assert [line for line in found.err_lines if "autocast" in line] == []


# -- transformers 5 ------------------------------------------------------------------------------
# The newest 5.x lives beside the venv (scripts/setup.sh; $DMLPATCH_TRANSFORMERS_5 may point
# elsewhere), first on PYTHONPATH, with the huggingface-hub and tokenizers it needs; the venv's
# accelerate and torch serve both. 5.x calls torch.cuda.is_current_stream_capturing in
# transformers.utils.import_utils and annotates with torch.cuda.CUDAGraph at import: both must
# leave the rest of the library rewritten.

TRANSFORMERS_5 = Path(
    os.environ.get("DMLPATCH_TRANSFORMERS_5", str(REPO / ".cache" / "transformers-5.24.0"))
)


@pytest.fixture(scope="module")
def transformers_5() -> dict[str, str]:
    assert (TRANSFORMERS_5 / "transformers").is_dir(), f"run scripts/setup.sh: no {TRANSFORMERS_5}"
    return clean_env(HF_HUB_OFFLINE="1", PYTHONPATH=str(TRANSFORMERS_5))


def test_transformers_5_pipelines_and_device_maps_on_the_device_equal_to_cpu(
    models: Path, tmp_path: Path, transformers_5: dict[str, str]
) -> None:
    script = tmp_path / "infer.py"
    script.write_text(INFERENCE)
    plain = run_python([str(script), str(models), "cpu", "no-st"], env=transformers_5)
    assert plain.code == 0, plain.err[-3000:]
    assert json.loads(plain.out)["transformers"].startswith("5.")
    report = tmp_path / "report.json"
    program = [str(script), str(models), "cuda", "no-st"]
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", *program], env=transformers_5
    )
    assert patched.code == 0, patched.err[-3000:]
    _equal_to_cpu(json.loads(patched.out), json.loads(plain.out))
    data = json.loads(report.read_text())
    # accelerate's NUMA affinity reads the GPU's through pynvml, and transformers' allocator
    # warm-up calls torch.<device type>.mem_get_info behind a test of the device: both keep
    # CUDA's meaning (under plain python neither runs off CUDA); nothing else of transformers 5.
    kept = "not answered: its sites keep CUDA's meaning (the rest of the module is rewritten)"
    assert data["kept_as_written"] == [
        {
            "module": "accelerate.utils.environment.override_numa_affinity",
            "reason": f"uses pynvml, {kept}",
        },
        {
            "module": "transformers.modeling_utils.caching_allocator_warmup",
            "reason": f"uses torch.<device type> (getattr), {kept}",
        },
    ]
    assert data["ops"]["fallback"] == {} and data["compute"]["device_share"] == 1.0
    assert "transformers.utils.import_utils" in {entry["module"] for entry in data["rewritten"]}


def test_transformers_5_trainer_trains_on_the_device_equal_to_cpu(
    models: Path, tmp_path: Path, transformers_5: dict[str, str]
) -> None:
    _trainer_equal_to_cpu(models, tmp_path, transformers_5)
