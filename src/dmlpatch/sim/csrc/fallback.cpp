// The boxed fallback: every operator without an explicit kernel runs its CPU kernel on
// zero-copy CPU aliases of the device tensors. Before that it applies the profile: refusal
// rules (DirectML's RuntimeErrors), the once-per-operator CPU-fallback warning and counting.
#include "sim.h"

#include <chrono>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>

namespace dmlsim {

struct Rule {
  std::string predicate;
  std::vector<std::string> args;
  int64_t limit = 0;
  std::string message;
};

namespace {

// What the fallback needs to know about one operator overload, resolved on its first call.
struct OpEntry {
  OpRecord* rec = nullptr;
  bool host_tensors_ok = false;  // exempt from the same-device check
  bool drops_out_resize = false;  // DirectML's fallback loses the resize of its out= tensor
  Quirk quirk = Quirk::None;  // a wrong answer DirectML gives for some calls (quirks.cpp)
  // Refusal rules for this overload, with the schema positions of the arguments they read.
  std::vector<std::pair<const Rule*, std::vector<int>>> rules;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, OpRecord*> by_name;
  std::unordered_map<std::string, std::string> reported_as;
  std::unordered_map<const void*, OpEntry*> by_handle;
  std::vector<OpRecord*> all;
  OpClass default_class = OpClass::Native;
  std::unordered_set<std::string> native;
  std::unordered_set<std::string> host_ok;  // operator names without overload
  std::unordered_set<std::string> unresized;  // qualified overload names
  std::unordered_map<std::string, std::vector<std::unique_ptr<Rule>>> rules;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: records outlive static teardown
  return *r;
}

std::string qualified(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

OpRecord* make_record(Registry& reg, const std::string& name) {
  auto* rec = new OpRecord();
  rec->name = name;
  rec->cls = reg.native.count(name) ? OpClass::Native : reg.default_class;
  reg.by_name.emplace(name, rec);
  reg.all.push_back(rec);
  return rec;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- refusal rules ----

std::string fill_rank(std::string message, int64_t rank) {
  const auto pos = message.find("{n}");
  if (pos != std::string::npos) message.replace(pos, 3, std::to_string(rank));
  return message;
}

int64_t rank_of(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().dim();
  if (v.isIntList()) return static_cast<int64_t>(v.toIntList().size());
  return 0;
}

// Returns the message of the first rule the call breaks, or nullptr.
const std::string* broken_rule(const OpEntry* rec, const torch::jit::Stack& stack, size_t base,
                               std::string& scratch) {
  for (const auto& [rule, idx] : rec->rules) {
    auto arg = [&](size_t i) -> const c10::IValue& { return stack[base + idx[i]]; };
    const std::string& p = rule->predicate;
    if (p == "always") return &rule->message;
    if (p == "flag") {
      for (size_t i = 0; i < idx.size(); ++i) {
        if (arg(i).isBool() && arg(i).toBool()) return &rule->message;
      }
    } else if (p == "present") {
      for (size_t i = 0; i < idx.size(); ++i) {
        if (!arg(i).isNone()) return &rule->message;
      }
    } else if (p == "rank_above") {
      int64_t rank = 0;
      for (size_t i = 0; i < idx.size(); ++i) rank = std::max(rank, rank_of(arg(i)));
      if (rank > rule->limit) {
        scratch = fill_rank(rule->message, rank);
        return &scratch;
      }
    } else if (p == "same_shape") {
      // args: index, src — refused when src is a tensor whose shape differs from index.
      if (idx.size() == 2 && arg(0).isTensor() && arg(1).isTensor() &&
          arg(0).toTensor().sizes() != arg(1).toTensor().sizes()) {
        return &rule->message;
      }
    } else if (p == "only_dim_differs") {
      // args: self, dim, index — refused when index and self differ outside `dim`.
      if (idx.size() == 3 && arg(0).isTensor() && arg(2).isTensor()) {
        const at::Tensor& self = arg(0).toTensor();
        const at::Tensor& index = arg(2).toTensor();
        const int64_t dim = c10::maybe_wrap_dim(arg(1).toInt(), self.dim());
        if (index.dim() == self.dim()) {
          for (int64_t d = 0; d < self.dim(); ++d) {
            if (d != dim && index.size(d) != self.size(d)) return &rule->message;
          }
        }
      }
    }
  }
  return nullptr;
}

// ---- inference mode ----

bool made_outside_inference_mode(const at::Tensor& t) {
  return t.defined() && t.device().type() == kSim && !t.is_inference();
}

bool holds_normal_device_tensor(const c10::IValue& v) {
  if (v.isTensor()) return made_outside_inference_mode(v.toTensor());
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (made_outside_inference_mode(t)) return true;
    }
    return false;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toList()) {
      if (e.isTensor() && made_outside_inference_mode(e.toTensor())) return true;
    }
  }
  return false;
}

// ---- argument and result conversion ----

int64_t nbytes_of(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

struct Call {
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 8> storages;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 8> tensors;  // (device, CPU alias)
  c10::SmallVector<std::pair<c10::StorageImpl*, at::Tensor>, 4> fresh;  // adopted results
  // Per schema argument: the device tensor it held (for written-argument copies), or null.
  c10::SmallVector<const c10::TensorImpl*, 8> written;
  c10::DeviceIndex index = -1;
  c10::optional<c10::Device> stranger;  // a tensor on another device
  int64_t adopted = 0;        // results that are new device tensors (copied back on DirectML)
  int64_t adopted_bytes = 0;

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() != kSim) {
      // CPU scalars (0-dim) are allowed beside device tensors, as in PyTorch.
      if (t.dim() > 0 && !stranger) stranger = t.device();
      return t;
    }
    const c10::DeviceIndex i = t.device().index();
    if (index < 0) {
      index = i;
    } else if (i != index && !stranger) {
      stranger = t.device();
    }
    for (const auto& p : tensors) {
      if (p.first.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return p.second;
    }
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    c10::Storage cpu_storage;
    for (const auto& p : storages) {
      if (p.first == si) cpu_storage = p.second;
    }
    if (!cpu_storage) {
      cpu_storage = cpu_storage_alias(t.storage());
      storages.emplace_back(si, cpu_storage);
    }
    at::Tensor cpu = cpu_view_of(cpu_storage, t);
    tensors.emplace_back(t, cpu);
    return cpu;
  }

  c10::IValue to_cpu(const c10::IValue& v) {
    if (v.isTensor()) return to_cpu(v.toTensor());
    if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      if (d.type() != kSim) return v;
      if (index < 0 && d.has_index()) index = d.index();
      return c10::Device(c10::kCPU);
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      const auto in = v.toTensorList();
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(to_cpu(t));
      return out;
    }
    if (v.isList()) {  // Tensor?[] (indices of index/index_put)
      auto list = v.toList();
      bool has_tensor = false;
      for (const c10::IValue& e : list) has_tensor = has_tensor || e.isTensor();
      if (!has_tensor) return v;
      auto out = c10::impl::GenericList(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& e : list) out.push_back(e.isTensor() ? to_cpu(e.toTensor()) : e);
      return out;
    }
    return v;
  }

