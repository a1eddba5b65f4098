"""The upstream GFPGAN demo, unmodified, on the simulated DirectML device.

Real libraries (facexlib 0.3.0, basicsr 1.4.2, gfpgan 1.3.8, realesrgan 0.3.0), random-init
weights in their exact formats (``gfpgan_fixtures.py``), sockets blocked. The CPU references
are plain runs (no dmlpatch): the only help they get is the functional_tensor alias a user
would add by editing basicsr, and half=False, as the script's own comment asks on the CPU.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest

from dmlpatch import paths

from support import (
    Result,
    distribution_digests,
    file_stamps,
    linked_venv,
    run_python,
    written_between,
)

SIM = ("-m", "dmlpatch", "--device", "sim")
DISTRIBUTIONS = ("facexlib", "basicsr", "gfpgan", "realesrgan", "torchvision", "torch")


def _hashes() -> dict[str, str]:
    return distribution_digests(*DISTRIBUTIONS)


@pytest.fixture(scope="module")
def before() -> dict[str, str]:
    return _hashes()


# The user's hand edit of basicsr/data/degradations.py, for plain (unpatched) runs only.
HAND_ALIAS = (
    "import sys, torchvision.transforms._functional_tensor as f; "
    "sys.modules['torchvision.transforms.functional_tensor'] = f\n"
)

# Counts every convolution per model (forward hooks mark the running model) in a CPU run, so
# the simulated device's convolution count can be checked against it.
CONV_COUNTER = """
import collections, torch
from torch.utils._python_dispatch import TorchDispatchMode
CONVS = collections.Counter()
_current = ["other"]


class _Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.convolution:
            CONVS[_current[0]] += 1
        return func(*args, **(kwargs or {}))


def watch(name, model):
    model.register_forward_pre_hook(lambda *a: _current.__setitem__(0, name))
    model.register_forward_hook(lambda *a: _current.__setitem__(0, "other"))
"""

WHOLE_REFERENCE = (
    HAND_ALIAS
    + CONV_COUNTER
    + """
import json, sys, cv2
from basicsr.archs.rrdbnet_arch import RRDBNet
from realesrgan import RealESRGANer
from gfpgan import GFPGANer

model = RRDBNet(num_in_ch=3, num_out_ch=3, num_feat=64, num_block=23, num_grow_ch=32, scale=2)
bg = RealESRGANer(scale=2, model_path=sys.argv[2], model=model, tile=400, tile_pad=10, pre_pad=0,
                  half=False)
restorer = GFPGANer(model_path="gfpgan/weights/GFPGANv1.3.pth", upscale=2, arch="clean",
                    channel_multiplier=2, bg_upsampler=bg)
for name, net in (("retinaface", restorer.face_helper.face_det),
                  ("parsenet", restorer.face_helper.face_parse),
                  ("gfpgan", restorer.gfpgan), ("rrdbnet", bg.model)):
    watch(name, net)
with _Count():
    crops, faces, image = restorer.enhance(cv2.imread(sys.argv[1]), paste_back=True, weight=0.5)
cv2.imwrite(sys.argv[3] + "/restored.png", image)
cv2.imwrite(sys.argv[3] + "/face.png", faces[0])
print(json.dumps({"faces": len(faces), "devices": sorted({str(restorer.device), str(bg.device)}),
                  "convs": dict(CONVS)}))
