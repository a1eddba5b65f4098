// DirectML's wrong answers, reproduced where a report pins them down (profiles.QUIRKS). Each
// is a kernel DirectML has and runs, that answers differently from the CPU: the simulator
// computes what DirectML gives instead of what the CPU gives.
#include "sim.h"

#include <c10/core/ScalarType.h>

namespace dmlsim {
namespace {

bool is_device_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kSim;
}

// microsoft/DirectML#686, #737 (0.2.5): `x * mask` and `x *= mask` with a float x and a bool
// mask give a bool tensor holding bool(x) and mask; in place, x itself turns bool.
bool float_times_bool(OpRecord* rec, const c10::OperatorName& name, torch::jit::Stack* stack,
                      size_t base) {
  const c10::IValue& self_v = (*stack)[base];
  const c10::IValue& other_v = (*stack)[base + 1];
  if (!is_device_tensor(self_v) || !is_device_tensor(other_v)) return false;
  const at::Tensor self = self_v.toTensor();
  const at::Tensor other = other_v.toTensor();
  if (other.scalar_type() != c10::ScalarType::Bool || self.scalar_type() == c10::ScalarType::Bool)
    return false;
  if (self.device() != other.device()) return false;  // the same-device error comes first
  count_call(rec);
  const at::Tensor answer = cpu_alias(self).ne(0).logical_and(cpu_alias(other)).contiguous();
  const at::Tensor result = adopt_cpu(answer, self.device().index());
  torch::jit::drop(*stack, stack->size() - base);
  if (name.name == "aten::mul_") {
    c10::TensorImpl* impl = self.unsafeGetTensorImpl();
    impl->set_storage_and_dtype(result.storage(), result.dtype());
    impl->set_sizes_and_strides(result.sizes(), result.strides(), 0);
    stack->push_back(self);
  } else {
    stack->push_back(result);
  }
  return true;
}

// microsoft/DirectML#619 (0.2.3): `torch.tensor([1], dtype=torch.uint8, device=dml).sum()`
// raises an error whose text is not UTF-8. Python turns the text into a str first, so what
// the program sees is: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xcf in position
// 0: invalid continuation byte.
void uint8_sum(OpRecord* rec, const torch::jit::Stack& stack, size_t base) {
  const c10::IValue& self = stack[base];
  if (!is_device_tensor(self) || self.toTensor().scalar_type() != c10::ScalarType::Byte) return;
  rec->refused.fetch_add(1, std::memory_order_relaxed);
  if (config().trace && !rec->traced.exchange(true)) notify_python(rec, false, "refused");
  TORCH_CHECK(false, "\xcf\x5c");
}

}  // namespace

Quirk quirk_of(const c10::OperatorName& name) {
  if ((name.name == "aten::mul" || name.name == "aten::mul_") && name.overload_name == "Tensor")
    return Quirk::FloatTimesBool;
  if (name.name == "aten::nll_loss_backward") return Quirk::NllLossNoneZeroGrad;
  if (name.name == "aten::sum" &&
      (name.overload_name == "dim_IntList" || name.overload_name == "IntList_out"))
    return Quirk::Uint8Sum;
  return Quirk::None;
}

bool quirk_before(Quirk quirk, OpRecord* rec, const c10::OperatorName& name,
                  torch::jit::Stack* stack, size_t base) {
  switch (quirk) {
    case Quirk::FloatTimesBool:
      return config().float_times_bool && float_times_bool(rec, name, stack, base);
    case Quirk::Uint8Sum:
      if (config().uint8_sum) uint8_sum(rec, *stack, base);
      return false;
    default:
      return false;
  }
}

void quirk_after(Quirk quirk, const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 torch::jit::Stack* stack) {
  if (quirk != Quirk::NllLossNoneZeroGrad || !config().nll_loss_none_zero_grad) return;
  // microsoft/DirectML#739, #740 (0.2.5): with reduction='none' the loss is right and every
  // gradient upstream of it is exactly zero.
  const auto reduction_at = op.schema().argumentIndexWithName("reduction");
  if (!reduction_at || args.size() <= *reduction_at || !args[*reduction_at].isInt() ||
      args[*reduction_at].toInt() != 0)
    return;
  const c10::IValue& grad_input = stack->back();
  if (is_device_tensor(grad_input)) cpu_alias(grad_input.toTensor()).zero_();
}

void set_quirks(const std::string& quirks, const std::string& unsupported_dtypes) {
  Config& c = config();
  auto has = [](const std::string& list, const std::string& name) {
    return ("\n" + list + "\n").find("\n" + name + "\n") != std::string::npos;
  };
  c.float_times_bool = has(quirks, "float-times-bool");
  c.nll_loss_none_zero_grad = has(quirks, "cross-entropy-none-grad");
  c.uint8_sum = has(quirks, "uint8-reduction");
  c.cross_adapter_copy_zeros = has(quirks, "device-to-device");
  const int n = static_cast<int>(c10::ScalarType::NumOptions);
  c.unsupported_dtypes.assign(n, false);
  for (int i = 0; i < n; ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (has(unsupported_dtypes, c10::toString(type))) c.unsupported_dtypes[i] = true;
  }
}

}  // namespace dmlsim
