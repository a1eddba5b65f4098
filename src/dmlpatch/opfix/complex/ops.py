"""The operations of :class:`~dmlpatch.opfix.complex.tensor.PairedComplex`, in real arithmetic.

Every aten call with a paired complex tensor among its arguments arrives at :func:`dispatch`
(PyTorch's ``__torch_dispatch__``, below autograd, so composite operations arrive already
decomposed). Each entry of :data:`HANDLERS` answers one operator with real operations on the
pairs, all of which DirectML runs natively:

- views and layout (``view``, ``permute``, ``slice``, ``select``, ``expand``, ``unfold``,
  ``as_strided``, ...) are the same view of the pairs, one dimension longer, so in-place
  operations on a view reach its base;
- arithmetic is written out on the parts: ``(a+bi)(c+di) = (ac-bd) + (ad+bc)i`` and so on,
  with real tensors, host scalars and Python numbers mixed in as PyTorch promotes them;
- ``abs``, ``angle``, ``view_as_real``, ``real`` and ``imag`` give real tensors;
- ``_fft_c2c`` and ``_fft_c2r`` come from :mod:`dmlpatch.opfix.complex.spectral`;
- copies to and from the host go through ``torch.view_as_complex`` on the host.

An operator without an entry stops with one line that names it and the catalogue entry
(``complex``), instead of DirectML's fatal ``Invalid or unsupported data type``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional, Union

import torch

from dmlpatch.opfix.complex import tensor as _tensor
from dmlpatch.opfix.complex.tensor import PART_DTYPES, PairedComplex, is_paired, wrap

aten = torch.ops.aten

Part = Union[torch.Tensor, float, int, None]  # None: zero
Handler = Callable[..., Any]
HANDLERS: dict[Any, Handler] = {}


class ComplexUnsupported(RuntimeError):
    """An operation on complex DirectML tensors that dmlpatch does not compose."""


def _handles(*ops: Any) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for op in ops:
            HANDLERS[op] = handler
        return handler

    return register


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Answer one aten call that has a paired complex tensor among its arguments."""
    query = METADATA.get(func)
    if query is not None:
        return query(args[0].pairs, *args[1:])
    handler = HANDLERS.get(func)
    if handler is None:
        raise ComplexUnsupported(
            f"{func.name()} of a complex tensor is not available on DirectML: dmlpatch holds "
            "complex tensors there as pairs of reals and does not compose this operation "
            "(catalogue entry 'complex'; .cpu() the tensor first)"
        )
    return handler(func, *args, **kwargs)


_tensor.dispatcher = dispatch

