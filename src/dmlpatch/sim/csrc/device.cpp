// The simulated adapters: allocator (plain CPU memory), device guard and PrivateUse1 hooks.
#include "sim.h"

#include <cstring>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 5
#include <ATen/core/GeneratorForPrivateuseone.h>
#endif
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

namespace dmlsim {
namespace {

std::atomic<c10::DeviceIndex> g_device_count{1};
thread_local c10::DeviceIndex t_current = 0;

void free_sim(void* ptr) { c10::free_cpu(ptr); }

struct SimAllocator final : c10::Allocator {
  // `allocate` lost its const qualifier in torch 2.3; torch-directml pins 2.4.
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {data, data, &free_sim, c10::Device(kSim, t_current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_sim; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

SimAllocator g_allocator;

struct SimGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSim; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(kSim, t_current);
    if (d.index() >= 0) {
      check_index(d.index());
      t_current = d.index();
    }
    return old;
  }
  c10::Device getDevice() const override { return {kSim, t_current}; }
  void setDevice(c10::Device d) const override {
    check_index(d.index());
    t_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  // torch 2.4's autograd asks for it when a backward pass crosses adapters (DataParallel).
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count.load(); }
  // Kernels run synchronously on the CPU, so events are always complete.
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
};

at::Generator new_generator(c10::DeviceIndex = -1) {
  return at::make_generator<at::CPUGeneratorImpl>();
}

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 5
// torch 2.4 looks the generator of torch.Generator(device=...) up in this registry.
REGISTER_GENERATOR_PRIVATEUSE1(new_generator)
#endif

// Members are declared without `override` where their signatures changed between torch 2.4
// and later releases (constness): the matching one overrides, the other is inert.
struct SimHooks final : at::PrivateUse1HooksInterface {
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  c10::DeviceIndex deviceCount() const { return g_device_count.load(); }
  // torch-directml draws random numbers from the CPU generator; so does the simulator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const {
    return at::detail::getDefaultCPUGenerator();
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) {
    return at::detail::getDefaultCPUGenerator();
  }
  // torch.Generator(device=dml): torch-directml 0.2.5 registers one made on the CPU generator
  // (its native library constructs CPUGeneratorImpl); torch >= 2.5 asks the hooks for it.
  at::Generator getNewGenerator(c10::DeviceIndex = -1) const { return new_generator(); }
  at::Device getDeviceFromPtr(void*) const { return {kSim, t_current}; }
  bool isPinnedPtr(const void*) const { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

SimHooks g_hooks;

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }
} g_register_hooks;

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuard);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

c10::DeviceIndex device_count() { return g_device_count.load(); }
void set_device_count(c10::DeviceIndex n) { g_device_count.store(n); }
c10::DeviceIndex current_device() { return t_current; }
void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  t_current = index;
}
void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < g_device_count.load(), "Invalid device_id argument supplied ",
              static_cast<int>(index), ". device_id must be in range [0, ",
              static_cast<int>(g_device_count.load()), ").");
}
c10::Allocator* allocator() { return &g_allocator; }

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const c10::DeviceIndex index = storage->device().index();
  const c10::DeviceIndex saved = t_current;
  t_current = index >= 0 ? index : saved;
  c10::DataPtr fresh = g_allocator.allocate(nbytes);
  t_current = saved;
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace dmlsim
