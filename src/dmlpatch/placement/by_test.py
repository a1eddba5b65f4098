"""Where each test of a pytest suite ran: the account the pytest plugin gives instead of the
exit warning's.

A test suite is not one program. Its tests run on the CPU on purpose (torchvision's
``cpu_and_cuda()`` runs every device test once with ``"cpu"``), so the share of the whole
session's compute that ran on the CPU says nothing true about it, and the explicit CPU placement
the exit warning names is a test doing what it was written to do. So each test is judged alone:
the ledger's totals before and after it, what its ``device`` (or ``dev``) argument holds once its
fixtures are set up, and whether a rewritten CUDA site gave it the device. A test warns only when
it asked for CUDA (its argument named CUDA, or it had no device argument and a CUDA site gave it
the device) and most of its model compute ran on the CPU. Each test costs a copy of the CPU
lines' call counts (a few dozen entries) and nothing else; the counted calls pay nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Optional

from dmlpatch.devices import announce
from dmlpatch.placement import ledger, summary

if TYPE_CHECKING:
    from dmlpatch.report_types import Tests, WarnedTest

#: The outcomes, in the order the summary line says them.
ON_DEVICE: Final = "on_device"
ON_CPU_AS_PARAMETRIZED: Final = "on_cpu_as_parametrized"
ASKED_BUT_ON_CPU: Final = "asked_for_cuda_but_on_cpu"
ON_CPU_NEVER_ASKED: Final = "on_cpu_never_asking_for_cuda"
NOT_PLACED: Final = "no_layer_and_no_device_argument"
#: Tests warned about one line each; the rest in one line.
_NAMED = 5
#: The argument names suites give a test's device (as the plugin's collection hook reads them).
_ARGUMENTS = ("device", "dev")


class _Running:
    """What is known of the test now running."""

    def __init__(self, book: ledger.Ledger) -> None:
        self.book = book
        self.cpu = book.totals(ledger.CPU)
        self.device = book.others(ledger.CPU, ledger.LOADING, ledger.BUILDING)
        self.sites = {site: entry["calls"] for site, entry in book.heaviest_cpu_sites()}
        self.hand_outs = announce.hand_outs()
        self.argument: Optional[str] = None  # "cpu", "cuda" (asked) or None
        self.called = False


_running: Optional[_Running] = None
_counts: dict[str, int] = dict.fromkeys(
    (ON_DEVICE, ON_CPU_AS_PARAMETRIZED, ASKED_BUT_ON_CPU, ON_CPU_NEVER_ASKED, NOT_PLACED), 0
)
#: One line for each test that asked for CUDA and ran on the CPU.
_warned: list[WarnedTest] = []
_said = False


def begin() -> None:
    """A test starts (before its fixtures): note the counts so far, if anything is counted."""
    global _running
    book = ledger.current()
    _running = _Running(book) if book is not None else None


def called(arguments: dict[str, Any]) -> None:
    """The test's function is called, with its fixtures and parameters in ``arguments``."""
    running = _running
    if running is None:
        return
    running.called = True
    for name in _ARGUMENTS:
        if name in arguments:
            running.argument = _kind(arguments[name])
            return


def _kind(value: Any) -> Optional[str]:
    """``cpu``, ``cuda`` (any accelerator: the plugin put the target where a test named
    CUDA) or None (not a device: a name the suite looks up, a fixture of its own)."""
    if isinstance(value, str):
        text = value
    elif type(value).__name__ == "device" and type(value).__module__ == "torch":
        text = str(value)
    else:
        return None
    kind = text.partition(":")[0]
    if kind == "cpu":
        return "cpu"
    chosen = _device()
    return "cuda" if kind == "cuda" or (chosen is not None and kind == chosen[1]) else None


def _device() -> Optional[tuple[str, str]]:
    """The selected device and its type, once resolved."""
    from dmlpatch.devices import resolution

    chosen = resolution.resolved_or_none()
    return None if chosen is None else (chosen.device, chosen.type)


