// Compiled with NDEBUG (see op_inputs.h).
#include "ddp/op_inputs.h"

namespace lockstep {
namespace ddp {
namespace {

void Add(const at::Tensor& t, std::vector<const c10::TensorImpl*>* out) {
  if (t.defined()) out->push_back(t.unsafeGetTensorImpl());
}

}  // namespace

void OpInputTensors(const at::RecordFunction& fn, std::vector<const c10::TensorImpl*>* out) {
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      Add(v.toTensor(), out);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) Add(t, out);
    }
  }
}

}  // namespace ddp
}  // namespace lockstep
