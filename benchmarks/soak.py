"""Soak: the example CNN and a YOLO epoch under ``python -m dmlpatch --device sim``, many times.

    python benchmarks/soak.py [--runs N] [--parallel P] [--only cnn|yolo]

Each workload runs N times one after another (default 50), then N times again with P processes
at once (default 4), each run a fresh process:

- ``cnn``: ``examples/train_cnn.py`` as it is (2 epochs of synthetic CIFAR-10-sized data);
- ``yolo``: ``YOLO("yolov8n.yaml").train(...)``, one epoch at imgsz=64 on the tests' synthetic
  dataset (``tests/e2e/yolo/yolo_fixtures.py``), then ultralytics' own final validation; offline,
  with sockets refused and logged, as the tests run it.

Each workload has its own empty caches, so its first run is the cold one:
``DMLPATCH_CACHE_DIR`` (the simulated device's build, patch plans) and ``PYTHONPYCACHEPREFIX``,
where the bytecode cache of rewritten modules (``*.opt-dmlpatch*.pyc``, see
``dmlpatch.rewriting.bytecode_cache``) goes instead of the ``__pycache__`` directories of the
installed targets. Bytecode is written, as
users' interpreters write it. (Neither workload imports a rewritten module today: the
ultralytics spec only wraps functions, so that cache stays empty; the GFPGAN stack fills it.)

Reported: failures (must be 0); each child's own peak RSS (``os.wait4``; it includes the
children a run waits for, so run 1's includes the simulated device's compiler), run 1 against
the runs after it (median, max, and growth: the median of the last runs over that of the first
warm ones); the size of dmlpatch's caches after run 1 and after the last run. Anything the
caches gain after a workload's first run (files or bytes) fails the soak, as does a
failed run: the exit status is then 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "examples" / "train_cnn.py"
YOLO_TRAIN = textwrap.dedent(
    """
    import sys

    from ultralytics import YOLO

    data, project = sys.argv[1:3]
    YOLO("yolov8n.yaml").train(
        data=data, epochs=1, imgsz=64, batch=4, workers=0, seed=1, device="dml", amp=False,
        plots=False, project=project, name="train", exist_ok=True,
    )
    """
)
#: Runs whose RSS medians are compared for growth, at each end of a phase.
WINDOW = 10
#: A dmlpatch bytecode-cache file, finished or a temporary one left behind.
TAGGED_PYC = "*.opt-dmlpatch*"
#: The cache reported but not judged: CPython's own bytecode of everything the runs import.
NOT_OURS = "CPython's own pycs"


@dataclass
class Run:
    index: int
    code: int
    seconds: float
    rss_mib: float
    log: Path


@dataclass
class Phase:
    workload: str
    mode: str
    runs: list[Run] = field(default_factory=list)


@dataclass(frozen=True)
class Tree:
    files: dict[str, int]  # relative path -> size

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


class Soak:
    def __init__(self, root: Path, workloads: list[str]) -> None:
        self.root = root
        self.logs = root / "logs"
        self.outputs = root / "outputs"
        for directory in (self.logs, self.outputs):
            directory.mkdir()
        self.netlog = root / "network.log"
        self.data = self.root / "data" / "data.yaml"
        sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e" / "yolo")]
        if "yolo" in workloads:
            import yolo_fixtures  # test helpers, found through the path above (cv2, matplotlib)

            yolo_fixtures.build_dataset(self.data.parent)
            config = yolo_fixtures.build_config_dir(self.root / "config")
            self.env = yolo_fixtures.offline_env(config, self.netlog)
            (self.root / "yolo_train.py").write_text(YOLO_TRAIN, encoding="utf-8")
        else:
            from support import clean_env

            self.env = clean_env()
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def _caches(self, workload: str) -> tuple[Path, Path]:
        """The workload's DMLPATCH_CACHE_DIR and PYTHONPYCACHEPREFIX."""
        return self.root / workload / "dmlpatch-cache", self.root / workload / "pycache"

    def command(self, workload: str, name: str) -> list[str]:
        prefix = [sys.executable, "-m", "dmlpatch", "--device", "sim"]
        if workload == "cnn":
            return [*prefix, str(CNN)]
        project = self.outputs / name
        return [*prefix, str(self.root / "yolo_train.py"), str(self.data), str(project)]

    def start(self, workload: str, index: int, mode: str) -> tuple[subprocess.Popen, Path, float]:
        name = f"{workload}-{mode}-{index}"
        log = self.logs / f"{name}.log"
        with log.open("wb") as stream:
            child = subprocess.Popen(
                self.command(workload, name),
                cwd=self.root,
                env=dict(
                    self.env,
                    DMLPATCH_CACHE_DIR=str(self._caches(workload)[0]),
                    PYTHONPYCACHEPREFIX=str(self._caches(workload)[1]),
                ),
                stdin=subprocess.DEVNULL,
                stdout=stream,
                stderr=subprocess.STDOUT,
            )
        return child, log, time.perf_counter()

    def finish(self, workload: str, mode: str, index: int) -> None:
        shutil.rmtree(self.outputs / f"{workload}-{mode}-{index}", ignore_errors=True)

    def caches(self, workload: str) -> dict[str, Tree]:
        cache, pycache = self._caches(workload)
        tagged = _tree(pycache, TAGGED_PYC)
        pycs = _tree(pycache, "*.pyc").files
        return {
            f"{workload}: DMLPATCH_CACHE_DIR": _tree(cache, "*"),
            f"{workload}: rewritten-module pycs": tagged,
            f"{workload}: {NOT_OURS}": Tree(
                {k: v for k, v in pycs.items() if k not in tagged.files}
            ),
        }


