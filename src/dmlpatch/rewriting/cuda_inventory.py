"""Every public name of ``torch.cuda``, and what rewritten code gets for it on DirectML.

Each name is one of:

- *answered*: rewritten code gets dmlpatch's answer for the DirectML adapter
  (``dmlpatch.runtime.sites``, ``dmlpatch.runtime.cuda_api``), or torch's own, which
  holds there too (``runtime.HARMLESS_CUDA_NAMES``: an exception class, ``amp``, whose autocast
  and GradScaler are sites of their own);
- *error*: a clear error when used on DirectML (``cuda_api.ERRORS``: CUDA graphs);
- *CUDA's meaning*: not answered; the function that uses it keeps CUDA's meaning, as under
  plain python (``dmlpatch.rewriting.transform``).

The public names of a torch are its ``torch.cuda.__all__`` and the submodules of ``torch.cuda``
it imports. ``docs/reference/torch-cuda.md`` is this table for torch 2.4.1 (torch-directml's) and
the newest torch, made by ``scripts/cuda_inventory.py`` from the running torches; a test checks it
against the running torch and this module.
"""

from __future__ import annotations

import types
from typing import Any

from dmlpatch.runtime.cuda_names import ERRORS, NAMES, RNG_FUNCTIONS
from dmlpatch.runtime.sites import CUDA_FUNCTIONS, HARMLESS_CUDA_NAMES

ANSWERED = "answered"
ERROR = "error"
CUDA_MEANING = "CUDA's meaning"

_HELD = "bytes the adapter's allocator holds now (DirectML: what its gpu_memory reports)"
_PEAK = (
    "the most held since the last reset (DirectML: the highest gpu_memory read at each memory "
    "query and optimizer step)"
)
_RESET = "the peak starts again from what is held now"
_STATS = (
    "allocated, reserved and active bytes: held now and the peak, as memory_allocated and "
    "max_memory_allocated"
)
_RNG = "on the device's generator (DirectML draws from the CPU's default generator)"
_LEGACY = "built on (or, with x.type(T), moved to) the device; isinstance checks dtype and device"

#: How each answered or erring name is answered on DirectML.
HOW: dict[str, str] = {
    "is_available": "True when the program runs on a DirectML adapter",
    "device_count": "the number of selected adapters",
    "current_device": "the ordinal set_device chose (0)",
    "set_device": "later 'cuda' and .cuda() mean that ordinal's adapter",
    "get_device_name": "the adapter's name",
    "synchronize": "drains the adapter's queue",
    "empty_cache": "nothing to release",
    "get_device_properties": "the adapter's name and memory, capability 0.0",
    "get_device_capability": "(0, 0): no CUDA-only fast path is taken",
    "is_bf16_supported": "False: bfloat16 kernels abort DirectML",
    "is_tf32_supported": "False: DirectML has no TF32",
    "init": "nothing to start",
    "can_device_access_peer": "False: adapters reach each other through the host",
    "device": "with torch.cuda.device(i): ordinal i is current inside",
    "device_of": "the ordinal of the tensor's adapter is current inside",
    "Stream": "the adapter's one queue",
    "Event": "drains the queue and reads the clock (elapsed_time in ms)",
    "stream": "one queue: nothing changes inside",
    "StreamContext": "one queue: nothing changes inside",
    "set_stream": "one queue: always current",
    "current_stream": "the adapter's one queue",
    "default_stream": "the adapter's one queue",
    "is_current_stream_capturing": "False: nothing captures a graph",
    "make_graphed_callables": "the callables themselves, run eagerly",
    "nvtx": "ranges and marks do nothing",
    "random": _RNG,
    "CUDAGraph": "RuntimeError: CUDA graphs have no DirectML counterpart",
    "graph": "RuntimeError: CUDA graphs have no DirectML counterpart",
    "graph_pool_handle": "RuntimeError: CUDA graphs have no DirectML counterpart",
    "memory_allocated": _HELD,
    "max_memory_allocated": _PEAK,
    "memory_reserved": _HELD + ", the same figure: no cache is counted apart",
    "max_memory_reserved": _PEAK,
    "memory_cached": _HELD + ", the same figure: no cache is counted apart",
    "max_memory_cached": _PEAK,
    "reset_peak_memory_stats": _RESET,
    "reset_max_memory_allocated": _RESET,
    "reset_max_memory_cached": _RESET,
    "reset_accumulated_memory_stats": _RESET,
    "memory_stats": _STATS,
    "memory_stats_as_nested_dict": _STATS,
    "memory_summary": "one line: the bytes held now and the peak",
    "memory_snapshot": "[]: the allocator lists no segments",
    "mem_get_info": "free and total memory where Windows records the size",
    "set_per_process_memory_fraction": "no cap (said once)",
    "get_per_process_memory_fraction": "1.0",
    "ipc_collect": "nothing to collect",
    **dict.fromkeys(RNG_FUNCTIONS, _RNG),
    **dict.fromkeys(
        (
            "FloatTensor",
            "DoubleTensor",
            "HalfTensor",
            "BFloat16Tensor",
            "ByteTensor",
            "CharTensor",
            "ShortTensor",
            "IntTensor",
            "LongTensor",
            "BoolTensor",
        ),
        _LEGACY,
    ),
    "amp": (
        "torch's own; its autocast, GradScaler, `custom_fwd` and `custom_bwd` are sites: on the "
        "device, CUDA's lists"
    ),
    "OutOfMemoryError": "torch's own",
    "CudaError": "torch's own",
    "DeferredCudaCallError": "torch's own",
    "is_initialized": "torch's own (False: nothing needs CUDA's lazy start)",
    "get_arch_list": "torch's own ([]: no CUDA architectures)",
    "get_gencode_flags": "torch's own ('')",
    "has_half": "torch's own",
    "has_magma": "torch's own",
}


