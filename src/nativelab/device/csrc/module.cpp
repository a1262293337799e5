// The Python face of the runtime (nativelab.device.runtime loads it): set-up, the current device, generators,
// and the entry the device queue calls when it reaches an event's marker.
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

#include "runtime.h"

namespace py = pybind11;

namespace nativelab {
namespace {

// Held for the life of the process (never destroyed: a static py::object would be released without the GIL).
py::object* keep(py::function fn) { return new py::object(std::move(fn)); }

void init(int cores, py::function drain, py::function idle, py::function record_marker) {
  init_devices(cores);
  auto* d = keep(std::move(drain));
  auto* i = keep(std::move(idle));
  auto* m = keep(std::move(record_marker));
  // Called from any thread (autograd's device threads too): take the GIL. A Python error propagates as
  // py::error_already_set, which PyTorch's bindings re-raise as the original exception.
  queue_callbacks().drain = [d] {
    py::gil_scoped_acquire gil;
    (*d)();
  };
  queue_callbacks().idle = [i] {
    py::gil_scoped_acquire gil;
    return (*i)().cast<bool>();
  };
  queue_callbacks().record_marker = [m](int64_t id, int64_t version) {
    py::gil_scoped_acquire gil;
    (*m)(id, version);
  };
  register_guard();
  register_hooks();
  register_profiler_stubs();
}

at::Generator unwrap_generator(const py::handle& obj) {
  TORCH_CHECK(THPGenerator_Check(obj.ptr()), "expected a torch.Generator");
  return reinterpret_cast<THPGenerator*>(obj.ptr())->cdata;
}

}  // namespace
}  // namespace nativelab

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace nativelab;
  m.doc() = "nativelab's emulated neuron device: the C++ runtime behind PrivateUse1";
  m.def("init", &init, "register the guard and hooks for `cores` logical cores, with the queue's callbacks");
  m.def("device_count", &device_count);
  m.def("current_device", [] { return static_cast<int>(current_device()); });
  m.def("set_device", [](int index) { set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  m.def("host_generator", [](py::handle gen) {
    return py::reinterpret_steal<py::object>(THPGenerator_Wrap(host_generator(unwrap_generator(gen))));
  }, "the CPU generator that holds a neuron generator's state (what the CPU kernels draw from)");
  m.def("event_reached", &event_reached);
  m.def("is_pinned", [](uintptr_t ptr) { return is_pinned(reinterpret_cast<const void*>(ptr)); });
}
