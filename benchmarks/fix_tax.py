"""What dmlpatch's operator fixes cost, per training step, measured side by side in one run.

    python benchmarks/fix_tax.py [--rounds N] [--breakdown]

Each workload runs in a process of its own on the simulated device, in each configuration,
the configurations interleaved round by round so that all see the same machine; each process
measures its own CPU time on one thread (the best of five runs) and the figure is the median of
the rounds.

**The fixes of DirectML's wrong answers, on the calls it gets right**: default profile with
dmlpatch's fixes against the permissive profile (no gaps, no fixes). Targets: within 1.10x and
1.03x.

- ``loop``: a launch-bound elementwise loop on small tensors (mul, mul_, add, sum, mean: what
  a GPU mostly sees in LLM decoding, small models and on iGPUs);
- ``loop + to(float16)``: the same with a dtype conversion, which passes the kernel that keeps
  bfloat16, complex and float64 off DirectML;
- ``transformer``: a small transformer encoder's training step with a padding mask (a bool
  tensor: the product fix is installed), SGD without foreach.

**Where the transformer step's tax goes** (``--breakdown``): in one process, the step with
every fix, without one fix at a time and with none, the configurations installed and removed in
a shuffled order each round; with each fix's calls per step (counted in a separate pass). A
Python kernel costs far more per call inside a real step than in ``ops.py``'s loop of one call
(timed inside this step, a few lines of Python that take 1 us in a loop take 3-11 us), which is
why this is measured on the step. One more configuration gives the floor of any fix written in
Python: the allocation kernel replaced by one that does nothing but allocate.

The tax is also set against the step's modelled DirectML time on each shipped adapter profile
(:mod:`dmlpatch.costs`): host time the Python kernels add is time a launch-bound step waits on
a real GPU too.

**The fixes of DirectML's gaps**, per training step of a model that needs them: dmlpatch's
on-device kernels ("fixed") against DirectML's CPU fallback (the same operators forced to the
CPU with ``DMLPATCH_CPU_OPS``, two copies per call) and against a native kernel (the permissive
profile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: The transformer step of both programs: a padding mask (a bool tensor: the product fix is
#: installed), SGD without foreach.
TRANSFORMER = r"""
def transformer():
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(8, 32, 64).to(dev)
    lengths = torch.tensor([32, 30, 28, 25, 32, 20, 31, 16])
    padding = (torch.arange(32)[None, :] >= lengths[:, None]).to(dev)
    def step():
        loss = model(x, src_key_padding_mask=padding).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step, 5

"""

PROGRAM = r"""
import json, sys, time, torch
import torch.nn.functional as F
import dmlpatch.sim as sim
from dmlpatch import opfix

profile, workload = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)  # CPU time below is this one thread's work, whatever the machine's load
sim.load(profile)
opfix.install("sim", profile)
dev = sim.device(0)
torch.manual_seed(0)


def loop(convert=False):
    x, y = torch.randn(256, device=dev), torch.randn(256, device=dev)
    def step():
        z = x * y
        z.mul_(0.5)
        z = z + x
        s = z.sum(0)
        m = z.mean()
        return (s, m, z.to(torch.float16)) if convert else (s, m)
    return step, 200


def trainer(model, make_input, optimizer=None):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
    x = make_input()
    def step():
        loss = model(x).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step, 5


def adamw():
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(6)]).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return trainer(model, lambda: torch.randn(16, 128).to(dev), optimizer)


def lstm():
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(32, 64, batch_first=True)
        def forward(self, x):
            return self.rnn(x)[0]
    return trainer(Tagger().to(dev), lambda: torch.randn(8, 20, 32).to(dev))


def group_norm():
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.GroupNorm(8, 32),
                                torch.nn.SiLU(), torch.nn.Conv2d(32, 8, 3, padding=1)).to(dev)
    return trainer(model, lambda: torch.randn(4, 8, 32, 32).to(dev))


def grid_sample():
    class Warp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offsets = torch.nn.Conv2d(16, 2, 3, padding=1)
        def forward(self, x):
            grid = torch.tanh(self.offsets(x)).permute(0, 2, 3, 1)
            return F.grid_sample(x, grid, align_corners=False)
    return trainer(Warp().to(dev), lambda: torch.randn(4, 16, 24, 24).to(dev))


