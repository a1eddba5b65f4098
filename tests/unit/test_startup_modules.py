"""What start-up modules use instead of typing and re behaves as those would."""

from __future__ import annotations

import pickle
import re
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmlpatch._tuple import NamedTuple
from dmlpatch.devices import resolution
from dmlpatch.errors import UsageError


class Light(NamedTuple):
    """A doc."""

    name: str
    size: int = 3

    @property
    def twice(self) -> int:
        return self.size * 2


class Heavy(typing.NamedTuple):
    """A doc."""

    name: str
    size: int = 3

    @property
    def twice(self) -> int:
        return self.size * 2


def test_named_tuple_matches_typing() -> None:
    light, heavy = Light("a"), Heavy("a")
    assert tuple(light) == tuple(heavy) == ("a", 3)
    assert Light._fields == Heavy._fields and Light._field_defaults == Heavy._field_defaults
    assert repr(light) == repr(heavy).replace("Heavy", "Light")
    assert light.twice == 6 and Light("b", size=5)._replace(size=1) == ("b", 1)
    assert Light.__doc__ == "A doc." and Light.__module__ == __name__
    assert Light.__qualname__ == "Light"
    assert pickle.loads(pickle.dumps(light)) == light
    make: Any = Light  # called without its field, on purpose
    with pytest.raises(TypeError):
        make()


@pytest.mark.parametrize(
    "call",
    [
        lambda T: T("a", 5),
        lambda T: T(name="a"),
        lambda T: T("a", size=2),
        lambda T: T(size=2, name="b"),
        lambda T: T("a", 1, 2),
        lambda T: T("a", name="b"),
        lambda T: T("a", colour=1),
        lambda T: T(),
        lambda T: T._make(["a", 4]),
        lambda T: T._make(["a"]),
        lambda T: T("a")._replace(size=9),
        lambda T: T("a")._replace(colour=9),
        lambda T: T("a", 2)._asdict(),
        lambda T: (T.__match_args__, T.name.__doc__, T("a").name, T("a")[1]),
        lambda T: (T("a", 2) == ("a", 2), hash(T("a", 2)) == hash(("a", 2))),
        lambda T: pickle.loads(pickle.dumps(T("a", 7))) == T("a", 7),
        lambda T: setattr(T("a"), "size", 1),
    ],
)
def test_named_tuple_behaves_as_typing_builds_it(call: Any) -> None:
    """Same result, or the same kind of error, for each way code uses a named tuple."""

    def outcome(kind: type) -> object:
        try:
            return ("value", call(kind))
        except Exception as error:
            return ("error", type(error))

    assert outcome(Light) == outcome(Heavy)


def test_named_tuple_refuses_what_typing_refuses() -> None:
    namespace = {"__annotations__": {"first": int, "second": int}, "first": 1}
    with pytest.raises(TypeError):  # `second` without a default follows `first` with one
        type(NamedTuple)("Bad", (NamedTuple,), namespace)


# The regular expressions the spec parser was written with, as the reference.
_SPEC = re.compile(
    r"^(?P<kind>auto|dml|privateuseone|sim|cpu|cuda|mps|xpu)(?::(?P<selector>[^\s]+))?$",
    re.IGNORECASE,
)
_INDICES = re.compile(r"^\d+(,\d+)*$")


def _reference(text: str) -> object:
    match = _SPEC.match(text.strip())
    if match is None:
        return "unknown"
    typed = match.group("kind").lower()
    kind = "dml" if typed == "privateuseone" else typed
    selector = match.group("selector")
    if selector is None:
        return (kind, (), None)
    if kind in ("auto", "cpu", "mps"):
        return "no selector"
    if "," in selector and not _INDICES.match(selector):
        return "bad list"
    if _INDICES.match(selector):
        indices = tuple(int(part) for part in selector.split(","))
        if len(set(indices)) != len(indices):
            return "twice"
        if kind in ("cuda", "xpu") and len(indices) > 1:
            return "several"
        return (kind, indices, None)
    if typed != "dml":  # privateuseone:N is dml:N, but only dml takes an adapter name
        return "name"
    return (kind, (), selector)


def _parsed(text: str) -> object:
    try:
        spec = resolution.parse(text)
    except UsageError as error:
        message = str(error)
        for marker, outcome in (
            ("unknown device spec", "unknown"),
            ("takes no ':...' part", "no selector"),
            ("several adapters are listed by index", "bad list"),
            ("names an adapter twice", "twice"),
            ("only dml and sim take several", "several"),
            ("takes an adapter index such as", "name"),
        ):
            if marker in message:
                return outcome
        raise
    return (spec.kind, spec.indices, spec.name)


@given(
    st.sampled_from(
        ["auto", "DML", "dml", "privateuseone", "sim", "cpu", "Cuda", "mps", "xpu", "x"]
    ).flatmap(
        lambda kind: st.text(alphabet="0123456789,:ab \t\n٣-", max_size=6).map(
            lambda tail: kind + tail
        )
    )
)
def test_spec_parser_agrees_with_the_regular_expressions(text: str) -> None:
    assert _parsed(text) == _reference(text)


def test_cache_file_tags_are_fnv1a_and_the_same_in_every_process() -> None:
    from dmlpatch.paths import file_tag

    # Published FNV-1a 32-bit values; str hash() would differ between processes.
    assert file_tag("") == "811c9dc5"
    assert file_tag("a") == "e40c292c"
    assert file_tag("foobar") == "bf9cf968"