#: What PyTorch asks a paired tensor about its geometry (its sizes and strides are dispatched):
#: the geometry of ``pairs`` without the trailing pair dimension.
METADATA: dict[Any, Callable[..., Any]] = {
    aten.sym_size.default: lambda p: p.shape[:-1],
    aten.sym_size.int: lambda p, d: p.shape[d % (p.dim() - 1)],
    aten.size.int: lambda p, d: p.shape[d % (p.dim() - 1)],
    aten.size.default: lambda p: list(p.shape[:-1]),
    aten.stride.default: lambda p: [s // 2 for s in p.stride()[:-1]],
    aten.sym_stride.int: lambda p, d: p.stride(d % (p.dim() - 1)) // 2,
    aten.stride.int: lambda p, d: p.stride(d % (p.dim() - 1)) // 2,
    aten.sym_numel.default: lambda p: p.numel() // 2,
    aten.numel.default: lambda p: p.numel() // 2,
    aten.storage_offset.default: lambda p: p.storage_offset() // 2,
    aten.sym_stride.default: lambda p: tuple(s // 2 for s in p.stride()[:-1]),
    aten.sym_numel.default: lambda p: p.numel() // 2,
    aten.dim.default: lambda p: p.dim() - 1,
    aten.sym_storage_offset.default: lambda p: p.storage_offset() // 2,
    aten.is_contiguous.default: lambda p: p.is_contiguous(),
    aten.is_contiguous.memory_format: lambda p: p.is_contiguous(),
    aten.is_strides_like_format.default: lambda p: False,
    aten.is_non_overlapping_and_dense.default: lambda p: p.is_contiguous(),
}


# ---- conversion ----


def _device_of(*values: Any) -> torch.device:
    for v in values:
        if is_paired(v):
            return v.device
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return v.device
    raise AssertionError("a paired complex call without a device tensor")


def _complex_dtype(*values: Any) -> torch.dtype:
    """The result dtype of an arithmetic call, as PyTorch promotes: the widest complex
    argument, widened by a float64 tensor with dimensions."""
    widest = torch.complex64
    for v in values:
        if is_paired(v) and v.dtype == torch.complex128:
            widest = torch.complex128
    for v in values:
        dimensioned = isinstance(v, torch.Tensor) and not is_paired(v) and v.dim() > 0
        if dimensioned and v.dtype in (torch.float64, torch.complex128):
            widest = torch.complex128
    return widest


def _parts(value: Any, device: torch.device, part: torch.dtype) -> tuple[Part, Part]:
    """``(real, imaginary)`` of an argument; a real argument's imaginary part is None."""
    if is_paired(value):
        pairs = value.pairs
        if pairs.dtype != part:
            pairs = pairs.to(part)
        return pairs[..., 0], pairs[..., 1]
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            host = torch.view_as_real(value.resolve_conj())
            pairs = host.to(device=device, dtype=part)
            return pairs[..., 0], pairs[..., 1]
        if value.device != device and value.dim() == 0:
            value = value.to(device)
        if value.is_floating_point() and value.dtype != part:
            value = value.to(part)
        return value, None
    if isinstance(value, complex):
        return value.real, value.imag
    return value, None


def _pairs_of(value: Any, device: torch.device, part: torch.dtype) -> torch.Tensor:
    re, im = _parts(value, device, part)
    return _stack(re, im, device, part)


def _stack(re: Part, im: Part, device: torch.device, part: torch.dtype) -> torch.Tensor:
    real: torch.Tensor = (
        re
        if isinstance(re, torch.Tensor)
        else torch.tensor(0.0 if re is None else re, dtype=part, device=device)
    )
    imag: torch.Tensor = (
        im
        if isinstance(im, torch.Tensor)
        else torch.full_like(real, 0.0 if im is None else im, dtype=real.dtype)
    )
    if real.shape != imag.shape:
        real, imag = torch.broadcast_tensors(real, imag)
    return torch.stack((real, imag), dim=-1)


def _result(re: Part, im: Part, dtype: torch.dtype, device: torch.device) -> PairedComplex:
    return wrap(_stack(re, im, device, PART_DTYPES[dtype]), dtype)


def _dim(d: int, ndim: int) -> int:
    return d % ndim if ndim else 0


def _dims(dims: Any, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return [_dim(d, ndim) for d in dims]


# ---- real-part arithmetic (None is zero; Python numbers allowed) ----


def _add(a: Part, b: Part) -> Part:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _neg(a: Part) -> Part:
    return None if a is None else -a


def _mul(a: Part, b: Part) -> Part:
    if a is None or b is None:
        return None
    return a * b


def _sub(a: Part, b: Part) -> Part:
    return _add(a, _neg(b))


def _scale(a: Part, alpha: Any) -> Part:
    return a if alpha == 1 else _mul(a, alpha)


def _product(ar: Part, ai: Part, br: Part, bi: Part) -> tuple[Part, Part]:
    return _sub(_mul(ar, br), _mul(ai, bi)), _add(_mul(ar, bi), _mul(ai, br))


def _quotient(ar: Part, ai: Part, br: Part, bi: Part) -> tuple[Part, Part]:
    if bi is None:
        # One side is a tensor here, so a zero divisor gives inf/nan as PyTorch's does.
        divisor = 0.0 if br is None else br
        return (None if ar is None else ar / divisor), (None if ai is None else ai / divisor)
    denominator = _add(_mul(br, br), _mul(bi, bi))
    assert denominator is not None  # bi is not zero, so neither is bi * bi
    re = _add(_mul(ar, br), _mul(ai, bi))
    im = _sub(_mul(ai, br), _mul(ar, bi))
    return (None if re is None else re / denominator), (None if im is None else im / denominator)


def _binary(func: Any, a: Any, b: Any, alpha: Any = 1, **kwargs: Any) -> Any:
    dtype = _complex_dtype(a, b)
    device = _device_of(a, b)
    part = PART_DTYPES[dtype]
    ar, ai = _parts(a, device, part)
    br, bi = _parts(b, device, part)
    name = func.overloadpacket.__name__.rstrip("_")
    if name == "add":
        re, im = _add(ar, _scale(br, alpha)), _add(ai, _scale(bi, alpha))
    elif name == "sub":
        re, im = _sub(ar, _scale(br, alpha)), _sub(ai, _scale(bi, alpha))
    elif name == "rsub":
        re, im = _sub(br, _scale(ar, alpha)), _sub(bi, _scale(ai, alpha))
    elif name == "mul":
        re, im = _product(ar, ai, br, bi)
    else:
        if kwargs.get("rounding_mode") is not None:
            raise ComplexUnsupported(f"{func.name()} with rounding_mode of a complex tensor")
        re, im = _quotient(ar, ai, br, bi)
    if func.overloadpacket.__name__.endswith("_"):
        target = a
        assert is_paired(target)
        target.pairs.copy_(_stack(re, im, device, part))
        return target
    return _result(re, im, dtype, device)


_handles(
    aten.add.Tensor,
    aten.add.Scalar,
    aten.add_.Tensor,
    aten.add_.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.sub_.Tensor,
    aten.sub_.Scalar,
    aten.rsub.Tensor,
    aten.rsub.Scalar,
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.mul_.Tensor,
    aten.mul_.Scalar,
    aten.div.Tensor,
    aten.div.Scalar,
    aten.div_.Tensor,
    aten.div_.Scalar,
    aten.div.Tensor_mode,
)(_binary)


@_handles(aten.neg.default, aten.neg_.default)
def _negate(func: Any, z: PairedComplex) -> PairedComplex:
    if func is aten.neg_.default:
        z.pairs.neg_()
        return z
    return wrap(-z.pairs, z.dtype)


@_handles(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)
def _conjugate(func: Any, z: PairedComplex) -> PairedComplex:
    return wrap(torch.stack((z.pairs[..., 0], -z.pairs[..., 1]), dim=-1), z.dtype)


@_handles(aten.conj_physical_.default)
def _conjugate_(func: Any, z: PairedComplex) -> PairedComplex:
    z.pairs[..., 1].neg_()
    return z


@_handles(aten.resolve_conj.default, aten.resolve_neg.default)
def _resolved(func: Any, z: PairedComplex) -> PairedComplex:
    # Paired tensors never carry the lazy conjugate or negative bits. A new tensor, as for
    # every view: autograd makes the output of a view operation a view of its input.
    return wrap(aten.alias.default(z.pairs), z.dtype)


@_handles(aten._neg_view.default)
def _neg_view(func: Any, z: PairedComplex) -> PairedComplex:
    return wrap(-z.pairs, z.dtype)


# ---- real results ----


def _magnitude(pairs: torch.Tensor) -> torch.Tensor:
    return (pairs * pairs).sum(-1).sqrt()


@_handles(aten.abs.default)
def _abs(func: Any, z: PairedComplex) -> torch.Tensor:
    return _magnitude(z.pairs)


@_handles(aten.angle.default)
def _angle(func: Any, z: PairedComplex) -> torch.Tensor:
    return torch.atan2(z.pairs[..., 1], z.pairs[..., 0])


@_handles(aten.view_as_real.default)
def _view_as_real(func: Any, z: PairedComplex) -> torch.Tensor:
    return aten.alias.default(z.pairs)


@_handles(aten.sgn.default)
def _sgn(func: Any, z: PairedComplex) -> PairedComplex:
    magnitude = _magnitude(z.pairs).unsqueeze(-1)
    safe = torch.where(magnitude == 0, torch.ones_like(magnitude), magnitude)
    return wrap(z.pairs / safe, z.dtype)


@_handles(aten.isnan.default)
def _isnan(func: Any, z: PairedComplex) -> torch.Tensor:
    return z.pairs.isnan().any(-1)


@_handles(aten.isinf.default)
def _isinf(func: Any, z: PairedComplex) -> torch.Tensor:
    return z.pairs.isinf().any(-1)


@_handles(aten.isfinite.default)
def _isfinite(func: Any, z: PairedComplex) -> torch.Tensor:
    return z.pairs.isfinite().all(-1)


@_handles(aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar)
def _compare(func: Any, a: Any, b: Any) -> torch.Tensor:
    dtype = _complex_dtype(a, b)
    device = _device_of(a, b)
    left = _pairs_of(a, device, PART_DTYPES[dtype])
    right = _pairs_of(b, device, PART_DTYPES[dtype])
    same = (left == right).all(-1)
    return same if func.overloadpacket is aten.eq else ~same


@_handles(aten.isclose.default)
def _isclose(
    func: Any, a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> torch.Tensor:
    dtype = _complex_dtype(a, b)
    device = _device_of(a, b)
    left = _pairs_of(a, device, PART_DTYPES[dtype])
    right = _pairs_of(b, device, PART_DTYPES[dtype])
    close = _magnitude(left - right) <= atol + rtol * _magnitude(right)
    close = close | (left == right).all(-1)  # equal infinities
    if equal_nan:
        close = close | (left.isnan().any(-1) & right.isnan().any(-1))
    return close


@_handles(aten.allclose.default)
def _allclose(
    func: Any, a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> bool:
    return bool(_isclose(func, a, b, rtol, atol, equal_nan).all())


@_handles(aten.equal.default)
def _equal(func: Any, a: Any, b: Any) -> bool:
    if not (is_paired(a) and is_paired(b)) or a.shape != b.shape:
        return False
    return bool(torch.equal(a.pairs, b.pairs))


@_handles(aten._local_scalar_dense.default)
def _item(func: Any, z: PairedComplex) -> complex:
    re, im = z.pairs.reshape(2).tolist()
    return complex(re, im)


# ---- elementary functions, through the polar form ----


@_handles(aten.exp.default)
def _exp(func: Any, z: PairedComplex) -> PairedComplex:
    scale = z.pairs[..., 0].exp()
    phase = z.pairs[..., 1]
    return _result(scale * phase.cos(), scale * phase.sin(), z.dtype, z.device)


@_handles(aten.log.default)
def _log(func: Any, z: PairedComplex) -> PairedComplex:
    pairs = z.pairs
    return _result(
        _magnitude(pairs).log(), torch.atan2(pairs[..., 1], pairs[..., 0]), z.dtype, z.device
    )


def _power(z: PairedComplex, exponent: Union[float, complex]) -> PairedComplex:
    pairs = z.pairs
    if exponent == 2:
        re, im = pairs[..., 0], pairs[..., 1]
        return _result(re * re - im * im, 2 * re * im, z.dtype, z.device)
    if exponent == 1:
        return wrap(pairs.clone(), z.dtype)
    magnitude = _magnitude(pairs)
    phase = torch.atan2(pairs[..., 1], pairs[..., 0])
    if isinstance(exponent, complex):
        # z^(c+di) = exp((c+di) log z)
        log_magnitude = magnitude.log()
        re = exponent.real * log_magnitude - exponent.imag * phase
        im = exponent.imag * log_magnitude + exponent.real * phase
        scale = re.exp()
        return _result(scale * im.cos(), scale * im.sin(), z.dtype, z.device)
    scale = magnitude.pow(exponent)
    angle = phase * exponent
    return _result(scale * angle.cos(), scale * angle.sin(), z.dtype, z.device)


@_handles(aten.pow.Tensor_Scalar)
def _pow(func: Any, z: PairedComplex, exponent: Any) -> PairedComplex:
    return _power(z, exponent)


@_handles(aten.sqrt.default)
def _sqrt(func: Any, z: PairedComplex) -> PairedComplex:
    return _power(z, 0.5)


@_handles(aten.reciprocal.default)
def _reciprocal(func: Any, z: PairedComplex) -> PairedComplex:
    re, im = _quotient(1.0, None, z.pairs[..., 0], z.pairs[..., 1])
    return _result(re, im, z.dtype, z.device)


# ---- reductions ----


@_handles(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim)
def _reduce(
    func: Any, z: PairedComplex, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
) -> Any:
    if dtype is not None and not dtype.is_complex:
        raise ComplexUnsupported(f"{func.name()} of a complex tensor into {dtype}")
    dims = _dims(dim, z.dim())
    if not dims:  # a 0-dim tensor
        return wrap(z.pairs.clone(), z.dtype)
    reduce = torch.sum if func.overloadpacket is aten.sum else torch.mean
    return wrap(reduce(z.pairs, dim=dims, keepdim=keepdim), z.dtype)


@_handles(aten.cumsum.default)
def _cumsum(func: Any, z: PairedComplex, dim: int, *, dtype: Any = None) -> PairedComplex:
    return wrap(torch.cumsum(z.pairs, _dim(dim, z.dim())), z.dtype)


@_handles(aten.linalg_vector_norm.default)
def _vector_norm(
    func: Any,
    z: PairedComplex,
    ord: Any = 2,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: Any = None,
) -> torch.Tensor:
    return torch.linalg.vector_norm(_magnitude(z.pairs), ord, dim, keepdim)


# ---- products ----


def _matmul_parts(
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], a: Any, b: Any
) -> PairedComplex:
    dtype = _complex_dtype(a, b)
    device = _device_of(a, b)
    ar, ai = _parts(a, device, PART_DTYPES[dtype])
    br, bi = _parts(b, device, PART_DTYPES[dtype])
    assert isinstance(ar, torch.Tensor) and isinstance(br, torch.Tensor)
    re = product(ar, br)
    if ai is not None and bi is not None:
        re = re - product(ai, bi)
    im: Part = None
    if bi is not None:
        im = product(ar, bi)
    if ai is not None:
        im = _add(im, product(ai, br))
    return _result(re, im, dtype, device)


@_handles(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default)
def _products(func: Any, a: Any, b: Any) -> PairedComplex:
    return _matmul_parts(lambda x, y: func(x, y), a, b)


# ---- views and layout ----


@_handles(aten.view.default, aten._unsafe_view.default)
def _view(func: Any, z: PairedComplex, size: list[int]) -> PairedComplex:
    return wrap(z.pairs.view(*size, 2), z.dtype)


@_handles(aten.view.dtype)
def _view_dtype(func: Any, z: PairedComplex, dtype: torch.dtype) -> Any:
    if dtype == z.dtype:
        return wrap(aten.alias.default(z.pairs), z.dtype)
    if dtype == PART_DTYPES[z.dtype]:
        return z.pairs.flatten(-2) if z.dim() else aten.alias.default(z.pairs)
    raise ComplexUnsupported(f"view of a complex tensor as {dtype}")


@_handles(aten._reshape_alias.default)
def _reshape_alias(
    func: Any, z: PairedComplex, size: list[int], stride: list[int]
) -> PairedComplex:
    return _as_strided(func, z, size, stride, z.storage_offset())


@_handles(aten.as_strided.default)
def _as_strided(
    func: Any,
    z: PairedComplex,
    size: list[int],
    stride: list[int],
    storage_offset: Optional[int] = None,
) -> PairedComplex:
    offset = z.pairs.storage_offset() if storage_offset is None else 2 * storage_offset
    pairs = z.pairs.as_strided([*size, 2], [2 * s for s in stride] + [1], offset)
    return wrap(pairs, z.dtype)


@_handles(aten.permute.default)
def _permute(func: Any, z: PairedComplex, dims: list[int]) -> PairedComplex:
    n = z.dim()
    return wrap(z.pairs.permute(*[_dim(d, n) for d in dims], n), z.dtype)


@_handles(aten.transpose.int)
def _transpose(func: Any, z: PairedComplex, d0: int, d1: int) -> PairedComplex:
    n = z.dim()
    return wrap(z.pairs.transpose(_dim(d0, n), _dim(d1, n)), z.dtype)


@_handles(aten.t.default)
def _t(func: Any, z: PairedComplex) -> PairedComplex:
    pairs = z.pairs.transpose(0, 1) if z.dim() == 2 else aten.alias.default(z.pairs)
    return wrap(pairs, z.dtype)


@_handles(aten.transpose_.default, aten.t_.default, aten.unsqueeze_.default)
def _in_place_view(func: Any, z: PairedComplex, *args: Any) -> PairedComplex:
    n = z.dim()
    if func is aten.t_.default:
        if n == 2:
            z.pairs.transpose_(0, 1)
    elif func is aten.transpose_.default:
        z.pairs.transpose_(_dim(args[0], n), _dim(args[1], n))
    else:
        z.pairs.unsqueeze_(_dim(args[0], n + 1))
    return z


@_handles(aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims)
def _squeeze_(func: Any, z: PairedComplex, dim: Any = None) -> PairedComplex:
    z.pairs = _squeeze(func, z, dim).pairs
    return z


@_handles(aten.as_strided_.default)
def _as_strided_(
    func: Any, z: PairedComplex, size: list[int], stride: list[int], storage_offset: Any = None
) -> PairedComplex:
    z.pairs = _as_strided(func, z, size, stride, storage_offset).pairs
    return z


@_handles(aten.resize_.default)
def _resize(
    func: Any, z: PairedComplex, size: list[int], memory_format: Any = None
) -> PairedComplex:
    z.pairs.resize_(*size, 2)
    return z


@_handles(aten.unsqueeze.default)
def _unsqueeze(func: Any, z: PairedComplex, dim: int) -> PairedComplex:
    return wrap(z.pairs.unsqueeze(_dim(dim, z.dim() + 1)), z.dtype)


@_handles(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func: Any, z: PairedComplex, dim: Any = None) -> PairedComplex:
    n = z.dim()
    dims = [d for d in range(n) if z.shape[d] == 1] if dim is None else _dims(dim, n)
    pairs = z.pairs
    for d in sorted((d for d in dims if z.shape[d] == 1), reverse=True):
        pairs = pairs.squeeze(d)
    return wrap(pairs, z.dtype)


@_handles(aten.expand.default)
def _expand(
    func: Any, z: PairedComplex, size: list[int], *, implicit: bool = False
) -> PairedComplex:
    return wrap(z.pairs.expand(*size, 2), z.dtype)


@_handles(aten.slice.Tensor)
def _slice(
    func: Any, z: PairedComplex, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> PairedComplex:
    return wrap(aten.slice.Tensor(z.pairs, _dim(dim, z.dim()), start, end, step), z.dtype)


@_handles(aten.select.int)
def _select(func: Any, z: PairedComplex, dim: int, index: int) -> PairedComplex:
    return wrap(z.pairs.select(_dim(dim, z.dim()), index), z.dtype)


@_handles(aten.unbind.int)
def _unbind(func: Any, z: PairedComplex, dim: int = 0) -> list[PairedComplex]:
    return [wrap(p, z.dtype) for p in z.pairs.unbind(_dim(dim, z.dim()))]


@_handles(aten.split.Tensor, aten.split_with_sizes.default)
def _split(func: Any, z: PairedComplex, sizes: Any, dim: int = 0) -> list[PairedComplex]:
    return [wrap(p, z.dtype) for p in func(z.pairs, sizes, _dim(dim, z.dim()))]


@_handles(aten.unfold.default)
def _unfold(func: Any, z: PairedComplex, dim: int, size: int, step: int) -> PairedComplex:
    windows = z.pairs.unfold(_dim(dim, z.dim()), size, step)  # [..., 2, size]
    return wrap(windows.transpose(-1, -2), z.dtype)


@_handles(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _alias(func: Any, z: PairedComplex) -> PairedComplex:
    return wrap(func(z.pairs), z.dtype)


@_handles(aten.clone.default)
def _clone(func: Any, z: PairedComplex, *, memory_format: Any = None) -> PairedComplex:
    return wrap(z.pairs.clone(), z.dtype)


@_handles(aten.flip.default)
def _flip(func: Any, z: PairedComplex, dims: list[int]) -> PairedComplex:
    return wrap(z.pairs.flip(_dims(dims, z.dim())), z.dtype)


@_handles(aten.roll.default)
def _roll(func: Any, z: PairedComplex, shifts: list[int], dims: Any = ()) -> PairedComplex:
    if not dims:
        flat = z.pairs.reshape(-1, 2).roll(shifts, 0)
        return wrap(flat.reshape(z.pairs.shape), z.dtype)
    return wrap(z.pairs.roll(shifts, _dims(dims, z.dim())), z.dtype)


@_handles(aten.repeat.default)
def _repeat(func: Any, z: PairedComplex, repeats: list[int]) -> PairedComplex:
    return wrap(z.pairs.repeat(*repeats, 1), z.dtype)


@_handles(aten.constant_pad_nd.default)
def _pad(func: Any, z: PairedComplex, pad: list[int], value: Any = 0) -> PairedComplex:
    pairs = z.pairs
    re = torch.nn.functional.pad(pairs[..., 0], pad, value=complex(value).real)
    im = torch.nn.functional.pad(pairs[..., 1], pad, value=complex(value).imag)
    return wrap(torch.stack((re, im), -1), z.dtype)


@_handles(aten.cat.default)
def _cat(func: Any, tensors: list[Any], dim: int = 0) -> PairedComplex:
    dtype = _complex_dtype(*tensors)
    device = _device_of(*tensors)
    part = PART_DTYPES[dtype]
    ndim = max(t.dim() for t in tensors)
    pieces = [_pairs_of(t, device, part) for t in tensors if t.numel() or t.dim() == ndim]
    return wrap(torch.cat(pieces, _dim(dim, ndim)), dtype)


@_handles(aten.stack.default)
def _stack_op(func: Any, tensors: list[Any], dim: int = 0) -> PairedComplex:
    dtype = _complex_dtype(*tensors)
    device = _device_of(*tensors)
    part = PART_DTYPES[dtype]
    pieces = [_pairs_of(t, device, part) for t in tensors]
    return wrap(torch.stack(pieces, _dim(dim, tensors[0].dim() + 1)), dtype)


@_handles(aten.where.self)
def _where(func: Any, condition: torch.Tensor, a: Any, b: Any) -> PairedComplex:
    dtype = _complex_dtype(a, b)
    device = _device_of(a, b)
    left = _pairs_of(a, device, PART_DTYPES[dtype])
    right = _pairs_of(b, device, PART_DTYPES[dtype])
    return wrap(torch.where(condition.unsqueeze(-1), left, right), dtype)


@_handles(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(func: Any, z: PairedComplex, mask: torch.Tensor, value: Any) -> PairedComplex:
    fill = _pairs_of(value, z.device, PART_DTYPES[z.dtype])
    return wrap(torch.where(mask.unsqueeze(-1), fill, z.pairs), z.dtype)


@_handles(aten.index.Tensor)
def _index(func: Any, z: PairedComplex, indices: list[Any]) -> PairedComplex:
    return wrap(aten.index.Tensor(z.pairs, indices), z.dtype)


@_handles(aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default)
def _index_put(
    func: Any,
    z: Any,
    indices: list[Any],
    values: Any,
    accumulate: bool = False,
    unsafe: bool = False,
) -> Any:
    if not is_paired(z):
        raise ComplexUnsupported(f"{func.name()} of complex values into a real tensor")
    pairs = _pairs_of(values, z.device, PART_DTYPES[z.dtype])
    if func is aten.index_put.default:
        return wrap(z.pairs.index_put(indices, pairs, accumulate), z.dtype)
    z.pairs.index_put_(indices, pairs, accumulate)
    return z


@_handles(aten.index_select.default)
def _index_select(func: Any, z: PairedComplex, dim: int, index: torch.Tensor) -> PairedComplex:
    return wrap(z.pairs.index_select(_dim(dim, z.dim()), index), z.dtype)


@_handles(aten.slice_backward.default)
def _slice_backward(
    func: Any, grad: PairedComplex, sizes: list[int], dim: int, start: int, end: int, step: int
) -> PairedComplex:
    pairs = grad.pairs.new_zeros(*sizes, 2)
    aten.slice.Tensor(pairs, _dim(dim, len(sizes)), start, end, step).copy_(grad.pairs)
    return wrap(pairs, grad.dtype)


@_handles(aten.select_backward.default)
def _select_backward(
    func: Any, grad: PairedComplex, sizes: list[int], dim: int, index: int
) -> PairedComplex:
    pairs = grad.pairs.new_zeros(*sizes, 2)
    pairs.select(_dim(dim, len(sizes)), index).copy_(grad.pairs)
    return wrap(pairs, grad.dtype)


# ---- new tensors like a complex one ----


def _made(shape: list[int], value: Any, dtype: torch.dtype, device: torch.device, name: str) -> Any:
    """A new tensor of ``shape`` holding ``value`` (``randn`` for random), complex or real."""
    if not dtype.is_complex:
        if name.startswith("randn"):
            return torch.randn(shape, dtype=dtype, device=device)
        return torch.full(shape, complex(value).real, dtype=dtype, device=device)
    pairs = torch.zeros(*shape, 2, dtype=PART_DTYPES[dtype], device=device)
    if name.startswith("randn"):
        pairs.normal_(0.0, math.sqrt(0.5))  # real and imaginary parts each of variance 1/2
    elif value:
        pairs[..., 0] = complex(value).real
        pairs[..., 1] = complex(value).imag
    return torch.view_as_complex(pairs) if device.type == "cpu" else wrap(pairs)


_FILL = {"ones_like": 1.0, "new_ones": 1.0}


@_handles(
    aten.empty_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
    aten.randn_like.default,
)
def _like(
    func: Any,
    z: PairedComplex,
    *args: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Any:
    name = func.overloadpacket.__name__
    value = args[0] if name == "full_like" else _FILL.get(name, 0.0)
    target = torch.device(device) if device is not None else z.device
    return _made(list(z.shape), value, dtype if dtype is not None else z.dtype, target, name)


@_handles(
    aten.new_zeros.default, aten.new_empty.default, aten.new_ones.default, aten.new_full.default
)
def _new_sized(
    func: Any,
    z: PairedComplex,
    size: list[int],
    *args: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Any:
    name = func.overloadpacket.__name__
    value = args[0] if name == "new_full" else _FILL.get(name, 0.0)
    target = torch.device(device) if device is not None else z.device
    return _made(list(size), value, dtype if dtype is not None else z.dtype, target, name)


@_handles(aten.new_empty_strided.default)
def _new_empty_strided(
    func: Any, z: PairedComplex, size: list[int], stride: list[int], **kwargs: Any
) -> Any:
    return _new_sized(aten.new_empty.default, z, size, **kwargs)


# ---- filling and copying ----


@_handles(aten.zero_.default)
def _zero(func: Any, z: PairedComplex) -> PairedComplex:
    z.pairs.zero_()
    return z


@_handles(aten.uniform_.default)
def _uniform(
    func: Any, z: PairedComplex, low: float = 0.0, high: float = 1.0, *, generator: Any = None
) -> PairedComplex:
    """``torch.rand`` of a complex dtype: PyTorch draws the real and imaginary parts as one
    real tensor (``view_as_real``), in that order, so the pairs drawn alike are its numbers."""
    z.pairs.uniform_(low, high, generator=generator)
    return z


@_handles(aten.normal_.default)
def _normal(
    func: Any, z: PairedComplex, mean: float = 0.0, std: float = 1.0, *, generator: Any = None
) -> PairedComplex:
    """``torch.randn`` of a complex dtype: each part drawn with ``std / sqrt(2)``, as PyTorch
    draws them (the modulus then has variance ``std ** 2``)."""
    z.pairs.normal_(mean, std / math.sqrt(2), generator=generator)
    return z


@_handles(aten.fill_.Scalar, aten.fill_.Tensor)
def _fill(func: Any, z: Any, value: Any) -> Any:
    if not is_paired(z):
        raise ComplexUnsupported("filling a real tensor with a complex value")
    if isinstance(value, torch.Tensor):
        value = value.item() if not is_paired(value) else _item(None, value)
    value = complex(value)
    z.pairs[..., 0].fill_(value.real)
    z.pairs[..., 1].fill_(value.imag)
    return z


def _warn_real_cast() -> None:
    """PyTorch's own warning, attributed past dmlpatch's frames to the caller of the copy."""
    warnings.warn(
        "Casting complex values to real discards the imaginary part", UserWarning, stacklevel=3
    )


@_handles(aten.copy_.default)
def _copy(func: Any, dst: Any, src: Any, non_blocking: bool = False) -> Any:
    if is_paired(dst):
        dst.pairs.copy_(_pairs_of(src, dst.device, PART_DTYPES[dst.dtype]), non_blocking)
        return dst
    # A paired source into a host or real tensor.
    host = (
        torch.view_as_complex(src.pairs.to(dst.device).contiguous())
        if dst.device.type == "cpu"
        else None
    )
    if host is not None and dst.is_complex():
        dst.copy_(host.to(dst.dtype), non_blocking)
        return dst
    _warn_real_cast()
    dst.copy_(src.pairs[..., 0], non_blocking)
    return dst


@_handles(aten._to_copy.default)
def _to_copy(
    func: Any,
    z: PairedComplex,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> Any:
    target = torch.device(device) if device is not None else z.device
    wanted = dtype if dtype is not None else z.dtype
    if not wanted.is_complex:
        _warn_real_cast()
        return z.pairs[..., 0].to(device=target, dtype=wanted, non_blocking=non_blocking, copy=True)
    pairs = z.pairs.to(
        device=target, dtype=PART_DTYPES[wanted], non_blocking=non_blocking, copy=True
    )
    if target.type == "cpu":
        return torch.view_as_complex(pairs.contiguous())
    return wrap(pairs)


@_handles(aten.view_as_complex.default)
def _view_as_complex(func: Any, z: Any) -> Any:
    raise ComplexUnsupported("view_as_complex of a tensor that is already complex")


def register(ops: dict[Any, Handler]) -> None:
    """Add handlers from another module (the transforms register theirs)."""
    HANDLERS.update(ops)
