// The Python-facing control surface (torch.ops.dmlpatch_sim.*): configuration from the
// profile table, counters, and the trace hook. Defined as custom operators so the extension
// needs no pybind11 and loads in milliseconds.
#include "sim.h"

#include <sstream>

#include <ATen/ops/empty.h>

namespace dmlsim {
namespace {

std::atomic<int64_t> g_transfer_count[3];
std::atomic<int64_t> g_transfer_bytes[3];
std::atomic<int64_t> g_syncs{0};

void configure(int64_t devices, bool float64, bool trace, const std::string& fault) {
  TORCH_CHECK(devices >= 1, "DMLPATCH_SIM_DEVICES must be at least 1");
  set_device_count(static_cast<c10::DeviceIndex>(devices));
  config().float64 = float64;
  config().trace = trace;
  config().drop_scalar_writes = fault == "drop-scalar-writes";
}

std::string counters_text() {
  static const char* kinds[] = {"h2d", "d2h", "d2d"};
  std::ostringstream out;
  for (int i = 0; i < 3; ++i) {
    out << "transfer\t" << kinds[i] << '\t' << g_transfer_count[i].load() << '\t'
        << g_transfer_bytes[i].load() << '\n';
  }
  out << "syncs\t" << g_syncs.load() << '\n';
  for (OpRecord* rec : all_records()) {
    const int64_t calls = rec->calls.load();
    const int64_t refused = rec->refused.load();
    if (calls > 0) {
      out << (rec->cls == OpClass::Native ? "native" : "fallback") << '\t' << rec->name << '\t'
          << calls << '\n';
    }
    if (refused > 0) out << "refused\t" << rec->name << '\t' << refused << '\n';
    const int64_t fixed = rec->fixed.load();
    if (fixed > 0) out << "fixed\t" << rec->name << '\t' << fixed << '\n';
    const int64_t forced = rec->forced.load();
    if (forced > 0) out << "fallback\t" << rec->name << '\t' << forced << '\n';
    const int64_t copies = rec->copies.load();
    if (copies > 0) {
      out << "copies\t" << rec->name << '\t' << copies << '\t' << rec->copy_bytes.load() << '\n';
    }
  }
  return out.str();
}

void reset_counters() {
  for (int i = 0; i < 3; ++i) {
    g_transfer_count[i].store(0);
    g_transfer_bytes[i].store(0);
  }
  g_syncs.store(0);
  for (OpRecord* rec : all_records()) {
    rec->calls.store(0);
    rec->refused.store(0);
    rec->fixed.store(0);
    rec->forced.store(0);
    rec->copies.store(0);
    rec->copy_bytes.store(0);
    rec->traced.store(false);
  }
  reset_costs();
}

// A call served outside the kernels: by a dmlpatch fix ("fixed") or sent to the CPU by
// DMLPATCH_CPU_OPS ("fallback", with the copies it made). Called from dmlpatch.opfix.
void record_call(const std::string& category, const std::string& name, int64_t copies,
                 int64_t bytes, int64_t cpu_ns) {
  OpRecord* rec = op_record(name);
  if (category == "fixed") {
    rec->fixed.fetch_add(1, std::memory_order_relaxed);
  } else if (category == "fallback") {
    rec->forced.fetch_add(1, std::memory_order_relaxed);
  } else {
    TORCH_CHECK(false, "record_call: unknown category ", category);
  }
  if (copies > 0) {
    rec->copies.fetch_add(copies, std::memory_order_relaxed);
    rec->copy_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (cpu_ns > 0) rec->cpu_ns.fetch_add(cpu_ns, std::memory_order_relaxed);
  if (config().trace && !rec->traced.exchange(true)) notify_python(rec, false, category.c_str());
}

void refuse_inference_mode(const std::string& message) {
  config().inference_mode_refusal = message;
}

// [held, peak]: what adapter `device`'s allocator holds and the most it held since the last
// reset_peak_memory, in bytes (dmlpatch.sim.memory_allocated, the device module's gpu_memory).
c10::DeviceIndex adapter_index(int64_t device) {
  // Out of c10::DeviceIndex's range, an index would wrap onto an adapter that exists.
  const int64_t checked = device < 0 || device > INT8_MAX ? -1 : device;
  check_index(static_cast<c10::DeviceIndex>(checked));
  return static_cast<c10::DeviceIndex>(checked);
}

std::vector<int64_t> memory_op(int64_t device) {
  const c10::DeviceIndex index = adapter_index(device);
  return {memory_held(index), memory_peak(index)};
}

void reset_peak_memory_op(int64_t device) { reset_memory_peak(adapter_index(device)); }

// A 0-element float tensor on adapter `device`, made without dispatching an operator, so no
// counter, cost or memory figure sees it: dmlpatch.sim.autograd_exit passes an empty backward
// through each adapter's autograd thread at exit with such tensors, after which a run report
// may still be written from the counters.
at::Tensor uncounted_empty(int64_t device) {
  const c10::DeviceIndex index = adapter_index(device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       c10::DataPtr(nullptr, c10::Device(kSim, index)), allocator(),
                       /*resizable=*/true);
  return at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::Make<float>());
}

int64_t set_classes_op(int64_t default_class, const std::string& native,
                       const std::string& host_ok) {
  set_classes(default_class, native, host_ok);
  return 0;
}

}  // namespace

Config& config() {
  static Config c;
  return c;
}

void count_transfer(Transfer kind, int64_t bytes) {
  const int i = static_cast<int>(kind);
  g_transfer_count[i].fetch_add(1, std::memory_order_relaxed);
  g_transfer_bytes[i].fetch_add(bytes, std::memory_order_relaxed);
}

void count_sync() { g_syncs.fetch_add(1, std::memory_order_relaxed); }

void notify_python(const OpRecord* rec, bool warn, const char* trace) {
  // The hook is implemented in Python (dmlpatch.sim.counting); it dispatches on a CPU tensor
  // so that it needs no device of its own.
  static const auto hook =
      c10::Dispatcher::singleton().findSchemaOrThrow("dmlpatch_sim::_notify", "");
  torch::jit::Stack stack;
  stack.emplace_back(at::empty({0}));
  stack.emplace_back(rec->name);
  stack.emplace_back(warn);
  stack.emplace_back(std::string(trace));
  hook.callBoxed(&stack);
}

TORCH_LIBRARY(dmlpatch_sim, m) {
  m.def("configure(int devices, bool float64, bool trace, str fault) -> ()", &configure);
  m.def("set_classes(int default_class, str native, str host_ok) -> int", &set_classes_op);
  m.def("add_rule(str op, str predicate, str args, int limit, str message) -> ()", &add_rule);
  m.def("register_direct(str names) -> str", &register_direct);
  m.def("refuse_inference_mode(str message) -> ()", &refuse_inference_mode);
  m.def("drop_out_resizes(str names) -> ()", &drop_out_resizes);
  m.def("set_quirks(str quirks, str unsupported_dtypes) -> ()", &set_quirks);
  m.def("counters() -> str", &counters_text);
  m.def("record_call(str category, str name, int copies, int bytes, int cpu_ns=0) -> ()",
        &record_call);
  m.def("set_cost_models(str models) -> ()", &set_cost_models);
  m.def("costs() -> str", &cost_text);
  m.def("reset_counters() -> ()", &reset_counters);
  m.def("memory(int device) -> int[]", &memory_op);
  m.def("reset_peak_memory(int device) -> ()", &reset_peak_memory_op);
  m.def("uncounted_empty(int device) -> Tensor", &uncounted_empty);
  m.def("_notify(Tensor anchor, str name, bool warn, str trace) -> ()");
}

}  // namespace dmlsim
