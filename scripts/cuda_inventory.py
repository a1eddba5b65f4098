"""Make docs/reference/torch-cuda.md: every public torch.cuda name, what dmlpatch gives it on
DirectML.

Run under each torch (names come from the running torch), then once more to write the table:

    PYTHONPATH=src OTHER_VENV/bin/python scripts/cuda_inventory.py names > 2.4.1.json
    .venv/bin/python scripts/cuda_inventory.py names > 2.15.0.json   # or any torch
    .venv/bin/python scripts/cuda_inventory.py markdown 2.4.1.json 2.15.0.json \
        > docs/reference/torch-cuda.md

tests/unit/test_cuda_inventory.py checks the table against the running torch and dmlpatch.
"""

from __future__ import annotations

import json
import sys

HEADER = """# `torch.cuda` on DirectML, name by name

Every public name of `torch.cuda` (its `__all__` and the submodules it imports) in torch 2.4.1,
the torch torch-directml 0.2.5 pins, and in newer torches, and what code dmlpatch rewrites gets
for it on a DirectML adapter:

- **answered**: dmlpatch answers for the adapter, or torch's own answer holds there too;
- **error**: a clear `RuntimeError` when used (CUDA graphs: nothing on DirectML replays one);
- **CUDA's meaning**: not answered; a function that uses it keeps CUDA's meaning (its device
  choices stay as under plain python, and when it asks `torch.cuda.is_available()` one line says
  so); the rest of its module is rewritten.

Where the program runs on a CUDA GPU or on the CPU, every name is torch's own. Also working as
written on DirectML (not `torch.cuda` names, nothing to answer): the `torch.backends.cuda` flags
(`matmul.allow_tf32`, `enable_flash_sdp`...) and the `torch.backends.cuda.sdp_kernel` /
`torch.nn.attention.sdpa_kernel` contexts (DirectML runs attention's math path whatever they
enable).

The memory figures: `memory_allocated` is what the adapter's allocator holds now (and so are
`memory_reserved` and `memory_cached`: no cache is counted apart); `max_memory_allocated` is the
most it held since `reset_peak_memory_stats` (or since the program started). On the simulated
device both are the allocator's own, counted at every allocation and free: the live storages'
bytes, exact, and the true peak whenever it happened. On DirectML, torch-directml reports only
what its allocator holds (`gpu_memory`) and keeps no peak, so the peak is the highest of that
figure read at the moments dmlpatch passes: each of the program's memory queries, and the end of
each optimizer step (one reading a step, none per operator). Memory held only between two such
moments, such as a forward pass's activations freed during the backward pass, is not seen: there
the peak is a lower bound of the true one.

Made by `scripts/cuda_inventory.py` from the running torches; `tests/unit/test_cuda_inventory.py`
checks it against the running torch.

"""


def main(argv: list[str]) -> int:
    if argv[:1] == ["names"]:
        import torch

        from dmlpatch.rewriting.cuda_inventory import public_names

        version = torch.__version__.split("+")[0]
        print(json.dumps({"torch": version, "names": public_names(torch.cuda)}))
        return 0
    if argv[:1] == ["markdown"] and len(argv) > 1:
        from dmlpatch.rewriting.cuda_inventory import markdown

        columns = {}
        for path in argv[1:]:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            columns[data["torch"]] = data["names"]
        sys.stdout.write(HEADER + markdown(columns))
        return 0
    sys.stderr.write("usage: cuda_inventory.py names | markdown FILE.json...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
