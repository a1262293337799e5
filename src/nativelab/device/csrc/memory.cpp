// Device memory: the per-core account (bytes allocated, peak, counts, capacity, OOM) and the blocks of host
// memory the runtime allocates itself (outputs of the ops it queues). Python's memory.py keeps its own blocks
// for the memory it adopts from CPU results, but every byte of either kind is counted here, once.
#include "runtime.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <array>
#include <mutex>

namespace nativelab {
namespace {

struct CoreAccount {
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t capacity = 0;
};

std::mutex g_mem_mutex;
std::array<CoreAccount, kMaxDevices> g_accounts;

// A block the runtime allocated: host memory and its place in one core's account.
struct Block {
  void* ptr;
  int index;
  int64_t nbytes;
};

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  mem_release(b->index, b->nbytes);
  c10::free_cpu(b->ptr);
  delete b;
}

[[noreturn]] void out_of_memory(int index, int64_t nbytes, const CoreAccount& a) {
  constexpr double gib = 1 << 30;
  TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", index, " out of memory: tried to allocate ", nbytes,
                   " bytes (", c10::str(static_cast<double>(nbytes) / gib).substr(0, 4), " GiB); ", a.allocated,
                   " bytes already allocated of a capacity of ", a.capacity,
                   " bytes. Set NATIVELAB_CORE_MEMORY_GB to change it.");
}

}  // namespace

void mem_set_capacity(int index, int64_t capacity) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_accounts.at(index).capacity = capacity;
}

void mem_check(int index, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  const auto& a = g_accounts.at(index);
  if (a.allocated + nbytes > a.capacity) out_of_memory(index, nbytes, a);
}

void mem_reserve(int index, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto& a = g_accounts.at(index);
  if (a.allocated + nbytes > a.capacity) out_of_memory(index, nbytes, a);
  a.allocated += nbytes;
  a.num_allocs += 1;
  if (a.allocated > a.peak) a.peak = a.allocated;
}

void mem_release(int index, int64_t nbytes) noexcept {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto& a = g_accounts[index];
  a.allocated -= nbytes;
  a.num_frees += 1;
}

MemStats mem_stats(int index) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  const auto& a = g_accounts.at(index);
  return {a.allocated, a.peak, a.num_allocs, a.num_frees, a.capacity};
}

void mem_reset_peak(int index) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto& a = g_accounts.at(index);
  a.peak = a.allocated;
}

c10::DataPtr mem_alloc(int index, int64_t nbytes) {
  mem_reserve(index, nbytes);  // first: an OOM leaves nothing behind
  void* ptr = nullptr;
  try {
    ptr = c10::alloc_cpu(nbytes == 0 ? 1 : nbytes);
  } catch (...) {
    mem_release(index, nbytes);
    throw;
  }
  auto* block = new Block{ptr, index, nbytes};
  return {ptr, block, &free_block, c10::Device(kDevice, static_cast<c10::DeviceIndex>(index))};
}

bool mem_owns(const c10::Storage& st) { return st.data_ptr().get_deleter() == &free_block; }

namespace {
void release_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }
}  // namespace

c10::Storage mem_host_storage(const c10::Storage& st) {
  c10::DataPtr dp(st.mutable_data(), new c10::Storage(st), &release_storage, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), st.nbytes(), std::move(dp), nullptr, false);
}

c10::Storage mem_storage(int index, int64_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            mem_alloc(index, nbytes), nullptr, false));
}

}  // namespace nativelab
