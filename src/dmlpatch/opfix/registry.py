"""The operator fixes dmlpatch has, each declared by its own module, and the order they take.

A fix module (``dmlpatch.opfix.vision.resizing``) declares:

- ``KERNELS``: the operator overloads it serves (:class:`~dmlpatch.opfix._kernel.Kernel`: the
  overload, the gap it fixes, the dispatch key);
- ``YIELDS_TO`` (optional): the fixes whose kernel wins where both serve an operator
  (``precision.half_on_host`` serves what no other fix does: it yields to ``vision.sampling``'s
  ``grid_sampler_2d``). Two fixes serving one operator without saying which yields is an error
  (:func:`conflicts`, checked by a test);
- ``reset`` (optional): a function that returns its module's state to what it was before the
  fix was installed, called when the fixes are uninstalled;
- its cost, where it replaces DirectML's CPU fallback with a composition: ``COSTS`` maps each
  such operator to a function of the call's arguments giving the composition's cost and the
  fallback's (:data:`dmlpatch.costs.choice.CostFunction`), by which its kernel takes the
  cheaper per call; or ``NO_CHOICE``, one sentence saying why no call would be cheaper through
  the fallback (it has no CPU kernel; a kernel or two against a read-back).

The catalogue entries a fix answers are those whose ``fixed_in`` names its module
(:func:`entries`): the link is declared once, on the catalogue's side. Adding a module to
:data:`FIXES` is all it takes to install it (``docs/contributing.md`` walks through a new gap).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

if TYPE_CHECKING:
    from dmlpatch.costs.choice import CostFunction
    from dmlpatch.opfix._kernel import Kernel

#: Every fix module under ``dmlpatch.opfix``, by name. The order here means nothing: precedence
#: between fixes is what they declare (``YIELDS_TO``).
FIXES = frozenset(
    {
        "complex.spectral",
        "layers.attention",
        "layers.embedding",
        "layers.losses",
        "layers.normalization",
        "layers.rnn",
        "layers.weight_norm",
        "linalg.cholesky",
        "linalg.exponential",
        "linalg.householder",
        "linalg.jacobi",
        "linalg.ldl",
        "linalg.least_squares",
        "linalg.lu",
        "linalg.nonsymmetric",
        "linalg.products",
        "optimizers.foreach",
        "optimizers.fused",
        "optimizers.grad_scaling",
        "precision.autocast",
        "precision.float64_draws",
        "precision.half_on_host",
        "tensors.allocation",
        "tensors.common_fallbacks",
        "tensors.dtypes",
        "tensors.elementwise",
        "tensors.factories",
        "tensors.indexing",
        "tensors.masks",
        "tensors.random",
        "tensors.repeat",
        "tensors.scatter",
        "tensors.sparse",
        "tensors.statistics",
        "tensors.transfers",
        "tensors.unique",
        "vision.detection",
        "vision.pooling",
        "vision.resizing",
        "vision.sampling",
        "vision.sliding_blocks",
    }
)


class Fix(NamedTuple):
    """One fix module, as it declares itself."""

    name: str
    kernels: tuple[Kernel, ...]
    yields_to: tuple[str, ...] = ()
    reset: Optional[Callable[[], None]] = None
    #: Operator -> its cost function (``COSTS``).
    costs: Mapping[str, CostFunction] = {}
    #: Why no call is cheaper through the fallback (``NO_CHOICE``), where it has no ``COSTS``.
    no_choice: str = ""

    @property
    def module(self) -> str:
        return f"dmlpatch.opfix.{self.name}"


def load(name: str) -> Fix:
    """The fix module ``name`` (``vision.resizing``), as it declares itself."""
    module = importlib.import_module(f"dmlpatch.opfix.{name}")
    yields_to = tuple(getattr(module, "YIELDS_TO", ()))
    for other in yields_to:
        if other not in FIXES:
            raise ValueError(f"opfix.{name} yields to {other!r}, which is not a fix")
    return Fix(
        name,
        tuple(module.KERNELS),
        yields_to,
        getattr(module, "reset", None),
        dict(getattr(module, "COSTS", {})),
        getattr(module, "NO_CHOICE", ""),
    )


def fixes() -> list[Fix]:
    """Every fix, each after the fixes it yields to (and otherwise by name)."""
    loaded = {name: load(name) for name in sorted(FIXES)}
    ordered: list[Fix] = []
    placed: set[str] = set()
    visiting: set[str] = set()

    def place(name: str) -> None:
        if name in placed:
            return
        if name in visiting:
            raise ValueError(f"opfix.{name}: fixes that yield to each other")
        visiting.add(name)
        for other in loaded[name].yields_to:
            place(other)
        visiting.discard(name)
        placed.add(name)
        ordered.append(loaded[name])

    for name in loaded:
        place(name)
    return ordered


def conflicts(chosen: list[Fix]) -> list[str]:
    """Operators two fixes serve with no declared precedence between them."""
    serving: dict[str, list[str]] = {}
    for fix in chosen:
        for kernel in fix.kernels:
            slot = f"{kernel.qualified} (autocast)" if kernel.casts else kernel.qualified
            serving.setdefault(slot, []).append(fix.name)
    by_name = {fix.name: fix for fix in chosen}
    found = []
    for operator, names in sorted(serving.items()):
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                declared = first in by_name[second].yields_to or second in by_name[first].yields_to
                if not declared:
                    found.append(f"{operator}: {first} and {second}")
    return found


def entries(fix: Fix) -> list[str]:
    """The catalogue entries whose fix is this module."""
    from dmlpatch.gaps import catalogue

    return [failure.key for failure in catalogue.FAILURES if failure.fixed_in == fix.module]
