// The simulated adapters: allocator (plain CPU memory), device guard and PrivateUse1 hooks.
#include "sim.h"

#include <cstring>
#include <new>

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

// What each adapter's allocator holds: the bytes of its live storages, as torch-directml's
// allocator holds them, and the most it held at once since the peak was last reset. Atomics,
// not a lock: autograd's device threads allocate and free too, and an allocation must cost no
// more than an addition.
struct AdapterMemory {
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> peak{0};
};
// c10::DeviceIndex is 8 bits wide: one slot for every index an adapter can have.
AdapterMemory g_memory[128];

AdapterMemory& memory_of(c10::DeviceIndex index) { return g_memory[index < 0 ? 0 : index]; }

void hold_bytes(c10::DeviceIndex index, int64_t nbytes) {
  AdapterMemory& memory = memory_of(index);
  const int64_t now = memory.held.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = memory.peak.load(std::memory_order_relaxed);
  while (now > peak &&
         !memory.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void release_bytes(c10::DeviceIndex index, int64_t nbytes) {
  memory_of(index).held.fetch_sub(nbytes, std::memory_order_relaxed);
}

// Each allocation carries its size and adapter just before the memory it hands out, so that
// freeing it, given only that pointer (as raw_deleter's callers give it), releases what it
// held. 64 bytes keep the memory as aligned as c10::alloc_cpu's own.
struct alignas(64) AllocationHeader {
  int64_t nbytes;
  c10::DeviceIndex index;
};
static_assert(sizeof(AllocationHeader) == 64, "the header must keep the memory 64-byte aligned");

void free_sim(void* ptr) {
  AllocationHeader* header = static_cast<AllocationHeader*>(ptr) - 1;
  release_bytes(header->index, header->nbytes);
  c10::free_cpu(header);
}

// Memory the device takes over from a CPU kernel's result (adopt_cpu, sync_back): DirectML
// copies such a result into an allocation of its own, so the device holds it like one.
struct AdoptedMemory {
  c10::DataPtr memory;
  int64_t nbytes;
  c10::DeviceIndex index;
};

void free_adopted(void* ctx) {
  auto* adopted = static_cast<AdoptedMemory*>(ctx);
  release_bytes(adopted->index, adopted->nbytes);
  delete adopted;
}

struct SimAllocator final : c10::Allocator {
  // `allocate` lost its const qualifier in torch 2.3; torch-directml pins 2.4.
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = t_current;
    if (nbytes == 0) return {nullptr, nullptr, &free_sim, c10::Device(kSim, index)};
    void* base = c10::alloc_cpu(nbytes + sizeof(AllocationHeader));
    auto* header = new (base) AllocationHeader{static_cast<int64_t>(nbytes), index};
    hold_bytes(index, static_cast<int64_t>(nbytes));
    void* data = header + 1;
    return {data, data, &free_sim, c10::Device(kSim, index)};
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

c10::DataPtr held_by_device(c10::DataPtr memory, size_t nbytes, c10::DeviceIndex index) {
  void* data = memory.get();
  hold_bytes(index, static_cast<int64_t>(nbytes));
  auto* adopted = new AdoptedMemory{std::move(memory), static_cast<int64_t>(nbytes), index};
  return {data, adopted, &free_adopted, c10::Device(kSim, index)};
}

int64_t memory_held(c10::DeviceIndex index) {
  check_index(index);
  return memory_of(index).held.load(std::memory_order_relaxed);
}

int64_t memory_peak(c10::DeviceIndex index) {
  check_index(index);
  return memory_of(index).peak.load(std::memory_order_relaxed);
}

void reset_memory_peak(c10::DeviceIndex index) {
  check_index(index);
  AdapterMemory& memory = memory_of(index);
  memory.peak.store(memory.held.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

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
