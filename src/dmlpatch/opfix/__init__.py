"""On-device replacements for the operators DirectML refuses or sends to the CPU.

torch-directml refuses some argument combinations outright (``unique`` with counts or
inverse, ``avg_pool`` with ``divisor_override``, ``repeat`` beyond 4-D, ``scatter`` shapes; the
2022 package even ``normal_``), runs operators it lacks on the CPU, two copies per call, and
answers a few calls wrongly (a float times a bool is bool; ``reduction='none'`` loses the
cross-entropy gradient).
Each module here fixes one family with kernels composed only of operators DirectML runs
natively, registered for the ``PrivateUse1`` dispatch key (``AutogradPrivateUse1`` where the
backward is missing too) with :mod:`torch.library`. The modules are grouped in packages by
what they serve (``tensors``, ``layers``, ``optimizers``, ``vision``, ``linalg``, ``complex``,
``precision``), and a catalogue entry (:mod:`dmlpatch.gaps.catalogue`) names the module of its
fix:

========================= ==========================================================================
complex.spectral          ``_fft_r2c``/``_fft_c2c``/``_fft_c2r`` (every FFT and STFT), ``complex``,
                          ``polar``, ``view_as_complex``: complex tensors held as pairs of reals
cpu_ops                   ``DMLPATCH_CPU_OPS=aten::foo,...``: named operators forced to the CPU
layers.attention          ``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``,
                          ``_masked_softmax`` (the fast path of ``nn.MultiheadAttention`` and
                          ``nn.TransformerEncoderLayer`` in eval)
layers.embedding          ``_embedding_bag`` (``nn.EmbeddingBag``) sum and mean, forward and
                          backward
layers.losses             ``logit`` (RT-DETR) and ``binary_cross_entropy``, forward and backward;
                          ``nll_loss_backward`` with ``reduction='none'`` (all-zero gradients)
layers.normalization      ``native_group_norm_backward`` (every diffusion UNet/VAE training step)
layers.rnn                ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` (missing: every
                          LSTM/GRU step)
layers.weight_norm        ``_weight_norm_interface`` and its backward (every weight-normed
                          convolution)
linalg.cholesky           ``linalg_cholesky_ex`` (column by column, as LAPACK),
                          ``_cholesky_solve_helper``, ``cholesky_inverse`` up to 64 columns
linalg.exponential        ``linalg_matrix_exp`` up to 128 columns (scaling and squaring)
linalg.householder        ``linalg_qr``, ``geqrf``, ``ormqr``, ``linalg_householder_product``
                          up to 64 columns (Householder reflections, as LAPACK)
linalg.jacobi             ``_linalg_eigh`` and ``_linalg_svd`` up to 64 columns (Jacobi
                          rotations)
linalg.ldl                ``linalg_ldl_factor_ex``, ``linalg_ldl_solve`` up to 64 columns
                          (Bunch-Kaufman pivoting, as LAPACK)
linalg.least_squares      ``linalg_lstsq`` of full-rank systems up to 64 columns (QR)
linalg.lu                 ``linalg_inv_ex``, ``_linalg_solve_ex``, ``linalg_lu_solve``,
                          ``linalg_lu``, ``linalg_lu_factor_ex``, ``_linalg_det``,
                          ``_linalg_slogdet`` up to 16 rows (LU); ``linalg_solve_triangular``,
                          ``triangular_solve`` up to 64 rows
linalg.nonsymmetric       ``linalg_eig``, ``_linalg_eigvals`` through the CPU (DirectML's own
                          fallback fails on their complex results)
linalg.products           ``dot``, ``vdot``, ``linalg_cross`` (geometry code)
optimizers.foreach        ``_foreach_*`` (every optimizer step on torch 2.4.1) as per-tensor
                          operators
optimizers.fused          ``_fused_adam_``/``_fused_adamw_`` (``Adam``/``AdamW(fused=True)``) as
                          per-tensor operators
precision.float64_draws   ``randn``/``rand``/``normal`` of float64 drawn on the host where the
                          adapter has no float64 (the CPU's numbers)
precision.half_on_host    float16 through the CPU fallback of operators whose CPU kernel has no
                          float16
tensors.allocation        ``empty``/``full`` of bfloat16, complex or float64 on the device;
                          ``torch.load``
tensors.common_fallbacks  ``silu_backward``, ``lerp``, ``nan_to_num``, ``addmv``, ``bincount`` (CPU
                          fallbacks)
tensors.dtypes            ``mul``/``mul_`` by a bool tensor (a bool result) and ``sum`` over uint8
tensors.elementwise       ``clamp``/``clamp_min``/``clamp_max`` with tensor bounds, ``glu`` and its
                          backward, ``nextafter``, ``_assert_async``
tensors.factories         ``eye``
tensors.indexing          ``repeat_interleave`` (tensor repeats), ``count_nonzero``,
                          ``upsample_nearest1d``
tensors.masks             ``isneginf``/``isposinf`` (every transformers attention mask)
tensors.random            ``normal_`` (pytorch-directml 1.8) from ``uniform_`` and Box-Muller
tensors.repeat            ``repeat`` to more than 4 dimensions
tensors.scatter           ``scatter``/``scatter_`` with an index smaller than ``self`` or ``src``
tensors.sparse            sparse tensors moved to the device stay on the CPU (whisper's sparse
                          buffer)
tensors.statistics        ``var_mean``, ``std``, ``amin``, ``aminmax``, ``cumprod``
tensors.transfers         ``_to_copy`` to another adapter (zeros) through the host; bfloat16,
                          complex and float64 arriving on the device
                          (:mod:`dmlpatch.opfix.dtype_policy`)
tensors.unique            ``_unique2`` (counts/inverse), ``unique_dim``, ``unique_consecutive`` and
                          friends
vision.detection          torchvision's ``nms``, ``roi_align``, ``roi_pool``, ``ps_roi_align``,
                          ``ps_roi_pool``, ``deform_conv2d`` and their backwards
vision.pooling            ``avg_pool2d``/``avg_pool3d`` with ``divisor_override``
vision.sampling           ``grid_sampler_2d`` forward and backward (RT-DETR's deformable attention)
vision.resizing           ``_upsample_bilinear2d_aa``/``_upsample_bicubic2d_aa`` (antialiased
                          ``Resize``), ``_upsample_nearest_exact1d/2d/3d``, forward and backward
vision.sliding_blocks     ``im2col``/``col2im`` (``F.unfold``/``F.fold``), forward and backward
========================= ==========================================================================

Four are PyTorch's gaps rather than DirectML's, and are installed for every profile:
:mod:`dmlpatch.opfix.module_moves` keeps parameters the same objects when a module moves to or
from the device (PyTorch replaces them for any ``PrivateUse1`` backend),
:mod:`dmlpatch.opfix.shared_modules` keeps a model's weights in host shared memory when the
program calls ``model.share_memory()`` (Hogwild's workers) and computes on the device with
copies of them, :mod:`dmlpatch.opfix.sharing` stops any other device tensor handed to another
process with one line (there is no inter-process memory to share it through), and
:mod:`dmlpatch.opfix.device_module` gives the device's module what torch's own code asks of
an accelerator's (its RNG state, current device...), which torch-directml's module lacks.

A fix is installed only where the backend has the gap it fixes: on the simulated device per
profile (:mod:`dmlpatch.gaps.profiles`), on real DirectML per torch-directml release
(``dmlpatch.gaps.profiles.DIRECTML_RELEASES``). A fixed kernel that receives arguments
DirectML handles itself passes them to DirectML's own kernel (through the operator's ``.out``
variant, which it registers), so only the calls DirectML would refuse or get wrong change path.

Every call a fix serves is counted as ``fixed`` through :func:`dmlpatch.opfix._accounting.record`.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import TYPE_CHECKING, NamedTuple, Optional

from dmlpatch.environment_variables import DMLPATCH_CPU_OPS

if TYPE_CHECKING:
    import torch

    from dmlpatch.opfix._kernel import Kernel


#: The modules holding fixes, in installation order.
FAMILIES = (
    "tensors.unique",
    "vision.pooling",
    "tensors.repeat",
    "tensors.scatter",
    "tensors.random",
    "tensors.common_fallbacks",
    "layers.rnn",
    "tensors.masks",
    "layers.normalization",
    "tensors.statistics",
    "tensors.factories",
    "layers.losses",
    "tensors.sparse",
    "vision.sampling",
    "vision.resizing",
    "tensors.indexing",
    "optimizers.foreach",
    "optimizers.fused",
    "layers.embedding",
    "tensors.dtypes",
    "tensors.transfers",
    "linalg.lu",
    "linalg.householder",
    "linalg.jacobi",
    "linalg.cholesky",
    "linalg.nonsymmetric",
    "linalg.exponential",
    "linalg.least_squares",
    "linalg.ldl",
    "complex.spectral",
    "tensors.allocation",
    "layers.attention",
    "linalg.products",
    "tensors.elementwise",
    "layers.weight_norm",
    "precision.half_on_host",
    "vision.detection",
    "vision.sliding_blocks",
    "precision.float64_draws",
)


class Installed(NamedTuple):
    """What :func:`install` registered: operator overloads served by fixes, and forced to CPU."""

    backend: str
    profile: Optional[str]
    fixes: tuple[str, ...]
    cpu_ops: tuple[str, ...]


_lock = threading.Lock()
_library: Optional[torch.library.Library] = None
_installed: Optional[Installed] = None
#: Libraries of the fixes installed when their trigger fired.
_triggered: list[torch.library.Library] = []
#: Libraries of the fixes for other operator libraries than aten (``torchvision``).
_namespaced: dict[str, torch.library.Library] = {}


class Gaps(NamedTuple):
    """What a profile lacks: operators with refusal rules, the overloads DirectML runs natively
    (names without ``aten::``; everything else falls back to the CPU), its wrong answers and
    the dtypes it cannot hold (c10 names: ``BFloat16``, ``ComplexFloat``, ``Double``...)."""

    refused: frozenset[str]
    native: frozenset[str]
    quirks: frozenset[str]
    dtypes: frozenset[str] = frozenset()


def gaps(profile: str) -> Gaps:
    """The gaps of a profile (see :class:`Gaps`)."""
    from dmlpatch.gaps import profiles, registered_ops

    chosen = profiles.resolve(profile)
    refused = profiles.refused_ops(profile)
    quirks = profiles.quirks(profile)
    dtypes = frozenset(chosen.unsupported_dtypes)
    if not chosen.has_gaps:
        return Gaps(refused, frozenset({"*"}), quirks, dtypes)
    native = frozenset(registered_ops.native_set(registered_ops.listed_ops(), None))
    return Gaps(refused, native, quirks, dtypes)


def kernels() -> list[Kernel]:
    """Every fix kernel this package has, in installation order."""
    import importlib

    found: list[Kernel] = []
    for family in FAMILIES:
        module = importlib.import_module(f"dmlpatch.opfix.{family}")
        found.extend(module.KERNELS)
    return found


def needed(kernel: Kernel, gaps: Gaps) -> bool:
    """Whether a profile has the gap ``kernel`` fixes."""
    if kernel.quirk and kernel.quirk in gaps.quirks:
        return True
    if kernel.gap == "dtype":
        return bool(gaps.dtypes)
    if kernel.gap == "refused":
        return kernel.op in gaps.refused
    if kernel.gap == "quirk":
        return kernel.quirk in gaps.quirks
    return "*" not in gaps.native and kernel.name not in gaps.native


def install(backend: str, profile_or_version: Optional[str]) -> Installed:
    """Register the fixes ``backend`` needs (``sim`` with a profile name, ``directml`` with the
    torch-directml version) and the ``DMLPATCH_CPU_OPS`` operators; idempotent per process.

    Returns what was installed. Raises :class:`~dmlpatch.errors.UsageError` for a bad
    ``DMLPATCH_CPU_OPS``.
    """
    global _library, _installed
    import torch

    from dmlpatch.gaps import profiles
    from dmlpatch.opfix import (
        _accounting,
        cpu_ops,
        device_module,
        module_moves,
        shared_modules,
        sharing,
    )

    with _lock:
        if _installed is not None:
            return _installed
        if backend == "sim":
            profile: Optional[str] = profile_or_version
            _accounting.use_sim_counters()
        elif backend == "directml":
            profile = profiles.profile_for_release(profile_or_version)
        else:
            raise ValueError(f"op fixes are for the sim and directml backends, not {backend!r}")
        forced_ops = cpu_ops.resolve(os.environ.get(DMLPATCH_CPU_OPS, ""))
        # PyTorch's, not DirectML's: every PrivateUse1 device has them, whatever the profile.
        module_moves.install()
        shared_modules.install()  # after module_moves: it wraps Module._apply too
        sharing.install()
        device_module.install()
        forced_names = {op.name() for op in forced_ops}
        library = torch.library.Library("aten", "IMPL")
        fixes: list[str] = []
        if profile is not None:
            missing = gaps(profile)
            float64 = _float64_everywhere(backend)
            if float64 is False:
                missing = missing._replace(dtypes=missing.dtypes | {"Double"})
            _configure_dtypes(missing, float64, _adapter_count(backend))
            waiting: dict[str, list[Kernel]] = {}
            for kernel in kernels():
                # A user's DMLPATCH_CPU_OPS entry wins over our fix; of two fixes for one
                # operator, the earlier family's (half_on_host comes last).
                taken = kernel.qualified in forced_names or kernel.qualified in fixes
                if not _installed_library(kernel.namespace):
                    continue
                if needed(kernel, missing) and not taken:
                    if kernel.trigger:
                        waiting.setdefault(kernel.trigger, []).append(kernel)
                    else:
                        _register(library, [kernel])
                    fixes.append(kernel.qualified)
            _wait_for_triggers(waiting)
        forced = cpu_ops.register(library, forced_ops)
        _library = library
        _installed = Installed(backend, profile, tuple(fixes), tuple(forced))
        from dmlpatch import changes

        changes.record(
            __name__,
            "kernels",
            f"{len(fixes)} operator fixes for DirectML's gaps"
            + (f" and {len(forced)} {DMLPATCH_CPU_OPS} operators" if forced else "")
            + " registered for PrivateUse1 through torch.library",
            uninstall,
        )
        return _installed


def _register(library: torch.library.Library, chosen: list[Kernel]) -> None:
    import torch

    for kernel in chosen:
        into = library
        if kernel.namespace != "aten":
            into = _namespaced.get(kernel.namespace) or _namespaced.setdefault(
                kernel.namespace, torch.library.Library(kernel.namespace, "IMPL")
            )
        with warnings.catch_warnings():
            # torch 2.4 warns when a Python kernel replaces the simulator's registration for
            # the same key: replacing it is the point.
            warnings.filterwarnings("ignore", "Warning only once for all operators")
            into.impl(kernel.name, kernel.function, kernel.key)


def _installed_library(namespace: str) -> bool:
    """Whether the operator library ``namespace`` can exist in this process: aten always, a
    package's own where the package is installed (it need not be imported yet: the dispatcher
    keeps an implementation registered ahead of its operator's schema)."""
    if namespace == "aten":
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(namespace) is not None
    except (ImportError, ValueError):
        return False