  at::Tensor to_device(const at::Tensor& r) {
    if (!r.defined() || r.device().type() == kSim) return r;
    for (const auto& p : tensors) {
      if (p.second.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return p.first;
    }
    c10::StorageImpl* si = r.storage().unsafeGetStorageImpl();
    for (const auto& p : storages) {
      // A view of an argument: keep it a view of the argument's device storage.
      if (p.second.unsafeGetStorageImpl() == si) {
        for (const auto& t : tensors) {
          if (t.second.storage().unsafeGetStorageImpl() == si) {
            return device_view(t.first, r);
          }
        }
      }
    }
    for (const auto& p : fresh) {
      if (p.first == si) return device_view(p.second, r);
    }
    const c10::DeviceIndex target = index >= 0 ? index : current_device();
    check_dtype(r.scalar_type(), target);
    // A CPU ZeroTensor (_efficientzerotensor: the gradient of sgn, of a detached branch) has
    // no memory behind its storage; adopted as it is, the first read of it crashes.
    at::Tensor t = adopt_cpu(r._is_zerotensor() ? at::zeros(r.sizes(), r.options()) : r, target);
    adopted += 1;
    adopted_bytes += nbytes_of(r);
    fresh.emplace_back(si, t);
    return t;
  }

  c10::IValue to_device(const c10::IValue& v) {
    if (v.isTensor()) return to_device(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      const auto in = v.toTensorList();
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(to_device(t));
      return out;
    }
    return v;
  }
};

// Counts the copies DirectML's CPU fallback makes for this call (the simulator makes none):
// every device tensor argument to the CPU, every written argument and new result back.
void count_fallback_copies(OpRecord* rec, const c10::OperatorHandle& op, const Call& call) {
  int64_t copies = call.adopted;
  int64_t bytes = call.adopted_bytes;
  for (const auto& p : call.tensors) {
    copies += 1;
    bytes += nbytes_of(p.first);
  }
  const auto& arguments = op.schema().arguments();
  for (const auto& p : call.tensors) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto* alias = arguments[i].alias_info();
      if (alias != nullptr && alias->isWrite() && call.written.size() > i &&
          call.written[i] == p.first.unsafeGetTensorImpl()) {
        copies += 1;
        bytes += nbytes_of(p.first);
      }
    }
  }
  rec->copies.fetch_add(copies, std::memory_order_relaxed);
  rec->copy_bytes.fetch_add(bytes, std::memory_order_relaxed);
  // Each argument copied down is a read-back: torch-directml copies them one by one, each
  // waiting for the queue.
  int64_t down = 0;
  for (const auto& p : call.tensors) down += nbytes_of(p.first);
  rec->readbacks.fetch_add(static_cast<int64_t>(call.tensors.size()), std::memory_order_relaxed);
  rec->readback_bytes.fetch_add(down, std::memory_order_relaxed);
  rec->upload_bytes.fetch_add(bytes - down, std::memory_order_relaxed);
}

