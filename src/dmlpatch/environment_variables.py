"""Every environment variable dmlpatch reads or sets, with its meaning.

Each name is spelled here once; the modules that read or set one import its constant, so a
reader finds every use of ``DMLPATCH_DEVICE`` by that word, and nothing reads a variable this
table does not explain. The README's "Environment variables" table is this table
(``tests/unit/test_environment_variables.py`` checks both ways). OpenTelemetry's
``environment_variables.py`` is the model.

Variables of other tools that dmlpatch only reads as they mean them (``RANK``, ``LOCAL_RANK``,
``XDG_CACHE_HOME``, ``CXX``, pip's) are not listed; ``PYTHONPATH`` is, because dmlpatch sets it
for the program's children.
"""

from __future__ import annotations

DMLPATCH_DEVICE = "DMLPATCH_DEVICE"
DMLPATCH_SCOPE = "DMLPATCH_SCOPE"
DMLPATCH_BF16 = "DMLPATCH_BF16"
DMLPATCH_REPORT = "DMLPATCH_REPORT"
DMLPATCH_VERBOSE = "DMLPATCH_VERBOSE"
DMLPATCH_DEBUG = "DMLPATCH_DEBUG"
DMLPATCH_QUIET = "DMLPATCH_QUIET"
DMLPATCH_ACCOUNTING = "DMLPATCH_ACCOUNTING"
DMLPATCH_DISABLE = "DMLPATCH_DISABLE"
DMLPATCH_PATCHES = "DMLPATCH_PATCHES"
DMLPATCH_DISABLE_PATCHES = "DMLPATCH_DISABLE_PATCHES"
DMLPATCH_CPU_OPS = "DMLPATCH_CPU_OPS"
DMLPATCH_DEVICE_OPS = "DMLPATCH_DEVICE_OPS"
DMLPATCH_COST_PROFILE = "DMLPATCH_COST_PROFILE"
DMLPATCH_CACHE_DIR = "DMLPATCH_CACHE_DIR"
DMLPATCH_TRACE = "DMLPATCH_TRACE"
DMLPATCH_SIM_PROFILE = "DMLPATCH_SIM_PROFILE"
DMLPATCH_SIM_ADAPTERS = "DMLPATCH_SIM_ADAPTERS"
DMLPATCH_SIM_DEVICES = "DMLPATCH_SIM_DEVICES"
DMLPATCH_SIM_FLOAT64 = "DMLPATCH_SIM_FLOAT64"
DMLPATCH_SIM_FAULT = "DMLPATCH_SIM_FAULT"
DMLPATCH_MAIN = "DMLPATCH_MAIN"
DMLPATCH_ANNOUNCE_RANK_ZERO = "DMLPATCH_ANNOUNCE_RANK_ZERO"
PYTHONPATH = "PYTHONPATH"

#: Each variable and what it means, in the README's words and order (markdown).
MEANINGS = {
    DMLPATCH_DEVICE: "the device spec, as `--device` (which sets it for the program's children)",
    DMLPATCH_SCOPE: "where CUDA sites are rewritten: `all`, `project` or `specs`, as `--scope`",
    DMLPATCH_BF16: "what bfloat16 runs as on DirectML: `float32` (default) or `float16`, "
    "as `--bf16`",
    DMLPATCH_REPORT: "write the JSON report to this file at exit (`-`: stderr), as "
    "`--report=FILE`; `{rank}` in it gives each process of a job its own",
    DMLPATCH_VERBOSE: "`1`: say what is patched, as `-v`",
    DMLPATCH_DEBUG: "`1`: as `DMLPATCH_VERBOSE`, and dmlpatch's own traceback before an error line",
    DMLPATCH_QUIET: "`1`: no warning line at exit when most model compute ran on the CPU",
    DMLPATCH_ACCOUNTING: "`0`: no counting of where the compute ran",
    DMLPATCH_DISABLE: "`1`: dmlpatch does nothing in this process (an activated environment "
    "included)",
    DMLPATCH_PATCHES: "directories of local patch specs, separated like `PATH`; a spec there "
    "replaces the built-in one of the same name",
    DMLPATCH_DISABLE_PATCHES: "comma-separated names of patch specs or packs to leave out",
    DMLPATCH_CPU_OPS: "comma-separated operators (`aten::name`) to run on the CPU instead of "
    "the device",
    DMLPATCH_DEVICE_OPS: "comma-separated operators (`aten::name`, or `all`) whose dmlpatch fix "
    "runs on the device whatever the cost model says a CPU fallback would save",
    DMLPATCH_COST_PROFILE: "the adapter profile that prices device work: a shipped one "
    "(`rdna2-desktop`, `rdna3-desktop`, `intel-igpu`, `intel-arc`) or a profile file; on the "
    "simulated device, the adapter it models",
    DMLPATCH_CACHE_DIR: "where caches live (default `$XDG_CACHE_HOME/dmlpatch` or "
    "`~/.cache/dmlpatch`)",
    DMLPATCH_TRACE: "`1`: the simulated device records where each operator was first called "
    "(`dmlpatch check` sets it)",
    DMLPATCH_SIM_PROFILE: "the simulated device's gap profile, as `dmlpatch check --profile` "
    "(default: the one of torch-directml 0.2.5)",
    DMLPATCH_SIM_ADAPTERS: "`;`-separated names of the simulated adapters",
    DMLPATCH_SIM_DEVICES: "how many simulated adapters (default: as many as named, else 1)",
    DMLPATCH_SIM_FLOAT64: "`0`: the simulated adapter refuses float64, as some DirectML "
    "adapters do",
    DMLPATCH_SIM_FAULT: "`drop-scalar-writes`: the simulated device reproduces DirectML's "
    "dropped scalar writes",
    DMLPATCH_MAIN: "set for children: the main script the runner rewrote, which spawn children "
    "rewrite too",
    DMLPATCH_ANNOUNCE_RANK_ZERO: "set for children: only rank 0 of a job says which device "
    "it runs on",
    PYTHONPATH: "set for children: the runner puts its `sitecustomize` first, so child "
    "processes start patched",
}
