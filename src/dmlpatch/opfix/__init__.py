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
optimizers.grad_scaling   ``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``
                          (``GradScaler``'s every step) with no read-back
precision.autocast        autocast on the device: each operator CUDA's autocast lists (and
                          torchvision's RoI operators) cast as on CUDA
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

Each fix module declares itself (its ``KERNELS``, the fixes it ``YIELDS_TO``, its state's
``reset``) and :mod:`dmlpatch.opfix.registry` lists them; :mod:`dmlpatch.opfix.installer`
installs them, each in libraries of its own. This package re-exports the installer's functions.
"""

from __future__ import annotations

from dmlpatch.opfix.installer import (
    Gaps,
    Installed,
    arm_all,
    gaps,
    install,
    install_for,
    installed,
    kernels,
    needed,
    uninstall,
)

__all__ = [
    "Gaps",
    "Installed",
    "arm_all",
    "gaps",
    "install",
    "install_for",
    "installed",
    "kernels",
    "needed",
    "uninstall",
]
