// The emulated device's C++ runtime: what PyTorch reads through the PrivateUse1 hooks and the device guard
// (current device per thread, streams, events, generators, pinned host memory). Layout after PyTorch's
// OpenReg: a file per concept. The op work itself stays in Python (nativelab/device/ops.py) for now; the
// runtime reaches it through the callbacks below, which module.cpp sets from Python.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <functional>

namespace nativelab {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;

// device.cpp: the logical cores and the current one of each thread
void init_devices(int count);
int device_count() noexcept;
c10::DeviceIndex check_device(c10::DeviceIndex index);  // -1 means the current device; throws when invalid
c10::DeviceIndex current_device() noexcept;
void set_device(c10::DeviceIndex index);
c10::DeviceIndex exchange_device(c10::DeviceIndex index);

// The device's work queue lives in Python (queue.py); these reach it, taking the GIL.
struct QueueCallbacks {
  std::function<void()> drain;                           // run everything queued
  std::function<bool()> idle;                            // nothing queued
  std::function<void(int64_t, int64_t)> record_marker;   // queue a marker that calls event_reached(id, version)
};
QueueCallbacks& queue_callbacks();

// events.cpp
void* event_create(bool timing);
void event_destroy(void* event) noexcept;
void event_record(void* event);
void event_reached(int64_t id, int64_t version) noexcept;
bool event_query(void* event);
void event_synchronize(void* event);
double event_elapsed_ms(void* start, void* end);

// streams: ids per device, 0 the default stream; the current stream is per thread and device
c10::Stream current_stream(c10::DeviceIndex index) noexcept;
c10::Stream default_stream(c10::DeviceIndex index);
c10::Stream new_stream(c10::DeviceIndex index);
c10::Stream exchange_stream(c10::Stream s) noexcept;

// hooks.cpp
void register_guard();
void register_hooks();
void register_profiler_stubs();
bool is_pinned(const void* ptr);

}  // namespace nativelab

namespace at {
struct Generator;
}
namespace nativelab {
at::Generator make_generator(c10::DeviceIndex index);
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator host_generator(const at::Generator& gen);  // the CPU generator holding a device generator's state
}  // namespace nativelab
