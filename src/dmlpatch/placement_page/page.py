"""The placement report as one self-contained HTML page, in the manner of coverage.py's: the
verdict and the device's share on top, the CPU fallbacks by cost, then the program's files and
the libraries' lines that computed, each line marked by where its compute ran; the reason shows
on hover and, in full, on a click. Styles and script are inline: the page needs no network.
"""

from __future__ import annotations

import datetime
import html
import os
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from dmlpatch.placement_page import marks, sources

if TYPE_CHECKING:
    from dmlpatch.report_types import Compute, CpuFallback, Line


class Report(NamedTuple):
    """What the page says."""

    #: The program as it was run (``train.py --epochs 1``).
    program: str
    device: str
    #: ``check``'s verdict, or an ordinary run's headline.
    verdict: str
    #: The report's ``compute`` section, with its ``lines``; None where nothing was counted.
    compute: Optional[Compute]
    #: ``check``'s operator table (fixed, fallback, refused), as its JSON writes it.
    operators: list[dict[str, Any]]
    #: ``dmlpatch check`` or ``an ordinary run``.
    made_by: str


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render(report: Report) -> str:
    compute = report.compute
    entries = (compute.get("lines") or []) if compute else []
    by_file: dict[str, dict[int, Line]] = {}
    for entry in entries:
        by_file.setdefault(entry["file"], {})[entry["line"]] = entry
    roots = sources._library_roots()
    files = [sources.shown(path, set(found), roots) for path, found in by_file.items()]
    # The program's files first, then the libraries', each by name.
    files.sort(key=lambda shown: (shown.kind != "program", shown.display))
    anchors = {shown.path: f"file-{index}" for index, shown in enumerate(files, start=1)}
    known = _known_failures(report)
    parts = [
        _header(report),
        _legend(report.made_by),
        _fallback_table(report, by_file, anchors, known),
        _operator_table(report, known),
        _file_index(files, by_file, report.device, anchors),
        *(_file_section(shown, by_file[shown.path], report.device, anchors) for shown in files),
        _catalogue(known),
    ]
    made = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return _asset("page.html").format(
        title=_e(f"dmlpatch placement: {report.program}"),
        style=_asset("page.css"),
        script=_asset("page.js"),
        body="\n".join(part for part in parts if part),
        footer=_e(f"made by {report.made_by} on {made}"),
    )


def write(path: str, report: Report) -> None:
    """Write the page to ``path`` (OSError if it cannot be)."""
    text = render(report)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _header(report: Report) -> str:
    # The terminal's words and the JSON's share (``device_share``), not a figure of the page's
    # own: one run gives one account wherever it is read.
    from dmlpatch.placement import summary

    compute = report.compute
    meter = '<p class="share" id="share">no layer computed</p>'
    if compute:
        meter = f'<p class="share" id="share">model compute: {_e(summary.headline(compute))}</p>'
        share = compute.get("device_share")
        if share is not None:
            label = f"{summary.share_text(share)} on {report.device}"
            meter += (
                f'<div class="meter" role="img" aria-label="{_e(label)}">'
                f'<div class="meter-device" style="width:{100 * share:.1f}%"></div></div>'
            )
    return (
        f'<header><h1>dmlpatch placement report</h1><p class="program"><code>'
        f"{_e(report.program)}</code> on <strong>{_e(report.device)}</strong></p>"
        f'<p class="verdict" id="verdict">{_e(report.verdict)}</p>{meter}</header>'
    )


#: Who made the page, as :attr:`Report.made_by` says.
BY_CHECK = "dmlpatch check"
BY_RUN = "an ordinary run"


def _legend(made_by: str) -> str:
    items = "".join(
        f'<li><span class="swatch {place}"></span>{_e(marks.LEGEND[place])}</li>'
        for place in (marks.DEVICE, marks.FIXED, marks.FALLBACK, marks.CPU)
    )
    note = ""
    if made_by != BY_CHECK:
        note = (
            '<p class="none" id="legend-note">An ordinary run counts layer calls (convolution, '
            "linear, attention, normalisation, recurrent) in the forward pass and the CPU "
            "fallbacks; <code>dmlpatch check</code> counts every operator, backward and fixes "
            "included.</p>"
        )
    return f'<ul class="legend" id="legend">{items}</ul>{note}'


