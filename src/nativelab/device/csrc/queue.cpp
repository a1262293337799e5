// The device's work queue (CUDA's stream as the host sees it): units of device work (DeviceWork) in program
// order, run when the host needs a value. Every producer launches through `launch`: the C++ op kernel (ATen
// ops and copies, run without the interpreter) and, through `launch_python`, compiled graphs, kernels, the
// Python op path, copies and event markers; work the host must run at once (collectives, graphs whose outputs
// alias their inputs) goes through `run_now_python`, which runs it as the queue would. Each unit says what it
// is, so a profiler reads its kind and name instead of guessing them, and while a torch.profiler trace runs the
// queue times each unit itself (`trace_*`). queue.py drives it: it drains (with the thread team and the
// inference mode around the work) and turns a failure into the DeviceError that names the work.
#include "queue.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace py = pybind11;

namespace nativelab {

namespace {
std::mutex g_queue_mutex;
std::vector<DeviceWork> g_pending;

std::atomic<bool> g_tracing{false};
std::mutex g_trace_mutex;
std::vector<TraceEvent> g_trace;

void release_python(DeviceWork& w) {  // GIL held
  Py_XDECREF(w.name);
  Py_XDECREF(w.fn);
  Py_XDECREF(w.args);
  w.name = w.fn = w.args = nullptr;
}

int64_t unix_ns() {  // the clock PyTorch puts its CPU events on
  using namespace std::chrono;
  return duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
}

void run_op(DeviceWork& w) {
  w.op->callBoxed(&w.stack);
  if (w.copy_into.empty()) return;
  if (w.stack.size() == 1 && w.stack[0].isTensorList()) {
    auto results = w.stack[0].toTensorList();
    for (size_t i = 0; i < w.copy_into.size(); ++i) w.copy_into[i].copy_(results.get(i));
    return;
  }
  for (size_t i = 0; i < w.copy_into.size(); ++i) w.copy_into[i].copy_(w.stack[i].toTensor());
}

// Run one unit (GIL held): by itself, or through the observers' `run` (observe.run: a nativelab.profile session
// and whoever else watches), which runs it as observer(kind, name, fn, args). Python work returns its result.
py::object execute(DeviceWork& w, const py::object& observer) {
  const char* name = nullptr;
  if (w.fn == nullptr) name = w.op_name != nullptr ? w.op_name->c_str() : nullptr;
  else if (PyUnicode_Check(w.name)) name = PyUnicode_AsUTF8(w.name);
  if (name == nullptr) PyErr_Clear();  // a name that is not text: the report goes without it
  RunningWorkNote note(w.kind, name, w.core);  // what a crash report names
  if (w.fn != nullptr) {
    auto fn = py::reinterpret_borrow<py::object>(w.fn);
    auto args = py::reinterpret_borrow<py::tuple>(w.args);
    if (observer.is_none()) return fn(*args);
    return observer(kind_name(w.kind), py::reinterpret_borrow<py::object>(w.name), fn, args);
  }
  if (observer.is_none()) {
    run_op(w);
    return py::none();
  }
  DeviceWork* wp = &w;  // an op a C++ kernel queued before the observer came: timed as opaque work
  return observer(kind_name(w.kind), py::str(*w.op_name), py::cpp_function([wp] { run_op(*wp); }), py::tuple());
}

void record(const DeviceWork& w, int64_t t0, int64_t t1) {
  if (w.kind == WorkKind::kMarker) return;  // an event's marker is no work
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_trace.push_back({w.label(), w.kind, w.core, w.stream, t0, std::max(t1, t0 + 1), w.correlation});
}

// execute(), timed while a trace runs. The host's run of device work is the device's, not the program's: the
// ATen ops it calls stay out of the CPU events (as a CUDA kernel's would).
py::object run_work(DeviceWork& w, const py::object& observer) {
  if (!g_tracing.load(std::memory_order_relaxed)) return execute(w, observer);
  at::RecordFunctionGuard off(false);
  const int64_t t0 = unix_ns();
  try {
    auto res = execute(w, observer);
    record(w, t0, unix_ns());
    return res;
  } catch (...) {
    record(w, t0, unix_ns());
    throw;
  }
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

// An argument of Python work as the host runs it: device tensors as host views (the core of the first one is
// where the work runs), other CPU tensors copied when `capture` (not Python numbers PyTorch wrapped: never
// written), `device=neuron` as cpu, lists and tuples item by item. Anything else as it is.
py::object host_arg(py::handle x, bool capture, int& core, const std::string& what) {
  PyObject* p = x.ptr();
  if (THPVariable_Check(p)) {
    const auto& t = THPVariable_Unpack(p);
    if (!t.defined()) return py::reinterpret_borrow<py::object>(x);
    if (t.device().type() == kDevice) {
      if (core < 0) core = t.device().index();
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(host_view(t, what)));
    }
    if (capture && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(t.clone()));
    }
    return py::reinterpret_borrow<py::object>(x);
  }
  const bool list = PyList_Check(p);
  if (list || PyTuple_Check(p)) {
    const Py_ssize_t n = list ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
    std::vector<py::object> items;
    bool changed = false;
    items.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = list ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
      items.push_back(host_arg(item, capture, core, what));
      changed |= items.back().ptr() != item;
    }
    if (!changed) return py::reinterpret_borrow<py::object>(x);
    if (list) {
      py::list out(n);
      for (Py_ssize_t i = 0; i < n; ++i) out[i] = std::move(items[i]);
      return std::move(out);
    }
    py::tuple out(n);
    for (Py_ssize_t i = 0; i < n; ++i) out[i] = std::move(items[i]);
    return std::move(out);
  }
  if (THPDevice_Check(p) && reinterpret_cast<THPDevice*>(p)->device.type() == kDevice) {
    return py::reinterpret_steal<py::object>(THPDevice_New(c10::Device(c10::DeviceType::CPU)));
  }
  return py::reinterpret_borrow<py::object>(x);
}

