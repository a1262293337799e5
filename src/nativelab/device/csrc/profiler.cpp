// Profiler stubs for PrivateUse1: torch.profiler with ProfilerActivity.PrivateUse1 times each op on the device
// with a pair of the runtime's timing events (markers in the device queue), as CUDA's stubs do with CUDA events.
#include "runtime.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

namespace nativelab {
namespace {

struct ProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device) *device = current_device();
    void* e = event_create(/*timing=*/true);
    *event = std::shared_ptr<void>(e, [](void* p) { event_destroy(p); });
    if (cpu_ns) *cpu_ns = c10::getTime();
    event_record(e);
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    if (!a || !*a || !b || !*b) return 0.f;
    event_synchronize(a->get());
    event_synchronize(b->get());
    return static_cast<float>(event_elapsed_ms(a->get(), b->get()) * 1000.0);  // microseconds
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  void onEachDevice(std::function<void(int)> op) const override {
    const auto prev = current_device();
    for (int i = 0; i < device_count(); ++i) {
      set_device(static_cast<c10::DeviceIndex>(i));
      op(i);
    }
    set_device(prev);
  }
  void synchronize() const override { queue_callbacks().drain(); }
  bool enabled() const override { return true; }
};

}  // namespace

void register_kineto_plugin();  // profiler_plugin.cpp

void register_profiler_stubs() {
  static ProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  register_kineto_plugin();
}

}  // namespace nativelab
