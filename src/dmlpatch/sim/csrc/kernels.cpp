// Kernels the device needs beyond the CPU fallback: allocation, views, storage surgery and
// copies (where transfers are counted), plus convolution, which reaches backends that are not
// CPU/CUDA only through the *_overrideable entry points.
#include "sim.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/view_native.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace dmlsim {
namespace {

const c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

// Sets the thread's current adapter for the duration of an allocation.
struct IndexScope {
  c10::DeviceIndex saved;
  explicit IndexScope(c10::DeviceIndex index) : saved(current_device()) {
    if (index >= 0) set_current_device(index);
  }
  ~IndexScope() { set_current_device(saved); }
};

c10::DeviceIndex index_of(const c10::optional<c10::Device>& device) {
  return device && device->has_index() ? device->index() : current_device();
}

#define SIM_COUNT(op_name)                              \
  static OpRecord* const rec_ = op_record(op_name);     \
  count_call(rec_)

at::Tensor sim_empty(c10::IntArrayRef size, c10::optional<c10::ScalarType> dtype,
                     c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                     c10::optional<bool> pin_memory, c10::optional<c10::MemoryFormat> fmt) {
  SIM_COUNT("aten::empty.memory_format");
  const c10::ScalarType st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  const c10::DeviceIndex index = index_of(device);
  check_dtype(st, index);
  IndexScope scope(index);
  return at::detail::empty_generic(size, allocator(), kSimKeys, st, fmt);
}

at::Tensor sim_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             c10::optional<c10::ScalarType> dtype,
                             c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                             c10::optional<bool> pin_memory) {
  SIM_COUNT("aten::empty_strided");
  const c10::ScalarType st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  const c10::DeviceIndex index = index_of(device);
  check_dtype(st, index);
  IndexScope scope(index);
  return at::detail::empty_strided_generic(size, stride, allocator(), kSimKeys, st);
}

at::Tensor sim_as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                          c10::optional<int64_t> offset) {
  SIM_COUNT("aten::as_strided");
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor sim_view(const at::Tensor& self, c10::IntArrayRef size) {
  SIM_COUNT("aten::view");
  return at::native::view(self, size);
}

at::Tensor sim_reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                             c10::IntArrayRef stride) {
  SIM_COUNT("aten::_reshape_alias");
  return at::native::_reshape_alias(self, size, stride);
}

void ensure_storage(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                    int64_t offset) {
  const size_t needed =
      at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), offset);
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resize_storage_bytes(storage, needed);
}

const at::Tensor& sim_resize(const at::Tensor& self, c10::IntArrayRef size,
                             c10::optional<c10::MemoryFormat> fmt) {
  SIM_COUNT("aten::resize_");
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && !fmt) return self;
  impl->set_sizes_contiguous(size);
  if (fmt && *fmt != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(*fmt);
  ensure_storage(self, self.sizes(), self.strides(), self.storage_offset());
  return self;
}

void check_storage_device(const at::Tensor& self, const c10::Storage& source) {
  TORCH_CHECK(source.device() == self.device() ||
                  (source.device().type() == kSim && source.device().index() < 0),
              "Attempted to set the storage of a tensor on device \"", self.device(),
              "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
}

at::Tensor& sim_set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                            c10::IntArrayRef size, c10::IntArrayRef stride) {
  SIM_COUNT("aten::set_.source_Storage_storage_offset");
  check_storage_device(self, source);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  } else {
    impl->set_sizes_and_strides(size, stride, offset);
  }
  ensure_storage(self, self.sizes(), self.strides(), offset);
  return self;
}

at::Tensor& sim_set_whole_storage(at::Tensor& self, c10::Storage source) {
  SIM_COUNT("aten::set_.source_Storage");
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return sim_set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& sim_set_tensor(at::Tensor& self, const at::Tensor& source) {
  SIM_COUNT("aten::set_.source_Tensor");
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return sim_set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                         source.strides());
}

at::Tensor& sim_set_empty(at::Tensor& self) {
  SIM_COUNT("aten::set_");
  IndexScope scope(self.device().index());
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return sim_set_storage(self, std::move(fresh), 0, {0}, {});
}