"""
)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> Result:
    return run_python(args, env=env, cwd=cwd, timeout=600)


def _images_equal(a: Path, b: Path) -> int:
    import numpy as np
    from PIL import Image

    left = np.asarray(Image.open(a), dtype=np.int16)
    right = np.asarray(Image.open(b), dtype=np.int16)
    assert left.shape == right.shape
    return int(np.abs(left - right).max())


def _no_network(assets) -> None:
    log = assets.netlog.read_text() if assets.netlog.exists() else ""
    assert log == "", f"network attempted: {log}"


def test_whole_image_cli_on_sim_equals_plain_cpu(assets, before, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path / "sim")
    report = tmp_path / "report.json"
    image_dir = assets.root / "inputs" / "whole"
    sim = _run(
        [
            *SIM,
            f"--report={report}",
            str(assets.script),
            "-i",
            str(image_dir),
            "-o",
            "results",
            "-v",
            "1.3",
            "-s",
            "2",
        ],
        assets.env(),
        work,
    )
    assert sim.code == 0, sim.err
    assert "Failed inference" not in sim.out  # GFPGANer swallows model errors; none allowed
    # Every spec entry applies (a fix the spec names but that no longer exists would warn).
    assert [line for line in sim.err_lines if line.startswith("dmlpatch: warning")] == []
    assert "Tile 1/1" in sim.out  # the background upsampler ran
    assert "The unoptimized RealESRGAN is slow on CPU" not in sim.err
    results = work / "results"
    for folder in ("restored_imgs", "restored_faces", "cmp", "cropped_faces"):
        assert any((results / folder).iterdir()), folder
    data = json.loads(report.read_text())
    assert data["device"] == "privateuseone:0" and data["backend"] == "sim"
    assert data["ops"]["refused"] == {} and data["ops"]["fallback"] == {}
    _all_on_device(data)

    ref_dir = tmp_path / "ref"
    ref_work = assets.workdir(ref_dir)
    script = ref_dir / "reference.py"
    script.write_text(WHOLE_REFERENCE)
    weights = assets.root / "realesrgan" / "RealESRGAN_x2plus.pth"
    plain = _run(
        [str(script), str(image_dir / "portrait.png"), str(weights), str(ref_dir)],
        assets.env(),
        ref_work,
    )
    assert plain.code == 0, plain.err
    reference = json.loads(plain.out.splitlines()[-1])
    assert reference["devices"] == ["cpu"] and reference["faces"] == 1
    convs = reference["convs"]
    assert set(convs) == {"retinaface", "parsenet", "gfpgan", "rrdbnet"}
    assert convs["rrdbnet"] == 23 * 3 * 5 + 6  # RRDB blocks + first/body/up/hr/last convs
    # Every convolution of every model (RRDB included) ran on the device.
    assert data["ops"]["native"]["aten::convolution_overrideable"] == sum(convs.values())
    restored = results / "restored_imgs" / "portrait.png"
    assert _images_equal(restored, ref_dir / "restored.png") <= 1
    assert _images_equal(results / "restored_faces" / "portrait_00.png", ref_dir / "face.png") <= 1
    from PIL import Image

    assert Image.open(restored).size == (128, 128)  # 64 px input, -s 2: upscaled
    _no_network(assets)


def test_original_arch_center_face_tiled_background(assets, tmp_path: Path) -> None:
    """-v 1 (GFPGANv1: fused_act + upfirdn2d), --only_center_face, tiled Real-ESRGAN."""
    work = assets.workdir(tmp_path)
    report = tmp_path / "report.json"
    result = _run(
        [
            *SIM,
            f"--report={report}",
            str(assets.script),
            "-i",
            str(assets.root / "inputs" / "whole"),
            "-o",
            "results",
            "-v",
            "1",
            "--only_center_face",
            "--bg_tile",
            "32",
        ],
        assets.env(),
        work,
    )
    assert result.code == 0, result.err
    assert "Failed inference" not in result.out
    assert "Tile 4/4" in result.out
    assert any((work / "results" / "restored_imgs").iterdir())
    data = json.loads(report.read_text())
    assert data["ops"]["refused"] == {} and data["ops"]["fallback"] == {}
    assert data["ops"]["native"]["aten::convolution_overrideable"] > 4 * (23 * 3 * 5 + 6)
    _all_on_device(data)
    _no_network(assets)


def test_aligned_restoreformer_cli_without_background(assets, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path)
    result = _run(
        [
            *SIM,
            "--report",
            str(assets.script),
            "-i",
            str(assets.root / "inputs" / "aligned"),
            "-o",
            "results",
            "-v",
            "RestoreFormer",
            "--aligned",
            "--bg_upsampler",
            "none",
        ],
        assets.env(),
        work,
    )
    assert result.code == 0, result.err
    assert "Failed inference" not in result.out
    results = work / "results"
    # Aligned faces are not pasted back, so upstream writes no restored_imgs/ for them.
    for folder in ("restored_faces", "cmp", "cropped_faces"):
        assert any((results / folder).iterdir()), folder
    assert "{" in result.err, result.err
    data = json.loads(result.err[result.err.index("{") :])
    assert data["ops"]["refused"] == {} and data["ops"]["fallback"] == {}
    _all_on_device(data)
    _no_network(assets)


def _all_on_device(report: dict) -> None:
    """Every layer of every model (detector, parser, restorer, upsampler) ran on the device."""
    compute = report["compute"]
    assert compute["device_share"] == 1.0 and compute["on_cpu"] == {"calls": 0, "flops": 0}
    assert compute["on_device"]["calls"] > 0


def test_footprint_is_dmlpatch_cache_and_the_outputs(
    assets, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """With bytecode writing on (as users have it), a run creates or changes nothing but
    dmlpatch's caches (the tagged .pyc of each rewritten module, the cache directory) and the
    program's outputs; the list goes to the test summary."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    cache = Path(paths.cache_directory())
    work = assets.workdir(tmp_path / "work")
    report = tmp_path / "report.json"
    roots = [purelib, cache, work, assets.root]
    before = file_stamps(*roots)
    arguments = ["-i", str(assets.root / "inputs" / "aligned"), "-o", "results", "-v", "1.3"]
    arguments += ["--aligned", "--bg_upsampler", "none"]
    result = _run(
        [*SIM, f"--report={report}", str(assets.script), *arguments],
        assets.env(PYTHONDONTWRITEBYTECODE=""),
        work,
    )
    assert result.code == 0, result.err
    # The modules this run loaded through dmlpatch's loader: tagged bytecode of any other
    # module was written by another test process at the same time (a YOLO run's ultralytics).
    written = json.loads(report.read_text())
    ours = {entry["module"] for entry in written["rewritten"] + written["kept_as_written"]}
    ours |= {
        entry["module"]
        for patch in written["patches"].values()
        for entry in patch.get("skipped", [])
    }
    kinds: dict[str, list[str]] = {}
    for path in map(Path, written_between(before, file_stamps(*roots))):
        if path.is_relative_to(cache):
            kind = "dmlpatch: cache directory"
        elif path.parent.name == "__pycache__" and ".opt-dmlpatch" in path.name:
            if _module_of_tagged(path, purelib) in ours:
                kind = "dmlpatch: rewritten bytecode (tagged .pyc beside the source)"
            else:
                kind = "another test process: rewritten bytecode"
        elif path.parent.name == "__pycache__" and path.suffix == ".pyc":
            kind = "python: its own bytecode cache"
        elif path.is_relative_to(work / "results") or path == assets.netlog:
            kind = "program output"
        else:
            kind = "unexpected"
        kinds.setdefault(kind, []).append(str(path))
    assert "unexpected" not in kinds, kinds["unexpected"]
    assert kinds["program output"]
    # The first run with bytecode on writes the tagged files; later runs only read them. Each
    # module this run rewrote has one, and this run wrote them only for those modules.
    tagged = {
        _module_of_tagged(path, purelib)
        for package in ("facexlib", "basicsr", "gfpgan", "realesrgan")
        for path in (purelib / package).rglob("__pycache__/*.opt-dmlpatch*.pyc")
    }
    rewritten_here = {entry["module"] for entry in written["rewritten"]}
    assert (
        rewritten_here
        and {module for module in rewritten_here if module.split(".")[0] in GFPGAN_STACK} <= tagged
    )
    for path in kinds.get("dmlpatch: rewritten bytecode (tagged .pyc beside the source)", []):
        assert _module_of_tagged(Path(path), purelib) in ours, path
    record_property(
        "terminal_summary",
        "footprint of `python -m dmlpatch inference_gfpgan.py ...`: "
        + "; ".join(f"{kind}: {len(files)} file(s)" for kind, files in sorted(kinds.items())),
    )


