// Logical cores and the current core of each thread (CUDA's current device).
#include "runtime.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace nativelab {
namespace {
std::atomic<int> g_count{0};
thread_local c10::DeviceIndex t_current = 0;  // a new thread starts on core 0, as CUDA's threads do
}  // namespace

void init_devices(int count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices, "neuron: ", count, " logical cores (1..", kMaxDevices,
              " supported)");
  g_count = count;
}

int device_count() noexcept { return g_count.load(); }

c10::DeviceIndex check_device(c10::DeviceIndex index) {
  if (index == -1) return t_current;
  const int n = device_count();
  // "The device index is out of range" is OpenReg's wording (its tests match it); the rest says what is valid.
  TORCH_CHECK(index >= 0 && index < n, "Invalid device index neuron:", static_cast<int>(index),
              ": The device index is out of range; this host has ", n, " logical NeuronCores (neuron:0..neuron:",
              n - 1, "; set NEURON_RT_NUM_CORES to change it)");
  return index;
}

c10::DeviceIndex current_device() noexcept { return t_current; }

void set_device(c10::DeviceIndex index) { t_current = check_device(index); }

c10::DeviceIndex exchange_device(c10::DeviceIndex index) {
  const auto prev = t_current;
  if (index >= 0) set_device(index);
  return prev;
}

QueueCallbacks& queue_callbacks() {
  static QueueCallbacks callbacks;
  return callbacks;
}

}  // namespace nativelab
