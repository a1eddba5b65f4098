"""Make src/dmlpatch/rewriting/transform/device_parameters.py: every device parameter of torch's
public callables, from the signatures of each supported torch.

Run under each torch (parameters come from the running torch), then once more to write the table:

    PYTHONPATH=src OTHER_VENV/bin/python scripts/device_parameters.py derive > 2.4.1.json
    .venv/bin/python scripts/device_parameters.py derive > 2.14.1.json
    .venv/bin/python scripts/device_parameters.py module 2.4.1.json 2.14.1.json \
        > src/dmlpatch/rewriting/transform/device_parameters.py

tests/unit/test_device_parameters.py derives the running torch's again and compares.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

HEADER = '''"""Every device parameter of torch's public callables: generated, do not edit.

A device reaches torch through these parameters, positional or keyword
(``torch.Generator("cuda")``, ``torch.load(f, "cuda")``, ``x.to(dev)``,
``torch.randn(2, device=gpu)``); the rewriter meets a device at each of them
(``dmlpatch.rewriting.transform.device_sites``). Derived from the signatures of torch
{versions} by ``dmlpatch.rewriting.device_signatures`` and written by
``scripts/device_parameters.py``; ``tests/unit/test_device_parameters.py`` derives the
running torch's again and fails on any parameter missing here.

Each parameter is ``(name, position, kind)``: its position among the positional parameters
(``self`` not counted; None: keyword-only) in any of those torches, and what a value there is
(``device``, ``map_location``, ``device_type``, ``devices``, ``cuda_api``: see
``device_signatures.KINDS``). Methods of :data:`METHOD_CLASSES` are met by name whatever the
object (``METHODS``, the union over those classes); other callables by the name the program
imports them under (``FUNCTIONS``).
"""

from __future__ import annotations

from typing import Optional

#: One device parameter: its name, position (None: keyword-only) and kind.
Parameter = tuple[str, Optional[int], str]

TORCH_VERSIONS = {versions_tuple}

METHOD_CLASSES = {classes}

CALLABLES: dict[str, tuple[Parameter, ...]] = {{
{rows}
}}


def _split() -> tuple[dict[str, tuple[Parameter, ...]], dict[str, tuple[Parameter, ...]]]:
    """The callables met by qualified name, and the methods met by name (merged over classes:
    positional where any class takes the parameter so)."""
    functions: dict[str, tuple[Parameter, ...]] = {{}}
    methods: dict[str, dict[str, Parameter]] = {{}}
    for qualified, parameters in CALLABLES.items():
        owner, _, name = qualified.rpartition(".")
        if owner in METHOD_CLASSES:
            merged = methods.setdefault(name, {{}})
            for parameter in parameters:
                known = merged.get(parameter[0])
                if known is None or known[1] is None:
                    merged[parameter[0]] = parameter
        else:
            functions[qualified] = parameters
    return functions, {{name: tuple(found.values()) for name, found in methods.items()}}


FUNCTIONS, METHODS = _split()
#: The modules those callables live in (``torch.nn``, ``torch.utils.data``...), which a program
#: may import under a name of its own.
MODULES = frozenset(
    name.rsplit(".", depth)[0]
    for name in FUNCTIONS
    for depth in range(1, name.count("."))
)
'''


def main(argv: list[str]) -> int:
    if argv[:1] == ["derive"]:
        import torch

        from dmlpatch.rewriting.device_signatures import derive

        version = torch.__version__.split("+")[0]
        table = {
            name: sorted(parameters.values(), key=lambda p: p[0])
            for name, parameters in derive(torch).items()
        }
        print(json.dumps({"torch": version, "callables": table}, indent=1, sort_keys=True))
        return 0
    if argv[:1] == ["module"] and len(argv) > 1:
        from dmlpatch.rewriting.device_signatures import METHOD_CLASSES

        versions: list[str] = []
        merged: dict[str, dict[str, tuple[str, Optional[int], str]]] = {}
        for path in argv[1:]:
            with open(path, encoding="utf-8") as handle:
                data: dict[str, Any] = json.load(handle)
            versions.append(data["torch"])
            for name, parameters in data["callables"].items():
                found = merged.setdefault(name, {})
                for parameter_name, position, kind in parameters:
                    known = found.get(parameter_name)
                    if known is None or known[1] is None:
                        found[parameter_name] = (parameter_name, position, kind)
        versions.sort(key=lambda v: tuple(int(p) for p in v.split(".")))
        rows = "\n".join(
            f"    {name!r}: ({''.join(f'{p!r}, ' for p in sorted(params.values()))}),"
            for name, params in sorted(merged.items())
        )
        sys.stdout.write(
            HEADER.format(
                versions=" and ".join(versions),
                versions_tuple=repr(tuple(versions)),
                classes=repr(METHOD_CLASSES),
                rows=rows,
            )
        )
        return 0
    sys.stderr.write("usage: device_parameters.py derive | module FILE.json...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
