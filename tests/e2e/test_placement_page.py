"""The placement page (``dmlpatch check --html DIR``, ``--report=FILE.html``) as a user sees it:
opened in a real headless Chromium (Debian's, installed by ``scripts/setup.sh``), read, hovered
and clicked, not only parsed.

The program computes in every way the page marks: layers on the device, a layer left on the
CPU, an optimizer step a dmlpatch fix serves, two operators through DirectML's CPU fallback at
very different costs, and a layer inside a library (a package in a ``site-packages``
directory), whose long file the page shows as the lines that computed, with context.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from support import Result, clean_env, run_python

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

LIBRARY = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, x):
        return torch.relu(self.proj(x))
""" + "".join(f"\n\ndef unused_{n}():\n    return {n}\n" for n in range(60))

PROGRAM = """
import torch
from torch import nn

from blocks import Block

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 256), Block()).cuda()
head = nn.Linear(256, 4)  # left on the CPU
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(32, 8, device="cuda")
    features = model(x)
    out = head(features.cpu())
    loss = out.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
big = torch.randn(256, 256, device="cuda")
for _ in range(3):
    spectrum = torch.linalg.svdvals(big)
values = torch.linalg.eigvalsh(torch.eye(80, device="cuda"))
print("done")
"""
LINES = {line: n for n, line in enumerate(PROGRAM.splitlines(), start=1) if line.strip()}


def _env(workspace: Path) -> dict[str, str]:
    return clean_env(PYTHONPATH=str(workspace / "site-packages"))


def _line(text: str) -> int:
    return LINES[text]


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "Chromium is missing: scripts/setup.sh installs Debian's chromium and chromium-driver"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1300,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("page")
    library = root / "site-packages"
    library.mkdir()
    (library / "blocks.py").write_text(LIBRARY)
    (root / "program.py").write_text(PROGRAM)
    return root


@pytest.fixture(scope="module")
def checked(workspace: Path) -> tuple[Path, str]:
    """The page ``check --html`` wrote, and check's verdict."""
    result = run_python(
        ["-m", "dmlpatch", "check", "--html", "page", "program.py"],
        cwd=workspace,
        env=_env(workspace),
    )
    assert result.code == 0, result.err
    assert result.out == "done\n"
    assert "dmlpatch: placement page: page/index.html" in result.err_lines
    (verdict,) = [line for line in result.err_lines if line.startswith("verdict: ")]
    return workspace / "page" / "index.html", verdict.removeprefix("verdict: ")


#: Two kinds of compute on the CPU: a layer of the program's whose product goes through
#: DirectML's CPU fallback (addbmm) and an operator outside the layers (svdvals), so that the
#: share of all model compute and the layers' alone differ: one of them is said everywhere.
SHARED = """
import torch
from torch import nn


class Mixer(nn.Module):
    def forward(self, x):
        return torch.addbmm(torch.zeros(64, 64, device=x.device), x, x)


torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).cuda()
mixer = Mixer()
with torch.no_grad():
    for step in range(2):
        x = encoder(torch.randn(16, 64, 64, device="cuda"))
        y = mixer(x)
        s = torch.linalg.svdvals(torch.randn(256, 256, device="cuda"))
print("done")
"""

#: Directory names that make a path far wider than a 1280-pixel window, with nowhere to break.
LONG_DIRECTORIES = ("a_directory_whose_name_goes_on_and_on_" * 5, "and_one_nested_inside_it_" * 8)


@pytest.fixture(scope="module")
def long_checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result, dict[str, Any]]:
    """``check --html --json`` of :data:`SHARED` kept at a very long path: the page, the
    terminal's lines and the JSON."""
    root = tmp_path_factory.mktemp("long")
    home = root.joinpath(*LONG_DIRECTORIES)
    home.mkdir(parents=True)
    (home / "program.py").write_text(SHARED)
    result = run_python(
        [
            "-m",
            "dmlpatch",
            "check",
            "--html",
            "page",
            "--json",
            "check.json",
            str(home / "program.py"),
        ],
        cwd=root,
        env=clean_env(),
    )
    assert result.code == 0, result.err
    assert result.out == "done\n"
    return root / "page" / "index.html", result, json.loads((root / "check.json").read_text())