def classify(name: str) -> tuple[str, str]:
    """What ``torch.cuda.<name>`` gives rewritten code on DirectML, and how."""
    if name in ERRORS:
        return ERROR, HOW[name]
    if name in CUDA_FUNCTIONS or name in NAMES or name in HARMLESS_CUDA_NAMES:
        return ANSWERED, HOW[name]
    return CUDA_MEANING, "the function that uses it keeps CUDA's meaning"


def public_names(cuda: Any) -> list[str]:
    """``torch.cuda.__all__`` and ``torch.cuda``'s own imported submodules, sorted."""
    names = set(getattr(cuda, "__all__", ()))
    for name, value in vars(cuda).items():
        if (
            isinstance(value, types.ModuleType)
            and not name.startswith("_")
            and value.__name__ == f"{cuda.__name__}.{name}"
        ):
            names.add(name)
    return sorted(names)


def markdown(columns: dict[str, list[str]]) -> str:
    """The inventory as a Markdown table: one row per name public in any of the torch versions
    of ``columns`` (version -> its public names), which it marks."""
    versions = list(columns)
    everything = sorted(set().union(*map(set, columns.values())), key=lambda n: (n.lower(), n))
    lines = [
        "| `torch.cuda.` | "
        + " | ".join(f"torch {v}" for v in versions)
        + " | on DirectML | how |",
        "| --- | " + " | ".join("---" for _ in versions) + " | --- | --- |",
    ]
    counts = {ANSWERED: 0, ERROR: 0, CUDA_MEANING: 0}
    for name in everything:
        mark, how = classify(name)
        counts[mark] += 1
        present = " | ".join("yes" if name in columns[v] else "" for v in versions)
        lines.append(f"| `{name}` | {present} | {mark} | {how} |")
    total = ", ".join(f"{count} {mark}" for mark, count in counts.items())
    return "\n".join([*lines, "", f"{len(everything)} names: {total}.", ""])


def parse(text: str) -> dict[str, dict[str, Any]]:
    """The rows of a table :func:`markdown` made: name -> versions present, mark, how."""
    rows: dict[str, dict[str, Any]] = {}
    versions: list[str] = []
    for line in text.splitlines():
        if line.startswith("| `torch.cuda.` |"):
            versions = [cell.strip()[len("torch ") :] for cell in line.split("|")[2:-3]]
        elif line.startswith("| `") and versions:
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            name = cells[0].strip("`")
            present = {v for v, cell in zip(versions, cells[1:]) if cell == "yes"}
            rows[name] = {"versions": present, "mark": cells[-2], "how": cells[-1]}
    return rows
