"""What rewritten code's CUDA API answers (``dmlpatch.runtime.cuda_api``, ``amp``,
``accelerator``) for a given resolution: DirectML's truth on an accelerator, torch's own
answer (or failure) anywhere else. The end-to-end runs are in tests/e2e/test_cuda_api.py."""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

import pytest
import torch

from corpus._harness import accelerator, cpu
from dmlpatch import log
from dmlpatch.devices import adapters, resolution
from dmlpatch.runtime import amp, cuda_api, cuda_device
from dmlpatch.runtime import sites as runtime


@pytest.fixture
def on(monkeypatch: pytest.MonkeyPatch) -> Callable[[resolution.Resolution], None]:
    def use(target: resolution.Resolution) -> None:
        monkeypatch.setattr(resolution, "current", lambda: target)
        monkeypatch.setattr(cuda_device, "_current_ordinal", 0)

    return use


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(log, "_said", set())
    monkeypatch.setattr(log, "say", lines.append)
    return lines


def directml(*indices: int) -> resolution.Resolution:
    return accelerator(*indices)._replace(backend="directml")


# -- properties and memory ----------------------------------------------------------------------


def test_properties_name_the_mapped_adapter_with_no_cuda_capability(on) -> None:
    on(accelerator(1, 0))
    properties = cuda_api.get_device_properties(0)
    assert (properties.name, properties.total_memory) == ("Fake adapter 1", 8 * 2**30)
    assert (properties.major, properties.minor) == (0, 0)
    assert cuda_api.get_device_capability("cuda:1") == (0, 0)
    assert cuda_api.get_device_properties(torch.device("cuda", 1)).name == "Fake adapter 0"
    assert "total_memory=8192MB" in repr(properties)
    assert cuda_api.is_bf16_supported() is False
    with pytest.raises(RuntimeError, match="invalid device ordinal 2"):
        cuda_api.get_device_properties(2)


def test_unknown_memory_reads_zero_and_is_said_once(on, said: list[str]) -> None:
    on(directml(0))
    assert cuda_api.get_device_properties().total_memory == 0
    assert cuda_api.get_device_properties().total_memory == 0
    assert said == [
        "warning: the memory size of Fake adapter 0 is unknown on this system (DirectML does "
        "not report it); torch.cuda.get_device_properties(...).total_memory reads 0"
    ]
    with pytest.raises(RuntimeError, match="memory size of Fake adapter 0 is unknown"):
        cuda_api.mem_get_info()


def _held(index: int) -> int:
    """What the simulated allocator holds for adapter ``index``: tests run before these in the
    same process may have left tensors there; 0 before it loads (or for an adapter it lacks)."""
    import dmlpatch.sim as sim

    return sim.memory_allocated(index) if sim.is_loaded() and index < sim.device_count() else 0


def _peak(index: int) -> int:
    import dmlpatch.sim as sim

    loaded = sim.is_loaded() and index < sim.device_count()
    return sim.max_memory_allocated(index) if loaded else 0


def test_memory_statistics_of_the_simulated_device(on) -> None:
    on(accelerator(0))
    cuda_api.reset_peak_memory_stats()
    held = _held(0)
    assert cuda_api.memory_allocated() == cuda_api.max_memory_allocated() == held
    assert cuda_api.memory_reserved(0) == cuda_api.max_memory_reserved("cuda:0") == held
    assert cuda_api.mem_get_info() == (8 * 2**30 - held, 8 * 2**30)
    assert cuda_api.memory_stats()["allocated_bytes.all.peak"] == held
    summary = f"DirectML memory of Fake adapter 0: {held / 2**20:.1f} MiB"
    assert cuda_api.memory_summary().startswith(summary)


