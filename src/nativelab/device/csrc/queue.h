// Device work and the work queue (queue.cpp), the Python face of the queue and of the op kernel (queue.cpp,
// ops.cpp; bound in module.cpp). Apart from runtime.h because it needs the dispatcher and pybind11, which the
// other files do not.
#pragma once

#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nativelab {

// What a unit of device work is, as the profiler reports it (kWorkKinds: their names, in this order).
enum class WorkKind : uint8_t { kOp, kCopy, kGraph, kKernel, kCollective, kMarker };
inline constexpr const char* kWorkKinds[] = {"op", "copy", "graph", "kernel", "collective", "marker"};
const char* kind_name(WorkKind kind) noexcept;
WorkKind kind_from(const std::string& name);  // "op", "copy", ...; throws ValueError naming the known kinds

// One unit of device work, whoever launched it (eager ops, copies, compiled graphs, kernels, collectives, event
// markers): what it is (kind, name), where it runs (core, stream), the launching op a profiler links it to, and
// what runs it on host views of device memory: an ATen op and its stack, or a Python function and its arguments.
struct DeviceWork {
  WorkKind kind = WorkKind::kOp;
  int16_t core = 0;
  int64_t stream = 0;
  uint64_t correlation = 0;  // the profiled op that launched it (0 unless a torch.profiler trace runs)
  // an ATen op (op set) ...
  std::optional<c10::OperatorHandle> op;
  std::vector<c10::IValue> stack;
  std::vector<at::Tensor> copy_into;  // a functional op without an out= form: its results are copied here
  const std::string* op_name = nullptr;  // held for the process by whoever launched it
  // ... or Python work (fn set): owned references, released with the GIL held
  PyObject* name = nullptr;
  PyObject* fn = nullptr;
  PyObject* args = nullptr;

  std::string label() const;  // its name
};

// The queue's bound: a launch that fills it to this many entries drains it (a deep queue keeps many buffers alive
// and runs out of cache: measured 2x slower at 4096).
inline constexpr size_t kMaxPending = 256;

// The names of the runtime's copies as units of device work (kind copy), whichever side launches them (ops.cpp,
// runtime_ops.py: module.cpp exports them as WORK_NAMES).
inline const std::string kCopyName = "aten::copy_";                         // device to device
inline const std::string kCopyH2DQueuedName = "aten::copy_ (host to device)";  // host to device, in program order
inline const std::string kMemcpyH2DName = "memcpy_host_to_device";          // host to device, run at once
inline const std::string kMemcpyD2HName = "memcpy_device_to_host";          // device to host (the host waits)

// The one way work reaches the device: stamps the stream (and the launching op while a trace runs) and queues
// it in program order. Returns the number of entries queued.
size_t launch(DeviceWork&& work);

// Python's launch: fn(*args) on host views (device tensors in args, also inside lists and tuples, become CPU
// views of their memory; other CPU tensors are copied now, as CUDA copies a CPU operand at launch); drains the
// queue when it reaches kMaxPending. Returns the queue length. run_now: the same work run at once (the queue
// already drained), its result returned. `observer`: None, or the observers' run (Python's observe.run), which
// runs each unit as observer(kind, name, fn, args).
size_t launch_python(const std::string& kind, pybind11::object name, pybind11::object fn, pybind11::tuple args);
pybind11::object run_now_python(const std::string& kind, pybind11::object name, pybind11::object fn,
                                pybind11::tuple args, pybind11::object observer);
pybind11::object queue_run(pybind11::object observer);

// torch.profiler's device events (profiler_plugin.cpp reads them): every unit of device work that runs between
// trace_start and trace_stop, timed by the queue itself.
struct TraceEvent {
  std::string name;
  WorkKind kind;
  int64_t core, stream, start_ns, end_ns;
  uint64_t correlation;
};
bool trace_start();  // false if a trace already runs
std::vector<TraceEvent> trace_stop();
// Host work the profiler should see as the device's (a transfer the host runs at once): `run` timed when tracing.
void trace_run(WorkKind kind, const std::string& name, int core, const std::function<void()>& run);
uint64_t profiler_correlation() noexcept;  // profiler_plugin.cpp: the calling thread's innermost profiled op

// ops.cpp: the kernel behind every op on the device
void install_kernels(pybind11::function python_kernel, pybind11::function decide, pybind11::function spec,
                     const std::vector<std::string>& direct);
void set_fast(bool on);
// The call signatures the C++ kernel cached for an op ('aten::add.Tensor'): each key's bytes, as the Python path
// is handed them (dispatch.device_kernel's `key`, schema.py's OpRecord.meta_cache)
pybind11::list spec_keys(const std::string& name);
// runtime_ops.py's kernels that the C++ kernels take over (serving their common case, calling them for the
// rest): returns the names taken
std::vector<std::string> install_runtime_kernels(const pybind11::dict& kernels);
void set_noticed();
void count_executed(const std::string& name);  // one launch of `name` the device ran
pybind11::dict executed_counts();  // name -> launches, in the order first counted since clear_executed
void clear_executed();
// host_views.cpp: a CPU tensor over a device tensor's memory (conj/neg bits kept; a zero tensor's zeros), after
// checking what it assumes of the tensor (layout, dtype, storage, bounds): a c10::Error naming `what` (the op)
at::Tensor host_view(const at::Tensor& t, std::string_view what = {});
void check_device_tensor(const at::Tensor& t, std::string_view what = {});

// crash_report.cpp: a fatal-signal handler (chained before faulthandler's) that names the device work running
// and the op being dispatched; the notes below say what they are while they last (names kept alive meanwhile).
void install_crash_report();
class RunningWorkNote {
 public:
  RunningWorkNote(WorkKind kind, const char* name, int core) noexcept;
  ~RunningWorkNote();
 private:
  const char* previous_;
};
class DispatchNote {
 public:
  explicit DispatchNote(const char* name) noexcept;
  ~DispatchNote();
 private:
  const char* previous_;
};

// zero_tensor.cpp: the device's `_efficientzerotensor` (registered by init) and the zero tensors it makes
void register_zero_tensors();
at::Tensor zero_tensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype, int index);

}  // namespace nativelab
