"""The second simulated adapter (``DMLPATCH_SIM_DEVICES=2``) behaves as the first.

Every model trains on ``privateuseone:1`` as on the CPU, copies there are counted like on
adapter 0 (host<->device) and between the adapters as device->device (where DirectML writes
zeros), DirectML's refusals are the same, and save/load keeps the index.
"""

from __future__ import annotations

from tests.e2e.sim.helpers import REPO_PATH, run_json

_ON_ADAPTER_1 = """
import io, json, torch, dmlpatch.sim as sim
from tests.e2e.sim.models import max_relative_error, train
sim.load()
one = sim.device(1)
out = {"count": sim.device_count(), "names": [sim.device_name(i) for i in range(2)]}
for model, optimizer, foreach in (
    ("cnn", "sgd", False), ("encoder", "adamw", False), ("unet", "adam", True)
):
    ref = train(model, torch.device("cpu"), optimizer, foreach)
    got = train(model, one, optimizer, foreach)
    out[model] = max_relative_error(got, ref)

sim.reset_counters()
a = torch.arange(256, dtype=torch.float32).to(one)           # h2d, 1 KiB
b = a.to(sim.device(0))                                       # d2d, 1 KiB
c = b.to(one).cpu()                                           # d2d, then d2h
counts = sim.counters()["transfers"]
out["transfers"] = {k: [counts[k]["count"], counts[k]["bytes"]] for k in ("h2d", "d2h", "d2d")}
# DirectML copies between adapters as zeros (microsoft/DirectML#443;
# dmlpatch.opfix.tensors.transfers)
out["round_trip_zeros"] = bool(torch.equal(c, torch.zeros(256)))

try:
    torch.tensor([1, 1, 2], device=one).unique(return_counts=True)
    out["unique"] = "ran"
except RuntimeError as error:
    out["unique"] = str(error)

buffer = io.BytesIO()
torch.save({"w": torch.ones(3, device=one)}, buffer)
buffer.seek(0)
loaded = torch.load(buffer)["w"]
out["loaded"] = [str(loaded.device), loaded.cpu().tolist()]
print(json.dumps(out))
"""


def test_everything_holds_on_adapter_1() -> None:
    out = run_json(_ON_ADAPTER_1, DMLPATCH_SIM_DEVICES="2", PYTHONPATH=REPO_PATH)
    assert out["count"] == 2
    assert out["names"][0] != out["names"][1]
    assert out["cnn"] <= 1e-6 and out["encoder"] <= 1e-6 and out["unet"] <= 1e-6, out
    assert out["transfers"] == {"h2d": [1, 1024], "d2h": [1, 1024], "d2d": [2, 2048]}
    assert out["round_trip_zeros"]
    assert out["unique"] == "Return counts not implemented for unique operator for DirectML."
    assert out["loaded"] == ["privateuseone:1", [1.0, 1.0, 1.0]]
