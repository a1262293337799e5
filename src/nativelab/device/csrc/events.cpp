// Streams and events. The device runs its work in one in-order queue (queue.py), which is a valid schedule
// for any set of streams: work on one stream runs in order, and a wait on an event can never be violated.
// So streams are ids (per device, 0 = default) and an event is a marker in that queue: recorded, reached
// when the queue runs it (stamping the time), waited for by draining the queue.
#include "runtime.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

namespace nativelab {
namespace {

struct EventState {
  bool timing = false;
  bool recorded = false;
  bool reached = false;
  int64_t version = 0;  // re-recording makes the markers of earlier records stale
  double time_ms = 0;
};

std::mutex g_events_mutex;
std::unordered_map<int64_t, EventState> g_events;
std::atomic<int64_t> g_next_event{1};

std::array<std::atomic<c10::StreamId>, kMaxDevices> g_next_stream{};
thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};  // 0: the default stream

int64_t id_of(void* event) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(event)); }

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void* event_create(bool timing) {
  const int64_t id = g_next_event++;
  std::lock_guard<std::mutex> lock(g_events_mutex);
  g_events[id].timing = timing;
  return reinterpret_cast<void*>(static_cast<intptr_t>(id));
}

void event_destroy(void* event) noexcept {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  g_events.erase(id_of(event));
}

void event_record(void* event) {
  const int64_t id = id_of(event);
  int64_t version;
  {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    auto& e = g_events.at(id);
    e.recorded = true;
    e.reached = false;
    version = ++e.version;
  }
  queue_callbacks().record_marker(id, version);  // may run at once (NATIVELAB_SYNC=1, or an idle queue)
}

void event_reached(int64_t id, int64_t version) noexcept {
  const double t = now_ms();
  std::lock_guard<std::mutex> lock(g_events_mutex);
  auto it = g_events.find(id);
  if (it != g_events.end() && it->second.version == version) {
    it->second.reached = true;
    it->second.time_ms = t;
  }
}

bool event_query(void* event) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  auto it = g_events.find(id_of(event));
  return it == g_events.end() || !it->second.recorded || it->second.reached;
}

void event_synchronize(void* event) {
  if (event_query(event)) return;
  queue_callbacks().drain();
  // A queued op that failed drops the work after it, markers included: the event is then as done as it gets.
  std::lock_guard<std::mutex> lock(g_events_mutex);
  auto it = g_events.find(id_of(event));
  if (it != g_events.end() && !it->second.reached) {
    it->second.reached = true;
    it->second.time_ms = now_ms();
  }
}

double event_elapsed_ms(void* start, void* end) {
  TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
  std::lock_guard<std::mutex> lock(g_events_mutex);
  auto a = g_events.find(id_of(start)), b = g_events.find(id_of(end));
  TORCH_CHECK(a != g_events.end() && b != g_events.end(), "neuron: elapsed_time of a destroyed event");
  TORCH_CHECK(a->second.timing && b->second.timing,
              "Both events must be created with argument 'enable_timing=True'.");
  TORCH_CHECK(a->second.reached && b->second.reached,
              "Both events must have completed before calculating elapsed time (call synchronize() first).");
  return b->second.time_ms - a->second.time_ms;
}

c10::Stream current_stream(c10::DeviceIndex index) noexcept {
  if (index < 0) index = current_device();
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), t_current_stream[index]);
}

c10::Stream default_stream(c10::DeviceIndex index) {
  index = check_device(index);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), 0);
}

c10::Stream new_stream(c10::DeviceIndex index) {
  index = check_device(index);
  const c10::StreamId id = ++g_next_stream[index];
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), id);
}

c10::Stream exchange_stream(c10::Stream s) noexcept {
  const auto index = s.device_index();
  const auto prev = current_stream(index);
  t_current_stream[index] = s.id();
  return prev;
}

}  // namespace nativelab
