// The device's work queue (CUDA's stream as the host sees it): entries in program order, run when the host
// needs a value. Two kinds of entry share the one order: ATen ops the C++ kernel queued (an operator and its
// stack of host tensors, run without the interpreter) and Python work (compiled graphs, kernels, copies,
// event markers, ops the Python path queued). queue.py drives it: it drains (with the thread team and the
// inference mode around the work) and turns a failure into the DeviceError that names the op.
#include "queue.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <mutex>
#include <vector>

namespace py = pybind11;

namespace nativelab {


namespace {
std::mutex g_queue_mutex;
std::vector<QueueEntry> g_pending;

void release_python(std::vector<QueueEntry>& work) {  // GIL held
  for (auto& e : work) {
    Py_XDECREF(e.name);
    Py_XDECREF(e.fn);
    Py_XDECREF(e.args);
    e.name = e.fn = e.args = nullptr;
  }
}

void run_op(QueueEntry& e) {
  e.op->callBoxed(&e.stack);
  if (e.copy_into.empty()) return;
  if (e.stack.size() == 1 && e.stack[0].isTensorList()) {
    auto results = e.stack[0].toTensorList();
    for (size_t i = 0; i < e.copy_into.size(); ++i) e.copy_into[i].copy_(results.get(i));
    return;
  }
  for (size_t i = 0; i < e.copy_into.size(); ++i) e.copy_into[i].copy_(e.stack[i].toTensor());
}

py::object python_exception(const std::exception& ex) {
  PyObject* type = PyExc_RuntimeError;
  std::string msg = ex.what();
  if (auto* c = dynamic_cast<const c10::Error*>(&ex)) {
    msg = c->what_without_backtrace();
    if (dynamic_cast<const c10::IndexError*>(&ex)) type = PyExc_IndexError;
    else if (dynamic_cast<const c10::ValueError*>(&ex)) type = PyExc_ValueError;
    else if (dynamic_cast<const c10::TypeError*>(&ex)) type = PyExc_TypeError;
    else if (dynamic_cast<const c10::NotImplementedError*>(&ex)) type = PyExc_NotImplementedError;
  }
  return py::reinterpret_borrow<py::object>(type)(msg);
}
}  // namespace

size_t queue_push(QueueEntry&& e) {
  std::lock_guard<std::mutex> lock(g_queue_mutex);
  g_pending.push_back(std::move(e));
  return g_pending.size();
}

size_t queue_submit_python(py::object name, py::object fn, py::object args) {
  QueueEntry e;
  e.name = name.release().ptr();
  e.fn = fn.release().ptr();
  e.args = args.release().ptr();
  return queue_push(std::move(e));
}

size_t queue_size() {
  std::lock_guard<std::mutex> lock(g_queue_mutex);
  return g_pending.size();
}

// Run everything queued so far (GIL held). None, or (op name, exception, ops dropped after it).
py::object queue_run(py::object observer) {
  std::vector<QueueEntry> work;
  {
    std::lock_guard<std::mutex> lock(g_queue_mutex);
    work.swap(g_pending);
  }
  py::object failure = py::none();
  for (size_t i = 0; i < work.size(); ++i) {
    auto& e = work[i];
    try {
      if (e.fn != nullptr) {
        auto fn = py::reinterpret_borrow<py::object>(e.fn);
        auto args = py::reinterpret_borrow<py::tuple>(e.args);
        if (observer.is_none()) fn(*args);
        else observer.attr("run")(py::reinterpret_borrow<py::object>(e.name), fn, args);
      } else if (observer.is_none()) {
        run_op(e);
      } else {  // a profiler installed while C++ entries were queued: it times them as opaque work
        QueueEntry* ep = &e;
        observer.attr("run")(py::str(*e.op_name), py::cpp_function([ep] { run_op(*ep); }), py::tuple());
      }
    } catch (py::error_already_set& ex) {
      auto name = e.fn != nullptr ? py::reinterpret_borrow<py::object>(e.name) : py::str(*e.op_name);
      failure = py::make_tuple(name, ex.value(), work.size() - i - 1);
      break;
    } catch (const std::exception& ex) {
      auto name = e.fn != nullptr ? py::reinterpret_borrow<py::object>(e.name) : py::str(*e.op_name);
      failure = py::make_tuple(name, python_exception(ex), work.size() - i - 1);
      break;
    }
  }
  release_python(work);
  return failure;
}

}  // namespace nativelab