def _wait_for_triggers(waiting: dict[str, list[Kernel]]) -> None:
    """Fixes with a trigger are installed when a tensor of its dtype is first on the device
    (:mod:`dmlpatch.opfix.triggers`), each set in a library of its own."""
    import torch

    from dmlpatch.opfix import sentinels, triggers

    def install_now(chosen: list[Kernel]) -> None:
        library = torch.library.Library("aten", "IMPL")
        _register(library, chosen)
        _triggered.append(library)

    from dmlpatch.opfix import dtype_policy
    from dmlpatch.opfix.tensors import allocation, transfers

    if dtype_policy.current() is None:
        # No allocation and copy kernels to see a trigger with: install them at once.
        for chosen in waiting.values():
            install_now(chosen)
        return

    def watched(dtype: torch.dtype, watching: bool) -> None:
        # Until it fires, allocations and copies of the dtype take the path that tells it.
        plain, waiting_now = allocation._plain, transfers._waiting
        allocation.plain_dtypes(plain - {dtype} if watching else plain | {dtype})
        transfers.watch_triggers(waiting_now | {dtype} if watching else waiting_now - {dtype})

    for dtype_name, chosen in waiting.items():
        dtype = getattr(torch, dtype_name)
        triggers.wait(dtype, chosen, install_now)
        watched(dtype, True)
        triggers.when_fired(dtype, functools.partial(watched, dtype, False))
    sentinels.install()


