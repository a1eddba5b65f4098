"""Which aten operators torch-directml 0.2.5 runs natively, from the op list in ``data/``.

Three facts turn the raw list into the set the simulator uses:

* **Tail merging.** The list holds strings found in DirectML's native library. The linker
  stores a string that ends another one only once (``add.out`` lives inside
  ``scatter_add.out``, ``mul.out`` inside ``addcmul.out``, ``mm.out`` inside ``addmm.out``,
  ``avg_pool2d`` inside ``_adaptive_avg_pool2d``), so a name that is a suffix of a listed name
  may be registered too. The simulator counts those as native (:data:`EXPECTED_MERGED` lists
  the ones known to be registered; tests check they come out native).
* **Structured delegates.** torch-directml registers structured kernels through their
  ``.out`` variant (``csrc/auto_gen_yaml.py`` in its wheel treats ``add.Tensor`` as supported
  when ``add.out`` is); PyTorch then runs ``add.Tensor``/``add_.Tensor`` through it.
* **Bookkeeping.** Allocation, views and copies (:data:`BOOKKEEPING`) are the backend itself.

PyTorch's ``native_functions.yaml`` (shipped in ``torchgen``) gives the delegates. Parsing it
takes tens of milliseconds, so the result is cached next to the built extension.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

OP_LIST = "registered_ops-0.2.5.txt"

#: Registered by torch-directml but merged into longer strings by the linker, so a string
#: search of the binary misses them.
EXPECTED_MERGED = (
    "add.out",
    "mul.out",
    "mm.out",
    "bmm.out",
    "sigmoid.out",
    "tanh.out",
    "_softmax.out",
    "avg_pool2d.out",
    "div.out",
    "sin.out",
    "cos.out",
)

#: Kernels csrc/kernels.cpp implements; they are the device, hence native.
BOOKKEEPING = (
    "empty.memory_format",
    "empty_strided",
    "as_strided",
    "view",
    "_reshape_alias",
    "resize_",
    "set_",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
    "set_.source_Tensor",
    "_copy_from",
    "_copy_from_and_resize",
    "_local_scalar_dense",
    "convolution_overrideable",
    "convolution_backward_overrideable",
)

#: Operators that accept host tensors beside device tensors (CPU index tensors, as on CUDA).
HOST_TENSORS_OK = ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_")

_FUNC = re.compile(r"^- func: ([\w.]+)\(")
_DELEGATE = re.compile(r"^  structured_delegate: ([\w.]+)")
_DISPATCH_LINE = re.compile(r"^    ([\w, ]+):")


@dataclass(frozen=True)
class OpIndex:
    """Operator facts from ``native_functions.yaml``."""

    names: frozenset[str]  #: every overload name, e.g. ``add.Tensor``
    delegates: dict[str, str]  #: structured functional/in-place name -> its ``.out`` name
    implicit: frozenset[str]  #: CompositeImplicitAutograd (never reach a backend)
    #: A CPU kernel and a CompositeExplicitAutograd one (other backends get the composite).
    cpu_and_composite: frozenset[str] = frozenset()


def listed_ops() -> list[str]:
    """Names in the shipped op list (comments and blanks dropped)."""
    text = resources.files("dmlpatch.gaps").joinpath("data").joinpath(OP_LIST).read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def _yaml_path() -> Path | None:
    try:
        import torchgen
    except ImportError:
        return None
    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return path if path.is_file() else None


def parse_native_functions(text: str) -> OpIndex:
    """Read overload names, structured delegates and implicit composites from the yaml text."""
    names: set[str] = set()
    delegates: dict[str, str] = {}
    implicit: set[str] = set()
    cpu_and_composite: set[str] = set()
    current: str | None = None
    keys: set[str] = set()
    has_dispatch = False

    def finish() -> None:
        if current is None:
            return
        if current not in delegates and (not has_dispatch or keys & {"CompositeImplicitAutograd"}):
            implicit.add(current)
        if "CPU" in keys and keys & {
            "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional",
        }:
            cpu_and_composite.add(current)

    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            finish()
            current, keys, has_dispatch = m.group(1), set(), False
            names.add(current)
            continue
        if current is None:
            continue
        if line.startswith("  autogen:"):
            names.update(n.strip() for n in line.split(":", 1)[1].split(","))
        elif (d := _DELEGATE.match(line)) is not None:
            delegates[current] = d.group(1)
        elif line.startswith("  dispatch:"):
            has_dispatch = True
        elif (k := _DISPATCH_LINE.match(line)) is not None:
            keys.update(x.strip() for x in k.group(1).split(","))
    finish()
    return OpIndex(frozenset(names), delegates, frozenset(implicit), frozenset(cpu_and_composite))


def load_index(cache_dir: Path | None) -> OpIndex | None:
    """The parsed yaml of the running torch, cached as JSON in ``cache_dir`` when given (a
    private directory: see dmlpatch.sim.build). A cache that is not this user's, or not what
    this function writes, is parsed again."""
    cache = cache_dir / "opindex.json" if cache_dir is not None else None
    cached = _cached_index(cache) if cache is not None else None
    if cached is not None:
        return cached
    path = _yaml_path()
    if path is None:
        return None
    index = parse_native_functions(path.read_text("utf-8"))
    if cache is not None:
        data = {
            "names": sorted(index.names),
            "delegates": index.delegates,
            "implicit": sorted(index.implicit),
            "cpu_and_composite": sorted(index.cpu_and_composite),
        }
        import contextlib

        from dmlpatch import atomic

        with contextlib.suppress(OSError):  # a read-only cache only costs the parse next time
            atomic.write(cache, json.dumps(data).encode("utf-8"), mode=0o600)
    return index


def _cached_index(cache: Path) -> OpIndex | None:
    from dmlpatch import trust

    text = trust.read(str(cache))
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    lists = [data.get(key) for key in ("names", "implicit", "cpu_and_composite")]
    delegates = data.get("delegates")
    if not all(isinstance(x, list) and all(isinstance(n, str) for n in x) for x in lists):
        return None
    if not isinstance(delegates, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in delegates.items()
    ):
        return None
    names, implicit, cpu_and_composite = (frozenset(x or ()) for x in lists)
    return OpIndex(names, delegates, implicit, cpu_and_composite)


def native_set(listed: list[str], index: OpIndex | None) -> set[str]:
    """Overload names DirectML runs natively (without the ``aten::`` prefix)."""
    native = set(listed) | set(BOOKKEEPING)
    if index is not None:
        # A name is hidden in a listed string when that string ends with it.
        suffixes = {entry[i:] for entry in listed for i in range(len(entry))}
        native.update(index.names & suffixes)
        for name, delegate in index.delegates.items():
            if delegate in native:
                native.add(name)
    else:
        native.update(EXPECTED_MERGED)
    return native


def direct_registrations(
    index: OpIndex | None, rule_ops: set[str], native: set[str]
) -> dict[str, str]:
    """Operators the fallback is registered for directly at PrivateUse1, each with the name
    it reports as (its ``.out`` delegate, as torch-directml's fallback would name it; or "").

    * Structured functional/in-place ops would otherwise reach it through their ``.out``
      variant (an extra allocation and a spurious resize warning).
    * Native operators with both a CPU kernel and a CompositeExplicitAutograd one
      (``native_layer_norm``, ``native_group_norm``): DirectML registers its own kernel, so the
      composite (a different algorithm, different rounding) never runs there; the simulator
      runs the CPU kernel instead.
    * Operators with a refusal rule that have a composite kernel (``repeat``) must reach the
      backend for the rule to apply.
    * The ``_foreach_*`` operators: torch 2.4.1 (torch-directml's) sends them to the backend,
      where DirectML has none and falls back to the CPU (microsoft/DirectML#604); later torch
      composes them of per-tensor operators first, which would hide that gap.
    """
    if index is None:
        return {}
    chosen = dict(index.delegates)
    for name in index.cpu_and_composite & native:
        chosen.setdefault(name, "")
    for name in index.names:
        if "aten::" + name.split(".")[0] in rule_ops and name not in index.implicit:
            chosen.setdefault(name, "")
    for name in index.names:
        if name.startswith("_foreach_") and name not in index.implicit:
            chosen.setdefault(name, "")
    for name in BOOKKEEPING:
        chosen.pop(name, None)
    return chosen