def test_off_the_accelerator_every_name_is_torch_cuda_s_own(on) -> None:
    on(cpu())
    with pytest.raises((RuntimeError, AssertionError)):
        cuda_api.get_device_properties(0)
    assert cuda_api.memory_allocated() == torch.cuda.memory_allocated()
    assert cuda_api.OutOfMemoryError is torch.cuda.OutOfMemoryError
    with pytest.raises((TypeError, RuntimeError)):  # "type torch.cuda.FloatTensor not available"
        cuda_api.FloatTensor(2)
    with pytest.raises((RuntimeError, AssertionError)):
        cuda_api.Event(enable_timing=True).record()


def test_registry_memory_of_the_adapter_named_by_directml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows' registry, as a stand-in module with its API (nothing else is replaced)."""
    adapters_in_registry = {
        "0000": {"DriverDesc": "Intel(R) UHD Graphics", "HardwareInformation.MemorySize": 2**30},
        "0001": {
            "DriverDesc": "AMD Radeon RX 6600",
            "HardwareInformation.qwMemorySize": 8 * 2**30,
        },
        "0002": {"DriverDesc": "Old card", "HardwareInformation.MemorySize": b"\x00\x00\x00\x20"},
        "Properties": {},
    }

    class Key:
        def __init__(self, values: dict[str, Any]) -> None:
            self.values = values

        def __enter__(self) -> Key:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def open_key(parent: Any, name: str) -> Key:
        if parent == "HKLM":
            return Key({})
        if name not in adapters_in_registry:
            raise OSError(name)
        return Key(adapters_in_registry[name])

    def enum_key(key: Key, index: int) -> str:
        names = list(adapters_in_registry)
        if index >= len(names):
            raise OSError("no more")
        return names[index]

    def query(key: Key, name: str) -> tuple[Any, int]:
        if name not in key.values:
            raise FileNotFoundError(name)
        return key.values[name], 0

    fake = types.SimpleNamespace(
        HKEY_LOCAL_MACHINE="HKLM", OpenKey=open_key, EnumKey=enum_key, QueryValueEx=query
    )
    monkeypatch.setitem(sys.modules, "winreg", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    assert adapters.total_memory("directml", "AMD Radeon RX 6600") == 8 * 2**30
    assert adapters.total_memory("directml", "Intel(R) UHD Graphics") == 2**30
    assert adapters.total_memory("directml", "Old card") == 2**29
    assert adapters.total_memory("directml", "Missing") is None
    monkeypatch.setattr(sys, "platform", "linux")
    assert adapters.total_memory("directml", "AMD Radeon RX 6600") is None


# -- the current device, streams, events ----------------------------------------------------------


def test_device_context_sets_and_restores_the_ordinal(on) -> None:
    on(accelerator(0, 1))
    with cuda_api.device(1):
        assert runtime.current_device() == 1
        with cuda_api.device("cuda:0"):
            assert runtime.current_device() == 0
        assert runtime.current_device() == 1
    assert runtime.current_device() == 0


def test_events_time_only_when_asked(on) -> None:
    on(accelerator(0))
    untimed, end = cuda_api.Event(), cuda_api.Event(enable_timing=True)
    end.recorded_at = 1.0
    untimed.recorded_at = 0.5
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(end)
    start = cuda_api.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="must be recorded"):
        start.elapsed_time(end)
    start.recorded_at = 0.25
    assert start.elapsed_time(end) == 750.0
    assert cuda_api.Stream() == cuda_api.current_stream() == cuda_api.default_stream(0)
    assert cuda_api.Stream().query() and start.query()


# -- AMP ------------------------------------------------------------------------------------------


#: Here no operator fixes are installed (the target is a resolution, not a loaded device), so
#: DirectML's autocast kernels are missing: the run is float32, said once. With the kernels (the
#: simulated device), autocast runs in float16: tests/e2e/opfix/test_opfix_autocast.py.
AMP_LINE = (
    "warning: DirectML's autocast kernels are not installed: the program's autocast and "
    "GradScaler are off and it runs in float32 on privateuseone:0"
)