def arm_all() -> None:
    """Install every fix that waits for a trigger now: before a program goes multithreaded on
    the device (DataParallel's replica threads), so that nothing is registered while another
    thread dispatches."""
    import torch

    from dmlpatch.opfix import triggers

    for dtype in (torch.bool, torch.uint8):
        triggers.seen(dtype)


def _all_dtypes() -> list[torch.dtype]:
    import torch

    return [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex32,
        torch.complex64,
        torch.complex128,
    ]


def _float64_everywhere(backend: str) -> Optional[bool]:
    """Whether every adapter has float64: the simulator's setting; None on DirectML, whose
    adapters are asked one by one when a float64 tensor comes their way."""
    if backend != "sim":
        return None
    from dmlpatch import sim

    return sim.has_float64()


def _adapter_count(backend: str) -> int:
    if backend == "sim":
        from dmlpatch import sim

        return sim.device_count()
    import torch_directml  # loaded already: the fixes are installed for it

    count: int = torch_directml.device_count()
    return count


def _configure_dtypes(missing: Gaps, float64: Optional[bool], adapters: int) -> None:
    from dmlpatch.opfix import dtype_policy
    from dmlpatch.opfix.tensors import allocation, transfers

    transfers.between_adapters("device-to-device" in missing.quirks, adapters)
    if missing.dtypes or float64 is None:
        import torch

        policy = dtype_policy.configure(missing.dtypes, float64)
        allocation.install_load_hook()
        attention = set(policy.unsupported) | set(policy.parts)
        if float64 is not True:  # float64 takes the policy's path where adapters may lack it
            attention.add(torch.float64)
        transfers.watch_dtypes(frozenset(attention))
        allocation.plain_dtypes(frozenset(_all_dtypes()) - attention)