def test_the_page_the_terminal_and_the_json_give_one_share_in_one_wording(
    browser: WebDriver, long_checked: tuple[Path, Result, dict[str, Any]]
) -> None:
    page, result, data = long_checked
    compute = data["compute"]
    assert {entry["operator"] for entry in compute["cpu_fallbacks"]} == {
        "aten::addbmm",
        "aten::_linalg_svd.U",
    }
    device_share = compute["device_share"]
    assert 0.8 < device_share < 0.97, compute
    browser.get(page.as_uri())
    share = browser.find_element(By.ID, "share").text
    (terminal,) = [line for line in result.err_lines if line.startswith("model compute: ")]
    assert share == terminal
    on_cpu = round(100 * (1 - device_share))
    assert share.startswith(f"model compute: {on_cpu}% of model compute ("), share
    meter = browser.find_element(By.CSS_SELECTOR, ".meter")
    assert meter.get_attribute("aria-label") == f"{100 - on_cpu}% on privateuseone:0"
    bar = browser.find_element(By.CSS_SELECTOR, ".meter-device").get_attribute("style")
    width = re.fullmatch(r"width: ([\d.]+)%;", bar)
    assert width is not None and float(width.group(1)) == round(100 * device_share, 1), bar


def test_a_long_path_does_not_widen_the_page_past_the_window(
    browser: WebDriver, long_checked: tuple[Path, Result, dict[str, Any]]
) -> None:
    page, _, _ = long_checked
    browser.set_window_size(1280, 1000)
    try:
        browser.get(page.as_uri())
        assert browser.execute_script("return window.innerWidth") == 1280
        shown = browser.find_element(By.CSS_SELECTOR, "section.file.program .path").text
        assert shown.endswith("/program.py") and LONG_DIRECTORIES[1] in shown.replace("\n", "")
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 1280
    finally:
        browser.set_window_size(1300, 1000)


def _program_row(browser: WebDriver, line: int) -> object:
    section = browser.find_element(By.CSS_SELECTOR, "section.file.program")
    return section.find_element(By.ID, f"{section.get_attribute('id')}-L{line}")


def test_the_page_shows_the_verdict_and_the_device_share(
    browser: WebDriver, checked: tuple[Path, str]
) -> None:
    page, verdict = checked
    browser.get(page.as_uri())
    assert browser.find_element(By.ID, "verdict").text == verdict
    assert verdict.startswith("runs on DirectML with 2 fallbacks")
    share = browser.find_element(By.ID, "share").text
    # The terminal's words (the CPU head is 256x4 of the 8x256 + 256x256 model's work per row,
    # and the fallbacks' little more): a small share.
    said = re.fullmatch(
        r"model compute: (\d+)% of model compute \([\d.]+ MFLOP of [\d.]+ MFLOP\) ran on the "
        r"CPU, not on privateuseone:0; 2 operators through DirectML's CPU fallback \(.*\)",
        share,
    )
    assert said is not None, share
    assert 1 <= int(said.group(1)) <= 5
    assert browser.find_element(By.CSS_SELECTOR, "header .program").text == (
        "program.py on privateuseone:0"
    )


def test_each_line_is_marked_where_its_compute_ran(
    browser: WebDriver, checked: tuple[Path, str]
) -> None:
    page, _ = checked
    browser.get(page.as_uri())
    expected = {
        "    features = model(x)": "device",
        "    out = head(features.cpu())": "cpu",
        "    opt.step()": "fixed",
        "    spectrum = torch.linalg.svdvals(big)": "fallback",
        'values = torch.linalg.eigvalsh(torch.eye(80, device="cuda"))': "fallback",
    }
    colours = {}
    for text, place in expected.items():
        row = _program_row(browser, _line(text))
        assert row.get_attribute("data-place") == place, text
        assert row.find_element(By.CSS_SELECTOR, ".src").text == text
        colours[place] = row.value_of_css_property("background-color")
    assert len(set(colours.values())) == 4  # four places, four colours
    plain = _program_row_plain(browser, _line('print("done")'))
    assert plain.value_of_css_property("background-color") == "rgba(0, 0, 0, 0)"
    # The reasons, on hover (the title) and in full on a click.
    row = _program_row(browser, _line("    spectrum = torch.linalg.svdvals(big)"))
    title = row.get_attribute("title")
    assert title.startswith("aten::_linalg_svd.U ran through DirectML's CPU fallback: 3 calls")
    why = row.find_element(By.XPATH, "following-sibling::tr[1]")
    assert not why.is_displayed()
    row.click()
    assert why.is_displayed() and why.text == title
    row.click()
    assert not why.is_displayed()
    fixed = _program_row(browser, _line("    opt.step()")).get_attribute("title")
    assert fixed.startswith("aten::_foreach_add_.List fixed on the device by dmlpatch (3 calls)")
    cpu = _program_row(browser, _line("    out = head(features.cpu())")).get_attribute("title")
    assert "on the CPU, where the program left its tensors: 3 calls" in cpu
    assert "(matmul)" in cpu
    device = _program_row(browser, _line("    features = model(x)")).get_attribute("title")
    assert device.startswith("on privateuseone:0: ")


