// dispatch.h: call a registered op through the C++ dispatcher (torch side only).
//
// What it is for: a day's pybind11 module exposes a function that calls
// torch.ops.<ns>.<op> from C++ (kc::find_op below), and the day's Python entry
// (kernel_common.fastpath.entry) calls that function instead of the Python op
// object when that is the same thing. The Python op-call path (matching Python
// arguments against the schema, boxing them) costs several microseconds of host
// time per call; the C++ call runs the same dispatch (Autograd, autocast, the
// device kernel) from the top of the dispatcher.
//
// Contract: the schema `name` must be registered before the first call (the
// day's TORCH_LIBRARY runs when its extension is imported); the handle is looked
// up once per call site (a function-local static) and is valid for the process.
// Never from .cu files: it needs torch headers.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace kc {

// Typed handle to the op `name` ("ns::op") with overload `overload` ("" for the default).
template <class Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).template typed<Sig>();
}

}  // namespace kc