GFPGAN_STACK = ("facexlib", "basicsr", "gfpgan", "realesrgan")


def _module_of_tagged(path: Path, root: Path) -> str:
    """``basicsr/utils/__pycache__/misc.cpython-311.opt-dmlpatch…pyc``: ``basicsr.utils.misc``."""
    package = path.parent.parent.relative_to(root).parts
    name = path.name.split(".", 1)[0]
    return ".".join(package if name == "__init__" else (*package, name))


API = """
import json, sys, cv2, numpy as np, torch
import dmlpatch.sim
from gfpgan import GFPGANer
from basicsr.models.base_model import BaseModel

VERSIONS = {"1": ("GFPGANv1", "original", 1), "1.2": ("GFPGANCleanv1-NoCE-C2", "clean", 2),
            "1.3": ("GFPGANv1.3", "clean", 2), "1.4": ("GFPGANv1.4", "clean", 2),
            "RestoreFormer": ("RestoreFormer", "RestoreFormer", 2)}
face = cv2.imread(sys.argv[1])
out = {}


def restore(version, device):
    name, arch, multiplier = VERSIONS[version]
    torch.manual_seed(0)
    restorer = GFPGANer(model_path=f"gfpgan/weights/{name}.pth", upscale=2, arch=arch,
                        channel_multiplier=multiplier, device=device)
    devices = {str(p.device) for p in restorer.gfpgan.parameters()}
    devices |= {str(p.device) for p in restorer.face_helper.face_det.parameters()}
    _, faces, _ = restorer.enhance(face, has_aligned=True, paste_back=True)
    return devices, faces[0].astype(np.int16)


for version in VERSIONS:
    # 1.4 with an explicit device=, the others with GFPGANer's own (rewritten) choice.
    explicit = torch.device("privateuseone:0") if version == "1.4" else None
    devices, restored = restore(version, explicit)
    entry = {"devices": sorted(devices)}
    if version in ("1", "RestoreFormer"):
        _, cpu = restore(version, torch.device("cpu"))
        entry["max_diff_vs_cpu"] = int(np.abs(restored - cpu).max())
    out[version] = entry
out["train_device"] = str(BaseModel({"num_gpu": 1, "is_train": False, "dist": False}).device)
out["ops"] = dmlpatch.sim.counters()["ops"]
print(json.dumps(out))
"""