int64_t host_bytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

// All copies that involve the device arrive here (copy_ re-dispatches them). Transfers are
// counted by direction; a copy within one adapter is not a transfer.
at::Tensor sim_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  SIM_COUNT("aten::_copy_from");
  const bool src_dev = self.device().type() == kSim;
  const bool dst_dev = dst.device().type() == kSim;
  if (src_dev && dst_dev) {
    check_dtype(dst.scalar_type(), dst.device().index());
    charge_work(rec_, host_bytes(self) + host_bytes(dst), dst.numel(),
                dst.scalar_type() == c10::ScalarType::Half);
    if (self.device().index() != dst.device().index()) {
      count_transfer(Transfer::D2D, host_bytes(dst));
      if (config().cross_adapter_copy_zeros) {
        // microsoft/DirectML#443: a copy to another adapter arrives as zeros.
        cpu_alias(dst).zero_();
        return dst;
      }
    }
  } else if (dst_dev) {
    check_dtype(dst.scalar_type(), dst.device().index());
    count_transfer(Transfer::H2D, host_bytes(self));
  } else {
    count_transfer(Transfer::D2H, host_bytes(dst));
  }
  if (config().drop_scalar_writes && dst_dev && dst.numel() == 1 &&
      dst.storage().nbytes() > static_cast<size_t>(dst.element_size())) {
    // Fault injection: DirectML reportedly drops single-element writes (errors.md); torch
    // >= 2.5 writes `t[i] = v` as a copy_ into the element rather than a fill_.
    return dst;
  }
  at::Tensor cpu_dst = cpu_alias(dst);
  cpu_dst.copy_(cpu_alias(self), non_blocking);
  return dst;
}

at::Tensor sim_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  SIM_COUNT("aten::_copy_from_and_resize");
  if (dst.sizes() != self.sizes()) {
    if (dst.device().type() == kSim) {
      sim_resize(dst, self.sizes(), c10::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return sim_copy_from(self, dst, false);
}

c10::Scalar sim_local_scalar_dense(const at::Tensor& self) {
  SIM_COUNT("aten::_local_scalar_dense");
  count_sync();
  return cpu_alias(self).item();
}

// 2 FLOPs per multiply-add: every output element of a convolution sums (in channels / groups)
// x (kernel extent) products; a transposed one does that for every input element.
int64_t convolution_flops(const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& out, bool transposed, int64_t groups) {
  int64_t extent = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) extent *= weight.size(d);
  if (transposed) return 2 * input.numel() * (weight.size(1)) * extent;
  return 2 * out.numel() * (weight.size(1)) * extent;
}

// float16 convolutions in float32, their results rounded to float16 once (the CPU's float16
// convolution is 30-40x slower than float32's; see widened_in_float32 in fallback.cpp).
bool all_half(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (t->defined() && t->scalar_type() != at::kHalf) return false;
  }
  return true;
}

at::Tensor widened(const at::Tensor& t, bool widen) {
  return widen && t.defined() ? t.to(at::kFloat) : t;
}

at::Tensor narrowed(const at::Tensor& t, bool widen) {
  return widen && t.defined() ? t.to(at::kHalf) : t;
}

