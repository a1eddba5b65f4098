"""The known failures of torch-directml 0.2.x, one entry each: what fails, what DirectML says,
where it was reported, whether the simulated device reproduces it and what dmlpatch does.

DirectML has been in maintenance mode since July 2025 and torch-directml 0.2.5.dev240914
(torch 2.4.1) is its last release, so this list is finite. It is data: ``dmlpatch doctor
--failures`` and the README print it as a table, ``dmlpatch check`` names the entry of every
gap a program meets. Sources are issues of the microsoft/DirectML tracker (``#602``) unless a
repository is named, and "native library" means the error strings of torch-directml 0.2.5's
own binary.

``simulated`` says how the default profile (``torch-directml-0.2.5``) reproduces an entry:

- ``rule``: a refusal rule or switch of :mod:`dmlpatch.gaps.profiles`, with DirectML's text;
- ``quirk``: the profile gives DirectML's wrong answer (``profiles.QUIRKS`` under the entry's
  key): a kernel that runs and answers differently from the CPU;
- ``op list``: the operator is missing from the list of kernels DirectML registers, so it runs
  through the CPU fallback with DirectML's warning (or fails there when the CPU has no kernel);
- ``pytorch``: PyTorch itself raises it for any PrivateUse1 device, so it happens as it is;
- ``opt-in``: reproduced only when asked (``DMLPATCH_SIM_FLOAT64=0``, ``DMLPATCH_SIM_FAULT``);
- ``no``: not reproduced, and ``simulation`` says why (mostly: the reports do not pin it down).

``fix`` says what dmlpatch does: ``kernel`` (an on-device composition of native operators in
:mod:`dmlpatch.opfix`, installed only where the backend has the gap), ``rewrite`` (CUDA-only
code rewritten in the program's targets), ``spec`` (a library's built-in patch), ``start-up``
(what dmlpatch does as the program starts), ``command``
(a dmlpatch command), ``none`` (not fixed yet: the CPU fallback still works where there is
one), ``cannot`` (out of dmlpatch's reach; ``remedy`` says why) or ``not in 0.2.5`` (an
earlier release's failure that 0.2.5, the last, does not have). ``fixed_in`` names the module
that holds the fix, in the packages :data:`FIXED_IN_PACKAGES` gives its kind; code and tests
that follow an entry to its fix read that field, never the prose of ``remedy``.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from dmlpatch.environment_variables import DMLPATCH_BF16, DMLPATCH_SIM_FAULT, DMLPATCH_SIM_FLOAT64

SIMULATED = ("rule", "quirk", "op list", "pytorch", "opt-in", "no")
FIXES = ("kernel", "rewrite", "spec", "start-up", "command", "none", "cannot", "not in 0.2.5")
#: Where the module of each kind of fix lives; the kinds not here fix nothing (no ``fixed_in``).
#: ``start-up`` includes ``opfix``: the module-move fix is installed with the device.
FIXED_IN_PACKAGES: dict[str, tuple[str, ...]] = {
    "kernel": ("dmlpatch.opfix",),
    "rewrite": ("dmlpatch.rewriting", "dmlpatch.runtime"),
    "spec": ("dmlpatch.patches",),
    "start-up": ("dmlpatch.startup", "dmlpatch.opfix"),
    "command": ("dmlpatch.commands", "dmlpatch.pinning"),
}

_FALLBACK = (
    "The operator '{op}' is not currently supported on the DML backend and will fall back to "
    "run on the CPU. This may have performance implications."
)


class Failure(NamedTuple):
    """One known failure of torch-directml."""

    key: str
    what: str
    #: What DirectML raises or warns, verbatim (first line); empty where no report shows it.
    text: str
    sources: str
    #: The aten operators (without overload) whose refusal or fallback this entry explains.
    ops: tuple[str, ...]
    simulated: str
    simulation: str
    fix: str
    #: The module that holds the fix (dotted path; ``None`` where nothing is fixed): what
    #: ``fix`` names it, in the package that kind of fix lives in (``kernel``: ``opfix``).
    fixed_in: Optional[str]
    #: What dmlpatch does, for people to read.
    remedy: str


def _fallback(op: str) -> str:
    return _FALLBACK.format(op=op)


FAILURES: tuple[Failure, ...] = (
    Failure(
        key="inference-mode",
        what="torch.inference_mode() with a model moved to the device before it",
        text="RuntimeError: Cannot set version_counter for inference tensor",
        sources="#602 (0.2.2, confirmed on 0.2.5), #450, #622 (ultralytics training's validation)",
        ops=(),
        simulated="rule",
        simulation="every kernel given a device tensor made outside inference mode, inside it (the "
        "reports pin F.linear and F.conv2d; a superset, so what runs on the simulator runs on "
        "DirectML)",
        fix="rewrite",
        fixed_in="dmlpatch.runtime.inference",
        remedy="torch.inference_mode in the program's targets is torch.no_grad on DirectML "
        "(dmlpatch.runtime.inference); ultralytics' smart_inference_mode likewise",
    ),
    Failure(
        key="fused-rnn-cells",
        what="nn.LSTM, nn.GRU, LSTMCell, GRUCell: every step",
        text="NotImplementedError: Could not run 'aten::_thnn_fused_lstm_cell' with arguments from "
        "the 'CPU' backend.",
        sources="#613, #654, #677",
        ops=("aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell"),
        simulated="op list",
        simulation="no DirectML kernel, and the CPU fallback finds no CPU kernel",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.rnn",
        remedy="dmlpatch.opfix.layers.rnn: the CPU cell's arithmetic at AutogradPrivateUse1 "
        "(forward and backward)",
    ),
    Failure(
        key="unique-counts",
        what="torch.unique(..., return_counts=True) (ultralytics' loss, every step)",
        text="RuntimeError: Return counts not implemented for unique operator for DirectML.",
        sources="native library",
        ops=("aten::_unique2",),
        simulated="rule",
        simulation="refusal rule on aten::_unique2",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.unique",
        remedy="dmlpatch.opfix.tensors.unique",
    ),
    Failure(
        key="unique-inverse",
        what="torch.unique(..., return_inverse=True)",
        text="RuntimeError: Return inverse not implemented for unique operator for DirectML.",
        sources="native library",
        ops=("aten::_unique2",),
        simulated="rule",
        simulation="refusal rule on aten::_unique2",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.unique",
        remedy="dmlpatch.opfix.tensors.unique",
    ),
    Failure(
        key="avg-pool-divisor",
        what="avg_pool2d/avg_pool3d with divisor_override",
        text="RuntimeError: Divisor override isn't supported for DirectML.",
        sources="native library",
        ops=("aten::avg_pool2d", "aten::avg_pool3d"),
        simulated="rule",
        simulation="refusal rule on avg_pool2d/avg_pool3d",
        fix="kernel",
        fixed_in="dmlpatch.opfix.vision.pooling",
        remedy="dmlpatch.opfix.vision.pooling",
    ),
    Failure(
        key="scatter-src-shape",
        what="scatter with a src whose shape differs from index",
        text="RuntimeError: DirectML scatter doesn't allow for index and source to have different "
        "dimensions.",
        sources="native library",
        ops=("aten::scatter", "aten::scatter_"),
        simulated="rule",
        simulation="refusal rule on scatter/scatter_",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.scatter",
        remedy="dmlpatch.opfix.tensors.scatter",
    ),
    Failure(
        key="scatter-partial",
        what="scatter with an index smaller than the input outside the scatter dimension",
        text="RuntimeError: DirectML scatter doesn't allow partially modified dimensions. Please "
        "update the dimension so that the indices and input only differ in the provided "
        "dimension.",
        sources="native library",
        ops=("aten::scatter", "aten::scatter_"),
        simulated="rule",
        simulation="refusal rule on scatter/scatter_",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.scatter",
        remedy="dmlpatch.opfix.tensors.scatter",
    ),
    Failure(
        key="repeat-rank",
        what="Tensor.repeat to more than 4 dimensions",
        text="RuntimeError: the dimesion of at::Tensor must be 4 or lower, but got <n>",
        sources="native library (sic)",
        ops=("aten::repeat",),
        simulated="rule",
        simulation="refusal rule on repeat",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.repeat",
        remedy="dmlpatch.opfix.tensors.repeat",
    ),
    Failure(
        key="normal-1.8",
        what="normal_ on pytorch-directml 1.8 (GFPGAN/StyleGAN2 noise, every forward)",
        text="RuntimeError: Could not run 'aten::normal_' with arguments from the 'DML' backend.",
        sources="#337 (1.8); 0.2.x registers normal_",
        ops=("aten::normal_",),
        simulated="rule",
        simulation="profile pytorch-directml-1.8 only",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.random",
        remedy="dmlpatch.opfix.tensors.random: Box-Muller from uniform_",
    ),
    Failure(
        key="step-fallbacks",
        what="silu_backward, lerp (EMA, Adam), nan_to_num, addmv, bincount, log_sigmoid: every "
        "training step of YOLO, diffusion UNets and most SiLU models",
        text=_fallback("aten::silu_backward.grad_input"),
        sources="0.2.5 op list; ultralytics#13620 (no faster than the CPU)",
        ops=(
            "aten::silu_backward",
            "aten::lerp",
            "aten::nan_to_num",
            "aten::addmv",
            "aten::bincount",
            "aten::log_sigmoid_forward",
            "aten::log_sigmoid_backward",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning, copies counted",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.common_fallbacks",
        remedy="dmlpatch.opfix.tensors.common_fallbacks",
    ),
    Failure(
        key="isneginf",
        what="isneginf/isposinf: every transformers attention mask",
        text=_fallback("aten::isneginf.out"),
        sources="0.2.5 op list",
        ops=("aten::isneginf", "aten::isposinf"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.masks",
        remedy="dmlpatch.opfix.tensors.masks",
    ),
    Failure(
        key="group-norm-backward",
        what="GroupNorm's backward: every diffusion UNet/VAE training step",
        text=_fallback("aten::native_group_norm_backward"),
        sources="#678",
        ops=("aten::native_group_norm_backward",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.normalization",
        remedy="dmlpatch.opfix.layers.normalization",
    ),
    Failure(
        key="var-mean",
        what="torch.var_mean",
        text=_fallback("aten::var_mean.correction"),
        sources="#536 (std_mean is native in 0.2.5)",
        ops=("aten::var_mean",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.statistics",
        remedy="dmlpatch.opfix.tensors.statistics",
    ),
    Failure(
        key="cumprod",
        what="torch.cumprod (diffusion schedules)",
        text=_fallback("aten::cumprod.out"),
        sources="#437 (cumsum is native in 0.2.5)",
        ops=("aten::cumprod",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.statistics",
        remedy="dmlpatch.opfix.tensors.statistics: a parallel prefix product",
    ),
    Failure(
        key="eye",
        what="torch.eye(n, device=dml): falls back to the CPU and returns an empty tensor",
        text=_fallback("aten::eye.m_out"),
        sources="#431 (torch.eye(3).to(dml) is right)",
        ops=("aten::eye",),
        simulated="rule",
        simulation="CPU fallback with DirectML's warning, and the out= resize lost (Profile."
        "drops_out_resizes): tensor([], device='privateuseone:0')",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.factories",
        remedy="dmlpatch.opfix.tensors.factories",
    ),
    Failure(
        key="logit",
        what="torch.logit and its backward: every RT-DETR step",
        text=_fallback("aten::logit"),
        sources="0.2.5 op list; ultralytics RT-DETR",
        ops=("aten::logit", "aten::logit_backward"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.losses",
        remedy="dmlpatch.opfix.layers.losses",
    ),
    Failure(
        key="binary-cross-entropy",
        what="nn.BCELoss / F.binary_cross_entropy, forward and backward",
        text=_fallback("aten::binary_cross_entropy"),
        sources="#411",
        ops=("aten::binary_cross_entropy", "aten::binary_cross_entropy_backward"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.losses",
        remedy="dmlpatch.opfix.layers.losses",
    ),
    Failure(
        key="grid-sampler",
        what="F.grid_sample forward and backward: every RT-DETR step (deformable attention)",
        text=_fallback("aten::grid_sampler_2d"),
        sources="0.2.5 op list; ultralytics RT-DETR",
        ops=("aten::grid_sampler_2d", "aten::grid_sampler_2d_backward"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.vision.sampling",
        remedy="dmlpatch.opfix.vision.sampling: bilinear and nearest with zeros or border padding, "
        "forward "
        "and backward; bicubic and reflection still through the CPU",
    ),
    Failure(
        key="repeat-interleave",
        what="torch.repeat_interleave with a tensor of repeats",
        text=_fallback("aten::repeat_interleave.Tensor"),
        sources="#449",
        ops=("aten::repeat_interleave",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.indexing",
        remedy="dmlpatch.opfix.tensors.indexing",
    ),
    Failure(
        key="embedding-bag",
        what="nn.EmbeddingBag",
        text=_fallback("aten::_embedding_bag"),
        sources="#724",
        ops=("aten::_embedding_bag", "aten::_embedding_bag_forward_only"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.embedding",
        remedy="dmlpatch.opfix.layers.embedding: sum and mean modes, forward and backward; max "
        "mode still through the CPU",
    ),
    Failure(
        key="linalg",
        what="torch.linalg's decompositions and solvers: inv, solve, det, slogdet, lu, lu_factor, "
        "solve_triangular (and the deprecated triangular_solve), cholesky, cholesky_solve, "
        "cholesky_inverse, qr, geqrf, ormqr, svd, eigh, eig, matrix_exp, lstsq, ldl_factor "
        "(geometry code: camera matrices, homographies, kornia's epipolar geometry and "
        "point-set alignment; MultivariateNormal; orthogonal parametrizations)",
        text=_fallback("aten::linalg_inv_ex.inverse"),
        sources="#671, #431; kornia's test suite",
        ops=(
            "aten::linalg_inv_ex",
            "aten::_linalg_solve_ex",
            "aten::linalg_lu_solve",
            "aten::linalg_lu_factor_ex",
            "aten::_linalg_det",
            "aten::_linalg_slogdet",
            "aten::linalg_solve_triangular",
            "aten::lu_unpack",
            "aten::linalg_lu",
            "aten::triangular_solve",
            "aten::linalg_cholesky_ex",
            "aten::_cholesky_solve_helper",
            "aten::cholesky_inverse",
            "aten::linalg_qr",
            "aten::linalg_householder_product",
            "aten::geqrf",
            "aten::ormqr",
            "aten::_linalg_svd",
            "aten::_linalg_eigh",
            "aten::linalg_eig",
            "aten::_linalg_eigvals",
            "aten::linalg_matrix_exp",
            "aten::linalg_lstsq",
            "aten::linalg_ldl_factor_ex",
            "aten::linalg_ldl_solve",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.linalg.lu",
        remedy="dmlpatch.opfix.linalg.lu: inv, solve, lu, lu_solve, lu_factor, lu_unpack, det and "
        "slogdet of float matrices up to 16 rows (LU with partial pivoting, as LAPACK), "
        "solve_triangular and triangular_solve up to 64 rows; "
        "dmlpatch.opfix.linalg.householder: qr, geqrf, ormqr and householder_product up to 64 "
        "columns (Householder reflections, as LAPACK); dmlpatch.opfix.linalg.cholesky: "
        "cholesky, cholesky_solve and cholesky_inverse up to 64 columns; "
        "dmlpatch.opfix.linalg.jacobi: eigh, eigvalsh, svd and svdvals (so pinv, matrix_rank, "
        "the 2-norm, cond) up to 64 columns "
        "(Jacobi rotations: values equal to the CPU's, vectors up to their sign, which PyTorch "
        "leaves to the device); dmlpatch.opfix.linalg.exponential: matrix_exp up to 128 "
        "columns; dmlpatch.opfix.linalg.nonsymmetric: eig and eigvals, whose DirectML fallback "
        "fails on their complex results, through the CPU by dmlpatch (as PyTorch's CUDA "
        "build computes them too: MAGMA's geev runs on the host); "
        "dmlpatch.opfix.linalg.least_squares: lstsq of systems whose full rank is proved (QR, "
        "up to 64 columns, with each driver's rank, residuals and singular values; others are "
        "the CPU's to decide); dmlpatch.opfix.linalg.ldl: "
        "ldl_factor and ldl_solve up to 64 columns (Bunch-Kaufman pivoting, as LAPACK); "
        "an empty batch's empty results made on the device; larger matrices still through the "
        "CPU, counted as fallbacks",
    ),
    Failure(
        key="attention-fast-path",
        what="nn.MultiheadAttention and nn.TransformerEncoderLayer in eval without grad "
        "(open-clip, torchvision's ViT, every nn.TransformerEncoder at inference): PyTorch's fused "
        "fast path",
        text=_fallback("aten::_native_multi_head_attention"),
        sources="0.2.5 op list; open-clip ViT-B-32 (12 calls, 72 copies, 117 MB per image batch)",
        ops=(
            "aten::_native_multi_head_attention",
            "aten::_transformer_encoder_layer_fwd",
            "aten::_masked_softmax",
            "aten::_masked_softmax_backward",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning, copies counted",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.attention",
        remedy="dmlpatch.opfix.layers.attention: projections, masked softmax (mask types 0, 1, 2; "
        "float masks as bool, as the CPU reads them), output projection, the encoder layer's norms "
        "and feed-forward, as PyTorch's CPU kernels",
    ),
    Failure(
        key="nested-tensor-encoder",
        what="nn.TransformerEncoder in eval given a src_key_padding_mask (enable_nested_tensor, "
        "the default): its sequences packed into a nested tensor",
        text=_fallback("aten::_nested_tensor_from_mask"),
        sources="0.2.5 op list",
        ops=("aten::_nested_tensor_from_mask", "aten::_nested_tensor_from_mask_left_aligned"),
        simulated="op list",
        simulation="the CPU fallback builds the nested tensor on the host and cannot hand it back "
        "(the simulator stops with PyTorch's 'NestedTensorImpl doesn't support strides'); on "
        "DirectML a nested tensor would have no kernels past it either",
        fix="spec",
        fixed_in="dmlpatch.patches.torch.transformer",
        remedy="torch spec: the encoder runs its layers on the padded batch with the padding mask "
        "(dmlpatch.opfix.layers.attention), padded positions zeroed before the final norm as the "
        "nested path leaves them; the mask check runs on the device; packing a nested tensor "
        "by hand stops with one line naming this entry",
    ),
    Failure(
        key="vector-products",
        what="torch.linalg.cross / torch.cross, torch.dot and torch.vdot (torch.linalg.vecdot of "
        "two vectors) (kornia's geometry, every call)",
        text=_fallback("aten::linalg_cross.out"),
        sources="0.2.5 op list (dot.out only); kornia's test suite",
        ops=("aten::linalg_cross", "aten::dot", "aten::vdot"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.linalg.products",
        remedy="dmlpatch.opfix.linalg.products",
    ),
    Failure(
        key="elementwise-fallbacks",
        what="clamp / clamp_min / clamp_max with tensor bounds, F.glu and its backward (Demucs, "
        "wav2vec2, Conformers), torch.nextafter, torch._assert_async",
        text=_fallback("aten::clamp_min.Tensor_out"),
        sources="0.2.5 op list (number bounds only); kornia's test suite, Demucs",
        ops=(
            "aten::clamp",
            "aten::clamp_min",
            "aten::clamp_max",
            "aten::glu",
            "aten::glu_backward",
            "aten::nextafter",
            "aten::_assert_async",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.elementwise",
        remedy="dmlpatch.opfix.tensors.elementwise",
    ),
    Failure(
        key="std-amin",
        what="torch.std (Demucs normalises every input by it), torch.amin and torch.aminmax (amax "
        "is native)",
        text=_fallback("aten::std.correction"),
        sources="0.2.5 op list (std_mean and var are native); kornia's test suite, Demucs",
        ops=("aten::std", "aten::amin", "aten::aminmax"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.statistics",
        remedy="dmlpatch.opfix.tensors.statistics",
    ),
    Failure(
        key="weight-norm",
        what="weight-normed layers (nn.utils.weight_norm, parametrizations.weight_norm): "
        "wav2vec2's positional convolution, HiFi-GAN-style vocoders; forward and backward",
        text=_fallback("aten::_weight_norm_interface"),
        sources="0.2.5 op list",
        ops=("aten::_weight_norm_interface", "aten::_weight_norm_interface_backward"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.weight_norm",
        remedy="dmlpatch.opfix.layers.weight_norm",
    ),
    Failure(
        key="peer-suite-fallbacks",
        what="other operators kornia's suite sends to the CPU: 3-D grid_sample, 3-D replication "
        "and reflection padding, 3-D max pooling, linear 1-D upsampling, bucketize, histc, median, "
        "any over several dims, xlogy",
        text=_fallback("aten::grid_sampler_3d"),
        sources="0.2.5 op list; kornia's test suite (benchmarks/peer_suite.py)",
        ops=(
            "aten::grid_sampler_3d",
            "aten::grid_sampler_3d_backward",
            "aten::replication_pad3d",
            "aten::replication_pad3d_backward",
            "aten::replication_pad2d_backward",
            "aten::reflection_pad3d",
            "aten::max_pool3d_with_indices",
            "aten::upsample_linear1d",
            "aten::bucketize",
            "aten::histc",
            "aten::median",
            "aten::any",
            "aten::xlogy",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning, copies counted",
        fix="none",
        fixed_in=None,
        remedy="not fixed: DirectML's CPU fallback runs them, correctly, two copies per call; the "
        "report's ops.fallback and dmlpatch check name each one",
    ),
    Failure(
        key="antialiased-resize",
        what="antialiased resizing (F.interpolate(antialias=True), the default of torchvision's "
        "transforms.v2.Resize on tensors) and exact nearest resizing "
        "(InterpolationMode.NEAREST_EXACT, F.interpolate(mode='nearest-exact')), forward and "
        "backward",
        text=_fallback("aten::_upsample_bilinear2d_aa.out"),
        sources="0.2.5 op list; torchvision's own transform tests on the device (120 calls, 27 MB "
        "copied each way per call)",
        ops=(
            "aten::_upsample_bilinear2d_aa",
            "aten::_upsample_bilinear2d_aa_backward",
            "aten::_upsample_bicubic2d_aa",
            "aten::_upsample_bicubic2d_aa_backward",
            "aten::_upsample_nearest_exact1d",
            "aten::_upsample_nearest_exact2d",
            "aten::_upsample_nearest_exact3d",
        ),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning, copies counted",
        fix="kernel",
        fixed_in="dmlpatch.opfix.vision.resizing",
        remedy="dmlpatch.opfix.vision.resizing: separable banded weights (antialiased) or source "
        "indices (exact nearest) computed on the host once per size and kept on the device; "
        "per call a gather, multiply and sum per resized dimension, no read-back (float16 in "
        "float32, as CUDA); uint8 and float64 still through the CPU",
    ),
    Failure(
        key="upsample-nearest1d",
        what="F.interpolate(mode='nearest') on 3-D input (audio models)",
        text=_fallback("aten::upsample_nearest1d.out"),
        sources="#718",
        ops=("aten::upsample_nearest1d", "aten::upsample_nearest1d_backward"),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.indexing",
        remedy="dmlpatch.opfix.tensors.indexing",
    ),
    Failure(
        key="random-sampling",
        what="torch.normal with tensor arguments, torch.multinomial",
        text=_fallback("aten::normal.Tensor_float"),
        sources="#405, #372 (multinomial is native in 0.2.5)",
        ops=("aten::normal",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.random",
        remedy="dmlpatch.opfix.tensors.random: normal_ then the CPU's multiply-add (the CPU's "
        "samples, seed for seed)",
    ),
    Failure(
        key="dropout-backward",
        what="dropout's backward",
        text=_fallback("aten::native_dropout_backward"),
        sources="#630 (an earlier release; native in 0.2.5's list)",
        ops=("aten::native_dropout_backward",),
        simulated="no",
        simulation="native in 0.2.5, so the 0.2.5 profile has no gap to reproduce",
        fix="not in 0.2.5",
        fixed_in=None,
        remedy="nothing to fix on 0.2.5",
    ),
    Failure(
        key="complex",
        what="complex tensors on the device: torch.stft/istft, torch.fft, torch.complex, "
        "view_as_complex, x * 1j (whisper's log-Mel spectrogram, Demucs, vocoders, rotary "
        "embeddings, FFT convolutions); the process stops",
        text="Invalid or unsupported data type ComplexFloat.",
        sources="#704 (torch.stft, 0.2.5), #421 (torch.complex; a maintainer: no complex support)",
        ops=(
            "aten::_fft_r2c",
            "aten::_fft_c2c",
            "aten::_fft_c2r",
            "aten::complex",
            "aten::polar",
            "aten::view_as_complex",
        ),
        simulated="rule",
        simulation="Profile.unsupported_dtypes: a complex device tensor raises DirectML's text "
        "(DirectML stops the process with it, a fatal log line of dml_util.cc)",
        fix="kernel",
        fixed_in="dmlpatch.opfix.complex.spectral",
        remedy="dmlpatch.opfix.complex.spectral: complex tensors are held as pairs of reals on the "
        "device (dmlpatch.opfix.complex) and their operations composed of real ones; FFTs and "
        "STFTs are matrix products, no copy to the host; an operation not composed stops with one "
        "line naming it (.cpu() the tensor first)",
    ),
    Failure(
        key="sparse-tensors",
        what="sparse COO tensors on the device: openai-whisper's alignment_heads buffer "
        "(whisper.load_model(..., device=dml))",
        text="NotImplementedError: Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' "
        "with arguments from the 'SparsePrivateUse1' backend.",
        sources="#414",
        ops=("aten::_sparse_coo_tensor_with_dims_and_tensors",),
        simulated="pytorch",
        simulation="no kernel is registered for SparsePrivateUse1",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.sparse",
        remedy="dmlpatch.opfix.tensors.sparse: a sparse tensor moved to the device stays on the "
        "CPU (none can exist on DirectML), said once; the model's parameters move",
    ),
    Failure(
        key="set-data",
        what="param.data = tensor across the CPU and the device (ultralytics RT-DETR's "
        "RepConv.fuse_convs at 'Validating best.pt')",
        text="RuntimeError: Attempted to call `variable.set_data(tensor)`, but `variable` and "
        "`tensor` have incompatible tensor type.",
        sources="PyTorch's own check for PrivateUse1 devices; ultralytics RT-DETR",
        ops=(),
        simulated="pytorch",
        simulation="PyTorch raises it for the simulated device as for DirectML",
        fix="spec",
        fixed_in="dmlpatch.patches.ultralytics.fixes",
        remedy="ultralytics spec: RepConv.fuse_convs fuses on the CPU and moves back; other "
        "libraries' .data assignments across devices are not rewritten",
    ),
    Failure(
        key="parameters-replaced",
        what="model.to(dml) puts new Parameter objects in the model: an optimizer made before the "
        "move trains nothing (accelerate's prepare(model, optimizer)), tied weights come apart "
        "(lm_head and embeddings), tensor hooks are lost",
        text="",
        sources="PyTorch's Module._apply for every PrivateUse1 device (param.data = moved needs "
        "shallow-copy compatible tensors); no error: the loss stays where it started",
        ops=(),
        simulated="pytorch",
        simulation="PyTorch replaces the parameters moving to the simulated device as for DirectML",
        fix="start-up",
        fixed_in="dmlpatch.opfix.module_moves",
        remedy="dmlpatch.opfix.module_moves, installed with the device: each replaced parameter "
        "takes the moved tensor into the old object, as param.data = moved does on CUDA",
    ),
    Failure(
        key="fold-unfold",
        what="F.unfold / F.fold (nn.Unfold, nn.Fold): patch embeddings, sliding windows, Vocos' "
        "ISTFT head's overlap-add; each is the other's gradient",
        text=_fallback("aten::im2col"),
        sources="torch-directml 0.2.5's operator list (neither im2col nor col2im is registered)",
        ops=("aten::im2col", "aten::col2im"),
        simulated="op list",
        simulation="",
        fix="kernel",
        fixed_in="dmlpatch.opfix.vision.sliding_blocks",
        remedy="dmlpatch.opfix.vision.sliding_blocks: strided slices of the padded image, one per "
        "kernel offset or per block (whichever is fewer), stacked for im2col and added up for "
        "col2im; PyTorch's derivatives call the other on the device",
    ),
    Failure(
        key="detection-ops",
        what="torchvision's detection operators on the device: nms (batched_nms, every detector's "
        "post-processing), roi_align (Faster/Mask R-CNN's box and mask heads), roi_pool (Fast "
        "R-CNN's), ps_roi_align and ps_roi_pool (R-FCN's), deform_conv2d (deformable "
        "convolutions, DCNv1/v2) and their backwards",
        text="The operator 'torchvision::nms' is not currently supported on the DML backend and "
        "will fall back to run on the CPU. This may have performance implications.",
        sources="torchvision ships CPU and CUDA kernels only; ultralytics' validation (#602 "
        "thread) and torchvision detection models",
        ops=(
            "torchvision::nms",
            "torchvision::roi_align",
            "torchvision::_roi_align_backward",
            "torchvision::roi_pool",
            "torchvision::_roi_pool_backward",
            "torchvision::ps_roi_align",
            "torchvision::_ps_roi_align_backward",
            "torchvision::ps_roi_pool",
            "torchvision::_ps_roi_pool_backward",
            "torchvision::deform_conv2d",
            "torchvision::_deform_conv2d_backward",
        ),
        simulated="op list",
        simulation="torchvision's operators are in no list of DirectML's kernels: they fall back",
        fix="kernel",
        fixed_in="dmlpatch.opfix.vision.detection",
        remedy="dmlpatch.opfix.vision.detection: nms as a fixed point of greedy suppression "
        "(torchvision's "
        "indices), roi_align as two batched matrix products with the bins' interpolation "
        "matrices, differentiated by autograd; roi_pool as a maximum over rows of the rows' "
        "maxima, its backward a scatter-add at the maxima; ps_roi_align and ps_roi_pool "
        "over every channel, each bin keeping its own; deform_conv2d as four weighted "
        "gathers of the image and a grouped matrix product, differentiated by autograd",
    ),
    Failure(
        key="torch-compile",
        what="torch.compile(model), model.compile(), @torch.compile and libraries that compile "
        "(transformers' Trainer with torch_compile=True) on a model on the device",
        text="torch._inductor.exc.InductorError: LoweringException: AssertionError: no scheduling "
        "registered for device privateuseone",
        sources="PyTorch's Inductor has code generators for CUDA (Triton), the CPU (C++) and a few "
        "registered backends; torch-directml registers none (KeyError: 'privateuseone' on "
        "newer torch)",
        ops=(),
        simulated="pytorch",
        simulation="Inductor refuses the simulated device's graphs as DirectML's",
        fix="spec",
        fixed_in="dmlpatch.patches.torch.compiler",
        remedy="torch spec: graphs on the device run through AOTAutograd as torch's aot_eager "
        "backend runs them (eager's results, no fused kernels); traced batch norm goes through the "
        "CPU fallback; mode='reduce-overhead' runs without CUDA graphs, said once",
    ),
    Failure(
        key="shared-memory",
        what="a model or tensor on the device handed to torch.multiprocessing workers "
        "(model.share_memory() and Hogwild-style training): the spawn start method, Windows' "
        "only one, refuses it; with fork each worker trains a copy the parent never sees",
        text="RuntimeError: _share_fd_: only available on CPU",
        sources="PyTorch's own check for PrivateUse1 devices (CUDA shares through its IPC handles)",
        ops=(),
        simulated="pytorch",
        simulation="PyTorch raises it for the simulated device as for DirectML",
        fix="start-up",
        fixed_in="dmlpatch.opfix.shared_modules",
        remedy="dmlpatch.opfix.shared_modules, installed with the device: DirectML has no "
        "inter-process memory, so model.share_memory() keeps the weights in host shared memory, "
        "said in one line, and each forward given device tensors computes on the device with "
        "copies of them (Hogwild's workers, spawn or fork, train as on the CPU); any other "
        "device tensor handed to a worker stops with one line (dmlpatch.opfix.sharing)",
    ),
    Failure(
        key="autocast",
        what="torch.autocast('cuda'), torch.cuda.amp.autocast, GradScaler: mixed precision",
        text="",
        sources="#192, #454, #370, #598",
        ops=("aten::linear", "aten::conv2d", "aten::softmax"),
        simulated="no",
        simulation="nothing is raised: torch-directml's operators ignore the autocast key, so an "
        "autocast region changes nothing; the simulated device's do too (its module answers as "
        "torch-directml's)",
        fix="kernel",
        fixed_in="dmlpatch.opfix.precision.autocast",
        remedy="dmlpatch.opfix.precision.autocast: kernels for the autocast key of the device "
        "cast as CUDA's autocast does (float16 for matrix products and convolutions, float32 "
        "for reductions, norms and losses, the widest input where inputs mix); a program's "
        "'cuda' autocast and GradScaler run on the device (dmlpatch.runtime.amp). bfloat16 "
        f"autocast runs in float32, or float16 with {DMLPATCH_BF16}=float16, said once",
    ),
    Failure(
        key="float64",
        what="float64 on adapters without double support (most Intel iGPUs): numpy-born data, "
        "torch.from_numpy(a).cuda()",
        text="RuntimeError: The GPU device does not support Double (Float64) operations!",
        sources="#438, #396, #398, #699; native library",
        ops=("aten::empty", "aten::full"),
        simulated="opt-in",
        simulation=f"{DMLPATCH_SIM_FLOAT64}=0: has_float64_support() is False and a float64 "
        "device tensor raises DirectML's text",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.allocation",
        remedy="dmlpatch.opfix.tensors.allocation: float64 runs as float32 on such an adapter, "
        "said once (float32's precision; integer-valued float64 beyond 2**24, such as large "
        "indices or timestamps kept as float64, loses its low bits: keep those as int64)",
    ),
    Failure(
        key="scalar-writes",
        what="t[i] = v on a device tensor reportedly not taking effect",
        text="",
        sources="user reports, not pinned to a release",
        ops=(),
        simulated="opt-in",
        simulation=f"{DMLPATCH_SIM_FAULT}=drop-scalar-writes",
        fix="none",
        fixed_in=None,
        remedy="dmlpatch check --verify compares every device operator with the CPU",
    ),
    Failure(
        key="bilinear-interpolate",
        what="bilinear F.interpolate reportedly corrupting GFPGAN's output",
        text="",
        sources="#482 (0.2.0)",
        ops=(),
        simulated="no",
        simulation="the report gives no inputs that reproduce it",
        fix="none",
        fixed_in=None,
        remedy="dmlpatch check --verify compares every device operator with the CPU",
    ),
    Failure(
        key="count-nonzero",
        what="torch.count_nonzero along dimensions (ComfyUI SDXL)",
        text=_fallback("aten::count_nonzero.dim_IntList"),
        sources="#665",
        ops=("aten::count_nonzero",),
        simulated="op list",
        simulation="CPU fallback with DirectML's warning",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.indexing",
        remedy="dmlpatch.opfix.tensors.indexing",
    ),
    Failure(
        key="foreach-optimizers",
        what="every optimizer step (SGD, Adam, AdamW, RMSprop...) and clip_grad_norm_: torch's "
        "foreach path",
        text=_fallback("aten::_foreach_lerp_.Scalar"),
        sources="#604 (0.2.2 and later)",
        ops=(
            "aten::_foreach_lerp_",
            "aten::_foreach_add_",
            "aten::_foreach_mul_",
            "aten::_foreach_norm",
            "aten::_foreach_*",
        ),
        simulated="op list",
        simulation="DirectML registers no _foreach_* operator and torch 2.4.1 sends them to the "
        "backend; the simulator sends them to its CPU fallback on every torch (newer torch would "
        "compose them of per-tensor operators first)",
        fix="kernel",
        fixed_in="dmlpatch.opfix.optimizers.foreach",
        remedy="dmlpatch.opfix.optimizers.foreach: each element through the per-tensor operator, "
        "as the CPU's slow path",
    ),
    Failure(
        key="fused-optimizers",
        what="Adam/AdamW(fused=True): every step, including transformers' Trainer (its default "
        "optim is adamw_torch_fused)",
        text=_fallback("aten::_fused_adamw_"),
        sources="found running transformers' Trainer on the simulated device; torch offers the "
        "fused path to PrivateUse1 backends and torch-directml registers no fused optimizer",
        ops=("aten::_fused_adam_", "aten::_fused_adamw_"),
        simulated="op list",
        simulation="",
        fix="kernel",
        fixed_in="dmlpatch.opfix.optimizers.fused",
        remedy="dmlpatch.opfix.optimizers.fused: the fused step of the CPU kernel, composed of "
        "per-tensor operators",
    ),
    Failure(
        key="grad-scaler",
        what="torch.amp.GradScaler: every mixed-precision step's unscale_ (each gradient checked "
        "and unscaled) and update",
        text=_fallback("aten::_amp_foreach_non_finite_check_and_unscale_"),
        sources="found running GradScaler on the simulated device; torch-directml 0.2.5's native "
        "library registers neither operator",
        ops=("aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"),
        simulated="op list",
        simulation="",
        fix="kernel",
        fixed_in="dmlpatch.opfix.optimizers.grad_scaling",
        remedy="dmlpatch.opfix.optimizers.grad_scaling: the check and unscale in two kernels per "
        "gradient and the update in twelve, with no read-back",
    ),
    Failure(
        key="float-times-bool",
        what="x * mask / x *= mask with a bool mask: a bool result holding bool(x) and mask; in "
        "place x itself turns bool (older transformers' causal masks, which then fail in "
        "masked_fill)",
        text="",
        sources="#686 (0.2.5), #737 (0.2.5); #702",
        ops=("aten::mul", "aten::mul_"),
        simulated="quirk",
        simulation="mul.Tensor and mul_.Tensor with a bool device tensor as other (what the "
        "reports pin)",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.dtypes",
        remedy="dmlpatch.opfix.tensors.dtypes: the mask is cast to the result's dtype first "
        "(PyTorch's type promotion); every other product goes to DirectML's mul.out",
    ),
    Failure(
        key="cross-entropy-none-grad",
        what="F.cross_entropy / F.nll_loss with reduction='none': the loss is right and every "
        "gradient upstream of it is exactly zero (a weighted per-token loss never trains)",
        text="",
        sources="#739, #740 (0.2.5: NllLossBackward0)",
        ops=("aten::nll_loss_backward",),
        simulated="quirk",
        simulation="nll_loss_backward with reduction='none' returns zeros",
        fix="kernel",
        fixed_in="dmlpatch.opfix.layers.losses",
        remedy="dmlpatch.opfix.layers.losses: -dy*w[t] written at each row's target with one "
        "scatter (nothing for ignore_index); the other reductions go to DirectML's kernel",
    ),
    Failure(
        key="generator",
        what="torch.Generator(device=dml) (SDE samplers, seeded pipelines)",
        text="RuntimeError: Device type PRIVATEUSEONE is not supported for torch.Generator() api.",
        sources="#374 (0.1.13), ComfyUI#1707 (0.2.0)",
        ops=(),
        simulated="no",
        simulation="torch-directml 0.2.5's native library registers a generator for the device, "
        "made on the CPU generator its random kernels draw from; the simulated device registers "
        "the same",
        fix="not in 0.2.5",
        fixed_in=None,
        remedy="nothing to do on 0.2.5; on earlier releases create the generator on the CPU",
    ),
    Failure(
        key="manual-seed",
        what="torch.manual_seed does not seed the device",
        text="UserWarning: Set seed for `privateuseone` device does not take effect, please add "
        "API's `_is_in_bad_fork` and `manual_seed_all` to `privateuseone` device module.",
        sources="#587 (0.2.1 to 0.2.4)",
        ops=(),
        simulated="no",
        simulation="0.2.5's device module has _is_in_bad_fork and manual_seed_all (seeding the CPU "
        "generator its kernels draw from), and so has the simulated device's",
        fix="not in 0.2.5",
        fixed_in=None,
        remedy="nothing to do on 0.2.5",
    ),
    Failure(
        key="uint8-reduction",
        what="t.sum() over a uint8 tensor",
        text="UnicodeDecodeError: 'utf-8' codec can't decode byte 0xcf in position 0: invalid "
        "continuation byte",
        sources="#619 (0.2.3; open)",
        ops=("aten::sum",),
        simulated="quirk",
        simulation="sum over a uint8 device tensor raises an error whose text is not UTF-8",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.dtypes",
        remedy="dmlpatch.opfix.tensors.dtypes: summed in int64 on the device and cast to the dtype "
        "asked for (torch.sum(..., out=t) over uint8 is not covered); other sums go to DirectML's "
        "sum.IntList_out",
    ),
    Failure(
        key="bfloat16",
        what="bfloat16 tensors on the device: bfloat16 checkpoints (most current LLM and diffusion "
        "weights) moved or loaded there; the process stops",
        text="Invalid or unsupported data type BFloat16.",
        sources="#688 (0.2.5; a maintainer: DirectML has no bfloat16)",
        ops=("aten::empty", "aten::full"),
        simulated="rule",
        simulation="Profile.unsupported_dtypes: a bfloat16 device tensor raises DirectML's text "
        "(DirectML stops the process with it, a fatal log line of dml_util.cc)",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.allocation",
        remedy="dmlpatch.opfix.tensors.allocation: bfloat16 runs as float32 (exact), or as "
        f"float16 with {DMLPATCH_BF16}=float16 (half the memory, float16's range), said once; "
        "tensors read as that dtype. Not covered: an operator asked for a bfloat16 result on the "
        "device (x.sum(dtype=torch.bfloat16)), empty_like/empty_strided with that dtype",
    ),
    Failure(
        key="half-cpu-fallback",
        what="float16 arguments to an operator DirectML runs on the CPU whose CPU kernel has no "
        "float16 (antialiased resizes, grid_sample, replication padding's backward and 3d "
        "padding on torch 2.4, cdist's backward, pdist, max_unpool, trace): float16 programs "
        "and autocast regions that run on CUDA (the antialiased resizes are now composed on "
        "the device: entry antialiased-resize)",
        text="NotImplementedError: \"compute_index_ranges_weights\" not implemented for 'Half'",
        sources="PyTorch's CPU kernels (OpInfo samples in float16, torch 2.4.1 and 2.14); a peer "
        "image library's float16 test run",
        ops=(
            "aten::max_unpool2d",
            "aten::trace",
            "aten::adaptive_max_pool3d",
            "aten::_cdist_backward",
            "aten::_pdist_forward",
        ),
        simulated="op list",
        simulation="",
        fix="kernel",
        fixed_in="dmlpatch.opfix.precision.half_on_host",
        remedy="dmlpatch.opfix.precision.half_on_host: a float16 call the CPU kernel refuses is "
        "computed in float32 on the CPU and brought back as float16; every call of these "
        "operators, float16 or not, still goes through the CPU, counted as a fallback",
    ),
    Failure(
        key="mixed-devices-assert",
        what="a CPU tensor reaching a DirectML kernel",
        text="RuntimeError: tensor.device().type() == at::DeviceType::PrivateUse1 INTERNAL ASSERT "
        "FAILED",
        sources="#442, #540, #397",
        ops=(),
        simulated="no",
        simulation="the simulator raises PyTorch's 'Expected all tensors to be on the same device' "
        "instead",
        fix="rewrite",
        fixed_in="dmlpatch.rewriting.transform",
        remedy="CUDA sites in the program's targets are rewritten, so their tensors land on one "
        "device",
    ),
    Failure(
        key="ddp-c10d",
        what="DistributedDataParallel on DirectML tensors",
        text="NotImplementedError: Could not run 'c10d::broadcast_' with arguments from the "
        "'AutogradPrivateUse1' backend.",
        sources="#474 (0.2.0)",
        ops=(),
        simulated="no",
        simulation="the simulator fails with gloo's 'No backend type associated with device type "
        "privateuseone' instead",
        fix="spec",
        fixed_in="dmlpatch.patches.torch.distributed",
        remedy="dmlpatch.patches.torch: gloo process groups with host-staged gradient buckets",
    ),
    Failure(
        key="device-to-device",
        what="t.to(privateuseone:1) from privateuseone:0 gives zeros (DataParallel, model "
        "parallelism over two adapters)",
        text="",
        sources="#443 (2023; open)",
        ops=("aten::_to_copy",),
        simulated="quirk",
        simulation="a copy between two simulated adapters writes zeros",
        fix="kernel",
        fixed_in="dmlpatch.opfix.tensors.transfers",
        remedy="dmlpatch.opfix.tensors.transfers: Tensor.to another adapter goes through the host "
        "(forward "
        "and backward); dst.copy_(src) across adapters is not covered",
    ),
    Failure(
        key="out-of-memory",
        what="allocation beyond the adapter's memory; memory not returned before the process exits",
        text="RuntimeError: Could not allocate tensor with 234881024 bytes. There is not enough "
        "GPU video memory available!",
        sources="#579, #395, #412",
        ops=(),
        simulated="no",
        simulation="the simulated device has the host's memory",
        fix="cannot",
        fixed_in=None,
        remedy="smaller batches or models; torch-directml has no empty_cache",
    ),
    Failure(
        key="autograd-device-queues",
        what="every backward on the device, once the process ran a backward before torch-directml "
        "was imported (a sanity check on the CPU first)",
        text="RuntimeError: 0 <= device.index() && device.index() < static_cast<c10::DeviceIndex>"
        "(device_ready_queues_.size()) INTERNAL ASSERT FAILED",
        sources="#668 (2024-11)",
        ops=(),
        simulated="pytorch",
        simulation="PyTorch's autograd engine sizes its per-device queues at the first backward "
        "pass; the simulated device registers itself as torch-directml does",
        fix="start-up",
        fixed_in="dmlpatch.startup.first_backward",
        remedy="the runner registers the device when torch is imported; an activated process "
        "(dmlpatch.startup.first_backward) before its first backward pass",
    ),
    Failure(
        key="layer-norm-strided",
        what="LayerNorm of a non-contiguous input (x.permute(0, 2, 1)) gives wrong values",
        text="",
        sources="#588 (0.2.1)",
        ops=(),
        simulated="no",
        simulation="the report gives the size of the error (std 0.70, max 3.6), not the values "
        "DirectML computes, nor whether 0.2.5 still does it",
        fix="none",
        fixed_in=None,
        remedy="x.contiguous() before the norm; dmlpatch check --verify compares every device "
        "operator with the CPU",
    ),
    Failure(
        key="meta-copy",
        what="a meta tensor copied to the device becomes zeros instead of failing (weights never "
        "loaded into a model built with init_empty_weights)",
        text="",
        sources="#477 (2023)",
        ops=(),
        simulated="no",
        simulation="the simulated device raises PyTorch's 'Cannot copy out of meta tensor; no "
        "data!', as the CPU does: a program that runs on it does not depend on the zeros",
        fix="none",
        fixed_in=None,
        remedy="load the weights before moving the model (accelerate's "
        "load_checkpoint_and_dispatch)",
    ),
    Failure(
        key="mixed-devices-1.8",
        what="a library creating tensors on cuda while its model is on DirectML (facexlib)",
        text="RuntimeError: bad optional access",
        sources="pytorch-directml 1.8 users",
        ops=(),
        simulated="no",
        simulation="the simulator raises PyTorch's 'Expected all tensors to be on the same device' "
        "instead",
        fix="rewrite",
        fixed_in="dmlpatch.rewriting.discovery",
        remedy="the library's CUDA sites are rewritten (facexlib spec, discovery)",
    ),
    Failure(
        key="torch-replaced",
        what="a pip install replacing torch-directml's torch 2.4.1",
        text="ImportError: ...torch_directml_native...so: undefined symbol: "
        "_ZN2at6native12cpu_fallback...",
        sources="#415, #473, #494, #537, #544, #554, #569, #712",
        ops=(),
        simulated="no",
        simulation="an installation problem, not a device behaviour",
        fix="command",
        fixed_in="dmlpatch.pinning.pin",
        remedy="dmlpatch pin: pip refuses to replace the pinned torch",
    ),
    Failure(
        key="plain-linux",
        what="torch-directml on Linux outside WSL2",
        text="OSError: libd3d12.so: cannot open shared object file: No such file or directory",
        sources="torch-directml 0.2.5 on a plain Linux machine",
        ops=(),
        simulated="no",
        simulation="an installation problem, not a device behaviour",
        fix="cannot",
        fixed_in=None,
        remedy="DirectML needs Windows or WSL2; dmlpatch doctor says so",
    ),
)

_BY_KEY = {failure.key: failure for failure in FAILURES}
#: Where a text stops being verbatim: ``<n>`` (a number filled in), ``...`` (left out).
_PLACEHOLDER = re.compile(r"<[a-z]+>|\.\.\.")


def get(key: str) -> Failure:
    """The entry named ``key`` (KeyError if there is none)."""
    return _BY_KEY[key]


def _operator(name: str) -> str:
    """``aten::lerp.Scalar_out`` → ``aten::lerp``; every foreach operator → ``aten::_foreach_*``
    (one failure, whichever of the family's operators a program meets)."""
    operator = name.split(".", 1)[0]
    return "aten::_foreach_*" if operator.startswith("aten::_foreach_") else operator


def for_gap(op: str, how: str, error: Optional[str] = None) -> tuple[Failure, ...]:
    """The entries that explain one row of ``dmlpatch check``: operator ``op`` (any overload)
    that was ``refused``, fell back (``fallback``) or was ``fixed``. ``error`` is the first line
    of the exception that stopped the program: it picks the one entry whose text it is (and
    names entries no operator does, such as inference mode). Without it an operator may have
    several (``_unique2``: counts or inverse), and all are returned."""
    if error:
        for failure in FAILURES:
            said = _PLACEHOLDER.split(failure.text.split(": ", 1)[-1], 1)[0]
            explains = not failure.ops or _operator(op) in failure.ops
            if said and error.startswith(said) and explains:
                return (failure,)
    wanted = _operator(op)
    candidates = [failure for failure in FAILURES if wanted in failure.ops]
    if how == "refused":
        refusals = [failure for failure in candidates if failure.simulated == "rule"]
        candidates = refusals or candidates
    return tuple(candidates)


#: What the simulated device raises for an entry whose DirectML text no report pins down.
_EXCEPTION_NAME = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Warning|Interrupt): ")
#: A stretch of text this short could be anything's.
_SHORTEST = 12