def test_python_api_every_version(assets, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path)
    script = tmp_path / "api.py"
    script.write_text(API)
    result = _run(
        [*SIM, str(script), str(assets.root / "inputs" / "aligned" / "face.png")],
        assets.env(),
        work,
    )
    assert result.code == 0, result.err
    assert "Failed inference" not in result.out
    data = json.loads(result.out.splitlines()[-1])
    for version in ("1", "1.2", "1.3", "1.4", "RestoreFormer"):
        assert data[version]["devices"] == ["privateuseone:0"], version
    assert data["1"]["max_diff_vs_cpu"] <= 1
    assert data["RestoreFormer"]["max_diff_vs_cpu"] <= 1
    assert data["train_device"] == "privateuseone:0"  # basicsr training device selection
    assert data["ops"]["refused"] == {} and data["ops"]["fallback"] == {}
    _no_network(assets)


# Re-saves a checkpoint as torch.save does from a GPU, without one: torch names each storage's
# location with the first tagger of its package registry that answers, and for a storage on
# cuda:0 its own CUDA tagger answers "cuda:0" (torch.serialization._backend_tag). A tagger
# registered ahead of the CPU's (priority 10) gives the same answer for these CPU storages; the
# bytes written (the raw storage data, copied to the CPU first on a GPU) are the same.
SAVE_AS_FROM_GPU = """
import sys, torch
state = torch.load(sys.argv[1], map_location="cpu")
torch.serialization.register_package(1, lambda storage: "cuda:0", lambda storage, where: None)
torch.save(state, sys.argv[2])
"""

LOAD_GPU_CHECKPOINT = """
import json, sys, torch
from gfpgan import GFPGANer
restorer = GFPGANer(model_path=sys.argv[1], upscale=2, arch="clean", channel_multiplier=2)
reference = torch.load(sys.argv[2], map_location="cpu")["params_ema"]
loaded = restorer.gfpgan.state_dict()
print(json.dumps({
    "device": str(restorer.device),
    "params": sorted({str(p.device) for p in restorer.gfpgan.parameters()}),
    "equal": sorted(reference) == sorted(loaded)
    and all(torch.equal(loaded[k].cpu(), v) for k, v in reference.items()),
}))
"""


def test_checkpoint_saved_on_a_gpu(assets, tmp_path: Path) -> None:
    """GFPGANer's torch.load (no map_location) of a CUDA-saved checkpoint: loads on the device
    under dmlpatch, and without dmlpatch fails with torch's own CUDA deserialization error."""
    import zipfile

    original = assets.root / "gfpgan" / "weights" / "GFPGANv1.3.pth"
    gpu_saved = tmp_path / "GFPGANv1.3-cuda.pth"
    saved = _run(["-c", SAVE_AS_FROM_GPU, str(original), str(gpu_saved)], assets.env(), tmp_path)
    assert saved.code == 0, saved.err
    with zipfile.ZipFile(gpu_saved) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        pickled = archive.read(name)
    assert b"cuda:0" in pickled and b"cpu" not in pickled  # every storage tagged cuda:0

    work = assets.workdir(tmp_path / "work")
    script = tmp_path / "load.py"
    script.write_text(LOAD_GPU_CHECKPOINT)
    args = [str(script), str(gpu_saved), str(original)]
    patched = _run([*SIM, *args], assets.env(), work)
    assert patched.code == 0, patched.err
    data = json.loads(patched.out.splitlines()[-1])
    assert data == {"device": "privateuseone:0", "params": ["privateuseone:0"], "equal": True}

    plain_script = tmp_path / "plain_load.py"
    plain_script.write_text(HAND_ALIAS + LOAD_GPU_CHECKPOINT)
    plain = _run([str(plain_script), str(gpu_saved), str(original)], assets.env(), work)
    assert plain.code == 1
    assert (
        "RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False." in plain.err
    )
    _no_network(assets)