@pytest.mark.parametrize(
    ("callee", "args", "kwargs"),
    [
        (torch.autocast, ("cuda",), {}),
        (torch.autocast, (), {"device_type": "cuda", "dtype": torch.float16}),
        (torch.autocast, ("privateuseone",), {}),
        # device_type = 'cuda' if ... else 'cpu', rewritten: the program's device string
        (torch.autocast, (), {"device_type": "privateuseone:0"}),
        (torch.amp.autocast, (torch.device("cuda", 0).type,), {}),
        (torch.cuda.amp.autocast, (), {}),
        (torch.cuda.amp.autocast, (True, torch.float16), {}),
    ],
)
def test_autocast_without_the_kernels_is_float32_said_once(
    on, said: list[str], callee: Any, args: tuple, kwargs: dict
) -> None:
    on(accelerator(0))
    context = amp.autocast(callee, *args, **kwargs)
    assert not isinstance(context, torch.autocast)
    with context:
        assert not torch.is_autocast_enabled()
    assert said == [AMP_LINE]

    @amp.autocast(callee, *args, **kwargs)
    def decorated() -> float:
        return torch.ones(1).item()

    assert decorated() == 1.0
    assert said == [AMP_LINE]


@pytest.mark.parametrize(
    ("callee", "args", "kwargs"),
    [
        (torch.autocast, ("cuda",), {"enabled": False}),
        (torch.autocast, ("cuda", torch.float16, False), {}),
        (torch.cuda.amp.autocast, (False,), {}),
    ],
)
def test_disabled_autocast_says_nothing(
    on, said: list[str], callee: Any, args: tuple, kwargs: dict
) -> None:
    on(accelerator(0))
    with amp.autocast(callee, *args, **kwargs):
        pass
    assert said == []


def test_cpu_autocast_and_runs_off_directml_are_torch_s(on, said: list[str]) -> None:
    on(accelerator(0))
    context = amp.autocast(torch.autocast, "cpu", dtype=torch.bfloat16)
    assert isinstance(context, torch.autocast)
    assert (context.device, context.fast_dtype) == ("cpu", torch.bfloat16)
    on(cpu())
    assert isinstance(amp.autocast(torch.autocast, "cpu"), torch.autocast)
    assert said == []


@pytest.mark.parametrize(
    ("callee", "args", "kwargs", "says"),
    [
        (torch.amp.GradScaler, (), {}, True),
        (torch.amp.GradScaler, ("cuda",), {"init_scale": 1024.0}, True),
        (torch.amp.GradScaler, ("cuda", 2.0**16, 2.0, 0.5, 2000, False), {}, False),
        (torch.cuda.amp.GradScaler, (), {}, True),
        (torch.cuda.amp.GradScaler, (2.0**16, 2.0, 0.5, 2000, False), {}, False),
        (torch.cuda.amp.GradScaler, (), {"enabled": False}, False),
    ],
)
def test_grad_scaler_without_the_kernels_is_the_identity(
    on, said: list[str], callee: Any, args: tuple, kwargs: dict, says: bool
) -> None:
    on(accelerator(0))
    scaler = amp.grad_scaler(callee, *args, **kwargs)
    assert not scaler.is_enabled()
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss
    assert said == ([AMP_LINE] if says else [])


def test_grad_scaler_for_the_cpu_is_torch_s(on, said: list[str]) -> None:
    on(accelerator(0))
    scaler = amp.grad_scaler(torch.amp.GradScaler, "cpu")
    assert scaler.is_enabled()
    assert said == []


# -- torch.accelerator ----------------------------------------------------------------------------