bool is_scalar_write(const c10::OperatorName& name, const torch::jit::Stack& stack,
                     size_t base) {
  if (name.name != "aten::fill_") return false;
  const at::Tensor& self = stack[base].toTensor();
  return self.numel() == 1 &&
         self.storage().nbytes() > static_cast<size_t>(self.element_size());
}

}  // namespace

OpRecord* op_record(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.by_name.find(name);
  return it != reg.by_name.end() ? it->second : make_record(reg, name);
}

OpEntry* op_entry(const c10::OperatorHandle& op) {
  Registry& reg = registry();
  const void* key = &op.operator_name();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto hit = reg.by_handle.find(key);
  if (hit != reg.by_handle.end()) return hit->second;
  auto* entry = new OpEntry();
  std::string name = qualified(op.operator_name());
  entry->drops_out_resize = reg.unresized.count(name) > 0;
  auto alias = reg.reported_as.find(name);
  if (alias != reg.reported_as.end()) name = alias->second;
  auto it = reg.by_name.find(name);
  entry->rec = it != reg.by_name.end() ? it->second : make_record(reg, name);
  entry->host_tensors_ok = reg.host_ok.count(op.operator_name().name) > 0;
  entry->quirk = quirk_of(op.operator_name());
  const auto& schema = op.schema();
  auto rules = reg.rules.find(op.operator_name().name);
  if (rules != reg.rules.end()) {
    for (const auto& rule : rules->second) {
      std::vector<int> idx;
      bool complete = true;
      for (const std::string& a : rule->args) {
        auto pos = schema.argumentIndexWithName(a);
        if (!pos) complete = false;
        else idx.push_back(static_cast<int>(*pos));
      }
      if (complete) entry->rules.emplace_back(rule.get(), std::move(idx));
    }
  }
  reg.by_handle.emplace(key, entry);
  return entry;
}

void check_inference_mode(OpRecord* rec, c10::ArrayRef<c10::IValue> args) {
  const std::string& message = config().inference_mode_refusal;
  if (message.empty() || !c10::InferenceMode::is_enabled()) return;
  for (const c10::IValue& v : args) {
    if (holds_normal_device_tensor(v)) {
      rec->refused.fetch_add(1, std::memory_order_relaxed);
      if (config().trace && !rec->traced.exchange(true)) notify_python(rec, false, "refused");
      TORCH_CHECK(false, message);
    }
  }
}

std::vector<OpRecord*> all_records() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.all;
}

void set_classes(int64_t default_class, const std::string& native, const std::string& host_ok) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.default_class = static_cast<OpClass>(default_class);
  for (auto& n : split(native, '\n')) reg.native.insert(n);
  for (auto& n : split(host_ok, '\n')) reg.host_ok.insert(n);
  for (OpRecord* rec : reg.all) {
    rec->cls = reg.native.count(rec->name) ? OpClass::Native : reg.default_class;
  }
}

