"""Reach, third ring: every road a device takes into torch.

A device reaches torch positionally (``torch.Generator("cuda")``, ``torch.load(f, "cuda")``,
``nn.Linear(3, 4, True, dev)``) and through any name (``dev = "cuda"``, ``cfg["dev"]``, a list,
``sys.argv``, an environment variable, a JSON config). One program takes every road, trains three
steps on the simulated device and under ``--device cpu`` (its oracle: plain python cannot run
it without CUDA) with the same losses; diffusers' own README snippet samples as on the CPU; a
road dmlpatch does not know is named, line and reason, by the runner and by ``check``; and the
device's module answers what torch's own code asks of an accelerator's module.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from support import clean_env, run_python

ROADS = """
    import io, json, os, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    dev = "cuda"
    gpu = "cuda:0"
    cfg = {"dev": "cuda"}
    devices = ["cuda"]
    with open(sys.argv[2], encoding="utf-8") as handle:
        settings = json.load(handle)

    where = {}
    generator = torch.Generator("cuda").manual_seed(0)
    inputs = torch.randn(32, 4, generator=generator, device="cuda")
    where["Generator"] = str(inputs.device)
    torch.manual_seed(1)
    targets = torch.randint(0, 2, (32,), device=gpu)
    where["randint"] = str(targets.device)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, True, dev), nn.ReLU(), nn.Linear(8, 2))
    model.to(devices[0])
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer, dev))
    where["load"] = str(next(model.parameters()).device)
    scripted = io.BytesIO()
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), scripted)
    scripted.seek(0)
    where["jit.load"] = str(next(torch.jit.load(scripted, "cuda").parameters()).device)

    scale = torch.ones(1, device=cfg["dev"])
    where["cfg"] = str(scale.device)
    where["argv"] = str(torch.zeros(1).to(sys.argv[1], torch.float16).device)
    where["environ"] = str(torch.zeros(1, device=os.environ["TRAIN_DEVICE"]).device)
    where["config file"] = str(torch.zeros(1).to(settings["device"]).device)
    where["ordinal"] = str(torch.zeros(1).to(0).device)
    where["new_zeros"] = str(scale.new_zeros(2, device=gpu).device)

    loader = DataLoader(
        TensorDataset(inputs.cpu(), targets.cpu()), batch_size=16, pin_memory=True,
        pin_memory_device=dev,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with torch.random.fork_rng(device_type=dev):
        torch.randn(3, device=dev)  # draws inside the fork: undone at its end
    for step in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(dev) * scale), y.to(dev))
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 6))
    where["autocast dtype"] = str(torch.get_autocast_dtype(dev))
    print(json.dumps({"where": where, "losses": losses, "after": torch.rand(2).tolist()}))
    """


@pytest.fixture(scope="module")
def roads(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("roads")
    script = directory / "roads.py"
    script.write_text(textwrap.dedent(ROADS), encoding="utf-8")
    settings = directory / "settings.json"
    settings.write_text(json.dumps({"device": "cuda"}), encoding="utf-8")
    return script, settings


def _run(script: Path, settings: Path, device: str) -> dict:
    env = clean_env(TRAIN_DEVICE="cuda:0")
    result = run_python(
        ["-m", "dmlpatch", "--device", device, str(script), "cuda", str(settings)], env=env
    )
    assert result.code == 0, result.err[-3000:]
    return json.loads(result.out)


def test_every_road_reaches_the_device_with_the_cpu_s_losses(roads: tuple[Path, Path]) -> None:
    script, settings = roads
    plain = run_python([str(script), "cuda", str(settings)], env=clean_env(TRAIN_DEVICE="cuda"))
    assert plain.code == 1  # without dmlpatch, CUDA's name stops it at the first road
    on_device = _run(script, settings, "sim")
    on_cpu = _run(script, settings, "cpu")
    assert set(on_device["where"]) == set(on_cpu["where"])
    for road, place in on_device["where"].items():
        if road == "autocast dtype":
            continue
        assert place == "privateuseone:0", road
        assert on_cpu["where"][road] == "cpu", road
    assert len(on_device["losses"]) == 6
    assert on_device["losses"] == pytest.approx(on_cpu["losses"], abs=1e-5)
    assert on_device["losses"][-1] < on_device["losses"][0]  # it trained
    # The fork gave back the generator's state: the draws after it are the CPU run's.
    assert on_device["after"] == pytest.approx(on_cpu["after"])


def test_scan_counts_the_sites_the_rewriter_sees(roads: tuple[Path, Path]) -> None:
    script, _ = roads
    result = run_python(["-m", "dmlpatch", "scan", str(script)])
    assert result.code == 0, result.err
    found = [line.split(": ", 1)[1] for line in result.out.splitlines()]
    assert found.count('device_literal: "cuda"') == 3  # Generator, randn, jit.load
    assert "device_literal: 0" in found  # .to(0): CUDA's ordinal 0
    for road in (
        "gpu",
        "dev",
        "devices[0]",
        'cfg["dev"]',
        "sys.argv[1]",
        'os.environ["TRAIN_DEVICE"]',
        'settings["device"]',
    ):
        assert f"device_argument: {road}" in found, road
    assert result.err.strip().endswith(
        f"roads.py: {len(found)} CUDA device site(s), 0 CUDA-only branch(es)"
    )


MAKE_STABLE_DIFFUSION = """
import json, os, sys, torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

