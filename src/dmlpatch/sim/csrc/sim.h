// Shared declarations of the simulated DirectML backend (PrivateUse1 over CPU memory).
//
// Kept to the API surface that exists from torch 2.4 (torch-directml's pin) to current
// releases; every version-dependent spelling is isolated in this header.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <torch/library.h>

namespace dmlsim {

constexpr c10::DeviceType kSim = c10::DeviceType::PrivateUse1;

// ---- device state (device.cpp) ----
c10::DeviceIndex device_count();
void set_device_count(c10::DeviceIndex n);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_index(c10::DeviceIndex index);
c10::Allocator* allocator();
// `memory` (not from allocator(): a CPU kernel's result) as held by adapter `index`'s
// allocator for as long as it lives, as DirectML holds its copy of such a result.
c10::DataPtr held_by_device(c10::DataPtr memory, size_t nbytes, c10::DeviceIndex index);
// What adapter `index`'s allocator holds now, the most it held since the last reset of its
// peak, in bytes; the reset (the peak becomes what it holds now).
int64_t memory_held(c10::DeviceIndex index);
int64_t memory_peak(c10::DeviceIndex index);
void reset_memory_peak(c10::DeviceIndex index);
// Grows (or shrinks) a simulated storage in place, keeping its contents; `sim` storages are
// resizable like CUDA's.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

// ---- configuration (api.cpp) ----
struct Config {
  bool float64 = true;         // has_float64_support()
  bool trace = false;          // DMLPATCH_TRACE=1: report the first call of gapped ops
  bool drop_scalar_writes = false;  // fault injection, see profiles.py
  // Non-empty: the text a kernel raises when, inside inference mode, it is given a device
  // tensor made outside it (DirectML's kernels copy that tensor's version counter onto what
  // they make; see profiles.py).
  std::string inference_mode_refusal;
  // DirectML's wrong answers the profile reproduces (quirks.cpp; profiles.QUIRKS).
  bool float_times_bool = false;
  bool nll_loss_none_zero_grad = false;
  bool uint8_sum = false;
  bool cross_adapter_copy_zeros = false;
  // Dtypes no device tensor may have (bfloat16, complex), by c10::ScalarType.
  std::vector<bool> unsupported_dtypes;
};
Config& config();
void check_dtype(c10::ScalarType dtype, c10::DeviceIndex index);

// ---- counters (api.cpp) ----
enum class Transfer { H2D = 0, D2H = 1, D2D = 2 };
void count_transfer(Transfer kind, int64_t bytes);
void count_sync();

// Adapters whose modelled compute time is kept side by side (costing.cpp).
constexpr int kCostSlots = 8;

// How an operator behaves on the simulated device, decided once per operator.
enum class OpClass : int { Native = 0, Fallback = 1 };

// Counts and warning state under the name DirectML would report: structured functional and
// in-place variants report as their .out kernel, as torch-directml's fallback sees them.
struct OpRecord {
  std::string name;  // "aten::add.out"
  OpClass cls = OpClass::Native;
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> fixed{0};   // calls served by a dmlpatch fix (dmlpatch.opfix)
  std::atomic<int64_t> forced{0};  // calls sent to the CPU by DMLPATCH_CPU_OPS
  // Host<->device copies the calls cause on DirectML: its CPU fallback copies every device
  // tensor argument to the CPU, and every written argument and new result back.
  std::atomic<int64_t> copies{0};
  std::atomic<int64_t> copy_bytes{0};
  // The cost model's inputs (costing.cpp): bytes the device kernels read and wrote, their
  // FLOPs, their modelled time on each configured adapter (picoseconds), the values read back
  // to the host (each drains DirectML's queue) and the CPU time of the fallback's kernel.
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> flops{0};
  std::atomic<int64_t> compute_ps[kCostSlots] = {};
  std::atomic<int64_t> readbacks{0};
  std::atomic<int64_t> readback_bytes{0};
  std::atomic<int64_t> upload_bytes{0};  // a fallback's copies back to the device
  std::atomic<int64_t> cpu_ns{0};
  std::atomic<bool> warned{false};
  std::atomic<bool> traced{false};
};

// The record of an operator (created on first use, never freed).
OpRecord* op_record(const std::string& name);
std::vector<OpRecord*> all_records();
// Counts one call of an explicitly implemented (native) kernel.
inline void count_call(OpRecord* rec) {
  rec->calls.fetch_add(1, std::memory_order_relaxed);
}
// Tells Python about the first call of a gapped operator: `warn` issues DirectML's CPU-fallback
// warning (a Python UserWarning, so filters and pytest see it whatever called the op);
// `trace` ("fallback"/"refused", or "" for none) records the caller's stack (DMLPATCH_TRACE=1).
void notify_python(const OpRecord* rec, bool warn, const char* trace);

// ---- zero-copy views between the device and the CPU (alias.cpp) ----
// A CPU tensor over the same memory as `t` (a simulated tensor); nothing is copied.
at::Tensor cpu_alias(const at::Tensor& t);
c10::Storage cpu_storage_alias(const c10::Storage& device_storage);
// A CPU tensor with `t`'s geometry over `cpu_storage` (an alias of t's storage).
at::Tensor cpu_view_of(const c10::Storage& cpu_storage, const at::Tensor& t);
// A simulated tensor adopting the memory of a CPU tensor `r` (kept alive, not copied).
at::Tensor adopt_cpu(const at::Tensor& r, c10::DeviceIndex index);
// A simulated tensor with `cpu_view`'s geometry over `base`'s storage, keyed like `base`.
at::Tensor device_view(const at::Tensor& base, const at::Tensor& cpu_view);
// After a CPU kernel wrote to `cpu` (an alias of `dev`), make `dev` match it: new shape,
// and new memory if the kernel had to reallocate.
void sync_back(const at::Tensor& dev, const at::Tensor& cpu);

// ---- DirectML's wrong answers (quirks.cpp) ----
enum class Quirk : int { None = 0, FloatTimesBool, NllLossNoneZeroGrad, Uint8Sum };
// The quirk an operator overload may show (decided by its name), or Quirk::None.
Quirk quirk_of(const c10::OperatorName& name);
// Before the kernel runs, with the call's device arguments from `base` on the stack: true when
// the quirk produced the call's results itself (counted on `rec`; they replace the arguments).
// May raise as DirectML does (counted as refused).
bool quirk_before(Quirk quirk, OpRecord* rec, const c10::OperatorName& name,
                  torch::jit::Stack* stack, size_t base);
// After the kernel ran, with its device results on the stack: the wrong answer, in place.
// `args` are the call's arguments as it was given them.
void quirk_after(Quirk quirk, const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 torch::jit::Stack* stack);
void set_quirks(const std::string& quirks, const std::string& unsupported_dtypes);

// ---- the cost model's accounting (costing.cpp) ----
// One device kernel's work: the bytes of the distinct device tensors it reads and writes, and
// its FLOPs (matrix products by their shapes, any other kernel one per element of its widest
// tensor). Given the arguments before the kernel runs and the results after it.
class KernelCharge {
 public:
  void arguments(const std::string& op, c10::ArrayRef<c10::IValue> args);
  void results(c10::ArrayRef<c10::IValue> values);
  void commit(OpRecord* rec) const;

