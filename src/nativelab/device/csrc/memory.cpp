// Device memory: the per-core account (bytes and blocks allocated, peaks, capacity, OOM), the blocks of host
// memory behind device storages, and PyTorch's allocator for PrivateUse1 (`c10::GetAllocator`), which
// `torch.UntypedStorage(n, device=...)`, storage resizing and `torch.accelerator`'s memory queries reach.
// A block is either memory the runtime allocated or the memory of a CPU storage the device adopted (a CPU
// kernel's result, memory.py); both are counted here, once, and freed with the device storage's memory.
#include "runtime.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace nativelab {
namespace {

using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
constexpr auto kAll = static_cast<size_t>(StatType::AGGREGATE);
constexpr int64_t kSmallSize = 1 << 20;  // CUDA's split of its statistics: blocks up to 1 MiB are "small_pool"

struct CoreAccount {
  StatArray bytes;   // bytes allocated: current, peak, allocated and freed in total; all, small, large blocks
  StatArray blocks;  // allocations, counted the same way
  int64_t num_ooms = 0;
  int64_t capacity = 0;

  void add(int64_t nbytes) {
    const auto pool = static_cast<size_t>(nbytes <= kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL);
    for (auto i : {kAll, pool}) {
      bytes[i].increase(nbytes);
      blocks[i].increase(1);
    }
  }
  void remove(int64_t nbytes) {
    const auto pool = static_cast<size_t>(nbytes <= kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL);
    for (auto i : {kAll, pool}) {
      bytes[i].decrease(nbytes);
      blocks[i].decrease(1);
    }
  }
  int64_t allocated() const { return bytes[kAll].current; }
};

// The live blocks form a list (under the lock): entering and leaving it costs two pointer writes on the hot
// path of every op; the rare questions (which core holds a pointer, a snapshot) walk it.
struct Block {
  void* ptr = nullptr;
  int index = 0;
  int64_t nbytes = 0;
  c10::Storage adopted;  // adopted memory: the CPU storage that owns it; empty: the runtime's own (alloc_cpu)
  Block* prev = this;
  Block* next = this;
};

std::mutex g_mem_mutex;  // guards the accounts and the list of blocks
std::array<CoreAccount, kMaxDevices> g_accounts;
Block g_blocks;  // the list's head (not a block)

[[noreturn]] void out_of_memory(int index, int64_t nbytes, CoreAccount& a) {
  a.num_ooms += 1;
  constexpr double gib = 1 << 30;
  TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", index, " out of memory: tried to allocate ", nbytes,
                   " bytes (", c10::str(static_cast<double>(nbytes) / gib).substr(0, 4), " GiB); ",
                   a.allocated(), " bytes already allocated of a capacity of ", a.capacity,
                   " bytes. Set NATIVELAB_CORE_MEMORY_GB to change it.");
}

CoreAccount& account(int index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "neuron: invalid device index ", index);
  return g_accounts[index];
}

// Count a new block and enter it in the list (the caller holds the lock and has checked the capacity).
void add_block(CoreAccount& a, Block* b) {
  a.add(b->nbytes);
  b->prev = g_blocks.prev;
  b->next = &g_blocks;
  g_blocks.prev->next = b;
  g_blocks.prev = b;
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_accounts[b->index].remove(b->nbytes);
    b->prev->next = b->next;
    b->next->prev = b->prev;
  }
  if (!b->adopted) c10::free_cpu(b->ptr);
  delete b;  // outside the lock: releasing an adopted CPU storage may take the GIL
}

c10::DataPtr block_ptr(Block* b) {
  return {b->ptr, b, &free_block, c10::Device(kDevice, static_cast<c10::DeviceIndex>(b->index))};
}

// ---- the allocator PyTorch sees -------------------------------------------------------------------------

