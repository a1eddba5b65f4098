// Zero-copy views between simulated storage and CPU tensors. The fallback runs CPU kernels on
// these aliases, so nothing is copied and nothing is counted as a transfer.
#include "sim.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/intrusive_ptr.h>

namespace dmlsim {
namespace {

// DataPtr contexts hold a reference on the storage that owns the memory.
void release_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

c10::DataPtr borrow(c10::StorageImpl* owner, c10::Device device) {
  c10::raw::intrusive_ptr::incref(owner);
  return {owner->mutable_data(), owner, &release_storage, device};
}

void copy_geometry(const at::Tensor& from, const at::Tensor& to) {
  to.unsafeGetTensorImpl()->set_sizes_and_strides(from.sizes(), from.strides(),
                                                  from.storage_offset());
  if (from.is_conj()) to._set_conj(true);
  if (from.is_neg()) to._set_neg(true);
}

}  // namespace

c10::Storage cpu_storage_alias(const c10::Storage& device_storage) {
  c10::StorageImpl* impl = device_storage.unsafeGetStorageImpl();
  // Resizable with the CPU allocator: an out= kernel that must grow its output reallocates
  // into CPU memory, and sync_back() hands that memory to the device tensor.
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), borrow(impl, c10::Device(c10::kCPU)),
      c10::GetCPUAllocator(), /*resizable=*/true));
}

at::Tensor cpu_view_of(const c10::Storage& cpu_storage, const at::Tensor& t) {
  at::Tensor r = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  copy_geometry(t, r);
  return r;
}

at::Tensor cpu_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kSim) return t;
  return cpu_view_of(cpu_storage_alias(t.storage()), t);
}

at::Tensor adopt_cpu(const at::Tensor& r, c10::DeviceIndex index) {
  TORCH_CHECK(r.layout() == c10::kStrided,
              "the simulated DirectML device holds only strided tensors, got ", r.layout());
  c10::StorageImpl* impl = r.storage().unsafeGetStorageImpl();
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
      held_by_device(borrow(impl, c10::Device(kSim, index)), impl->nbytes(), index), allocator(),
      /*resizable=*/true));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
  copy_geometry(r, t);
  return t;
}

at::Tensor device_view(const at::Tensor& base, const at::Tensor& cpu_view) {
  // The view constructor takes the key set as given, as PyTorch's own views do with their
  // base's: a bare PrivateUse1 set would make an inference tensor, whose version counter the
  // view machinery may not set.
  const c10::DispatchKeySet keys =
      base.key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), keys, cpu_view.dtype());
  t.unsafeGetTensorImpl()->_set_conj(cpu_view.is_conj());
  t.unsafeGetTensorImpl()->_set_neg(cpu_view.is_neg());
  copy_geometry(cpu_view, t);
  return t;
}

void sync_back(const at::Tensor& dev, const at::Tensor& cpu) {
  c10::StorageImpl* ds = dev.storage().unsafeGetStorageImpl();
  c10::StorageImpl* cs = cpu.storage().unsafeGetStorageImpl();
  if (cs->data() != ds->data()) {
    // The CPU kernel reallocated its output: the device storage takes over the new memory.
    c10::DataPtr moved = cs->set_data_ptr(c10::DataPtr());
    const size_t nbytes = cs->nbytes();
    ds->set_data_ptr_noswap(held_by_device(std::move(moved), nbytes, ds->device().index()));
    ds->set_nbytes(nbytes);
    // Leave the alias pointing at the same memory so later reads through it stay valid.
    cs->set_data_ptr_noswap(borrow(ds, c10::Device(c10::kCPU)));
  }
  if (dev.sizes() != cpu.sizes() || dev.strides() != cpu.strides() ||
      dev.storage_offset() != cpu.storage_offset()) {
    dev.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                                     cpu.storage_offset());
  }
}

}  // namespace dmlsim
