// The work queue's entries and the Python face of the queue and the op kernel (queue.cpp, ops.cpp; bound in
// module.cpp). Apart from runtime.h because it needs the dispatcher and pybind11, which the other files do not.
#pragma once

#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <vector>

namespace nativelab {

struct QueueEntry {
  // an ATen op (op set) or Python work (fn set)
  std::optional<c10::OperatorHandle> op;
  std::vector<c10::IValue> stack;
  std::vector<at::Tensor> copy_into;  // a functional op without an out= form: its results are copied here
  const std::string* op_name = nullptr;
  PyObject* name = nullptr;  // Python entries: owned references, released with the GIL held
  PyObject* fn = nullptr;
  PyObject* args = nullptr;
};

size_t queue_submit_python(pybind11::object name, pybind11::object fn, pybind11::object args);
pybind11::object queue_run(pybind11::object observer);

// ops.cpp: the kernel behind every op on the device
void install_kernels(pybind11::function python_kernel, pybind11::function decide, pybind11::function spec,
                     const std::vector<std::string>& direct);
void set_fast(bool on);
// runtime_ops.py's kernels that the C++ kernels take over (serving their common case, calling them for the
// rest): returns the names taken
std::vector<std::string> install_runtime_kernels(const pybind11::dict& kernels);
void set_noticed();
pybind11::dict take_executed();

}  // namespace nativelab