def _program_row_plain(browser: WebDriver, line: int) -> object:
    section = browser.find_element(By.CSS_SELECTOR, "section.file.program")
    (row,) = [
        row
        for row in section.find_elements(By.CSS_SELECTOR, "tr")
        if row.find_elements(By.CSS_SELECTOR, "td.num")
        and row.find_element(By.CSS_SELECTOR, "td.num").text == str(line)
    ]
    return row


def test_fallbacks_come_costliest_first_and_link_to_their_catalogue_entry(
    browser: WebDriver, checked: tuple[Path, str]
) -> None:
    page, _ = checked
    browser.get(page.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#fallbacks tbody tr")
    operators = [row.find_element(By.CSS_SELECTOR, "code").text for row in rows]
    assert operators == ["aten::_linalg_svd.U", "aten::_linalg_eigh.eigenvalues"]
    first = rows[0].find_elements(By.TAG_NAME, "a")
    assert first[0].text == f"program.py:{_line('    spectrum = torch.linalg.svdvals(big)')}" + (
        " in <module>"
    )
    link = first[-1]
    assert link.text == "linalg"
    link.click()
    assert browser.execute_script("return location.hash") == "#known-linalg"
    entry = browser.find_element(By.ID, "known-linalg")
    assert "dmlpatch.opfix.linalg.lu" in entry.text
    # The line link lands on the marked line.
    browser.get(page.as_uri())
    browser.find_elements(By.CSS_SELECTOR, "#fallbacks tbody tr a")[0].click()
    target = browser.execute_script("return location.hash").lstrip("#")
    assert browser.find_element(By.ID, target).get_attribute("data-place") == "fallback"


def test_a_library_file_shows_its_computing_lines_with_context(
    browser: WebDriver, checked: tuple[Path, str]
) -> None:
    page, _ = checked
    browser.get(page.as_uri())
    section = browser.find_element(By.CSS_SELECTOR, "section.file.library")
    assert section.find_element(By.TAG_NAME, "h2").text == "blocks.py (a library)"
    numbers = [cell.text for cell in section.find_elements(By.CSS_SELECTOR, "td.num") if cell.text]
    forward = LIBRARY.splitlines().index("        return torch.relu(self.proj(x))") + 1
    marked = section.find_element(By.ID, f"{section.get_attribute('id')}-L{forward}")
    assert marked.get_attribute("data-place") == "device"
    # The lines around it and nothing of the 180 lines of helpers below.
    assert numbers == [str(n) for n in range(forward - 3, forward + 4)]
    assert len(LIBRARY.splitlines()) > 150


def test_every_link_resolves_and_nothing_is_fetched(
    browser: WebDriver, checked: tuple[Path, str]
) -> None:
    page, _ = checked
    browser.get(page.as_uri())
    targets = browser.execute_script(
        "return Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))"
    )
    assert targets and all(target.startswith("#") for target in targets)
    for target in targets:
        assert browser.find_elements(By.ID, target[1:]), target
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert fetched == []
    external = browser.execute_script(
        "return Array.from(document.querySelectorAll('[src], link[href]')).length"
    )
    assert external == 0


def test_an_ordinary_run_writes_the_page_when_the_report_is_named_html(
    browser: WebDriver, workspace: Path
) -> None:
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", "--report=run.html", "program.py"],
        cwd=workspace,
        env=_env(workspace),
    )
    assert result.code == 0, result.err
    browser.get((workspace / "run.html").as_uri())
    verdict = browser.find_element(By.ID, "verdict").text
    assert "of model compute" in verdict and "through DirectML's CPU fallback" in verdict
    assert (
        _program_row(browser, _line("    features = model(x)")).get_attribute("data-place")
        == "device"
    )
    assert (
        _program_row(browser, _line("    out = head(features.cpu())")).get_attribute("data-place")
        == "cpu"
    )
    svd = _program_row(browser, _line("    spectrum = torch.linalg.svdvals(big)"))
    # An ordinary run counts each fallback's copies per call.
    assert re.search(r"3 calls, 12 copies \(\d", svd.get_attribute("title")), svd.get_attribute(
        "title"
    )
    notice = browser.find_element(By.ID, "legend-note").text
    assert "dmlpatch check" in notice


def test_a_page_directory_that_is_a_file_is_one_line_before_the_program_runs(
    workspace: Path,
) -> None:
    (workspace / "taken").write_text("mine")
    result = run_python(
        ["-m", "dmlpatch", "check", "--html", "taken", "program.py"],
        cwd=workspace,
        env=_env(workspace),
    )
    assert result.code == 2
    assert result.out == ""
    assert result.err_lines == [
        f"dmlpatch: error: cannot write the page in {str(workspace / 'taken')!r}: it is a file, "
        "not a directory"
    ]
    assert (workspace / "taken").read_text() == "mine"
