"""The run report's shape: one TypedDict per section and nested object of the JSON that
:func:`dmlpatch.report.snapshot` assembles, so that mypy checks the code that builds it
(the report, :mod:`dmlpatch.placement.summary`, :mod:`dmlpatch.placement.by_test`,
:mod:`dmlpatch.changes`) against the code that reads it back (the exit warning,
``dmlpatch check``, the placement page), and a test checks the field table of
``docs/reference/report.md`` against it.

A key that is data (an operator, a spec's name) rather than a fixed word is an ``Annotated``
string naming it as the page does (``<operator>``); a field present only sometimes is declared
in a ``total=False`` subclass. Modules that start-up loads import this one only under
``TYPE_CHECKING``: it imports ``typing``, which start-up must not.
"""

from __future__ import annotations

from typing import Annotated, Optional, TypedDict

#: Keys that are data, each named as the page's table names it (``patches.<spec>``).
SpecName = Annotated[str, "<spec>"]
OperatorName = Annotated[str, "<operator>"]
How = Annotated[str, "<how>"]
Direction = Annotated[str, "<direction>"]
DtypeName = Annotated[str, "<dtype>"]


class _Rewritten(TypedDict):
    module: str
    sites: int
    cached: bool
    by: str  # main script | spec | discovered


class Rewritten(_Rewritten, total=False):
    """``rewritten[]``: a module whose CUDA sites were rewritten."""

    spec: str  # only where ``by`` is ``spec``


class Kept(TypedDict):
    """``kept_as_written[]``: a module (or function) discovery left with CUDA's meaning."""

    module: str
    reason: str


class SpecModule(TypedDict):
    """``patches.<spec>.modules[]``."""

    module: str
    sites: int
    cached: bool


class Alias(TypedDict):
    """``patches.<spec>.aliases[]``."""

    alias: str
    module: str


class Skipped(TypedDict):
    """``patches.<spec>.skipped[]``: None as the module where the whole spec was left out."""

    module: Optional[str]
    reason: str


class _Patch(TypedDict):
    modules: list[SpecModule]
    functions: list[str]  # module:qualname
    skipped: list[Skipped]


class Patch(_Patch, total=False):
    """``patches.<spec>``: what one patch spec did."""

    aliases: list[Alias]  # only where the spec provided one


class Installed(TypedDict):
    """``installed[]``: one change dmlpatch made to the process (:mod:`dmlpatch.changes`)."""

    kind: str
    what: str
    undoable: bool
    why_not: str


class Work(TypedDict):
    """Heavy calls and their estimated FLOPs (or elements, for other operators' fallbacks)."""

    calls: int
    flops: int


class CpuLine(TypedDict):
    """``compute.cpu_lines[]``: one of the heaviest lines that computed on the CPU."""

    at: Optional[str]  # file:line; None under autograd's backward
    display: str
    function: Optional[str]
    calls: int
    flops: int
    families: list[str]
    fallbacks: list[str]


class CpuFallback(TypedDict):
    """``compute.cpu_fallbacks[]``: one operator DirectML's CPU fallback ran."""

    operator: str
    calls: int
    flops: int
    copies: int
    bytes: int
    estimated_by: Optional[str]  # flops | elements; None where check's counter never saw it
    at: Optional[str]
    seconds: float


class LikelyCause(TypedDict):
    """``compute.likely_cause``."""

    kind: str  # explicit-cpu | not-rewritten | chosen-at-run-time | fallback | cpu-ops
    at: Optional[str]
    text: str


class WarnedTest(TypedDict):
    """``compute.tests.warned[]``: a test that asked for CUDA and ran mostly on the CPU."""

    test: str
    cpu_share: float
    on_cpu: Work
    on_device: Work
    first_at: Optional[str]


class Tests(TypedDict):
    """``compute.tests``: a suite's tests by where they ran (:mod:`dmlpatch.placement.by_test`)."""

    on_device: int
    on_cpu_as_parametrized: int
    asked_for_cuda_but_on_cpu: int
    on_cpu_never_asking_for_cuda: int
    no_layer_and_no_device_argument: int
    warned: list[WarnedTest]


class LineWork(Work):
    """``compute.lines[].device`` and ``.cpu``: a line's compute in one place."""

    families: list[str]


class LineFallback(TypedDict):
    """``compute.lines[].fallbacks[]``."""

    operator: str
    calls: int
    flops: int
    copies: Optional[int]  # None where the backend counts copies per operator alone (check)
    bytes: int
    seconds: float


class Line(TypedDict):
    """``compute.lines[]``: one source line's compute, by where it ran (the placement page)."""

    file: str
    line: int
    function: str
    device: LineWork
    fixed: dict[OperatorName, int]
    cpu: LineWork
    fallbacks: list[LineFallback]


class _Compute(TypedDict):
    counted: str  # layers | operators
    device: str
    on_device: Work
    on_cpu: Work
    data_loading_on_cpu: Work
    model_setup_on_cpu: Work
    elsewhere: Work
    device_share: Optional[float]
    cpu_lines: list[CpuLine]
    cpu_fallbacks: list[CpuFallback]
    other_fallback_work: Work
    likely_cause: Optional[LikelyCause]


class Compute(_Compute, total=False):
    """``compute``: where model compute really ran (:func:`dmlpatch.placement.summary.compute`)."""

    tests: Tests  # only when a test suite's tests were counted
    lines: list[Line]  # only when the run keeps lines for a page


class Copies(TypedDict):
    """Host<->device copies and the bytes they moved."""

    count: int
    bytes: int


class FallbackCopies(Copies):
    """``transfers.fallback``: the copies of DirectML's CPU fallbacks, in all and per operator."""

    by_operator: dict[OperatorName, Copies]


class Transfers(TypedDict):
    """``transfers``: the simulated device's host<->device copies."""

    program: dict[Direction, Copies]
    fallback: FallbackCopies
    syncs: int


class ByCause(TypedDict):
    """Modelled seconds by cause (:class:`dmlpatch.costs.pricing.Split`)."""

    launch: float
    readback: float
    copy: float
    compute: float
    host: float


class OperatorTime(ByCause):
    """``modelled.by_operator[]``: one operator's modelled seconds, in all and by cause."""

    operator: str
    seconds: float


class Modelled(TypedDict):
    """``modelled``: the simulated device's work priced on the adapter it models
    (:func:`dmlpatch.costs.simulated.section`)."""

    profile: str
    how: str
    steps: int
    seconds: float
    wall_seconds: float
    by_cause: ByCause
    by_operator: list[OperatorTime]
    launches: int
    readbacks: int
    copied_bytes: int
    flops: int


class Report(TypedDict):
    """The run report, as ``--report`` writes it."""

    device: Optional[str]
    backend: Optional[str]
    adapter: Optional[str]
    why: str
    scope: str
    patches: dict[SpecName, Patch]
    rewritten: list[Rewritten]
    kept_as_written: list[Kept]
    compute: Optional[Compute]
    installed: list[Installed]
    ops: Optional[dict[How, dict[OperatorName, int]]]  # calls by how DirectML served them
    transfers: Optional[Transfers]
    modelled: Optional[Modelled]
    autocast: Optional[dict[DtypeName, int]]  # calls autocast ran on DirectML, by dtype
