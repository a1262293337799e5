// The device guard PyTorch asks for the current device, streams and events of PrivateUse1
// (c10::DeviceGuard, torch.Stream / torch.Event, torch.accelerator, the autograd engine's device threads).
#include "runtime.h"

#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace nativelab {
namespace {

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDevice, "Expected a neuron device, but got ", d);
    return c10::Device(kDevice, nativelab::exchange_device(d.index()));
  }
  c10::Device getDevice() const override { return c10::Device(kDevice, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDevice, "Expected a neuron device, but got ", d);
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) set_device(d.index());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    return c10::DeviceCapability();  // every dtype: the host CPU computes them all (dtype policy aside)
  }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override { return new_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return new_stream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  bool queryStream(const c10::Stream& /*stream*/) const override { return queue_callbacks().idle(); }
  void synchronizeStream(const c10::Stream& /*stream*/) const override { queue_callbacks().drain(); }
  void synchronizeDevice(const c10::DeviceIndex /*index*/) const override { queue_callbacks().drain(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "Event device index ", static_cast<int>(index),
                " does not match recording stream's device index ", static_cast<int>(stream.device_index()),
                ".");
    if (*event == nullptr) *event = event_create(flag == c10::EventFlag::BACKEND_DEFAULT);
    event_record(*event);
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {
    // One in-order queue: whatever the stream queues next already runs after the event.
  }
  bool queryEvent(void* event) const override { return event == nullptr || event_query(event); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) event_synchronize(event);
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*index*/) const noexcept override {
    if (event != nullptr) event_destroy(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*index*/) const override {
    return event_elapsed_ms(start, end);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {
    // Memory is freed when its last tensor dies, after the queue has run what uses it (queue entries hold it).
  }
};

}  // namespace

void register_guard() {
  static GuardImpl impl;
  static c10::impl::DeviceGuardImplRegistrar registrar(kDevice, &impl);
}

}  // namespace nativelab