def end(test: str) -> None:
    """The test ``test`` (its node id) is over, teardown included: where did it run?"""
    global _running
    running, _running = _running, None
    if running is None or not running.called or ledger.current() is not running.book:
        return  # skipped, failed in set-up, or the ledger went away (the CPU was resolved)
    book = running.book
    cpu_calls, cpu_flops = _less(book.totals(ledger.CPU), running.cpu)
    device_calls, device_flops = _less(
        book.others(ledger.CPU, ledger.LOADING, ledger.BUILDING), running.device
    )
    share = _share(cpu_calls, cpu_flops, device_calls, device_flops)
    asked = running.argument == "cuda" or (
        running.argument is None and announce.hand_outs() > running.hand_outs
    )
    if share is not None and share > summary.MOST:
        if running.argument == "cpu":
            outcome = ON_CPU_AS_PARAMETRIZED
        elif asked:
            outcome = ASKED_BUT_ON_CPU
            _warned.append(
                {
                    "test": test,
                    "cpu_share": round(share, 4),
                    "on_cpu": {"calls": cpu_calls, "flops": cpu_flops},
                    "on_device": {"calls": device_calls, "flops": device_flops},
                    "first_at": _heaviest_new_line(book, running.sites),
                }
            )
        else:
            outcome = ON_CPU_NEVER_ASKED
    elif share is not None or running.argument == "cuda":
        outcome = ON_DEVICE
    elif running.argument == "cpu":
        outcome = ON_CPU_AS_PARAMETRIZED
    else:
        outcome = NOT_PLACED
    _counts[outcome] += 1


def _less(now: tuple[int, int], before: tuple[int, int]) -> tuple[int, int]:
    return now[0] - before[0], now[1] - before[1]


def _share(cpu_calls: int, cpu_flops: int, device_calls: int, device_flops: int) -> Optional[float]:
    """The CPU's share of the test's model compute (by FLOPs; by calls without FLOPs)."""
    if cpu_flops + device_flops > 0:
        return cpu_flops / (cpu_flops + device_flops)
    if cpu_calls + device_calls > 0:
        return cpu_calls / (cpu_calls + device_calls)
    return None


def _heaviest_new_line(book: ledger.Ledger, before: dict[Any, int]) -> Optional[str]:
    """The CPU line that ran most of this test's CPU compute (heaviest overall among those
    that ran during it), with the operator a CPU fallback ran there."""
    for site, entry in book.heaviest_cpu_sites():
        if site is not None and entry["calls"] > before.get(site, 0):
            through = sorted(entry.get("fallbacks") or ())
            how = f" (DirectML's CPU fallback of {', '.join(through)})" if through else ""
            return f"{site.describe()}{how}"
    return None


def counted() -> bool:
    """Whether any test was accounted for."""
    return any(_counts.values())


def as_dict() -> Tests:
    """The report's ``compute.tests``: tests by outcome, and those that warned."""
    return {
        ON_DEVICE: _counts[ON_DEVICE],
        ON_CPU_AS_PARAMETRIZED: _counts[ON_CPU_AS_PARAMETRIZED],
        ASKED_BUT_ON_CPU: _counts[ASKED_BUT_ON_CPU],
        ON_CPU_NEVER_ASKED: _counts[ON_CPU_NEVER_ASKED],
        NOT_PLACED: _counts[NOT_PLACED],
        "warned": list(_warned),
    }


def say() -> None:
    """The summary line and the warnings, once (in the plugin's section of pytest's summary)."""
    global _said
    if _said or not counted():
        return
    _said = True
    from dmlpatch import log

    chosen = _device()
    device = chosen[0] if chosen is not None else "the device"
    log.say(summary_line(device))
    for entry in _warned[:_NAMED]:
        log.say(f"warning: {warning_line(entry, device)}")
    if len(_warned) > _NAMED:
        log.say(
            f"warning: {len(_warned) - _NAMED} more tests asked for CUDA and ran mostly on the "
            "CPU (the report's compute.tests.warned names them)"
        )


def summary_line(device: str) -> str:
    """``tests by where their model compute ran: 410 on privateuseone:0, 410 on the CPU as
    parametrized``, then the other outcomes that happened."""
    said = [
        f"{_counts[ON_DEVICE]} on {device}",
        f"{_counts[ON_CPU_AS_PARAMETRIZED]} on the CPU as parametrized",
    ]
    for outcome, words in (
        (ASKED_BUT_ON_CPU, "on the CPU despite asking for CUDA"),
        (ON_CPU_NEVER_ASKED, "on the CPU, never asking for CUDA"),
        (NOT_PLACED, "with no layer counted and no device argument"),
    ):
        if _counts[outcome]:
            said.append(f"{_counts[outcome]} {words}")
    return f"tests by where they ran: {', '.join(said)}"


def warning_line(entry: WarnedTest, device: str) -> str:
    """One test that asked for CUDA and computed mostly on the CPU."""
    on_cpu = entry["on_cpu"]["flops"]
    total = on_cpu + entry["on_device"]["flops"]
    where = f" (first at {entry['first_at']})" if entry["first_at"] else ""
    return (
        f"{entry['test']} asked for CUDA and was given {device}, yet "
        f"{summary.share_text(entry['cpu_share'])} of its model compute "
        f"({summary.flops_text(on_cpu)} of {summary.flops_text(total)}) ran on the CPU{where}"
    )