def test_accelerator_answers_for_the_mapped_adapters(on) -> None:
    from dmlpatch.runtime import accelerator as api

    on(accelerator(2, 0))
    assert api.is_available() is True
    assert api.device_count() == 2
    assert api.current_device_index() == api.current_device_idx() == 0
    api.set_device_index(1)
    assert runtime.current_device() == 1  # torch.cuda code in the same program agrees
    api.set_device_index(torch.device("privateuseone", 2))  # the target's own device: adapter 2
    assert api.current_device_index() == 0
    with api.device_index(1):
        assert api.current_device_index() == 1
    assert api.current_device_index() == 0
    # cuda:0 is adapter 2, which the simulated device lacks; cuda:1 is its adapter 0
    assert api.memory_allocated() == 0
    assert api.max_memory_allocated(1) == _peak(0)
    assert api.get_memory_info() == (8 * 2**30, 8 * 2**30)
    with pytest.raises(RuntimeError, match="not one of the adapters dmlpatch maps"):
        api.set_device_index("privateuseone:1")


def test_accelerator_off_directml_is_torch_s(on) -> None:
    from dmlpatch.runtime import accelerator as api

    on(cpu())
    if not hasattr(torch, "accelerator"):  # torch-directml's torch 2.4.1: missing, as there
        with pytest.raises(AttributeError):
            api.is_available()
        return
    assert api.is_available() == torch.accelerator.is_available()
    assert api.device_count() == torch.accelerator.device_count()
    assert api.current_accelerator() == torch.accelerator.current_accelerator()


# -- .cuda() on objects with their own to() ----------------------------------------------------


class _Descriptor:
    """Like spandrel's ModelDescriptor: ``to(device, dtype)`` and nothing else."""

    def __init__(self) -> None:
        self.moved: list[tuple[Any, ...]] = []

    def to(self, device: Any = None, dtype: Any = None) -> _Descriptor:
        self.moved.append((device, dtype))
        return self

    def cuda(self, device: Any = None) -> _Descriptor:
        raise AssertionError("its own cuda() reaches CUDA")


class _Loose:
    def __init__(self) -> None:
        self.moved: list[tuple[Any, dict[str, Any]]] = []

    def to(self, *args: Any, **kwargs: Any) -> _Loose:
        self.moved.append((args, kwargs))
        return self


def test_cuda_of_an_object_with_its_own_to_passes_what_it_takes(on) -> None:
    on(accelerator(0, 1))
    target = torch.device("privateuseone", 1)
    descriptor = _Descriptor()
    assert runtime.cuda(descriptor) is descriptor
    assert runtime.cuda(descriptor, 1, non_blocking=True) is descriptor
    assert descriptor.moved == [(torch.device("privateuseone", 0), None), (target, None)]
    loose = _Loose()
    runtime.cuda(loose, "cuda:1", True)
    assert loose.moved == [((target,), {"non_blocking": True})]


def test_cuda_on_a_cuda_gpu_is_the_object_s_own(on) -> None:
    on(accelerator(0)._replace(backend="cuda", type="cuda"))
    with pytest.raises(AssertionError, match="its own cuda"):
        runtime.cuda(_Descriptor())
    on(cpu())
    descriptor = _Descriptor()
    runtime.cuda(descriptor)
    assert descriptor.moved == [(torch.device("cpu"), None)]


# -- the rest of torch.cuda a program calls once it has its device ------------------------------


def test_random_numbers_come_from_the_device_s_generator(on, said: list[str]) -> None:
    """DirectML draws from the CPU's default generator: the RNG family answers for it."""
    on(accelerator(0, 1))
    saved = torch.get_rng_state()
    try:
        _round_trips(said)
    finally:
        torch.set_rng_state(saved)


def _round_trips(said: list[str]) -> None:
    cuda_api.manual_seed_all(11)
    assert cuda_api.initial_seed() == 11
    state = cuda_api.get_rng_state("cuda:1")
    first = torch.rand(3)
    cuda_api.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    states = cuda_api.get_rng_state_all()
    assert len(states) == 2 and torch.equal(states[0], cuda_api.get_rng_state(0))
    assert cuda_api.default_generators == (torch.default_generator,) * 2
    cuda_api.set_rng_state(torch.zeros(16, dtype=torch.uint8))  # a CUDA generator's state
    assert torch.equal(cuda_api.get_rng_state(), states[0])
    assert said == [
        "warning: torch.cuda.set_rng_state was given a CUDA generator's state (16 bytes); "
        f"DirectML draws from the CPU generator ({states[0].numel()} bytes), which keeps its "
        "state"
    ]
    with pytest.raises(RuntimeError, match="invalid device ordinal 2"):
        cuda_api.get_rng_state(2)


