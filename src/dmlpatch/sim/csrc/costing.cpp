// What each device kernel would cost on DirectML, charged as it runs: the bytes it reads and
// writes, its FLOPs, and its time on a roofline (the slower of its memory traffic at the
// adapter's bandwidth and its FLOPs at the adapter's rate) for each adapter model Python
// configured (dmlpatch.costs). Launches, read-backs and copies are counted elsewhere; Python
// prices them.
#include "sim.h"

#include <sstream>

namespace dmlsim {
namespace {

struct CostModel {
  double bytes_per_ps = 0;  // memory bandwidth
  double flops_per_ps_float = 0;
  double flops_per_ps_half = 0;
};

struct CostModels {
  std::mutex mu;
  int count = 0;
  CostModel slots[kCostSlots];
};

CostModels& models() {
  static CostModels* m = new CostModels();
  return *m;
}

int64_t nbytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size())
                     : 0;
}

const at::Tensor* tensor_at(c10::ArrayRef<c10::IValue> args, size_t i) {
  return i < args.size() && args[i].isTensor() && args[i].toTensor().defined()
             ? &args[i].toTensor()
             : nullptr;
}

// 2 * M * N * K for the products whose first two matrix arguments start at `first`.
int64_t product_flops(c10::ArrayRef<c10::IValue> args, size_t first) {
  const at::Tensor* a = tensor_at(args, first);
  const at::Tensor* b = tensor_at(args, first + 1);
  if (a == nullptr || b == nullptr || a->dim() < 1 || b->dim() < 1) return -1;
  const int64_t k = a->size(-1);
  const int64_t n = b->dim() >= 2 ? b->size(-1) : 1;
  // a's every row but the last dimension: the batch and M.
  const int64_t rows = k > 0 ? a->numel() / k : 0;
  if (a->dim() == 2 && b->dim() == 3) return 2 * rows * k * n * b->size(0);  // addbmm's
  return 2 * rows * k * n;
}

// FLOPs of a matrix product by its operands' shapes; -1 for any other operator.
int64_t product_flops_of(const std::string& name, c10::ArrayRef<c10::IValue> args) {
  int64_t counted = -1;
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::mv" || name == "aten::dot" ||
      name == "aten::vdot") {
    counted = product_flops(args, 0);
  } else if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addmv" ||
             name == "aten::_addmm_activation") {
    counted = product_flops(args, 1);
  } else if (name == "aten::addbmm") {
    const at::Tensor* a = tensor_at(args, 1);
    const at::Tensor* b = tensor_at(args, 2);
    if (a != nullptr && b != nullptr && a->dim() == 3 && b->dim() == 3) {
      counted = 2 * a->size(0) * a->size(1) * a->size(2) * b->size(2);
    }
  }
  return counted;
}

}  // namespace

void charge_work(OpRecord* rec, int64_t bytes, int64_t flops, bool half) {
  rec->bytes.fetch_add(bytes, std::memory_order_relaxed);
  rec->flops.fetch_add(flops, std::memory_order_relaxed);
  CostModels& m = models();
  for (int i = 0; i < m.count; ++i) {
    const CostModel& model = m.slots[i];
    const double rate = half ? model.flops_per_ps_half : model.flops_per_ps_float;
    const double memory = model.bytes_per_ps > 0 ? bytes / model.bytes_per_ps : 0.0;
    const double arithmetic = rate > 0 ? flops / rate : 0.0;
    rec->compute_ps[i].fetch_add(static_cast<int64_t>(std::max(memory, arithmetic)),
                                 std::memory_order_relaxed);
  }
}

void KernelCharge::add(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kSim) return;
  for (const auto* impl : seen_) {
    if (impl == t.unsafeGetTensorImpl()) return;
  }
  seen_.push_back(t.unsafeGetTensorImpl());
  bytes_ += nbytes(t);
  widest_ = std::max<int64_t>(widest_, t.numel());
  if (!seen_first_) {
    seen_first_ = true;
    half_ = t.scalar_type() == c10::ScalarType::Half;
  }
}

void KernelCharge::add(const c10::IValue& v) {
  if (v.isTensor()) {
    add(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) add(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) {
      if (e.isTensor()) add(e.toTensor());
    }
  }
}

void KernelCharge::arguments(const std::string& op, c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue& v : args) add(v);
  product_flops_ = product_flops_of(op, args);
}

void KernelCharge::results(c10::ArrayRef<c10::IValue> values) {
  for (const c10::IValue& v : values) add(v);
}

void KernelCharge::commit(OpRecord* rec) const {
  charge_work(rec, bytes_, product_flops_ >= 0 ? product_flops_ : widest_, half_);
}

bool reads_back(const c10::OperatorName& name, c10::ArrayRef<c10::IValue> args) {
  const std::string& n = name.name;
  if (n == "aten::index" && args.size() > 1 && args[1].isList()) {
    // x[mask]: the mask's count of True decides the result's size (a nonzero, read back).
    for (const c10::IValue& index : args[1].toList()) {
      if (index.isTensor() && index.toTensor().defined() &&
          (index.toTensor().scalar_type() == c10::ScalarType::Bool ||
           index.toTensor().scalar_type() == c10::ScalarType::Byte)) {
        return true;
      }
    }
  }
  // aten::equal answers the host with a bool: it waits for the queue as .item() does.
  return n == "aten::equal" || n == "aten::nonzero" || n == "aten::masked_select" ||
         n == "aten::_unique2" || n == "aten::unique_consecutive" || n == "aten::unique_dim" ||
         n == "aten::_unique" || (n == "aten::repeat_interleave" && name.overload_name == "Tensor");
}

// `models`: one line per adapter, "GB/s<TAB>float32 TFLOP/s<TAB>float16 TFLOP/s" (a GB/s is
// a byte per ns: 1e-3 bytes per ps; a TFLOP/s is one FLOP per ps).
void set_cost_models(const std::string& text) {
  CostModels& m = models();
  std::lock_guard<std::mutex> lock(m.mu);
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line) && count < kCostSlots) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    double gbps = 0, float_tflops = 0, half_tflops = 0;
    fields >> gbps >> float_tflops >> half_tflops;
    TORCH_CHECK(gbps > 0 && float_tflops > 0 && half_tflops > 0,
                "set_cost_models: every figure must be positive: ", line);
    m.slots[count++] = CostModel{gbps * 1e-3, float_tflops, half_tflops};
  }
  m.count = count;
}

std::string cost_text() {
  std::ostringstream out;
  for (OpRecord* rec : all_records()) {
    const int64_t bytes = rec->bytes.load();
    const int64_t readbacks = rec->readbacks.load();
    const int64_t cpu = rec->cpu_ns.load();
    if (bytes == 0 && readbacks == 0 && cpu == 0 && rec->flops.load() == 0 &&
        rec->upload_bytes.load() == 0)
      continue;
    out << rec->name << '\t' << bytes << '\t' << rec->flops.load() << '\t' << readbacks << '\t'
        << rec->readback_bytes.load() << '\t' << rec->upload_bytes.load() << '\t' << cpu;
    for (int i = 0; i < models().count; ++i) out << '\t' << rec->compute_ps[i].load();
    out << '\n';
  }
  return out.str();
}

void reset_costs() {
  for (OpRecord* rec : all_records()) {
    rec->bytes.store(0);
    rec->flops.store(0);
    for (auto& slot : rec->compute_ps) slot.store(0);
    rec->readbacks.store(0);
    rec->readback_bytes.store(0);
    rec->upload_bytes.store(0);
    rec->cpu_ns.store(0);
  }
}

}  // namespace dmlsim