 private:
  void add(const c10::IValue& v);
  void add(const at::Tensor& t);
  int64_t bytes_ = 0;
  int64_t widest_ = 0;
  int64_t product_flops_ = -1;
  bool half_ = false;
  bool seen_first_ = false;
  c10::SmallVector<const c10::TensorImpl*, 8> seen_;
};
// Charges work to `rec` directly (convolutions, whose FLOPs come from their own shapes).
void charge_work(OpRecord* rec, int64_t bytes, int64_t flops, bool half);
// Calls whose result DirectML must read back: a shape that depends on the values (nonzero, a
// boolean mask index), or a value the host waits for (equal).
bool reads_back(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args);
void set_cost_models(const std::string& models);
std::string cost_text();
void reset_costs();

// ---- the boxed CPU fallback (fallback.cpp) ----
// Raises the inference-mode refusal (counted on `rec`) when the profile has it, inference
// mode is on and one of `args` holds a device tensor made outside inference mode.
void check_inference_mode(OpRecord* rec, c10::ArrayRef<c10::IValue> args);
void sim_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
// `names`: lines "overload<TAB>reported-as" (reported-as may be empty).
std::string register_direct(const std::string& names);
// Overloads ("aten::eye.m_out") whose out= resize DirectML's fallback loses.
void drop_out_resizes(const std::string& names);
void add_rule(const std::string& op, const std::string& predicate, const std::string& args,
              int64_t limit, const std::string& message);
void set_classes(int64_t default_class, const std::string& native, const std::string& host_ok);

}  // namespace dmlsim