void drop_out_resizes(const std::string& names) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& n : split(names, '\n')) reg.unresized.insert(n);
}

void add_rule(const std::string& op, const std::string& predicate, const std::string& args,
              int64_t limit, const std::string& message) {
  auto rule = std::make_unique<Rule>();
  rule->predicate = predicate;
  rule->args = split(args, ',');
  rule->limit = limit;
  rule->message = message;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.rules[op].push_back(std::move(rule));
}

std::string register_direct(const std::string& names) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  std::string failed;
  for (const std::string& line : split(names, '\n')) {
    const auto tab = line.find('\t');
    const std::string name = line.substr(0, tab);
    if (tab != std::string::npos && tab + 1 < line.size()) {
      Registry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      reg.reported_as["aten::" + name] = "aten::" + line.substr(tab + 1);
    }
    try {
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
    } catch (const c10::Error&) {
      failed += name + "\n";
    }
  }
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.libraries.push_back(std::move(lib));
  return failed;
}

namespace {

// The CPU has no fast float16 matrix product or convolution (30-40x float32's time), which
// made a mixed-precision step on the simulator minutes long. These kernels, given float16,
// compute in float32 and round their results to float16 once: what the CPU's float16 kernels
// do too (they accumulate in float32), in another order of summation, so a result may differ
// from theirs in its last float16 bit. DirectML's own accumulation order is its own.
bool widened_in_float32(const c10::OperatorName& name) {
  // (convolution has kernels of its own, kernels.cpp, which widen likewise)
  static const std::unordered_set<std::string> ops = {"aten::mm", "aten::addmm", "aten::bmm",
                                                      "aten::baddbmm"};
  return ops.count(name.name) > 0;
}

struct Widened {
  // (schema argument, the float16 tensor it held) of each written (out=) argument
  c10::SmallVector<std::pair<size_t, at::Tensor>, 2> outs;
  bool any = false;
};

Widened widen_half_arguments(const c10::FunctionSchema& schema, torch::jit::Stack* stack,
                             size_t base) {
  Widened widened;
  for (size_t i = base; i < stack->size(); ++i) {
    // Mixed float16 and float32 arguments: the CPU kernel's own error, not a float32 result.
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_floating_point() &&
        v.toTensor().scalar_type() != at::kHalf) {
      return widened;
    }
  }
  for (size_t i = base; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().scalar_type() != at::kHalf) {
      continue;
    }
    const auto& alias = schema.arguments()[i - base].alias_info();
    if (alias && alias->isWrite()) widened.outs.emplace_back(i - base, v.toTensor());
    v = v.toTensor().to(at::kFloat);
    widened.any = true;
  }
  return widened;
}

void narrow_results(const Widened& widened, torch::jit::Stack* stack, size_t nret) {
  size_t next_out = 0;
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().scalar_type() != at::kFloat) {
      continue;
    }
    const at::Tensor& wide = v.toTensor();
    if (next_out < widened.outs.size()) {  // an out= kernel returns its out argument
      at::Tensor out = widened.outs[next_out++].second;
      if (out.sizes() != wide.sizes()) out.resize_(wide.sizes());
      out.copy_(wide);
      v = out;
    } else {
      v = wide.to(at::kHalf);
    }
  }
}

bool holds_half(const torch::jit::Stack& stack, size_t base) {
  for (size_t i = base; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kHalf) {
      return true;
    }
  }
  return false;
}

// torch's CPU has no float16 kernel for some operators DirectML computes in float16 (torch
// 2.4's replication and reflection padding): the simulator computes those in float32 and
// rounds once, as it does its matrix products, where a DirectML program would not stop. Tried
// first as they are, so a torch release whose CPU has the kernel runs its own.
void redispatch_widening_refused_half(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                      size_t base, Widened* widened) {
  const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
  const c10::SmallVector<c10::IValue, 8> given(stack->begin() + static_cast<std::ptrdiff_t>(base),
                                               stack->end());
  try {
    op.redispatchBoxed(cpu, stack);
    return;
  } catch (const c10::Error& error) {
    if (std::string(error.what_without_backtrace()).find("not implemented for 'Half'") ==
        std::string::npos) {
      throw;
    }
    stack->resize(base);
    stack->insert(stack->end(), given.begin(), given.end());
    *widened = widen_half_arguments(op.schema(), stack, base);
    if (!widened->any) throw;
  }
  op.redispatchBoxed(cpu, stack);
}

}  // namespace