def test_noise_without_normal_on_pytorch_directml_1_8(assets, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path)
    script = tmp_path / "noise.py"
    script.write_text(
        "import json, sys, cv2, numpy as np, dmlpatch.sim\n"
        "from gfpgan import GFPGANer\n"
        "r = GFPGANer(model_path='gfpgan/weights/GFPGANv1.3.pth', upscale=2)\n"
        "_, faces, _ = r.enhance(cv2.imread(sys.argv[1]), has_aligned=True)\n"
        "print(json.dumps({'ops': dmlpatch.sim.counters()['ops'], 'std': float(faces[0].std())}))\n"
    )
    result = _run(
        [*SIM, str(script), str(assets.root / "inputs" / "aligned" / "face.png")],
        assets.env(DMLPATCH_SIM_PROFILE="pytorch-directml-1.8"),
        work,
    )
    assert result.code == 0, result.err
    assert "Failed inference" not in result.out
    data = json.loads(result.out.splitlines()[-1])
    # DirectML 1.8 refuses normal_; dmlpatch's op fix draws every StyleConv's noise on the
    # device from uniform_ (Box-Muller), so nothing is refused and nothing leaves the device.
    assert data["ops"]["refused"] == {}
    assert data["ops"]["fixed"]["aten::normal_"] >= 15
    assert data["ops"]["native"]["aten::uniform_"] >= 15
    assert data["ops"]["fallback"] == {}
    assert data["std"] > 0


def test_without_dmlpatch_it_fails_as_users_report(assets, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path)
    args = [str(assets.script), "-i", str(assets.root / "inputs" / "whole"), "-o", "results"]
    plain = _run(args, assets.env(), work)
    assert plain.code == 1
    assert "No module named 'torchvision.transforms.functional_tensor'" in plain.err
    # With basicsr edited by hand and the simulated device loaded, the unmodified script
    # silently drops Real-ESRGAN and runs every model on the CPU: no device convolution.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        (assets.site / "sitecustomize.py").read_text()
        + HAND_ALIAS
        + "import atexit, json, dmlpatch.sim\ndmlpatch.sim.load()\n"
        + "atexit.register(lambda: print(json.dumps(dmlpatch.sim.counters()['ops'])))\n"
    )
    env = assets.env(PYTHONPATH=str(site))
    edited = _run([*args, "--only_center_face"], env, work)
    assert edited.code == 0, edited.err
    assert "The unoptimized RealESRGAN is slow on CPU. We do not use it." in edited.err
    assert "aten::convolution_overrideable" not in json.loads(edited.out.splitlines()[-1])["native"]
    # The hand edit DirectML guides give for gfpgan/utils.py (device -> DirectML) alone:
    # GFPGANv1 ("-v 1") calls basicsr's CUDA extension and dies.
    script = tmp_path / "v1.py"
    script.write_text(
        "import sys, cv2, torch\nfrom gfpgan import GFPGANer\n"
        "r = GFPGANer(model_path='gfpgan/weights/GFPGANv1.pth', arch='original', "
        "channel_multiplier=1, device=torch.device('privateuseone:0'))\n"
        "r.enhance(cv2.imread(sys.argv[1]), has_aligned=True)\n"
    )
    v1 = _run([str(script), str(assets.root / "inputs" / "aligned" / "face.png")], env, work)
    assert v1.code == 1
    assert "NameError: name 'fused_act_ext' is not defined" in v1.err


AUTO = """
import json, sys
{first}
import cv2, dmlpatch.sim
from gfpgan import GFPGANer
r = GFPGANer(model_path="gfpgan/weights/GFPGANv1.3.pth", upscale=2)
_, faces, _ = r.enhance(cv2.imread(sys.argv[1]), has_aligned=True)
ops = dmlpatch.sim.counters()["ops"]
print(json.dumps({{"device": str(r.device), "convs": ops["native"].get(
    "aten::convolution_overrideable", 0), "fallback": ops["fallback"], "refused": ops["refused"]}}))
"""


