"""Which precision each operator takes under autocast: CUDA's policy, for DirectML.

The facts are PyTorch's (``aten/src/ATen/autocast_mode.h``, the lists its ``AutocastCUDA``
kernels are made from, the same from torch 2.4 to 2.14 but for a few overloads each release
adds or drops). Only overloads that CUDA registers on the running torch get a DirectML kernel
(:func:`cuda_registered`), so a torch that drops one drops it here too; a test checks that
every overload CUDA registers has a policy here, on each torch the suite runs.
"""

from __future__ import annotations

#: Computed in the autocast dtype (float16): convolutions, matrix products, RNN cells, attention.
LOWER_PRECISION = (
    "_convolution",
    "_convolution.deprecated",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)

#: Computed in float32: functions whose range or accuracy float16 lacks, norms, losses, and
#: (torch 2.5 on) the resizes.
FLOAT32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "rms_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "linalg_matrix_sqrth",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)

#: Reductions with an optional ``dtype``: given none, they accumulate and answer in float32
#: (the input is not cast; an explicit dtype is the program's and stands).
FLOAT32_OUTPUT = (
    "prod",
    "prod.dim_int",
    "prod.dim_Dimname",
    "softmax.int",
    "softmax.Dimname",
    "log_softmax.int",
    "log_softmax.Dimname",
    "cumprod",
    "cumprod.dimname",
    "cumsum",
    "cumsum.dimname",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
    "sum.dim_DimnameList",
)

#: ``norm`` overloads without a dtype, each answered by its overload with one (float32).
FLOAT32_BY_DTYPE_OVERLOAD = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}

#: Several floating inputs, all cast to the widest of them (float16 only where all are).
WIDEST = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)

#: Refused under autocast, with CUDA's text: float16 probabilities into a log are unsafe.
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using "
        "torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

#: torchvision's operators with CUDA autocast kernels of its own: computed in float32, the
#: results cast back to the input's dtype (argmax and channel maps too, as torchvision does).
TORCHVISION_FLOAT32_AS_INPUT = (
    "roi_align",
    "roi_pool",
    "ps_roi_align",
    "ps_roi_pool",
    "deform_conv2d",
)
#: torchvision's ``nms``: boxes and scores in float32; it answers indices.
TORCHVISION_FLOAT32 = ("nms",)

#: CUDA's registrations that have no DirectML counterpart: cuDNN's own operators, which no
#: DirectML tensor reaches.
CUDNN_ONLY = ("cudnn_convolution", "cudnn_convolution_transpose", "_cudnn_rnn")


def policies() -> dict[str, str]:
    """Every overload with a policy here, by ``torch.library`` name (``pow.Scalar``, ``mm``)."""
    table: dict[str, str] = {}
    for names, policy in (
        (LOWER_PRECISION, "lower"),
        (FLOAT32, "float32"),
        (FLOAT32_OUTPUT, "float32-output"),
        (tuple(FLOAT32_BY_DTYPE_OVERLOAD), "float32-overload"),
        (WIDEST, "widest"),
        (tuple(BANNED), "banned"),
    ):
        for name in names:
            table[name] = policy
    return table


def cuda_registered() -> frozenset[str]:
    """The overloads CUDA's autocast serves on this torch, by ``torch.library`` name."""
    import torch

    names = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
    return frozenset(name.split("::", 1)[1] for name in names if name.startswith("aten::"))