struct DeviceAllocator final : public c10::DeviceAllocator {
  // On the current core, as CUDA's allocator allocates on the current device (callers set it with a guard).
  c10::DataPtr allocate(size_t nbytes) override { return mem_alloc(current_device(), static_cast<int64_t>(nbytes)); }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    queue_callbacks().drain();  // queued work may still write the source
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return device_count() > 0; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}  // nothing cached: freed blocks go back at once
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}  // see above

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    const auto& a = account(index);
    c10::CachingDeviceAllocator::DeviceStats s;
    // No cache between the program and the host: every allocation is its own segment, reserved is allocated.
    s.allocation = s.segment = s.active = a.blocks;
    s.allocated_bytes = s.reserved_bytes = s.active_bytes = s.requested_bytes = a.bytes;
    s.num_device_alloc = a.blocks[kAll].allocated;
    s.num_device_free = a.blocks[kAll].freed;
    s.num_ooms = a.num_ooms;
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex index) override {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto& a = account(index);
    for (auto& st : a.bytes) st.reset_accumulated();
    for (auto& st : a.blocks) st.reset_accumulated();
    a.num_ooms = 0;
  }

  void resetPeakStats(c10::DeviceIndex index) override { mem_reset_peak(index); }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    const auto& a = account(index);
    return {static_cast<size_t>(std::max<int64_t>(a.capacity - a.allocated(), 0)),
            static_cast<size_t>(a.capacity)};
  }
};

DeviceAllocator g_allocator;

c10::Storage make_storage(c10::DataPtr dp, int64_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(dp), &g_allocator, /*resizable=*/true));
}

}  // namespace

void register_allocator() { c10::SetAllocator(kDevice, &g_allocator); }

void mem_set_capacity(int index, int64_t capacity) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_accounts.at(index).capacity = capacity;
}

void mem_check(int index, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto& a = account(index);
  if (a.allocated() + nbytes > a.capacity) out_of_memory(index, nbytes, a);
}

MemStats mem_stats(int index) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  const auto& a = account(index);
  const auto &b = a.bytes[kAll], &n = a.blocks[kAll];
  return {b.current, b.peak, n.allocated, n.freed, a.capacity, n.current, n.peak, a.num_ooms};
}

void mem_reset_peak(int index) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto& a = account(index);
  for (auto& st : a.bytes) st.reset_peak();
  for (auto& st : a.blocks) st.reset_peak();
}

c10::DataPtr mem_alloc(int index, int64_t nbytes) {
  auto* b = new Block();
  b->index = index;
  b->nbytes = nbytes;
  try {  // one lock for the check, the host memory, the account and the list (the hot path of every op)
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto& a = account(index);
    if (a.allocated() + nbytes > a.capacity) out_of_memory(index, nbytes, a);  // before touching host memory
    b->ptr = c10::alloc_cpu(nbytes == 0 ? 1 : nbytes);
    add_block(a, b);
  } catch (...) {
    delete b;
    throw;
  }
  return block_ptr(b);
}

c10::Storage mem_storage(int index, int64_t nbytes) { return make_storage(mem_alloc(index, nbytes), nbytes); }

namespace {
c10::DataPtr adopt_ptr(const c10::Storage& host, int index) {
  TORCH_CHECK(host.device().is_cpu(), "neuron: only CPU memory can be adopted, got a storage on ", host.device());
  const auto nbytes = static_cast<int64_t>(host.nbytes());
  auto* b = new Block();
  b->ptr = nbytes ? host.mutable_data() : nullptr;
  b->index = index;
  b->nbytes = nbytes;
  b->adopted = host;
  try {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto& a = account(index);
    if (a.allocated() + nbytes > a.capacity) out_of_memory(index, nbytes, a);
    add_block(a, b);
  } catch (...) {
    delete b;
    throw;
  }
  return block_ptr(b);
}
}  // namespace

c10::Storage mem_adopt(const c10::Storage& host, int index, bool resizable) {
  auto st = make_storage(adopt_ptr(host, index), static_cast<int64_t>(host.nbytes()));
  st.unsafeGetStorageImpl()->set_resizable(resizable);
  return st;
}