def linalg():
    class Solve(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.matrix = torch.nn.Parameter(torch.randn(4, 4) + 4 * torch.eye(4))
        def forward(self, x):
            return torch.linalg.solve(self.matrix.expand(x.shape[0], 4, 4), x)
    return trainer(Solve().to(dev), lambda: torch.randn(64, 4, 1).to(dev))


"""
PROGRAM += TRANSFORMER
PROGRAM += r"""
workloads = {"loop": loop, "loop + to(float16)": lambda: loop(True), "transformer": transformer,
             "adamw": adamw, "lstm": lstm, "group_norm": group_norm,
             "grid_sample": grid_sample, "linalg": linalg}
step, repeat = workloads[workload]()
for _ in range(3):
    step()
best = float("inf")
for _ in range(5):
    start = time.process_time()
    for _ in range(repeat):
        step()
    best = min(best, (time.process_time() - start) / repeat)
from dmlpatch.costs import simulated
sim.reset_counters()
step()
modelled = {p.name: simulated.priced(p).total * 1e6 for p in simulated.models()}
print(json.dumps({"cpu_us": best * 1e6, "modelled_us": modelled}))
"""

DEFAULT, PERMISSIVE = "torch-directml-0.2.5", "permissive"

BREAKDOWN = r"""
import collections, json, random, statistics, sys, time, warnings
import torch
import dmlpatch.sim as sim
from dmlpatch import opfix

warnings.filterwarnings("ignore")  # without fixes, isneginf falls back with a warning
rounds = int(sys.argv[1])
torch.set_num_threads(1)
sim.load("torch-directml-0.2.5")
dev = sim.device(0)
torch.manual_seed(0)
"""
BREAKDOWN += TRANSFORMER
BREAKDOWN += r"""
step, _ = transformer()

every = opfix.kernels
counts = collections.Counter()

def counted(kernel):
    def call(*args, **kwargs):
        counts[kernel.name] += 1
        return kernel.function(*args, **kwargs)
    return kernel._replace(function=call)

_empty_strided = torch.empty_strided

def only_allocates(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                   memory_format=None):
    # The least a Python kernel in front of the allocation can do: the native allocation.
    strides, step = [], 1
    for extent in reversed(size):
        strides.append(step)
        step *= max(extent, 1)
    return _empty_strided(size, strides[::-1], dtype=dtype, device=device)

def floor(kernel):
    if kernel.name == "empty.memory_format":
        return kernel._replace(function=only_allocates)
    return kernel

def install(drop=frozenset(), count=False):
    if drop == "floor":
        opfix.kernels = lambda: [floor(k) for k in every()]
    else:
        opfix.kernels = lambda: [counted(k) if count else k for k in every() if k.name not in drop]
    opfix.install("sim", "torch-directml-0.2.5")
    torch.zeros(1, dtype=torch.bool).to(dev)  # a bool copy, as the step's mask: the trigger

def measure():
    for _ in range(2):
        step()
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(5):
            step()
        best = min(best, (time.process_time() - start) / 5)
    return best * 1e6

install(count=True)
step()
counts.clear()
step()
per_step = dict(counts)
opfix.uninstall()
families = {}
for name in per_step:
    families.setdefault(name.split(".")[0].rstrip("_"), set()).add(name)
configurations = {"every fix": frozenset()}
configurations.update({f"without {f}": frozenset(n) for f, n in families.items()})
configurations["allocation kernel that only allocates"] = "floor"
times = {name: [] for name in [*configurations, "no fixes"]}
random.seed(0)
for _ in range(rounds):
    order = [*configurations.items(), ("no fixes", None)]
    random.shuffle(order)
    for name, drop in order:
        if drop is not None:
            install(drop)
        times[name].append(measure())
        opfix.uninstall()
print(json.dumps({"per_step": per_step, "families": {f: sorted(n) for f, n in families.items()},
                  "times": {k: statistics.median(v) for k, v in times.items()}}))
"""

#: Workloads of the gaps' fixes, with the operators their fallback path forces to the CPU
#: (empty: there is no fallback path, DirectML fails).
GAP_WORKLOADS = {
    "adamw": "aten::_foreach_add_,aten::_foreach_lerp_,aten::_foreach_mul_,"
    "aten::_foreach_addcmul_,aten::_foreach_sqrt,aten::_foreach_div_,aten::_foreach_addcdiv_",
    "lstm": "",  # the fused cells have no CPU kernel: DirectML's fallback fails
    "group_norm": "aten::native_group_norm_backward",
    "grid_sample": "aten::grid_sampler_2d,aten::grid_sampler_2d_backward",
    "linalg": "aten::_linalg_solve_ex,aten::linalg_lu_solve",
}


#: The modelled DirectML step (microseconds per profile) of the last measured configuration.
_modelled: dict[tuple[str, str, str], dict[str, float]] = {}


def _measure(profile: str, workload: str, cpu_ops: str = "") -> float:
    env = {k: v for k, v in os.environ.items() if k != "DMLPATCH_CPU_OPS"}
    if cpu_ops:
        env["DMLPATCH_CPU_OPS"] = cpu_ops
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, profile, workload],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    _modelled[profile, workload, cpu_ops] = found["modelled_us"]
    return float(found["cpu_us"])


def _median_of(rounds: int, configurations: dict[str, tuple[str, str, str]]) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in configurations}
    for _ in range(rounds):
        for name, arguments in configurations.items():
            times[name].append(_measure(*arguments))
    return {name: statistics.median(values) for name, values in times.items()}


def breakdown(rounds: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BREAKDOWN, str(rounds)], capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    times, per_step = found["times"], found["per_step"]
    every, none = times["every fix"], times["no fixes"]
    print("the transformer step's tax, fix by fix (us per step, CPU time, one process)")
    print(f"every fix {every:.0f}, no fixes {none:.0f}: {every / none:.2f}x")
    print(f"{'fix':24} {'calls/step':>10} {'saved':>8} {'us/call':>8}")
    for family, names in found["families"].items():
        calls = sum(per_step[name] for name in names)
        saved = every - times[f"without {family}"]
        print(f"{family:24} {calls:10d} {saved:8.0f} {saved / calls:8.1f}")
    # The floor of any Python kernel here: the allocation kernel reduced to the allocation.
    calls = per_step["empty.memory_format"]
    bare = times["allocation kernel that only allocates"] - times["without empty"]
    print(
        f"a Python allocation kernel that only allocates: {bare / calls:.1f} us per call, "
        f"{calls} calls = {bare / none:.1%} of the step without fixes"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--breakdown", action="store_true", help="only the transformer step's tax, fix by fix"
    )
    options = parser.parse_args()
    rounds = options.rounds
    if options.breakdown:
        breakdown(max(rounds, 15))
        return
    print("wrong answers' fixes, on the calls DirectML gets right (us per step, CPU time)")
    print(f"{'workload':24} {'fixed':>10} {'native':>10} {'ratio':>7}")
    for workload in ("loop", "loop + to(float16)", "transformer"):
        found = _median_of(
            rounds, {"fixed": (DEFAULT, workload, ""), "native": (PERMISSIVE, workload, "")}
        )
        fixed, native = found["fixed"], found["native"]
        print(f"{workload:24} {fixed:10.1f} {native:10.1f} {fixed / native:6.2f}x")
        # The tax is host time the Python kernels add to every step; on DirectML it adds to the
        # modelled step (the model is serial), whose figure it is set against here.
        modelled = _modelled[DEFAULT, workload, ""]
        print(
            f"{'':24} the tax, {fixed - native:.0f} us of host time per step, against the "
            "modelled DirectML step: "
            + ", ".join(
                f"{name} {us:.0f} us (+{(fixed - native) / us:.0%})"
                for name, us in modelled.items()
            )
        )
    print("\ngaps' fixes, per training step (us, CPU time): fixed on the device, DirectML's")
    print("CPU fallback (two copies per call), a native kernel (permissive profile)")
    print(f"{'workload':24} {'fixed':>10} {'fallback':>10} {'native':>10} {'vs fallback':>12}")
    for workload, forced in GAP_WORKLOADS.items():
        configurations = {"fixed": (DEFAULT, workload, ""), "native": (PERMISSIVE, workload, "")}
        if forced:
            configurations["fallback"] = (DEFAULT, workload, forced)
        found = _median_of(rounds, configurations)
        fixed, native = found["fixed"], found["native"]
        fallback = f"{found['fallback']:10.1f}" if forced else f"{'fails':>10}"
        versus = f"{fixed / found['fallback']:11.2f}x" if forced else f"{'-':>12}"
        print(
            f"{workload:24} {fixed:10.1f} {fallback} {native:10.1f} {versus}"
            f"   ({fixed / native:.2f}x native)"
        )


if __name__ == "__main__":
    main()
