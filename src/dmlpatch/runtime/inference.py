"""``torch.inference_mode`` in rewritten code: grad mode off, on DirectML without inference tensors.

Inside ``torch.inference_mode()`` DirectML's kernels fail as soon as they are given a tensor
made outside it, a module's parameters for one: ``RuntimeError: Cannot set version_counter for
inference tensor`` (microsoft/DirectML#602, #450, #622; torch-directml 0.2.2 to 0.2.5). The
workaround its users share is ``torch.no_grad()``, which is what inference mode is apart from
inference tensors: gradients off, same results. So in a process where DirectML tensors can
exist (torch-directml imported, or the simulated device loaded, whoever chose it: dmlpatch's
device, or a library's own ``device=dml``), the ``inference_mode`` a rewritten module uses
switches gradients off (``inference_mode(False)``: on) for its extent and makes no inference
tensors; anywhere else it *is* ``torch.inference_mode``. Only rewritten modules see it: torch
and code outside the program's targets keep the real one.

It is decided at each entry, not when a decorator is applied, because libraries decorate their
methods at import time, before the program has chosen its device. Forms served: ``with
inference_mode():``, ``@inference_mode()``, bare ``@inference_mode``, ``inference_mode(False)``,
generator functions (each step inside it, as torch decorates them) and ``clone()``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

#: ``inspect.CO_GENERATOR`` (inspect costs milliseconds to import at start-up).
_CO_GENERATOR = 0x20


def on_directml() -> bool:
    """Whether DirectML tensors can exist in this process: torch-directml is imported, or the
    simulated device is loaded (for the device dmlpatch resolved, or on demand, as ultralytics'
    ``device=sim`` does). Either way the process's PrivateUse1 tensors are DirectML's."""
    if "torch_directml" in sys.modules:
        return True
    simulated = sys.modules.get("dmlpatch.sim")
    return simulated is not None and bool(simulated.is_loaded())


class _InferenceMode:
    """The context manager and decorator behind :func:`inference_mode`."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = mode
        self._inner: Optional[Any] = None

    def __enter__(self) -> None:
        import torch

        if on_directml():
            self._inner = torch.no_grad() if self.mode else torch.enable_grad()
        else:
            self._inner = torch.inference_mode(self.mode)
        self._inner.__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.__exit__(*exc_info)

    def clone(self) -> _InferenceMode:
        return self.__class__(self.mode)

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function``: every call (every step of a generator) runs inside a fresh
        copy of this context."""
        if getattr(getattr(function, "__code__", None), "co_flags", 0) & _CO_GENERATOR:
            return _generator(function, self)

        @functools.wraps(function)
        def decorated(*args: Any, **kwargs: Any) -> Any:
            with self.clone():
                return function(*args, **kwargs)

        return decorated


def _generator(function: Callable[..., Any], context: _InferenceMode) -> Callable[..., Any]:
    """A generator function whose body runs inside ``context`` while it runs, not while its
    consumer does, as ``torch.inference_mode`` decorates one."""

    @functools.wraps(function)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        generator = function(*args, **kwargs)
        try:
            with context.clone():
                request = generator.send(None)
            while True:
                try:
                    response = yield request
                except GeneratorExit:
                    with context.clone():
                        generator.close()
                    raise
                except BaseException as error:
                    with context.clone():
                        request = generator.throw(error)
                else:
                    with context.clone():
                        request = generator.send(response)
        except StopIteration as stop:
            return stop.value

    return decorated


def inference_mode(mode: Any = True) -> Any:
    """``torch.inference_mode`` in a rewritten module (see the module's docstring).

    ``inference_mode`` used bare as a decorator receives the function as ``mode``.
    """
    if callable(mode):
        return _InferenceMode(True)(mode)
    return _InferenceMode(bool(mode))