at::Tensor sim_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  static OpRecord* const rec = op_record("aten::convolution_overrideable");
  const c10::IValue args[] = {input, weight, bias ? c10::IValue(*bias) : c10::IValue()};
  check_inference_mode(rec, args);
  count_call(rec);
  TORCH_CHECK(input.device() == weight.device() &&
                  (!bias || !bias->defined() || bias->device() == input.device()),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              input.device(), " and ", weight.device(), "!");
  const at::Tensor no_bias;
  const bool widen = all_half({&input, &weight, bias ? &*bias : &no_bias});
  c10::optional<at::Tensor> cpu_bias;
  if (bias && bias->defined()) cpu_bias = widened(cpu_alias(*bias), widen);
  at::Tensor out = narrowed(
      at::convolution(widened(cpu_alias(input), widen), widened(cpu_alias(weight), widen),
                      cpu_bias, stride, padding, dilation, transposed, output_padding, groups),
      widen);
  charge_work(rec, host_bytes(input) + host_bytes(weight) + host_bytes(out),
              convolution_flops(input, weight, out, transposed, groups),
              input.scalar_type() == c10::ScalarType::Half);
  return adopt_cpu(out, input.device().index());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sim_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  SIM_COUNT("aten::convolution_backward_overrideable");
  // The bias gradient has one entry per output channel.
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  std::vector<int64_t> bias_sizes{out_channels};
  const bool widen = all_half({&grad_output, &input, &weight});
  auto grads = at::convolution_backward(
      widened(cpu_alias(grad_output), widen), widened(cpu_alias(input), widen),
      widened(cpu_alias(weight), widen), bias_sizes, stride, padding, dilation, transposed,
      output_padding, groups, output_mask);
  std::get<0>(grads) = narrowed(std::get<0>(grads), widen);
  std::get<1>(grads) = narrowed(std::get<1>(grads), widen);
  std::get<2>(grads) = narrowed(std::get<2>(grads), widen);
  // Each gradient asked for is about one forward pass of work.
  const int64_t passes = static_cast<int64_t>(output_mask[0]) + output_mask[1];
  const at::Tensor& out = grad_output;
  charge_work(rec_, host_bytes(grad_output) + host_bytes(input) + host_bytes(weight) * 2,
              passes * convolution_flops(input, weight, out, transposed, groups),
              input.scalar_type() == c10::ScalarType::Half);
  const c10::DeviceIndex index = input.device().index();
  auto lift = [index](const at::Tensor& t) { return t.defined() ? adopt_cpu(t, index) : t; };
  return {lift(std::get<0>(grads)), lift(std::get<1>(grads)), lift(std::get<2>(grads))};
}

}  // namespace

void check_dtype(c10::ScalarType dtype, c10::DeviceIndex index) {
  const auto& unsupported = config().unsupported_dtypes;
  const auto at = static_cast<size_t>(dtype);
  // DirectML stops the process with this fatal log line (dml_util.cc:118); the simulator
  // raises it, so that the traceback shows where (microsoft/DirectML#688, #704, #421).
  TORCH_CHECK(at >= unsupported.size() || !unsupported[at], "Invalid or unsupported data type ",
              c10::toString(dtype), ".");
  // torch-directml 0.2.5's text for a float64 tensor on an adapter without float64
  // (microsoft/DirectML#438; has_float64_support() is False there).
  TORCH_CHECK(dtype != c10::ScalarType::Double || config().float64,
              "The GPU device does not support Double (Float64) operations!");
  (void)index;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(sim_empty));
  m.impl("empty_strided", TORCH_FN(sim_empty_strided));
  m.impl("as_strided", TORCH_FN(sim_as_strided));
  m.impl("view", TORCH_FN(sim_view));
  m.impl("_reshape_alias", TORCH_FN(sim_reshape_alias));
  m.impl("resize_", TORCH_FN(sim_resize));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(sim_set_storage));
  m.impl("set_.source_Storage", TORCH_FN(sim_set_whole_storage));
  m.impl("set_.source_Tensor", TORCH_FN(sim_set_tensor));
  m.impl("set_", TORCH_FN(sim_set_empty));
  m.impl("_copy_from", TORCH_FN(sim_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(sim_copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(sim_local_scalar_dense));
  m.impl("convolution_overrideable", TORCH_FN(sim_convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(sim_convolution_backward));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
}

// PyTorch's conjugate and negative fallbacks resolve a lazily conjugated source of
// `_copy_from` by cloning it, and the clone copies with `_copy_from` again: endless recursion
// (a segfault) for every backend that copies through `_copy_from`. The copy resolves the bits
// itself (its CPU aliases carry the bits, alias.cpp), so it skips those fallbacks.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace dmlsim

// torch 2.4 (torch-directml's pin) registers no AutogradPrivateUse1 or AutocastPrivateUse1
// fallback: custom ops such as torchvision::nms then fail at the autograd key, and every op
// under torch.autocast('privateuseone') fails at the autocast key. Later releases register the
// autograd one themselves, and the autocast one is added from Python (Library.fallback).
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 5
namespace dmlsim {
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
}  // namespace dmlsim
#endif