DeviceWork python_work(const std::string& kind, py::object name, py::object fn, const py::tuple& args,
                       bool capture) {
  DeviceWork w;
  w.kind = kind_from(kind);
  int core = -1;
  py::object hargs = host_arg(args, capture, core, py::str(name).cast<std::string>());
  w.core = static_cast<int16_t>(core >= 0 ? core : current_device());
  w.name = name.release().ptr();
  w.fn = fn.release().ptr();
  w.args = hargs.release().ptr();
  return w;
}
}  // namespace

const char* kind_name(WorkKind kind) noexcept { return kWorkKinds[static_cast<int>(kind)]; }

WorkKind kind_from(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kWorkKinds)); ++i) {
    if (name == kWorkKinds[i]) return static_cast<WorkKind>(i);
  }
  TORCH_CHECK_VALUE(false, "neuron: unknown kind of device work '", name,
                    "' (one of op, copy, graph, kernel, collective, marker)");
}

std::string DeviceWork::label() const {
  if (fn == nullptr) return *op_name;
  py::gil_scoped_acquire gil;
  return py::str(py::handle(name)).cast<std::string>();
}

size_t launch(DeviceWork&& w) {
  w.stream = current_stream(w.core).id();
  if (g_tracing.load(std::memory_order_relaxed)) w.correlation = profiler_correlation();
  std::lock_guard<std::mutex> lock(g_queue_mutex);
  g_pending.push_back(std::move(w));
  return g_pending.size();
}

size_t launch_python(const std::string& kind, py::object name, py::object fn, py::tuple args) {
  const size_t pending = launch(python_work(kind, std::move(name), std::move(fn), args, /*capture=*/true));
  if (pending >= kMaxPending) queue_callbacks().drain();
  return pending;
}

py::object run_now_python(const std::string& kind, py::object name, py::object fn, py::tuple args,
                          py::object observer) {
  DeviceWork w = python_work(kind, std::move(name), std::move(fn), args, /*capture=*/false);
  w.stream = current_stream(w.core).id();
  if (g_tracing.load(std::memory_order_relaxed)) w.correlation = profiler_correlation();
  try {
    auto res = run_work(w, observer);
    release_python(w);
    return res;
  } catch (...) {
    release_python(w);
    throw;
  }
}

size_t queue_size() {
  std::lock_guard<std::mutex> lock(g_queue_mutex);
  return g_pending.size();
}

// Run everything queued so far (GIL held). None, or (work's name, exception, units dropped after it).
py::object queue_run(py::object observer) {
  std::vector<DeviceWork> work;
  {
    std::lock_guard<std::mutex> lock(g_queue_mutex);
    work.swap(g_pending);
  }
  py::object failure = py::none();
  try {
    // What the queued ATen ops warn (TORCH_WARN) reaches Python's warnings in the draining thread, as a CPU op's
    // warning reaches them at its call; without a handler c10 would print it to stderr.
    torch::PyWarningHandler warnings;
    for (size_t i = 0; i < work.size(); ++i) {
      auto& w = work[i];
      try {
        run_work(w, observer);
      } catch (py::error_already_set& ex) {
        failure = py::make_tuple(w.label(), ex.value(), work.size() - i - 1);
        break;
      } catch (const std::exception& ex) {
        failure = py::make_tuple(w.label(), python_exception(ex), work.size() - i - 1);
        break;
      }
    }
  } catch (python_error& e) {  // a warning that a filter turned into an error
    for (auto& w : work) release_python(w);
    e.restore();
    throw py::error_already_set();
  }
  for (auto& w : work) release_python(w);
  return failure;
}

// ---- torch.profiler's device events ---------------------------------------------------------------------

bool trace_start() {
  bool expected = false;
  if (!g_tracing.compare_exchange_strong(expected, true)) return false;
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_trace.clear();
  return true;
}

std::vector<TraceEvent> trace_stop() {
  g_tracing.store(false);
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  std::vector<TraceEvent> out;
  out.swap(g_trace);
  return out;
}

void trace_run(WorkKind kind, const std::string& name, int core, const std::function<void()>& run) {
  if (!g_tracing.load(std::memory_order_relaxed)) return run();
  DeviceWork w;
  w.kind = kind;
  w.op_name = &name;
  w.core = static_cast<int16_t>(core);
  w.stream = current_stream(w.core).id();
  w.correlation = profiler_correlation();
  at::RecordFunctionGuard off(false);
  const int64_t t0 = unix_ns();
  run();
  record(w, t0, unix_ns());
}

}  // namespace nativelab
