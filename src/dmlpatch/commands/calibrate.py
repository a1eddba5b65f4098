"""``dmlpatch calibrate``: measure the cost model's constants on this DirectML adapter and keep
them, so that every later run on it chooses between a fix and a fallback by its own figures.

Prints each figure beside the shipped profile's closest to the adapter, and where the profile
was written (``--no-save``: nowhere). ``--device sim`` measures the simulated device instead,
on the cost model's clock: it recovers the profile the simulated adapter is configured as
(``DMLPATCH_COST_PROFILE``), which is how the measurement itself is tested.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dmlpatch.errors import DeviceUnavailable, UsageError


def _device(spec: str) -> tuple[Any, str, str]:
    """(torch device, backend, adapter name) for ``sim``, ``dml`` or ``dml:N``."""
    if spec == "sim":
        from dmlpatch import sim

        sim.load()
        return sim.device(), "sim", sim.device_name(0)
    index = 0
    if spec.startswith(("dml:", "privateuseone:")):
        text = spec.partition(":")[2]
        if not text.isdigit():
            raise UsageError(f"dmlpatch calibrate: --device {spec!r}: the adapter must be a number")
        index = int(text)
    elif spec not in ("dml", "privateuseone"):
        raise UsageError(
            f"dmlpatch calibrate: --device {spec!r}: measures a DirectML adapter (dml, dml:N) "
            "or the simulated device (sim)"
        )
    from dmlpatch.devices import directml

    found = directml.probe()
    if not found.available or found.module is None:
        raise DeviceUnavailable(f"no DirectML adapter to measure: {found.reason}")
    if not 0 <= index < len(found.names):
        raise DeviceUnavailable(
            f"DirectML adapter {index} does not exist; there are {len(found.names)}"
        )
    return found.module.device(index), "directml", found.names[index]


def main(spec: str, as_json: bool, save: bool) -> int:
    from dmlpatch.costs import active, calibrate, machine, profiles
    from dmlpatch.devices import adapters

    device, backend, adapter = _device(spec)
    clock = calibrate.modelled_clock() if backend == "sim" else calibrate.wall_clock()
    driver = adapters.driver_version(backend, adapter)
    measured = calibrate.measure(device, clock, adapter, name=f"measured: {adapter}")
    compared = active.current().profile if backend == "sim" else profiles.closest(adapter)[0]
    from dmlpatch import opfix

    opfix.install_for(backend)
    checks = calibrate.check_fixes(device, clock, measured.profile)
    written = None
    if save:
        try:
            written = machine.save(
                adapter, driver, measured.profile, [check.to_json() for check in checks]
            )
        except OSError as error:
            raise DeviceUnavailable(
                f"measured, but cannot write the profile into dmlpatch's cache: {error}"
            ) from None
    if as_json:
        data = {
            "adapter": adapter,
            "driver": driver,
            "backend": backend,
            "clock": clock.name,
            "profile": measured.profile.to_json(),
            "compared_with": compared.name,
            "fixes": [check.to_json() for check in checks],
            "written": written,
        }
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return 0
    lines = [
        f"adapter: {adapter} (driver {driver}), timed on {clock.name}",
        f"{'figure':15} {'measured':>10} {compared.name:>14}  how",
    ]
    for name, value in measured.profile.figures().items():
        lines.append(
            f"{name:15} {value:10.4g} {getattr(compared, name):14.4g}  {measured.how[name]}"
        )
    if checks:
        lines.append(
            "each fix both ways, measured (ms), and the side the model picks on the figures above:"
        )
        for check in checks:
            measured_side = "composed" if check.composition_s <= check.fallback_s else "fallback"
            picked = (
                "composed"
                if check.modelled_composition_s <= check.modelled_fallback_s
                else "fallback"
            )
            lines.append(
                f"  {check.label:28} composed {check.composition_s * 1e3:8.3f}  fallback "
                f"{check.fallback_s * 1e3:8.3f}  faster: {measured_side:8}  model: {picked}"
                + ("" if check.agrees else "  (the model is wrong here: please send this)")
            )
    if written is not None and backend == "sim":
        lines.append(
            f"written to {written} (the simulated device itself always models the profile it "
            "is configured as; a real adapter's runs read the profile measured on it)"
        )
    elif written is not None:
        lines.append(f"written to {written}; runs on this adapter and driver use it from now on")
    else:
        lines.append("not written (--no-save)")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
