// torch.profiler's device lane: a Kineto activity-profiler plugin for PrivateUse1 (what CUPTI is for CUDA).
// With ProfilerActivity.PrivateUse1, Kineto configures this plugin; the session it returns has the device queue
// time every unit of device work it runs (queue.cpp's trace_*: kind, name, core, stream, start/end in Unix ns,
// the correlation id of the op that launched it) from start to stop, and hands them to Kineto as kernel
// activities named after the work, with its kind and stream as metadata. PyTorch maps CONCURRENT_KERNEL to
// DeviceType::PrivateUse1 for a renamed backend, links each one to the CPU op with that correlation id (its
// device time in key_averages()), and the Chrome trace gets a "neuron N" lane. No Python runs per unit, and
// the C++ op path stays on during a trace.
#include <ATen/record_function.h>
#include <kineto/IActivityProfiler.h>
#include <kineto/libkineto.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Export.h>

#include "queue.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

// PyTorch's registry (torch/csrc/profiler/standalone/privateuse1_profiler.h, exported by libtorch_cpu).
// Declared here rather than included: that header includes <IActivityProfiler.h> from Kineto's own include
// directory, which torch.utils.cpp_extension does not put on the include path. The canary in
// tests/test_private_apis.py checks the header still declares these two members.
namespace torch::profiler::impl {
using PrivateUse1ProfilerFactory = std::function<std::unique_ptr<libkineto::IActivityProfiler>()>;
class TORCH_API PrivateUse1ProfilerRegistry {
 public:
  static PrivateUse1ProfilerRegistry& instance();
  void registerFactory(PrivateUse1ProfilerFactory factory);
};
}  // namespace torch::profiler::impl

namespace py = pybind11;

namespace nativelab {
namespace {

// The correlation ids Kineto pushes as each profiled op starts, per thread (the op that queues device work
// runs on the thread that called it).
thread_local std::vector<uint64_t> t_correlation;

const std::set<libkineto::ActivityType> kActivities = {libkineto::ActivityType::CONCURRENT_KERNEL};

struct DeviceEvent {
  std::string name;
  WorkKind kind;
  int64_t device, stream, start_ns, end_ns;
  uint64_t correlation;
};

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    // Earlier work belongs to no trace.
    if (!guarded("start", [] { queue_callbacks().drain(); })) return;
    if (!trace_start()) {
      errors_.push_back("neuron profiler: a torch.profiler trace with the neuron activity is already running");
      status_ = libkineto::TraceStatus::ERROR;
      return;
    }
    owner_ = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (!owner_) return;
    guarded("stop", [] { queue_callbacks().drain(); });  // work launched inside the trace is part of it
    for (auto& e : trace_stop()) {
      std::string name = e.name.rfind("aten::", 0) == 0 ? e.name.substr(6) : e.name;
      // Distinct from the CPU op's name (as a CUDA kernel's is): key_averages() keeps them in separate rows.
      events_.push_back({"neuron::" + name, e.kind, e.core, e.stream, e.start_ns, e.end_ns, e.correlation});
    }
    owner_ = false;
    if (status_ != libkineto::TraceStatus::ERROR) status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t /*startTime*/, int64_t /*endTime*/) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    int32_t id = 0;
    for (const auto& e : events_) {
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL, e.name);
      auto& a = *buffer_->activities.back();
      a.startTime = e.start_ns;
      a.endTime = e.end_ns;
      a.id = ++id;
      a.device = static_cast<int32_t>(e.device);
      a.resource = 0;  // the device's one queue
      a.addMetadataQuoted("kind", kind_name(e.kind));
      a.addMetadataQuoted("stream", std::to_string(e.stream));
      a.linked = e.correlation ? linked(static_cast<int32_t>(e.correlation)) : nullptr;
      a.log(logger);  // the logger keeps a pointer: the activity lives in buffer_, which Kineto then owns
    }
    status_ = libkineto::TraceStatus::READY;
  }

  // The Chrome trace's name for the device lane (Kineto takes one per session: the first core that ran work).
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (events_.empty()) return nullptr;
    int64_t d = events_.front().device;
    for (const auto& e : events_) d = std::min(d, e.device);
    const auto name = "neuron " + std::to_string(d);
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{d, d, name, name});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::set<int64_t> devices;
    for (const auto& e : events_) devices.insert(e.device);
    std::vector<libkineto::ResourceInfo> out;
    for (auto d : devices) out.push_back({0, d, d, "neuron " + std::to_string(d) + " queue"});
    return out;
  }

  // Kineto keeps the buffer (and so the activities the logger was given) until the trace is released.
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }

 private:
  template <class F>
  bool guarded(const char* what, F&& body) {
    try {
      body();
      return true;
    } catch (py::error_already_set& e) {
      py::gil_scoped_acquire gil;
      errors_.push_back(std::string("neuron profiler: ") + what + ": " + e.what());
    } catch (const std::exception& e) {
      errors_.push_back(std::string("neuron profiler: ") + what + ": " + e.what());
    }
    status_ = libkineto::TraceStatus::ERROR;
    return false;
  }

  bool owner_ = false;  // this session started the queue's trace
  std::vector<DeviceEvent> events_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return kActivities; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config& /*config*/) override {
    for (auto t : activity_types)
      if (kActivities.count(t)) return std::make_unique<Session>();
    return nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"neuron"};
};

}  // namespace

uint64_t profiler_correlation() noexcept { return t_correlation.empty() ? 0 : t_correlation.back(); }

void register_kineto_plugin() {
  torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
      [] { return std::unique_ptr<libkineto::IActivityProfiler>(std::make_unique<Profiler>()); });
}

}  // namespace nativelab