out = sys.argv[1]
os.makedirs(os.path.join(out, "vocabulary"), exist_ok=True)
vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
for letter in "abcdefghijklmnopqrstuvwxyz":
    vocab[letter] = len(vocab)
    vocab[letter + "</w>"] = len(vocab)
vocab_file = os.path.join(out, "vocabulary", "vocab.json")
merges_file = os.path.join(out, "vocabulary", "merges.txt")
with open(vocab_file, "w") as handle:
    json.dump(vocab, handle)
with open(merges_file, "w") as handle:
    handle.write("#version: 0.2\\n")
torch.manual_seed(0)
text = CLIPTextModel(CLIPTextConfig(
    vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_attention_heads=4,
    num_hidden_layers=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
    pad_token_id=1, projection_dim=32))
unet = UNet2DConditionModel(
    block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
    out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
    norm_num_groups=8, attention_head_dim=4)
vae = AutoencoderKL(
    block_out_channels=(32,), in_channels=3, out_channels=3,
    down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
    latent_channels=4, norm_num_groups=8, sample_size=32)
tokenizer = CLIPTokenizer(vocab_file, merges_file, model_max_length=16)
StableDiffusionPipeline(
    vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet, scheduler=DDIMScheduler(),
    safety_checker=None, feature_extractor=None, requires_safety_checker=False,
).save_pretrained(out)
"""

# diffusers' README: from_pretrained, .to("cuda"), a generator made on "cuda", a prompt.
README = """
import json, sys, torch
from diffusers import DiffusionPipeline

