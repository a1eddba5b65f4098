"""What a rewritten test of the device costs (``cuda_test``, ``device_value`` and
``device_argument`` sites: every value at a device parameter goes through the runtime's
check), against the same line compiled as written, in one process, interleaved (best of rounds):

- on the CPU (``--device cpu``: every test answers as under plain python; the calls that did not
  need a rewrite);
- on the simulated DirectML device (the tests answer as on CUDA).

    python benchmarks/device_tests.py [--rounds N]
"""

from __future__ import annotations

import argparse
import textwrap
import timeit
from typing import Any, Callable

import torch

from dmlpatch.devices import resolution
from dmlpatch.rewriting.transform import rewrite

SOURCE = textwrap.dedent(
    """
    import torch

    DEVICE = torch.device("cuda")  # a site: the module chose CUDA
    DTYPES = {"cuda": torch.float16, "cpu": torch.bfloat16}

    class Args:
        device = "cpu"

    args = Args()

    def type_test(x):
        return x.device.type == "cuda"

    def is_cuda(x):
        return x.is_cuda

    def table(x):
        return DTYPES[x.device.type]

    def prefix(d):
        return str(d).startswith("cuda")

    def move(x):
        return x.to(args.device)

    def to_dtype(x):
        half = torch.float32
        return x.to(half)

    def to_its_device(x):
        return x.to(x.device)

    def make_on(d):
        return torch.zeros(2, device=d)
    """
)

CASES = {
    "x.device.type == 'cuda'": ("type_test", "x"),
    "x.is_cuda": ("is_cuda", "x"),
    "DTYPES[x.device.type]": ("table", "x"),
    "str(d).startswith('cuda')": ("prefix", "d"),
    "x.to(args.device)": ("move", "x"),
    "x.to(half) (a dtype)": ("to_dtype", "x"),
    "x.to(x.device)": ("to_its_device", "x"),
    "torch.zeros(2, device=d)": ("make_on", "d"),
}


def _namespaces() -> tuple[dict[str, Any], dict[str, Any]]:
    plain: dict[str, Any] = {}
    exec(compile(SOURCE, "plain.py", "exec"), plain)
    rewritten: dict[str, Any] = {}
    exec(compile(rewrite(SOURCE, "rewritten.py").tree, "rewritten.py", "exec"), rewritten)
    return plain, rewritten


def _best(call: Callable[[], Any], rounds: int) -> float:
    number = 20000
    return min(timeit.repeat(call, number=number, repeat=rounds)) / number * 1e9


def measure(spec: str, rounds: int) -> None:
    resolution.configure(spec)
    target = resolution.current()
    plain, rewritten = _namespaces()
    x = torch.ones(4, device=target.device if target.is_accelerator else "cpu")
    d = x.device
    arguments = {"x": x, "d": d}
    print(f"--device {spec} ({target.device}): ns per call, as written / rewritten")
    for name, (function, argument) in CASES.items():
        value = arguments[argument]
        before, after = plain[function], rewritten[function]
        try:
            answer: Any = before(value)
        except KeyError as error:  # DTYPES["privateuseone"]: what the rewrite is for
            answer = f"KeyError {error}"
        if isinstance(answer, str):
            after_ns = min(_best(lambda f=after, v=value: f(v), 3) for _ in range(rounds))
            print(f"  {name:28}{'':>8}{after_ns:8.0f}  as written: {answer}")
            continue
        times = [1e12, 1e12]
        for _ in range(rounds):
            times[0] = min(times[0], _best(lambda f=before, v=value: f(v), 3))
            times[1] = min(times[1], _best(lambda f=after, v=value: f(v), 3))
        shown = "" if isinstance(answer, torch.Tensor) else f"   {answer} / {after(value)}"
        print(
            f"  {name:28}{times[0]:8.0f}{times[1]:8.0f}  {times[1] / times[0]:5.2f}x"
            f"  (+{times[1] - times[0]:.0f} ns){shown}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    measure("cpu", args.rounds)
    measure("sim", args.rounds)


if __name__ == "__main__":
    main()
