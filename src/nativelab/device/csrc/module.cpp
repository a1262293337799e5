// The Python face of the runtime (nativelab.device.runtime loads it): set-up, the current device, generators,
// and the entry the device queue calls when it reaches an event's marker.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "queue.h"

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
  register_zero_tensors();
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
  // memory.cpp: the per-core account
  m.def("mem_set_capacity", &mem_set_capacity);
  m.def("mem_check", &mem_check, "raise torch.OutOfMemoryError if nbytes would not fit on the core");
  m.def("mem_stats", [](int index) {
    const auto s = mem_stats(index);
    return py::make_tuple(s.allocated, s.peak, s.num_allocs, s.num_frees, s.capacity, s.blocks, s.peak_blocks,
                          s.num_ooms);
  }, "(allocated, peak, num_allocs, num_frees, capacity, blocks, peak_blocks, num_ooms) of a core");
  m.def("mem_reset_peak", &mem_reset_peak);
  // The statistics of PyTorch's allocator interface (what torch.accelerator.memory_stats reads), nested as
  // PyTorch nests them: {name: {"all"|"small_pool"|"large_pool": {"current"|"peak"|"allocated"|"freed": n}}}.
  m.def("mem_device_stats", [](int index) {
    const auto s = c10::getDeviceAllocator(kDevice)->getDeviceStats(static_cast<c10::DeviceIndex>(index));
    auto stat = [](const c10::CachingAllocator::Stat& x) {
      py::dict d;
      d["current"] = x.current, d["peak"] = x.peak, d["allocated"] = x.allocated, d["freed"] = x.freed;
      return d;
    };
    auto pools = [&](const c10::CachingAllocator::StatArray& a) {
      py::dict d;
      d["all"] = stat(a[0]), d["small_pool"] = stat(a[1]), d["large_pool"] = stat(a[2]);
      return d;
    };
    py::dict d;
    d["allocation"] = pools(s.allocation), d["segment"] = pools(s.segment), d["active"] = pools(s.active);
    d["inactive_split"] = pools(s.inactive_split), d["allocated_bytes"] = pools(s.allocated_bytes);
    d["reserved_bytes"] = pools(s.reserved_bytes), d["active_bytes"] = pools(s.active_bytes);
    d["inactive_split_bytes"] = pools(s.inactive_split_bytes), d["requested_bytes"] = pools(s.requested_bytes);
    d["num_alloc_retries"] = s.num_alloc_retries, d["num_ooms"] = s.num_ooms;
    d["num_sync_all_streams"] = s.num_sync_all_streams, d["num_device_alloc"] = s.num_device_alloc;
    d["num_device_free"] = s.num_device_free, d["max_split_size"] = s.max_split_size;
    d["oversize_allocations"] = stat(s.oversize_allocations), d["oversize_segments"] = stat(s.oversize_segments);
    return d;
  }, "the core's allocator statistics under CUDA's names, nested");
  m.def("mem_reset_accumulated", [](int index) {
    c10::getDeviceAllocator(kDevice)->resetAccumulatedStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("mem_blocks", [] {
    py::list out;
    for (const auto& b : mem_blocks()) out.append(py::make_tuple(b.address, b.nbytes, b.index));
    return out;
  }, "the live blocks: (address, nbytes, core) by address");
  // Storages are passed as torch.UntypedStorage objects (device ones: the caller checks the device).
  m.def("mem_storage", [](int index, int64_t nbytes) {
    return py::reinterpret_steal<py::object>(THPStorage_Wrap(mem_storage(index, nbytes)));
  }, "a new device storage of nbytes on a core");
  m.def("mem_adopt", [](py::handle host, int index, bool resizable) {
    return py::reinterpret_steal<py::object>(
        THPStorage_Wrap(mem_adopt(THPStorage_Unpack(host.ptr()), index, resizable)));
  }, py::arg("host"), py::arg("index"), py::arg("resizable") = true,
        "a device storage on a core over a CPU storage's memory (kept alive and counted until it dies)");
  m.def("mem_move_to", [](py::handle st, py::handle host) {
    mem_move_to(THPStorage_Unpack(st.ptr()), THPStorage_Unpack(host.ptr()));
  }, "move a device storage in place onto a CPU storage's memory (its bytes copied there; no longer resizable)");
  m.def("mem_owns", [](py::handle st) { return mem_owns(THPStorage_Unpack(st.ptr())); },
        "whether a device storage's memory is the runtime's (allocated or adopted; freed with the storage)");
  m.def("mem_host_storage", [](py::handle st, bool resizable) {
    return py::reinterpret_steal<py::object>(
        THPStorage_Wrap(mem_host_storage(THPStorage_Unpack(st.ptr()), resizable)));
  }, py::arg("st"), py::arg("resizable") = false,
        "a CPU storage over a device storage's memory, keeping that memory alive (resizable: growing it moves it "
        "to new CPU memory)");
  // queue.cpp
  m.def("launch", &launch_python,
        "launch(kind, name, fn, args): queue device work fn(*args) on host views; returns the queue length");
  m.def("run_now", &run_now_python,
        "run_now(kind, name, fn, args, observer): device work run at once on host views (through "
        "observer(kind, name, fn, args) unless it is None); returns its result");
  m.def("queue_size", &queue_size);
  // What Python reads from here instead of saying it again: the queue's bound, the kinds of device work, the
  // names of the runtime's copies (queue.h).
  m.attr("MAX_PENDING") = kMaxPending;
  py::tuple kinds(std::size(kWorkKinds));
  for (size_t i = 0; i < std::size(kWorkKinds); ++i) kinds[i] = py::str(kWorkKinds[i]);
  m.attr("WORK_KINDS") = kinds;
  py::dict names;
  names["copy"] = kCopyName, names["host_to_device_queued"] = kCopyH2DQueuedName;
  names["host_to_device"] = kMemcpyH2DName, names["device_to_host"] = kMemcpyD2HName;
  m.attr("WORK_NAMES") = names;
  m.def("queue_run", &queue_run,
        "queue_run(observer): run everything queued (as run_now); None, or (name, exception, dropped) for a failed "
        "entry");
  // ops.cpp
  m.def("install_kernels", &install_kernels, "register the device's op kernel (fallback + the named ops)");
  m.def("set_fast", &set_fast, "whether ops may take the C++ path (off while a tool watches or in sync mode)");
  m.def("spec_keys", &spec_keys, "the call signatures the C++ kernel cached for an op: their keys, the bytes the "
        "Python path is handed (the one key, built in ops.cpp)");
  m.def("install_runtime_kernels", &install_runtime_kernels,
        "take over runtime_ops kernels (name -> Python kernel) that C++ serves; returns the names taken");
  m.def("set_noticed", &set_noticed, "the emulated-device notice was printed: allocations may skip Python");
  m.def("count_executed", &count_executed, "count one launch of an op or kernel the device ran (the one count)");
  m.def("executed_counts", &executed_counts, "{name: launches the device ran}, in the order first counted");
  m.def("clear_executed", &clear_executed, "forget the op counts");
  m.def("mark_wrapped_number", [](py::handle t) {
    TORCH_CHECK(THPVariable_Check(t.ptr()), "expected a tensor");
    const auto& tensor = THPVariable_Unpack(t.ptr());
    TORCH_CHECK(tensor.dim() == 0 && tensor.device().is_cpu(), "a wrapped number is a 0-d CPU tensor");
    tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
  }, "mark a 0-d CPU tensor as a wrapped Python number (it then takes no part in type promotion)");
  // What a C++ extension does with a device pointer: at::from_blob without naming the core, which PyTorch asks
  // the hooks' getDeviceFromPtr for (no Python API reaches it: DLPack names the index).
  m.def("from_blob", [](uintptr_t ptr, std::vector<int64_t> sizes, py::handle dtype) {
    TORCH_CHECK(THPDtype_Check(dtype.ptr()), "from_blob: expected a torch.dtype");
    const auto scalar = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
    auto t = at::from_blob(reinterpret_cast<void*>(ptr), sizes, at::TensorOptions().dtype(scalar).device(kDevice));
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
  }, "a device tensor over memory the device holds (not owned: the caller keeps it alive), its core from the pointer");
  m.def("zero_tensor", [](std::vector<int64_t> sizes, std::vector<int64_t> strides, py::handle dtype, int index) {
    TORCH_CHECK(THPDtype_Check(dtype.ptr()), "zero_tensor: expected a torch.dtype");
    auto t = zero_tensor(sizes, strides, reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type, check_device(index));
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
  }, "a zero tensor (the ZeroTensor key, no memory) of these sizes and strides on a core");
  m.def("check_device_tensor", [](py::handle t, const std::string& what) {
    TORCH_CHECK(THPVariable_Check(t.ptr()), "check_device_tensor: expected a tensor");
    check_device_tensor(THPVariable_Unpack(t.ptr()), what);
  }, "raise (naming `what`) unless a device tensor is what host views assume: strided, a supported dtype, "
     "memory on the device, sizes and strides inside its storage");
  m.def("install_crash_report", &install_crash_report,
        "a fatal-signal handler naming the device work and op at the crash, chained before the current one");
  m.def("is_pinned", [](uintptr_t ptr) { return is_pinned(reinterpret_cast<const void*>(ptr)); });
}