def _stretches(text: str) -> list[str]:
    """The verbatim parts of an entry's text, without its exception name."""
    body = _EXCEPTION_NAME.sub("", text, count=1)
    return [part for part in _PLACEHOLDER.split(body) if part.strip()]


def _shows(said: str, text: str) -> bool:
    stretches = _stretches(text)
    if sum(len(part) for part in stretches) < _SHORTEST:
        return False
    at = 0
    for part in stretches:
        found = said.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def for_error(said: str) -> Optional[Failure]:
    """The entry an error shows: every verbatim stretch of its text appears in ``said``, in
    order. ``said`` is an exception's first line (``RuntimeError: ...``) or a line that quotes
    one."""
    for failure in FAILURES:
        if failure.text and _shows(said, failure.text):
            return failure
    return None


def table(markdown: bool = False) -> str:
    """The catalogue as a table: Markdown for the README, aligned text for the terminal."""
    header = ("failure", "DirectML says", "reported", "simulator", "dmlpatch")
    rows = [
        (
            f"{failure.key}: {failure.what}",
            failure.text or "(no exact text)",
            failure.sources,
            failure.simulated,
            f"{failure.fix}: {failure.remedy}",
        )
        for failure in FAILURES
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in rows:
            cells = [cell.replace("|", "\\|") for cell in row]
            if row[1] != "(no exact text)":
                cells[1] = f"`` {cells[1]} ``" if "`" in cells[1] else f"`{cells[1]}`"
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"
    lines = []
    for failure in FAILURES:
        lines.append(f"{failure.key}  [{failure.simulated} / {failure.fix}]  {failure.what}")
        lines.append(f"    DirectML: {failure.text or '(no exact text)'}  ({failure.sources})")
        lines.append(f"    dmlpatch: {failure.remedy}")
    return "\n".join(lines) + "\n"


def summary() -> str:
    """One line: how many entries, how many the simulated device reproduces, how many are fixed."""
    by_default = sum(
        failure.simulated in ("rule", "quirk", "op list", "pytorch") for failure in FAILURES
    )
    on_request = sum(failure.simulated == "opt-in" for failure in FAILURES)
    fixed = sum(
        failure.fix in ("kernel", "rewrite", "spec", "start-up", "command") for failure in FAILURES
    )
    earlier = sum(failure.fix == "not in 0.2.5" for failure in FAILURES)
    return (
        f"{len(FAILURES)} known torch-directml failures: {by_default} reproduced by the "
        f"simulated device ({on_request} more on request), {fixed} fixed by dmlpatch, "
        f"{earlier} only in releases before 0.2.5"
    )
