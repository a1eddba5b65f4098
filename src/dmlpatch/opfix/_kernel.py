"""What a fix module declares, and the helpers its kernels share."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Kernel(NamedTuple):
    """One operator overload a fix serves on ``PrivateUse1``."""

    #: The overload as :mod:`torch.library` names it: ``_unique2``, ``scatter.src``.
    name: str
    function: Callable[..., Any]
    #: ``refused``: DirectML raises for some arguments (installed where the profile has a rule
    #: for the operator); ``fallback``: DirectML has no kernel and copies through the CPU
    #: (installed where the operator is not native).
    gap: str

    @property
    def op(self) -> str:
        """The operator without overload, as refusal rules name it: ``aten::scatter``."""
        return "aten::" + self.name.split(".", 1)[0]

    @property
    def qualified(self) -> str:
        """``aten::scatter.src`` (``aten::_unique2`` for a default overload)."""
        return "aten::" + self.name