def install_for(backend: str) -> Optional[Installed]:
    """:func:`install` for the loaded ``sim`` or ``directml`` backend (its profile or release).

    A fix that fails to register is reported once and skipped: the program then meets
    DirectML's own behaviour for that operator, as without dmlpatch.
    """
    from dmlpatch import log

    if backend == "sim":
        from dmlpatch import sim

        detail: Optional[str] = sim.profile()
    else:
        from dmlpatch._metadata import version_of

        detail = version_of("torch-directml")
    try:
        return install(backend, detail)
    except RuntimeError as error:
        log.warn_once("opfix", f"operator fixes not installed: {error}")
        return None


def installed() -> Optional[Installed]:
    """What :func:`install` registered in this process, or None."""
    return _installed


def uninstall() -> None:
    """Remove every registered kernel: DirectML's own kernels serve the operators again."""
    global _library, _installed
    from dmlpatch import changes
    from dmlpatch.opfix import (
        device_module,
        module_moves,
        sentinels,
        shared_modules,
        sharing,
        triggers,
    )
    from dmlpatch.opfix.tensors import allocation

    changes.forget(__name__)
    with _lock:
        shared_modules.uninstall()
        module_moves.uninstall()
        sharing.uninstall()
        device_module.uninstall()
        if _library is not None:
            _library._destroy()
        for library in (*_triggered, *_namespaced.values()):
            library._destroy()
        _triggered.clear()
        _namespaced.clear()
        triggers.reset()
        sentinels.uninstall()
        _library = None
        _installed = None
        allocation.uninstall_load_hook()