pipeline = DiffusionPipeline.from_pretrained(sys.argv[1])
pipeline.to("cuda")
generator = torch.Generator("cuda").manual_seed(0)
image = pipeline(
    "a squirrel in picasso style", generator=generator, num_inference_steps=3, height=32,
    width=32, output_type="np",
).images[0]
print(json.dumps({"device": str(pipeline.device), "values": image.reshape(-1).tolist()}))
"""


def test_diffusers_readme_snippet_samples_on_the_device_as_on_the_cpu(tmp_path: Path) -> None:
    saved = tmp_path / "tiny-sd"
    env = clean_env(HF_HUB_OFFLINE="1")
    made = run_python(["-c", MAKE_STABLE_DIFFUSION, str(saved)], env=env)
    assert made.code == 0, made.err[-3000:]
    script = tmp_path / "readme.py"
    script.write_text(README, encoding="utf-8")
    results = {}
    for device in ("sim", "cpu"):
        run = run_python(
            ["-m", "dmlpatch", "--device", device, str(script), str(saved)], env=env, timeout=600
        )
        assert run.code == 0, run.err[-3000:]
        results[device] = json.loads(run.out)
    assert results["sim"]["device"] == "privateuseone:0"
    assert results["cpu"]["device"] == "cpu"
    assert results["sim"]["values"] == pytest.approx(results["cpu"]["values"], abs=1e-5)
    # As the rest of diffusers' docs load one: device_map="cuda" (the diffusers spec).
    mapped = tmp_path / "mapped.py"
    mapped.write_text(
        README.replace("(sys.argv[1])", '(sys.argv[1], device_map="cuda")').replace(
            'pipeline.to("cuda")\n', ""
        ),
        encoding="utf-8",
    )
    run = run_python(["-m", "dmlpatch", "--device", "sim", str(mapped), str(saved)], env=env)
    assert run.code == 0, run.err[-3000:]
    assert json.loads(run.out)["values"] == pytest.approx(results["cpu"]["values"], abs=1e-5)


QUEUES = """
    import torch

    dev = "cuda"
    stream = torch.Stream(dev)
    start, end = torch.Event(dev, enable_timing=True), torch.Event(device=dev, enable_timing=True)
    start.record()
    x = torch.ones(64, 64, device=dev) @ torch.ones(64, 64, device=dev)
    end.record(stream)
    end.synchronize()
    stream.synchronize()
    print(stream.device, start.elapsed_time(end) >= 0, x.sum().item())
    """


def test_torch_streams_and_events_are_the_adapter_s_one_queue(tmp_path: Path) -> None:
    """DirectML has neither (``Backend doesn't support create a new Stream``): torch.Stream and
    torch.Event made for CUDA are the adapter's queue, as torch.cuda.Stream and Event are."""
    script = tmp_path / "queues.py"
    script.write_text(textwrap.dedent(QUEUES), encoding="utf-8")
    run = run_python(["-m", "dmlpatch", "--device", "sim", str(script)])
    assert run.code == 0, run.err[-3000:]
    assert run.out.split() == ["privateuseone:0", "True", "262144.0"]


UNKNOWN_ROAD = """
    import torch

    options = {"device": "cuda"}
    make = torch.zeros
    print(make(2, **options))
    """


def test_a_road_dmlpatch_does_not_know_is_named_with_its_line(tmp_path: Path) -> None:
    """CUDA's name through **options and a function held in a variable: the runner and check
    name the line and say why, instead of 'the program failed for another reason'."""
    script = tmp_path / "unknown.py"
    script.write_text(textwrap.dedent(UNKNOWN_ROAD), encoding="utf-8")
    run = run_python(["-m", "dmlpatch", "--device", "sim", str(script)])
    assert run.code == 1
    assert "Found no NVIDIA driver" in run.err
    said = [line for line in run.err_lines if line.startswith("dmlpatch: CUDA reached torch")]
    assert said == [
        "dmlpatch: CUDA reached torch at unknown.py:6 in <module> (print(make(2, **options))): "
        "nothing on this line passes a device where dmlpatch looks for one (a parameter of a "
        "torch callable, or a keyword named device, map_location or pin_memory_device): the "
        "device came through a road the rewriter does not know (**options, a callable held "
        "in a variable, getattr)"
    ] or said[0].startswith(f"dmlpatch: CUDA reached torch at {script}:6")
    checked = run_python(["-m", "dmlpatch", "check", str(script)], cwd=tmp_path)
    assert checked.code == 1
    verdict = next(line for line in checked.err_lines if line.startswith("verdict:"))
    assert "CUDA reached torch at unknown.py:6 in <module>" in verdict
    assert "another reason" not in verdict


def test_a_library_handed_cuda_s_name_outside_the_scope_is_named(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    library.mkdir()
    (library / "helperlib.py").write_text(
        "import torch\n\n\ndef zeros(where='cuda'):\n    return torch.zeros(2, device=where)\n",
        encoding="utf-8",
    )
    script = tmp_path / "uses.py"
    script.write_text("import helperlib\n\nprint(helperlib.zeros())\n", encoding="utf-8")
    env = clean_env(PYTHONPATH=str(library))
    run = run_python(
        ["-m", "dmlpatch", "--device", "sim", "--scope", "specs", str(script)], env=env
    )
    assert run.code == 1
    assert run.err_lines[-1].startswith("dmlpatch: CUDA reached torch at ")
    assert run.err_lines[-1].endswith(
        "helperlib.py:5 in zeros (return torch.zeros(2, device=where)): its module was not "
        "rewritten (device_argument on this line): the scope (specs) leaves it out, or it was "
        "imported before dmlpatch started"
    )
    # Under the default scope the library's default "cuda" is its own CUDA name: it runs.
    run = run_python(["-m", "dmlpatch", "--device", "sim", str(script)], env=env)
    assert run.code == 0, run.err
    assert "privateuseone:0" in run.out


ASKED = """
    import io, json, sys
    import torch
    from torch.utils.checkpoint import checkpoint

    device = torch.device(sys.argv[1])
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to(device)
    x = torch.randn(4, 8, device=device, requires_grad=True)
    # Recomputed in backward with the RNG state it saved: the same dropout mask both times.
    out = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=True)
    out.sum().backward()
    answers = {"grad": x.grad.flatten().tolist()}
    on_cpu = device.type == "cpu"  # torch.cpu has no RNG state to fork: the CPU's alone
    kind = "cuda" if on_cpu else device.type
    with torch.random.fork_rng(devices=[] if on_cpu else [0], device_type=kind):
        torch.rand(4, device=device)
    answers["after fork"] = torch.rand(3, device=device).tolist()
    from torch.testing._internal.common_utils import freeze_rng_state

    with freeze_rng_state():
        torch.rand(2, device=device)
    answers["after freeze"] = torch.rand(3, device=device).tolist()
    buffer = io.BytesIO()
    torch.save(torch.ones(1), buffer)
    buffer.seek(0)
    try:
        getattr(torch, "load")(buffer, "cuda")  # a road the rewriter does not take
    except RuntimeError as error:
        answers["load"] = str(error).split(" but ")[0]
    print(json.dumps(answers))
    """


def test_the_device_module_answers_what_torch_asks_of_an_accelerator(tmp_path: Path) -> None:
    """torch.utils.checkpoint, fork_rng and freeze_rng_state ask the device's module for its
    RNG state, and torch.load(f, 'cuda') for its current device: torch-directml's module (and
    the simulated one, faithfully) has neither; dmlpatch adds them, the CPU's numbers kept."""
    script = tmp_path / "asked.py"
    script.write_text(textwrap.dedent(ASKED), encoding="utf-8")
    device = run_python(["-m", "dmlpatch", "--device", "sim", str(script), "privateuseone:0"])
    assert device.code == 0, device.err[-3000:]
    cpu = run_python([str(script), "cpu"])
    assert cpu.code == 0, cpu.err[-3000:]
    on_device, on_cpu = json.loads(device.out), json.loads(cpu.out)
    for key in ("grad", "after fork", "after freeze"):
        assert on_device[key] == pytest.approx(on_cpu[key], abs=1e-6), key
    # Unanswered, the load fails as plain python's does, not with an AttributeError.
    assert (
        on_device["load"] == on_cpu["load"] == ("Attempting to deserialize object on a CUDA device")
    )


#: What torch's own code asks of a device's module that dmlpatch leaves unanswered, and why:
#: each is asked only by code DirectML cannot run anyway.
NOT_ANSWERED = {
    "_utils": "serialization falls back to torch.device(location) without it",
    "_sleep": "CUDA's spin kernel, asked by CUDA graph tests",
    "sparse": "legacy sparse tensor types of the device (torch._utils._type)",
    "current_stream": "distributed checkpointing's staging streams",
    "stream": "distributed checkpointing's staging streams",
    "memory_stats": "distributed memory tracking",
    "memory_allocated": "distributed memory tracking",
    "memory_reserved": "distributed memory tracking",
    "empty_cache": "distributed memory tracking",
    "get_device_properties": "NUMA binding of distributed ranks",
    "__wrapped__": "Dynamo's registration of get_device_module itself",
    "Stream": "torch 2.4 DataParallel's background copy streams, made for CUDA devices only",
}

_ASKED = re.compile(
    r"(?:device_module|device_mod|custom_device_mod|custom_backend_mod|_device_module"
    r"|get_device_module\([^()]*\)|lambda m: m)\.([A-Za-z_]\w*)"
)


def _asked_of_a_device_module() -> set[str]:
    """Every attribute torch's own Python (not its tests) asks of a device's module."""
    import torch

    root = Path(torch.__file__).parent
    asked: set[str] = set()
    for path in root.rglob("*.py"):
        if "testing" in path.parts or "test" in path.parts:
            continue
        asked.update(_ASKED.findall(path.read_text(encoding="utf-8", errors="replace")))
    return asked


def test_the_device_module_has_everything_torch_asks_of_it(tmp_path: Path) -> None:
    asked = _asked_of_a_device_module()
    assert {"get_rng_state", "set_rng_state", "current_device", "device_count"} <= asked
    script = tmp_path / "names.py"
    script.write_text(
        "import json, torch\nx = torch.zeros(1, device='cuda')\n"
        "print(json.dumps(sorted(dir(torch.privateuseone))))\n",
        encoding="utf-8",
    )
    run = run_python(["-m", "dmlpatch", "--device", "sim", str(script)])
    assert run.code == 0, run.err[-3000:]
    has = set(json.loads(run.out))
    missing = sorted(asked - has - set(NOT_ANSWERED))
    assert missing == [], f"torch asks the device's module for {missing}: answer or list them"