def _known_failures(report: Report) -> dict[str, list[Any]]:
    """Operator -> the catalogue entries that explain it (fallbacks, fixes, refusals)."""
    from dmlpatch.gaps import catalogue

    wanted: dict[str, str] = {}
    compute = report.compute
    for fallback in compute["cpu_fallbacks"] if compute else ():
        wanted[fallback["operator"]] = marks.FALLBACK
    for row in report.operators:
        wanted.setdefault(row["op"], row["how"])
    for entry in (compute.get("lines") or ()) if compute else ():
        for operator in entry.get("fixed") or {}:
            wanted.setdefault(operator, marks.FIXED)
    return {op: list(catalogue.for_gap(op, how)) for op, how in wanted.items()}


def _catalogue_links(operator: str, known: dict[str, list[Any]]) -> str:
    failures = known.get(operator) or []
    if not failures:
        return '<span class="none">not a catalogued failure</span>'
    return ", ".join(
        f'<a href="#known-{_e(failure.key)}">{_e(failure.key)}</a>' for failure in failures
    )


def _fallback_table(
    report: Report,
    by_file: dict[str, dict[int, Line]],
    anchors: dict[str, str],
    known: dict[str, list[Any]],
) -> str:
    listed: list[CpuFallback] = report.compute["cpu_fallbacks"] if report.compute else []
    fallbacks = sorted(
        listed,
        key=lambda f: (-f.get("seconds", 0.0), -f.get("bytes", 0), -f["calls"]),
    )
    if not fallbacks:
        return (
            '<section id="fallbacks"><h2>CPU fallbacks</h2><p class="none">No operator went '
            "through DirectML's CPU fallback.</p></section>"
        )
    rows = []
    for fallback in fallbacks:
        operator = fallback["operator"]
        at = _first_line_of(operator, by_file, anchors)
        where = (
            f'<a href="#{at[0]}">{_e(fallback.get("at") or at[1])}</a>'
            if at
            else _e(fallback.get("at") or "autograd's backward")
        )
        rows.append(
            f'<tr><td><code>{_e(operator)}</code></td><td class="n">{fallback["calls"]}</td>'
            f'<td class="n">{fallback.get("copies", 0)}</td>'
            f'<td class="n">{_e(marks.size(fallback.get("bytes", 0)))}</td>'
            f'<td class="n">{_e(marks.duration(fallback.get("seconds", 0.0)))}</td>'
            f"<td>{where}</td><td>{_catalogue_links(operator, known)}</td></tr>"
        )
    return (
        '<section id="fallbacks"><h2>CPU fallbacks, costliest first</h2>'
        '<table class="grid"><thead><tr><th>operator</th><th>calls</th><th>copies</th>'
        "<th>moved</th><th>time</th><th>first line</th><th>known failure</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _first_line_of(
    operator: str, by_file: dict[str, dict[int, Line]], anchors: dict[str, str]
) -> Optional[tuple[str, str]]:
    """The anchor and name of the line where ``operator`` fell back most."""
    best: Optional[tuple[float, str, str]] = None
    for path, lines in by_file.items():
        for number, entry in lines.items():
            for fallback in entry.get("fallbacks") or ():
                if fallback["operator"] != operator:
                    continue
                cost = fallback.get("seconds", 0.0)
                if best is None or cost > best[0]:
                    name = f"{sources.display(path, sources.kind_of(path))}:{number}"
                    best = (cost, f"{anchors[path]}-L{number}", name)
    return None if best is None else (best[1], best[2])