def _check_auto(result: Result) -> None:
    assert result.code == 0, result.err
    assert "of model compute" not in result.err  # no placement warning at exit
    assert "Failed inference" not in result.out
    data = json.loads(result.out.splitlines()[-1])
    assert data["device"] == "privateuseone:0"
    assert data["convs"] > 0 and data["fallback"] == {} and data["refused"] == {}


def test_import_dmlpatch_auto(assets, tmp_path: Path) -> None:
    work = assets.workdir(tmp_path)
    script = tmp_path / "auto.py"
    script.write_text(AUTO.format(first="import dmlpatch.auto"))
    face = str(assets.root / "inputs" / "aligned" / "face.png")
    _check_auto(_run([str(script), face], assets.env(DMLPATCH_DEVICE="sim"), work))


def test_after_dmlpatch_activate(assets, tmp_path: Path) -> None:
    for python, _ in linked_venv():
        _activated_run(assets, tmp_path, python)


def _activated_run(assets, tmp_path: Path, python: str) -> None:
    env = assets.env()
    activated = run_python(
        ["-m", "dmlpatch", "activate", "--device", "sim"], env=env, python=python
    )
    assert activated.code == 0, activated.err
    work = assets.workdir(tmp_path / "work")
    script = tmp_path / "activated.py"
    script.write_text(AUTO.format(first=""))
    face = str(assets.root / "inputs" / "aligned" / "face.png")
    _check_auto(run_python([str(script), face], env=env, cwd=work, python=python, timeout=600))


def test_missing_weights_offline_gives_a_hint(assets, tmp_path: Path) -> None:
    script = tmp_path / "missing.py"
    script.write_text(
        "from gfpgan import GFPGANer\n"
        "GFPGANer(model_path='https://github.com/TencentARC/GFPGAN/releases/download/"
        "v1.3.0/GFPGANv1.3.pth')\n"
    )
    result = _run([*SIM, str(script)], assets.env(), tmp_path)
    assert result.code == 1
    assert "urllib.error.URLError" in result.err  # facexlib's own download error, untouched
    destination = tmp_path / "gfpgan" / "weights" / "detection_Resnet50_Final.pth"
    hints = [line for line in result.err_lines if line.startswith("dmlpatch: hint:")]
    assert hints == [
        "dmlpatch: hint: detection_Resnet50_Final.pth could not be downloaded (URLError); "
        "without network, fetch https://github.com/xinntao/facexlib/releases/download/v0.1.0/"
        f"detection_Resnet50_Final.pth elsewhere and put it at {destination}"
    ]


def test_unsupported_version_warns_and_runs_unpatched(assets, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    info = fake / "gfpgan-9.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gfpgan\nVersion: 9.0\n")
    work = assets.workdir(tmp_path / "work")
    script = tmp_path / "old.py"
    script.write_text(
        "import sys, cv2\nfrom gfpgan import GFPGANer\n"
        "r = GFPGANer(model_path='gfpgan/weights/GFPGANv1.3.pth')\n"
        "r.enhance(cv2.imread(sys.argv[1]), has_aligned=True)\nprint(r.device)\n"
    )
    env = assets.env(PYTHONPATH=f"{fake}:{assets.site}")
    face = str(assets.root / "inputs" / "aligned" / "face.png")
    result = _run([*SIM, str(script), face], env, work)
    assert result.code == 0, result.err
    assert result.out.splitlines()[-1] == "cpu"  # GFPGANer unpatched: its own choice
    warnings = [line for line in result.err_lines if line.startswith("dmlpatch: warning")]
    unpatched, on_cpu = warnings
    assert unpatched == (
        "dmlpatch: warning: patch spec 'gfpgan' is for gfpgan <1.4,>=1.3.5, but 9.0 is "
        "installed; gfpgan runs unpatched"
    )
    # So GFPGANer's models ran on the CPU, and the run says so at exit instead of implying
    # DirectML did the work.
    assert "100% of model compute" in on_cpu and "ran on the CPU, not on privateuseone:0" in on_cpu


def test_realesrgan_half_policy() -> None:
    from dmlpatch.patches.realesrgan.fixes import keeps_half

    assert keeps_half("directml", "privateuseone")
    assert not keeps_half("sim", "privateuseone")  # CPU kernels: float16 ~100x slower
    assert not keeps_half("directml", "cpu")
    assert not keeps_half("cpu", "cpu")


def test_zz_distributions_unchanged(before: dict[str, str]) -> None:
    """Runs last in this module: no file of the five distributions changed (sha256)."""
    assert len(before) > 100
    assert _hashes() == before
    assert sys.executable  # the hashes are of this interpreter's environment
