"""Module aliases: a name a library imports that its dependencies have since renamed.

basicsr 1.4.2 imports ``torchvision.transforms.functional_tensor``, which torchvision 0.17
renamed to ``_functional_tensor``; basicsr, gfpgan and realesrgan then fail to import at all.
A finder at the *end* of ``sys.meta_path`` answers only when every normal finder has failed,
so the alias exists only where the real module is missing.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import importlib
import importlib.machinery
import sys
import types

from dmlpatch import log, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader as _LoaderInterface
    from typing import Optional
else:
    # The loader interface the checker sees; importlib.abc costs milliseconds to import.
    _LoaderInterface = object

_lock = _thread.allocate_lock()
_aliases: dict[str, tuple[str, str]] = {}  # alias -> (real module, spec name)


def install(alias: str, real: str, spec: str) -> None:
    with _lock:
        _aliases[alias] = (real, spec)
        if _finder not in sys.meta_path:
            sys.meta_path.append(_finder)


def uninstall() -> None:
    with _lock:
        _aliases.clear()
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


class _AliasLoader(_LoaderInterface):
    def __init__(self, real: str, spec: str) -> None:
        self.real = real
        self.spec = spec

    def create_module(self, module_spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.real)
        record.record_alias(self.spec, module_spec.name, self.real)
        log.info(f"{self.spec}: {module_spec.name} is missing; using {self.real}")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """The real module is already executed."""


class _AliasFinder:
    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        entry = _aliases.get(fullname)
        if entry is None:
            return None
        real, spec = entry
        import importlib.util

        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real, spec))


_finder = _AliasFinder()
