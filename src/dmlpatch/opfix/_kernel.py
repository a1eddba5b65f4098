"""What a fix module declares, and the helpers its kernels share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

if TYPE_CHECKING:
    import torch

#: An operator's ``out=`` kernel: its arguments, then ``out``; returns ``out``.
OutKernel = Callable[..., "torch.Tensor"]


class Kernel(NamedTuple):
    """One operator overload a fix serves on ``PrivateUse1``."""

    #: The overload as :mod:`torch.library` names it: ``_unique2``, ``scatter.src``.
    name: str
    function: Callable[..., Any]
    #: ``refused``: DirectML raises for some arguments (installed where the profile has a rule
    #: for the operator); ``fallback``: DirectML has no kernel and copies through the CPU
    #: (installed where the operator is not native); ``missing``: DirectML has no kernel and
    #: its CPU fallback finds none either (installed where the operator is not native);
    #: ``quirk``: DirectML's kernel answers wrongly for some arguments (installed where the
    #: profile has :attr:`quirk`); ``dtype``: a dtype DirectML cannot hold would come to exist
    #: (installed where the device lacks one, :mod:`dmlpatch.opfix.dtype_policy`);
    #: ``autocast``: DirectML's operators ignore the autocast key (installed where the profile
    #: has DirectML's gaps).
    gap: str
    #: The dispatch key it is registered for: ``AutogradPrivateUse1`` for a composition that
    #: autograd differentiates (an operator whose backward DirectML lacks too).
    key: str = "PrivateUse1"
    #: The wrong answer it fixes (a ``dmlpatch.gaps.profiles.QUIRKS`` name): installed where the
    #: profile has it, whatever :attr:`gap` says.
    quirk: str = ""
    #: A dtype (``bool``, ``uint8``): the fix waits until a tensor of it is first on the
    #: device (:mod:`dmlpatch.opfix.triggers`); until then the operator is DirectML's own.
    trigger: str = ""
    #: The operator library: ``aten``, or a library's own (``torchvision``), whose kernels are
    #: registered only where that library is installed.
    namespace: str = "aten"
    #: A structured functional form's ``out=`` overload (``reflection_pad1d.out``), which
    #: torch runs it through where the backend has no kernel for it: where DirectML runs that
    #: natively, so it does this one, and a ``fallback`` kernel is not installed.
    delegate: str = ""

    @property
    def op(self) -> str:
        """The operator without overload, as refusal rules name it: ``aten::scatter``."""
        return f"{self.namespace}::" + self.name.split(".", 1)[0]

    @property
    def casts(self) -> bool:
        """An autocast kernel: it casts and passes the call on, so it shares its operator with
        the kernel that computes it (and with ``DMLPATCH_CPU_OPS``)."""
        return self.key.startswith("Autocast")

    @property
    def qualified(self) -> str:
        """``aten::scatter.src`` (``aten::_unique2`` for a default overload)."""
        return f"{self.namespace}::" + self.name


def into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Write ``result`` into an ``out=`` tensor the way structured kernels do."""
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)
    return out


def functional(out_kernel: OutKernel, like: int = 0) -> Callable[..., torch.Tensor]:
    """The functional form of an ``out=`` kernel: the result is shaped like argument ``like``."""

    def functional_form(*args: Any, **kwargs: Any) -> torch.Tensor:
        template = args[like]
        return out_kernel(*args, **kwargs, out=template.new_empty(0))

    return functional_form


def in_place(out_kernel: OutKernel) -> Callable[..., torch.Tensor]:
    """The in-place form of an ``out=`` kernel: ``self`` is ``out``."""

    def in_place_form(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return out_kernel(self, *args, **kwargs, out=self)

    return in_place_form
