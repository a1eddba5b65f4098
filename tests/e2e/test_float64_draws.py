"""A seeded float64 draw on an adapter without float64 gives the CPU's numbers (rounded to
float32, as every float64 tensor on such an adapter is held). Before, the factories filled a
float32 tensor from the float32 stream: other numbers than the CPU's (2.8 apart here), and a
solve on them 0.2 apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import clean_env, run_python

PROGRAM = """
import json, torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
eye = torch.eye(6, dtype=torch.float64, device=device)
a = torch.randn(6, 6, dtype=torch.float64, device=device) + 6 * eye
b = torch.rand(6, 2, dtype=torch.float64, device=device)
c = torch.normal(2.0, 3.0, (4,), dtype=torch.float64, device=device)
g = torch.Generator().manual_seed(1)
d = torch.randn(5, dtype=torch.float64, device=device, generator=g)
torch.set_default_dtype(torch.float64)
e = torch.randn(3, device=device)
torch.set_default_dtype(torch.float32)
f = torch.randn(3, device=device)  # float32: DirectML's own draw, as before
x = torch.linalg.solve(a, b)
found = dict(a=a, b=b, c=c, d=d, e=e, f=f, x=x)
print(json.dumps({
    "values": {k: v.double().cpu().flatten().tolist() for k, v in found.items()},
    "device": str(a.device),
    "dtype": str(a.dtype),
}))
"""


def test_seeded_float64_draws_are_the_cpus_numbers(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM)
    plain = run_python(["program.py"], cwd=tmp_path)
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", "program.py"],
        cwd=tmp_path,
        env=clean_env(DMLPATCH_SIM_FLOAT64="0"),
    )
    assert plain.code == 0 and patched.code == 0, patched.err
    expected, found = json.loads(plain.out), json.loads(patched.out)
    assert found["device"] == "privateuseone:0" and found["dtype"] == "torch.float32"
    assert "float64 runs as float32 on privateuseone:0" in patched.err
    for name, values in expected["values"].items():
        # float32's rounding of the CPU's float64 values (the solve: of float32 data).
        assert found["values"][name] == pytest.approx(values, rel=1e-6, abs=1e-6), name