def _tree(root: Path, pattern: str) -> Tree:
    if not root.is_dir():
        return Tree({})
    return Tree(
        {str(p.relative_to(root)): p.stat().st_size for p in root.rglob(pattern) if p.is_file()}
    )


def _dmlpatch_inputs() -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of dmlpatch's sources and patch specs, which its caches depend on."""
    spec = importlib.util.find_spec("dmlpatch")
    packages = list(spec.submodule_search_locations or []) if spec else []
    roots = packages  # the patch specs are inside the package
    return {
        str(path): (path.stat().st_mtime_ns, path.stat().st_size)
        for root in roots
        for path in Path(root).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _reap(pid: int) -> tuple[int, float]:
    """Exit code and peak RSS (MiB) of one child, from its own rusage."""
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024  # KiB on Linux


def sequential(soak: Soak, phase: Phase, indices: range) -> None:
    for index in indices:
        child, log, started = soak.start(phase.workload, index, phase.mode)
        code, rss = _reap(child.pid)
        child.returncode = code  # reaped here, so that Popen does not wait again
        phase.runs.append(Run(index, code, time.perf_counter() - started, rss, log))
        soak.finish(phase.workload, phase.mode, index)
        _progress(phase)


def parallel(soak: Soak, phase: Phase, runs: int, width: int) -> None:
    waiting = iter(range(1, runs + 1))
    active: dict[int, tuple[subprocess.Popen, int, Path, float]] = {}
    while True:
        while len(active) < width and (index := next(waiting, None)) is not None:
            child, log, started = soak.start(phase.workload, index, phase.mode)
            active[child.pid] = (child, index, log, started)
        if not active:
            return
        pid, status, usage = os.wait4(-1, 0)
        if pid not in active:
            continue
        child, index, log, started = active.pop(pid)
        child.returncode = os.waitstatus_to_exitcode(status)
        rss = usage.ru_maxrss / 1024
        phase.runs.append(Run(index, child.returncode, time.perf_counter() - started, rss, log))
        soak.finish(phase.workload, phase.mode, index)
        _progress(phase)


def _progress(phase: Phase) -> None:
    run = phase.runs[-1]
    status = "ok" if run.code == 0 else f"exit {run.code}"
    print(
        f"  {phase.workload} {phase.mode} run {len(phase.runs)}: {status}, "
        f"{run.seconds:.1f} s, {run.rss_mib:.0f} MiB",
        file=sys.stderr,
        flush=True,
    )


def _window(values: list[float]) -> int:
    return min(WINDOW, len(values) // 2)


def _growth(values: list[float]) -> Optional[float]:
    """Median of the last values over that of the first ones (None if too few)."""
    width = _window(values)
    if width == 0:
        return None
    return statistics.median(values[-width:]) / statistics.median(values[:width])


def _tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    return "\n".join(f"    | {line}" for line in text[-lines:])


def report(
    phases: list[Phase], trees: dict[str, dict[str, Tree]], netlog: Path, edited: list[str]
) -> bool:
    print(
        f"{'workload':<9}{'phase':<11}{'runs':>5}{'fail':>5}{'med s':>7}"
        f"{'RSS MiB: run 1':>16}{'median':>8}{'max':>7}{'growth':>8}"
    )
    failures = 0
    growths: list[str] = []
    for phase in phases:
        bad = [run for run in phase.runs if run.code != 0]
        failures += len(bad)
        rss = [run.rss_mib for run in phase.runs]
        # Run 1 of the sequential phase is the cold one; its successors are compared.
        first, later = (rss[0], rss[1:]) if phase.mode == "sequential" else (None, rss)
        growth = _growth(later)
        growths.append(f"{phase.workload} {phase.mode} {_ratio(growth)} ({_window(later)})")
        median = f"{statistics.median(later):.0f}" if later else "-"
        print(
            f"{phase.workload:<9}{phase.mode:<11}{len(phase.runs):>5}{len(bad):>5}"
            f"{statistics.median(r.seconds for r in phase.runs):>7.1f}"
            f"{'-' if first is None else f'{first:.0f}':>16}{median:>8}"
            f"{f'{max(later):.0f}' if later else '-':>7}{_ratio(growth):>8}"
        )
        for run in bad[:3]:
            print(f"  run {run.index} exited {run.code}; the end of {run.log.name}:")
            print(_tail(run.log))
    print()
    print(f"{'cache':<34}{'after run 1':>20}{'after the last run':>22}{'growth':>16}")
    grew = False
    for name, snapshots in trees.items():
        before, after = snapshots["after run 1"], snapshots["after the last run"]
        files = len(after.files) - len(before.files)
        size = after.bytes - before.bytes
        owned = not name.endswith(NOT_OURS)
        changed = sorted(set(after.files.items()) ^ set(before.files.items()))
        grew |= owned and bool(files or size or changed)
        print(f"{name:<34}{_size(before):>20}{_size(after):>22}{f'{files:+d} f, {size:+d} B':>16}")
        if owned:
            for path, _ in changed[:5]:
                print(f"  changed: {path}")
    if edited:
        # A cache keyed on these files is rebuilt after an edit: growth is then not the soak's.
        print(f"dmlpatch's sources or specs changed during the soak ({len(edited)}), e.g.:")
        for path in edited[:5]:
            print(f"  edited: {path}")
    attempts = netlog.read_text().splitlines() if netlog.exists() else []
    if attempts:
        print(f"network attempts (refused): {len(attempts)}, e.g. {attempts[0]}")
    total = sum(len(phase.runs) for phase in phases)
    ok = failures == 0 and not grew
    ratios = ", ".join(
        f"{name} {_size_ratio(s['after run 1'], s['after the last run'])}"
        for name, s in trees.items()
        if not name.endswith(NOT_OURS)
    )
    print()
    print(
        f"verdict: {'PASS' if ok else 'FAIL'}: {failures}/{total} runs failed; cache size last/"
        f"run 1: {ratios}; RSS growth (median of the last N / first N warm runs, N): "
        + "; ".join(growths)
    )
    return ok


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _size_ratio(before: Tree, after: Tree) -> str:
    if not before.bytes:
        return "1.000x (both empty)" if not after.bytes else "inf (was empty)"
    return _ratio(after.bytes / before.bytes)


def _size(tree: Tree) -> str:
    return f"{len(tree.files)} f, {tree.bytes / 2**20:.2f} MiB"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per workload and phase")
    parser.add_argument("--parallel", type=int, default=4, help="processes at once, phase 2")
    parser.add_argument("--only", choices=("cnn", "yolo"), help="one workload instead of both")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.parallel < 1:
        parser.error("--runs and --parallel must be at least 1")
    workloads = [args.only] if args.only else ["cnn", "yolo"]
    started = time.perf_counter()
    inputs = _dmlpatch_inputs()
    with tempfile.TemporaryDirectory(prefix="dmlpatch-soak-") as directory:
        soak = Soak(Path(directory), workloads)
        trees: dict[str, dict[str, Tree]] = {}
        phases: list[Phase] = []
        for workload in workloads:
            serial, wide = (
                Phase(workload, "sequential"),
                Phase(workload, f"parallel{args.parallel}"),
            )
            print(f"{workload}: run 1 (cold caches)", file=sys.stderr)
            sequential(soak, serial, range(1, 2))
            for name, tree in soak.caches(workload).items():
                trees[name] = {"after run 1": tree}
            if args.runs > 1:
                print(f"{workload}: runs 2-{args.runs}, one at a time", file=sys.stderr)
            sequential(soak, serial, range(2, args.runs + 1))
            print(f"{workload}: {args.runs} runs, {args.parallel} at once", file=sys.stderr)
            parallel(soak, wide, args.runs, args.parallel)
            for name, tree in soak.caches(workload).items():
                trees[name]["after the last run"] = tree
            phases += [serial, wide]
        now = _dmlpatch_inputs()
        edited = sorted(k for k in inputs.keys() | now.keys() if inputs.get(k) != now.get(k))
        ok = report(phases, trees, soak.netlog, edited)
    print(f"wall time: {(time.perf_counter() - started) / 60:.1f} min")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
