// The tensors an operator is called with, as an at::RecordFunction start
// callback sees them (DdpOptions::overlap_forward's gate, ddp.cc).
//
// Why a file of its own: RecordFunction::inputs() is inline, and without
// NDEBUG it asserts a flag that LibTorch's release build never sets, so it
// fails on every call. op_inputs.cc is compiled with NDEBUG (BUILD,
// CMakeLists.txt) and is the only place that calls it.
#ifndef LOCKSTEP_DDP_OP_INPUTS_H_
#define LOCKSTEP_DDP_OP_INPUTS_H_

#include <ATen/record_function.h>

#include <vector>

namespace lockstep {
namespace ddp {

// Appends the TensorImpl of every defined tensor among `fn`'s inputs
// (tensors and tensor lists) to `out`. REQUIRES: called from a start
// callback registered with needsInputs(true).
void OpInputTensors(const at::RecordFunction& fn, std::vector<const c10::TensorImpl*>* out);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_OP_INPUTS_H_
