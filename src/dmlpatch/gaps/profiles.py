"""What the simulated device refuses or runs on the CPU: DirectML's gaps as data.

Each profile is a table of rules; nothing else in ``dmlpatch.sim`` decides fidelity. A rule
names the operator, the predicate the C++ fallback evaluates on the call's arguments
(``csrc/fallback.cpp``: ``flag``, ``present``, ``rank_above``, ``same_shape``,
``only_dim_differs``, ``always``), the exact text DirectML raises, and where that text comes from.

Which operators DirectML runs natively comes from the op list shipped in
``data/registered_ops-0.2.5.txt`` (see :mod:`dmlpatch.gaps.registered_ops`); the others run
through the CPU fallback with DirectML's once-per-operator warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dmlpatch.environment_variables import DMLPATCH_SIM_PROFILE
from dmlpatch.errors import DeviceUnavailable

#: The profile of the release DirectML users run today; the simulated device's default.
DEFAULT_PROFILE = "torch-directml-0.2.5"

#: torch-directml releases and the profile that reproduces their gaps, oldest first. A release
#: up to and including a listed one has that one's gaps; a release newer than all of them is
#: assumed to keep the newest one's (no later release is known to close them, and a fix
#: DirectML no longer needs only costs the composition of native kernels).
DIRECTML_RELEASES: tuple[tuple[str, str], ...] = (("0.2.5.dev240914", DEFAULT_PROFILE),)

ERRORS_MD = "the error strings of torch-directml 0.2.5's native library"


@dataclass(frozen=True)
class Rule:
    """One argument combination DirectML refuses with a RuntimeError."""

    op: str  #: aten operator without overload, e.g. ``aten::_unique2`` (all overloads match)
    predicate: str
    args: tuple[str, ...]
    message: str  #: verbatim; ``{n}`` is replaced by the rank for ``rank_above``
    source: str
    limit: int = 0


@dataclass(frozen=True)
class Profile:
    """A DirectML release as the simulator reproduces it."""

    name: str
    description: str
    #: Operators outside the native list run on the CPU with DirectML's warning (else native).
    has_gaps: bool
    rules: tuple[Rule, ...] = ()
    #: ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` work. DirectML lacks them and has no
    #: CPU kernel to fall back to, so nn.LSTM/nn.GRU raise NotImplementedError on it
    #: (microsoft/DirectML#613, #677); the simulator reproduces that unless this is set.
    fused_rnn_cells: bool = False
    #: Inside ``torch.inference_mode()``, a kernel given a device tensor made outside it (a
    #: module's parameters) raises :data:`INFERENCE_MODE_TEXT` (microsoft/DirectML#602, #622).
    refuses_inference_mode: bool = False
    #: Overloads whose ``out=`` resize DirectML's CPU fallback loses: the device tensor keeps its
    #: old (empty) shape. ``torch.eye(3, device=dml)`` is ``tensor([])`` (microsoft/DirectML#431).
    drops_out_resizes: tuple[str, ...] = ()
    #: Kernels that run but give a wrong answer, by name (:data:`QUIRKS`).
    quirks: tuple[str, ...] = ()
    #: Dtypes no device tensor may have (``c10`` names): DirectML stops the process with
    #: :data:`UNSUPPORTED_DTYPE_TEXT`; the simulator raises it (a RuntimeError), so that the
    #: program's traceback and ``dmlpatch check`` can show where it happened.
    unsupported_dtypes: tuple[str, ...] = ()
    sources: tuple[str, ...] = field(default=())


#: DirectML's kernels share an argument's version counter with the tensors they make; an
#: inference tensor may not take one that counts. The reports pin ``F.linear`` and ``F.conv2d``
#: with weights made before ``inference_mode`` (#602: ``nn.Linear(3, 128).to(dml)``, then
#: ``model(torch.zeros(4, 3).to(dml))`` inside it); which other kernels do it is not public,
#: so the simulator refuses every kernel given such a tensor there: a superset, so a program
#: that runs on the simulator does not meet this on DirectML.
INFERENCE_MODE_TEXT = "Cannot set version_counter for inference tensor"

#: The only overloads the reports pin the lost resize to.
EYE_OUT = ("aten::eye.m_out", "aten::eye.out")

#: DirectML's wrong answers, each pinned by a reproduction, under their catalogue keys
#: (``csrc/quirks.cpp`` implements them).
QUIRKS: dict[str, str] = {
    "float-times-bool": "mul/mul_ of a non-bool tensor by a bool device tensor gives a bool "
    "tensor, bool(x) and mask; in place, x itself becomes bool (#686 and #737, 0.2.5)",
    "cross-entropy-none-grad": "nll_loss_backward with reduction='none' gives an all-zero "
    "gradient (#739 and #740, 0.2.5: F.cross_entropy(reduction='none'), then a weighted sum)",
    "uint8-reduction": "sum over a uint8 tensor raises an error whose text is not UTF-8, which "
    "Python reports as UnicodeDecodeError (#619, 0.2.3; open)",
    "device-to-device": "a copy from one adapter to another writes zeros "
    "(t.to(privateuseone:1) from privateuseone:0, #443; open)",
}

#: The fatal log line of torch-directml's dml_util.cc for a dtype it has no DirectML type for
#: (#688: BFloat16; #704: ComplexFloat, from torch.stft; #421: torch.complex on the device).
UNSUPPORTED_DTYPE_TEXT = "Invalid or unsupported data type {dtype}."
#: bfloat16 and the complex dtypes (the 0.2.5 reports name BFloat16 and ComplexFloat).
UNSUPPORTED_DTYPES_0_2_5 = ("BFloat16", "ComplexHalf", "ComplexFloat", "ComplexDouble")

_UNIQUE_COUNTS = Rule(
    "aten::_unique2",
    "flag",
    ("return_counts",),
    "Return counts not implemented for unique operator for DirectML.",
    ERRORS_MD + "; ultralytics' loss calls unique(return_counts=True)",
)
_UNIQUE_INVERSE = Rule(
    "aten::_unique2",
    "flag",
    ("return_inverse",),
    "Return inverse not implemented for unique operator for DirectML.",
    ERRORS_MD,
)
_DIVISOR = "Divisor override isn't supported for DirectML."
_SCATTER_SHAPE = "DirectML scatter doesn't allow for index and source to have different dimensions."
_SCATTER_PARTIAL = (
    "DirectML scatter doesn't allow partially modified dimensions. Please update the dimension "
    "so that the indices and input only differ in the provided dimension."
)

RULES_0_2_5: tuple[Rule, ...] = (
    # Counts is checked before inverse: unique(return_inverse=True, return_counts=True) reports
    # the counts text.
    _UNIQUE_COUNTS,
    _UNIQUE_INVERSE,
    Rule("aten::avg_pool2d", "present", ("divisor_override",), _DIVISOR, ERRORS_MD),
    Rule("aten::avg_pool3d", "present", ("divisor_override",), _DIVISOR, ERRORS_MD),
    # scatter with a src tensor: index and src must have the same shape.
    Rule("aten::scatter", "same_shape", ("index", "src"), _SCATTER_SHAPE, ERRORS_MD),
    Rule("aten::scatter_", "same_shape", ("index", "src"), _SCATTER_SHAPE, ERRORS_MD),
    # index may differ from the input only along `dim`.
    Rule(
        "aten::scatter", "only_dim_differs", ("self", "dim", "index"), _SCATTER_PARTIAL, ERRORS_MD
    ),
    Rule(
        "aten::scatter_", "only_dim_differs", ("self", "dim", "index"), _SCATTER_PARTIAL, ERRORS_MD
    ),
    # The result of repeat has max(self.dim(), len(repeats)) dimensions; "dimesion" is sic.
    Rule(
        "aten::repeat",
        "rank_above",
        ("self", "repeats"),
        "the dimesion of at::Tensor must be 4 or lower, but got {n}",
        ERRORS_MD,
        limit=4,
    ),
)

RULES_1_8: tuple[Rule, ...] = (
    *RULES_0_2_5,
    Rule(
        "aten::normal_",
        "always",
        (),
        "Could not run 'aten::normal_' with arguments from the 'DML' backend.",
        "pytorch-directml 1.8 (the last release before torch-directml) lacks normal_ "
        "(GFPGAN/StyleGAN2 noise injection)",
    ),
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            DEFAULT_PROFILE,
            "torch-directml 0.2.5.dev240914 (torch 2.4.1): its op list, fallback and refusals",
            has_gaps=True,
            rules=RULES_0_2_5,
            refuses_inference_mode=True,
            drops_out_resizes=EYE_OUT,
            quirks=tuple(QUIRKS),
            unsupported_dtypes=UNSUPPORTED_DTYPES_0_2_5,
            sources=("data/registered_ops-0.2.5.txt", ERRORS_MD),
        ),
        Profile(
            "pytorch-directml-1.8",
            "pytorch-directml 1.8 (2022): as 0.2.5, and normal_ is missing",
            has_gaps=True,
            rules=RULES_1_8,
            refuses_inference_mode=True,
            drops_out_resizes=EYE_OUT,
            quirks=tuple(QUIRKS),
            unsupported_dtypes=UNSUPPORTED_DTYPES_0_2_5,
            sources=("data/registered_ops-0.2.5.txt", ERRORS_MD),
        ),
        Profile(
            "permissive",
            "no gaps: every operator runs natively (for isolating bugs)",
            has_gaps=False,
            fused_rnn_cells=True,
        ),
    )
}


def names() -> list[str]:
    """Profile names, default first."""
    return [DEFAULT_PROFILE, *sorted(n for n in PROFILES if n != DEFAULT_PROFILE)]


def resolve(name: str | None = None) -> Profile:
    """The profile named by ``name``, else ``$DMLPATCH_SIM_PROFILE``, else the default."""
    chosen = name or os.environ.get(DMLPATCH_SIM_PROFILE) or DEFAULT_PROFILE
    try:
        return PROFILES[chosen]
    except KeyError:
        raise DeviceUnavailable(
            f"unknown simulated-device profile {chosen!r}; valid profiles: {', '.join(names())}"
        ) from None


def quirks(name: str | None = None) -> frozenset[str]:
    """The wrong answers a profile reproduces (:data:`QUIRKS` names); :mod:`dmlpatch.opfix`
    installs the fixes for exactly these."""
    return frozenset(resolve(name).quirks)


def refused_ops(name: str | None = None) -> frozenset[str]:
    """Operators (``aten::name``, all overloads) that a profile refuses some arguments of.

    :mod:`dmlpatch.opfix` asks this to install only the fixes a profile needs.
    """
    return frozenset(rule.op for rule in resolve(name).rules)


def profile_for_release(version: str | None) -> str | None:
    """The simulator profile describing a torch-directml release (None if not installed)."""
    if version is None:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        wanted = Version(version)
    except InvalidVersion:
        return DIRECTML_RELEASES[-1][1]
    for release, profile in DIRECTML_RELEASES:
        if wanted <= Version(release):
            return profile
    return DIRECTML_RELEASES[-1][1]
