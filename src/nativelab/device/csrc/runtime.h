// The emulated device's C++ runtime: what PyTorch reads through the PrivateUse1 hooks and the device guard
// (current device per thread, streams, events, generators, pinned host memory). Layout after PyTorch's
// OpenReg: a file per concept. The per-op policy is Python's (nativelab/device/: schema.py, policy.py,
// dispatch.py), decided once per op overload and call signature; the per-call work is ops.cpp's.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <c10/core/Storage.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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

// queue.py drives the queue (drains run Python context around the work); these reach it, taking the GIL.
struct QueueCallbacks {
  std::function<void()> drain;                           // run everything queued
  std::function<bool()> idle;                            // nothing queued
  std::function<void(int64_t, int64_t)> record_marker;   // queue a marker that calls event_reached(id, version)
};
QueueCallbacks& queue_callbacks();

// memory.cpp: the per-core account (every device byte, whoever allocated it), the blocks behind device storages,
// and the PrivateUse1 allocator
struct MemStats {
  int64_t allocated, peak, num_allocs, num_frees, capacity, blocks, peak_blocks, num_ooms;
};
void register_allocator();  // c10::SetAllocator(PrivateUse1, ...)
void mem_set_capacity(int index, int64_t capacity);
void mem_check(int index, int64_t nbytes);  // throws torch.OutOfMemoryError if it would not fit
MemStats mem_stats(int index);
void mem_reset_peak(int index);
c10::DataPtr mem_alloc(int index, int64_t nbytes);  // host memory on core `index`, counted until freed
c10::Storage mem_storage(int index, int64_t nbytes);
c10::Storage mem_adopt(const c10::Storage& host, int index, bool resizable = true);  // over a CPU storage's memory
void mem_move_to(const c10::Storage& st, const c10::Storage& host);  // st's bytes and memory now: host's (in place)
bool mem_owns(const c10::Storage& st);  // memory the runtime counts (allocated or adopted), freed with st
// A CPU storage over a device storage's memory that keeps the device storage alive (work queued on host views
// may outlive every device tensor of that memory).
c10::Storage mem_host_storage(const c10::Storage& st, bool resizable = false);
void mem_resize(const c10::Storage& st, size_t nbytes);  // in place, keeping the first bytes (as CPU's)
std::optional<int> mem_core_of(const void* ptr);  // the core whose block holds ptr, if any
struct MemBlock {
  uintptr_t address;
  int64_t nbytes;
  int index;
};
std::vector<MemBlock> mem_blocks();  // the live blocks, by address

// queue.cpp: the work queue (device work, its launch and Python face: queue.h)
size_t queue_size();

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