def test_graphs_fail_clearly_and_graphed_callables_run_as_they_are(on) -> None:
    on(accelerator(0))
    for name in ("CUDAGraph", "graph", "graph_pool_handle"):
        with pytest.raises(RuntimeError, match=f"torch.cuda.{name}: CUDA graphs have no DirectML"):
            getattr(cuda_api, name)()
    layer = torch.nn.Linear(2, 2)
    assert cuda_api.make_graphed_callables(layer, (torch.ones(1, 2),)) is layer
    assert cuda_api.is_current_stream_capturing() is False
    with cuda_api.StreamContext(cuda_api.current_stream()):
        cuda_api.set_stream(cuda_api.Stream())


def test_nvtx_ranges_do_nothing_on_the_device(on) -> None:
    on(accelerator(0))
    assert cuda_api.nvtx.range_push("step") == 0
    assert cuda_api.nvtx.range_pop() == 0
    cuda_api.nvtx.mark("here")
    cuda_api.nvtx.range_end(cuda_api.nvtx.range_start("a"))
    with cuda_api.nvtx.range("forward"):
        pass


def test_peers_device_of_and_nested_statistics(on) -> None:
    on(accelerator(0, 1))
    assert cuda_api.can_device_access_peer(0, 1) is False
    assert cuda_api.is_tf32_supported() is False
    assert cuda_api.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["peak"] == _peak(0)
    assert cuda_api.memory_cached() == _held(0)
    assert cuda_api.max_memory_cached() == _peak(0)
    assert cuda_api.memory_snapshot() == []
    assert cuda_api.get_per_process_memory_fraction() == 1.0
    tensor = types.SimpleNamespace(device=torch.device("privateuseone", 1))
    with cuda_api.device_of(tensor):
        assert runtime.current_device() == 1
    assert runtime.current_device() == 0


def test_answered_classes_stay_classes_for_annotations_and_isinstance(on) -> None:
    """transformers 5 annotates ``def get_graph(...) -> torch.cuda.CUDAGraph | None`` at import."""
    on(accelerator(0))
    for name in ("CUDAGraph", "graph", "StreamContext", "Stream", "Event", "device"):
        answer = getattr(cuda_api, name)
        assert isinstance(answer, type) and (answer | None) is not None
        assert not isinstance(object(), answer)


def test_the_random_submodule_is_the_rng_family(on) -> None:
    """transformers' Trainer saves ``torch.cuda.random.get_rng_state_all()`` with checkpoints."""
    on(accelerator(0))
    assert cuda_api.random.get_rng_state_all()[0].numel() == torch.get_rng_state().numel()
    assert cuda_api.random.initial_seed() == torch.initial_seed()


def test_the_facade_hands_out_each_answer_itself() -> None:
    """Rewritten code reaches every answer through ``cuda_api``: the object of the module that
    holds it, not a wrapper, so that no call pays for the split into modules."""
    import importlib
    import pkgutil

    from dmlpatch import runtime as package

    holders = [
        importlib.import_module(f"{package.__name__}.{module.name}")
        for module in pkgutil.iter_modules(package.__path__)
        # cuda_device maps the program's ordinals (its own device() is for CUDA literals).
        if module.name.startswith("cuda_") and module.name not in ("cuda_api", "cuda_device")
    ]
    held = {
        name: vars(holder)[name]
        for holder in holders
        for name in cuda_api.NAMES
        if name in vars(holder)
    }
    assert set(held) == set(cuda_api.NAMES) - {"default_generators"}
    for name, answer in held.items():
        assert vars(cuda_api)[name] is answer, name