def _operator_table(report: Report, known: dict[str, list[Any]]) -> str:
    if not report.operators:
        return ""
    rows = "".join(
        f'<tr class="{_e(row["how"])}"><td><code>{_e(row["op"])}</code></td>'
        f'<td>{_e(row["how"])}</td><td class="n">{row["calls"]}</td>'
        f"<td>{_e(row.get('first_call') or '?')}</td>"
        f"<td>{_catalogue_links(row['op'], known)}</td></tr>"
        for row in report.operators
    )
    return (
        '<section id="operators"><h2>Operators DirectML does not run as they are</h2>'
        '<table class="grid"><thead><tr><th>operator</th><th>how</th><th>calls</th>'
        "<th>first called at</th><th>known failure</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _file_index(
    files: list[sources.Shown],
    by_file: dict[str, dict[int, Line]],
    device: str,
    anchors: dict[str, str],
) -> str:
    if not files:
        return (
            '<section id="files"><h2>Files</h2><p class="none">No line of the program or of a '
            "library was recorded computing.</p></section>"
        )
    rows = []
    for shown in files:
        counts = dict.fromkeys(marks.ORDER, 0)
        for entry in by_file[shown.path].values():
            counts[marks.of_line(entry, device).place] += 1
        cells = "".join(f'<td class="n {place}">{counts[place]}</td>' for place in marks.ORDER)
        rows.append(
            f'<tr><td><a href="#{anchors[shown.path]}">{_e(shown.display)}</a></td>'
            f"<td>{shown.kind}</td>{cells}</tr>"
        )
    heads = "".join(f"<th>{_e(marks.LEGEND[place])}</th>" for place in marks.ORDER)
    return (
        '<section id="files"><h2>Files with lines that computed</h2><table class="grid">'
        f"<thead><tr><th>file</th><th>whose</th>{heads}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _file_section(
    shown: sources.Shown, found: dict[int, Line], device: str, anchors: dict[str, str]
) -> str:
    anchor = anchors[shown.path]
    title = f"{shown.display} ({'the program' if shown.kind == 'program' else 'a library'})"
    if shown.missing:
        body = f'<p class="none">{_e(shown.missing)}</p>'
    else:
        rows = []
        for item in shown.lines:
            if item is None:
                rows.append('<tr class="gap"><td class="num">…</td><td></td></tr>')
                continue
            number, text = item
            entry = found.get(number)
            code = _e(text) or "&nbsp;"
            if entry is None:
                rows.append(f'<tr><td class="num">{number}</td><td class="src">{code}</td></tr>')
                continue
            mark = marks.of_line(entry, device)
            why = "\n".join(mark.reasons)
            details = "".join(f"<li>{_e(reason)}</li>" for reason in mark.reasons)
            rows.append(
                f'<tr class="line {mark.place}" id="{anchor}-L{number}" tabindex="0" '
                f'data-place="{mark.place}" title="{_e(why)}"><td class="num">{number}</td>'
                f'<td class="src">{code}</td></tr>'
                f'<tr class="why" hidden><td></td><td><ul>{details}</ul></td></tr>'
            )
        body = (
            f'<div class="source-box"><table class="source"><tbody>{"".join(rows)}</tbody>'
            "</table></div>"
        )
    return (
        f'<section class="file {shown.kind}" id="{anchor}"><h2>{_e(title)}</h2>'
        f'<p class="path">{_e(os.path.abspath(shown.path))}</p>{body}</section>'
    )


def _catalogue(known: dict[str, list[Any]]) -> str:
    seen: dict[str, Any] = {}
    for failures in known.values():
        for failure in failures:
            seen.setdefault(failure.key, failure)
    if not seen:
        return ""
    entries = "".join(
        f'<article class="known" id="known-{_e(failure.key)}"><h3>{_e(failure.key)}</h3>'
        f"<p>{_e(failure.what)}</p>"
        + (f"<p>DirectML says: <code>{_e(failure.text)}</code></p>" if failure.text else "")
        + f"<p>dmlpatch: {_e(failure.fix)}: {_e(failure.remedy)}</p>"
        + f'<p class="sources">reports: {_e(failure.sources)}</p></article>'
        for failure in seen.values()
    )
    return (
        '<section id="catalogue"><h2>Known DirectML failures met in this run</h2>'
        f"{entries}</section>"
    )
