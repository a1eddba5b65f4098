"""Device specs: the text a user gives (``--device``, ``$DMLPATCH_DEVICE``,
``dmlpatch activate``) checked and parsed, without torch and without ``re`` (every process of an
activated environment parses one). :mod:`dmlpatch.devices.resolution` turns a spec into a
device."""

from __future__ import annotations

from dmlpatch.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple, Optional
else:
    from dmlpatch._tuple import NamedTuple


# Parsed by hand: ``re`` costs every process of an activated environment milliseconds.
_KINDS = frozenset({"auto", "dml", "privateuseone", "sim", "cpu", "cuda", "mps", "xpu"})
_NO_SELECTOR = {"auto", "cpu", "mps"}
SPEC_HELP = (
    "auto, dml, dml:N, dml:N,M, dml:NAME, privateuseone:N, sim, sim:N, cpu, cuda, cuda:N, mps, xpu"
)


class Spec(NamedTuple):
    """A parsed device spec: ``kind`` plus adapter ``indices`` or a ``name`` fragment."""

    text: str
    kind: str
    indices: tuple[int, ...] = ()
    name: Optional[str] = None


def parse(text: str) -> Spec:
    """Validate a spec without importing torch; :class:`UsageError` names the accepted forms."""
    kind, colon, selector = text.strip().partition(":")
    kind = kind.lower()
    if kind not in _KINDS or (colon and (not selector or _has_space(selector))):
        raise UsageError(f"unknown device spec {text!r}; expected one of: {SPEC_HELP}")
    typed, kind = kind, "dml" if kind == "privateuseone" else kind
    if not colon:
        return Spec(text, kind)
    if kind in _NO_SELECTOR:
        raise UsageError(f"device spec {text!r}: {kind!r} takes no ':...' part")
    if "," in selector and not _are_indices(selector):
        raise UsageError(
            f"device spec {text!r}: several adapters are listed by index, e.g. {typed}:0,1"
        )
    if _are_indices(selector):
        indices = tuple(int(part) for part in selector.split(","))
        if len(set(indices)) != len(indices):
            raise UsageError(f"device spec {text!r} names an adapter twice")
        if kind in ("cuda", "xpu") and len(indices) > 1:
            raise UsageError(f"device spec {text!r}: only dml and sim take several adapters")
        return Spec(text, kind, indices)
    if typed != "dml":
        raise UsageError(
            f"device spec {text!r}: {typed} takes an adapter index such as {typed}:0 "
            "(only dml takes an adapter name)"
        )
    return Spec(text, kind, name=selector)


def _has_space(text: str) -> bool:
    return any(character.isspace() for character in text)


def _are_indices(selector: str) -> bool:
    """``N`` or ``N,M,...`` in decimal digits (what ``int`` reads)."""
    return all(part.isdecimal() for part in selector.split(","))