void sim_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpEntry* entry = op_entry(op);
  OpRecord* rec = entry->rec;
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;

  check_inference_mode(rec, c10::ArrayRef<c10::IValue>(stack->data() + base, nargs));
  if (!entry->rules.empty()) {
    std::string scratch;
    if (const std::string* message = broken_rule(entry, *stack, base, scratch)) {
      rec->refused.fetch_add(1, std::memory_order_relaxed);
      if (config().trace && !rec->traced.exchange(true)) notify_python(rec, false, "refused");
      TORCH_CHECK(false, *message);
    }
  }
  c10::SmallVector<c10::IValue, 8> given;  // the arguments, for a quirk that reads them after
  if (entry->quirk != Quirk::None) {
    if (quirk_before(entry->quirk, rec, op.operator_name(), stack, base)) return;
    given.assign(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  }
  count_call(rec);
  if (rec->cls == OpClass::Fallback) {
    const bool warn = !rec->warned.exchange(true);
    const bool trace = config().trace && !rec->traced.exchange(true);
    if (warn || trace) notify_python(rec, warn, trace ? "fallback" : "");
  }

  const bool native = rec->cls == OpClass::Native;
  KernelCharge charge;
  bool read_back = false;
  if (native) {
    const c10::ArrayRef<c10::IValue> arguments(stack->data() + base, nargs);
    charge.arguments(op.operator_name().name, arguments);
    read_back = reads_back(op.operator_name(), arguments);
  }
  Call call;
  for (size_t i = base; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    call.written.push_back(v.isTensor() && v.toTensor().defined() &&
                                   v.toTensor().device().type() == kSim
                               ? v.toTensor().unsafeGetTensorImpl()
                               : nullptr);
    (*stack)[i] = call.to_cpu(v);
  }
  if (call.stranger && !entry->host_tensors_ok) {
    const c10::Device mine(kSim, call.index < 0 ? 0 : call.index);
    TORCH_CHECK(false,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                mine, " and ", *call.stranger, "!");
  }
  if (config().drop_scalar_writes && is_scalar_write(op.operator_name(), *stack, base)) {
    // Fault injection: DirectML reportedly drops single-element writes (errors.md).
    const c10::IValue self = (*stack)[base];
    torch::jit::drop(*stack, nargs);
    stack->push_back(call.to_device(self));
    return;
  }

  Widened widened;
  if (native && widened_in_float32(op.operator_name())) {
    widened = widen_half_arguments(op.schema(), stack, base);
  }
  const auto started = std::chrono::steady_clock::now();
  if (native && !widened.any && holds_half(*stack, base)) {
    redispatch_widening_refused_half(op, stack, base, &widened);
  } else {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  if (widened.any) narrow_results(widened, stack, op.schema().returns().size());
  if (!native) {
    // DirectML's fallback runs this same CPU kernel on the same host: its time is real.
    const auto spent = std::chrono::steady_clock::now() - started;
    rec->cpu_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count(),
                          std::memory_order_relaxed);
  }

  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    (*stack)[i] = call.to_device((*stack)[i]);
  }
  if (native) {
    charge.results(c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - nret, nret));
    charge.commit(rec);
    if (read_back) {
      rec->readbacks.fetch_add(1, std::memory_order_relaxed);
      rec->readback_bytes.fetch_add(8, std::memory_order_relaxed);
    }
  }
  for (const auto& p : call.tensors) {
    // torch.eye(3, device=dml) returns an empty tensor (microsoft/DirectML#431): the CPU
    // kernel resized the out= argument's host copy, and the device tensor never follows.
    if (entry->drops_out_resize && p.first.sizes() != p.second.sizes()) continue;
    sync_back(p.first, p.second);
  }
  if (entry->quirk != Quirk::None) quirk_after(entry->quirk, op, given, stack);
  if (rec->cls == OpClass::Fallback) count_fallback_copies(rec, op, call);
}

}  // namespace dmlsim