void mem_move_to(const c10::Storage& st, const c10::Storage& host) {
  // The device storage itself moves (every tensor viewing it follows), as CPU's share_memory_() moves a CPU
  // storage into shared memory; like that storage, it can no longer be resized.
  TORCH_CHECK(host.nbytes() == st.nbytes(), "neuron: mem_move_to: the CPU storage has ", host.nbytes(),
              " bytes, the device storage ", st.nbytes());
  queue_callbacks().drain();  // queued work may still write the old memory
  auto fresh = adopt_ptr(host, st.device().index());
  if (st.nbytes()) std::memcpy(host.mutable_data(), st.data(), st.nbytes());
  auto* impl = st.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));  // the old block is freed here, unless a host view still holds it
  impl->set_resizable(false);
}

bool mem_owns(const c10::Storage& st) { return st.data_ptr().get_deleter() == &free_block; }

namespace {
void release_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }
}  // namespace

// One host storage per device storage (while any host view of it lives): CPU kernels tell aliasing apart by
// StorageImpl, so two host views of one device storage must share theirs, or CPU's overlap checks ("more than one
// element of the written-to tensor refers to a single memory location", an out= that is also an input) pass
// on the device where they raise on CPU. Weak: the host storage holds the device storage, not the reverse.
static std::mutex g_host_mutex;
static std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> g_host_storages;

c10::Storage mem_host_storage(const c10::Storage& st, bool resizable) {
  // Holds the device storage, not its memory: a cached host view must not keep memory that a resize gave back
  // (a resize waits for queued work first, and memory.py's views check the pointer before use). `resizable`
  // (for a CPU kernel that may grow an out= argument; the next plain request turns it off again): growing it
  // moves the host storage to new CPU memory, and the caller grows the device storage to match
  // (ops._follow_host_resize); this device storage then gets a fresh host storage.
  std::lock_guard<std::mutex> lock(g_host_mutex);
  const auto* key = st.unsafeGetStorageImpl();
  auto it = g_host_storages.find(key);
  if (it != g_host_storages.end()) {
    auto impl = it->second.lock();
    if (impl && impl->data_ptr().get() == st.data_ptr().get() && impl->nbytes() == st.nbytes()) {
      impl->set_resizable(resizable);
      return c10::Storage(std::move(impl));
    }
  }
  c10::DataPtr dp(st.mutable_data(), new c10::Storage(st), &release_storage, c10::Device(c10::DeviceType::CPU));
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), st.nbytes(), std::move(dp),
                                                    c10::GetCPUAllocator(), resizable);
  if (g_host_storages.size() >= 4096) {  // forget the host storages that died
    for (auto e = g_host_storages.begin(); e != g_host_storages.end();) {
      e = e->second.expired() ? g_host_storages.erase(e) : std::next(e);
    }
  }
  g_host_storages.insert_or_assign(key, c10::weak_intrusive_ptr<c10::StorageImpl>(impl));
  return c10::Storage(std::move(impl));
}

void mem_resize(const c10::Storage& st, size_t nbytes) {
  TORCH_CHECK(st.resizable(), "Trying to resize storage that is not resizable");
  const size_t old = st.nbytes();
  if (nbytes == old) return;
  queue_callbacks().drain();  // queued work may still read or write the old memory
  auto fresh = mem_alloc(st.device().index(), static_cast<int64_t>(nbytes));  // an OOM leaves st as it was
  const size_t keep = std::min(nbytes, old);
  if (keep) std::memcpy(fresh.get(), st.data(), keep);  // the first bytes survive, as on CPU
  auto* impl = st.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

std::optional<int> mem_core_of(const void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  for (const Block* b = g_blocks.next; b != &g_blocks; b = b->next) {
    const auto start = reinterpret_cast<uintptr_t>(b->ptr);
    if (b->ptr != nullptr && addr >= start && addr < start + std::max<int64_t>(b->nbytes, 1)) return b->index;
  }
  return std::nullopt;
}

std::vector<MemBlock> mem_blocks() {
  std::vector<MemBlock> out;
  {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    for (const Block* b = g_blocks.next; b != &g_blocks; b = b->next)
      if (b->ptr != nullptr) out.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->nbytes, b->index});
  }
  std::sort(out.begin(), out.end(), [](const MemBlock& x, const MemBlock& y) { return x.address < y.address; });
  return out;
}

}  // namespace nativelab
