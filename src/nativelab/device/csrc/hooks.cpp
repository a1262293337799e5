// PrivateUse1HooksInterface: what PyTorch asks the backend directly (availability, device count, current
// device, generators, pinned host memory), plus the device's generators and its pinned-memory allocator.
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace nativelab {

// ---- generators ---------------------------------------------------------------------------------------
// A device generator keeps its state in a CPU generator: the device's random ops run CPU kernels, which
// draw from that one (nativelab/device/dispatch.py swaps it in), so seeding, state save/restore and the numbers
// drawn are one state, exactly CPU's.

struct NeuronGenerator final : public c10::GeneratorImpl {
  NeuronGenerator(c10::DeviceIndex index, at::Generator host)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(host_.mutex());
    host_.set_current_seed(seed);
  }
  uint64_t current_seed() const override { return host_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(host_.mutex());
    return host_.seed();
  }
  void set_offset(uint64_t offset) override { host_.set_offset(offset); }
  uint64_t get_offset() const override { return host_.get_offset(); }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(host_.mutex());
    host_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(host_.mutex());
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return kDevice; }

  const at::Generator& host() const { return host_; }

 private:
  NeuronGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> lock(host_.mutex());
    return new NeuronGenerator(device().index(), host_.clone());
  }
  mutable at::Generator host_;  // mutable: its mutex is locked in const accessors
};

namespace {
std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens;
  return gens;
}
}  // namespace

at::Generator make_generator(c10::DeviceIndex index) {
  return at::make_generator<NeuronGenerator>(check_device(index), at::make_generator<at::CPUGeneratorImpl>());
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = check_device(index);
  return default_generators().at(index);
}

at::Generator host_generator(const at::Generator& gen) {
  auto* impl = dynamic_cast<NeuronGenerator*>(gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "neuron: expected a neuron generator, got one on ", gen.device());
  return impl->host();
}

// ---- pinned host memory ---------------------------------------------------------------------------------
// Host memory the device copies from asynchronously. Page-locking buys nothing here (the device is the
// host), so it is ordinary aligned host memory that the allocator remembers, for `is_pinned()`.

struct PinnedAllocator final : public at::HostAllocator {
  at::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(nbytes == 0 ? 1 : nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
      ++stats_.allocations;
      stats_.allocated += nbytes;
    }
    return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool contains(const void* p) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return false;
    --it;
    return addr < it->first + std::max<size_t>(it->second, 1);
  }

  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}  // nothing is cached: freed blocks go back at once
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  static PinnedAllocator& instance() {
    static PinnedAllocator* a = new PinnedAllocator();  // never destroyed: tensors may outlive static teardown
    return *a;
  }

 private:
  static void free_block(void* ptr) {
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.blocks_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it != self.blocks_.end()) {
        self.stats_.allocated -= it->second;
        self.blocks_.erase(it);
      }
    }
    c10::free_cpu(ptr);
  }
  struct {
    int64_t allocations = 0;
    int64_t allocated = 0;
  } stats_;
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

bool is_pinned(const void* ptr) { return ptr != nullptr && PinnedAllocator::instance().contains(ptr); }

// ---- the hooks ------------------------------------------------------------------------------------------

namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override { return nativelab::exchange_device(index); }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return (index < 0 || index >= device_count()) ? current_device() : nativelab::exchange_device(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return make_generator(index); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator::instance(); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  // The core whose memory holds `data` (from the allocator's list of live blocks): at::from_blob over device
  // memory without an index asks this.
  at::Device getDeviceFromPtr(void* data) const override {
    const auto index = mem_core_of(data);
    TORCH_CHECK(index.has_value(), "neuron: ", data, " is not in memory the neuron device holds (freed, or not "
                "the device's); pass the device explicitly");
    return at::Device(kDevice, static_cast<c10::DeviceIndex>(*index));
  }
  // UntypedStorage.resize_ (FSDP2 frees and re-allocates parameters this way): in place, on the storage's core.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    mem_resize(storage, newsize);
  }
};

}  // namespace

void register_hooks() {
  auto& gens = default_generators();
  for (int i = static_cast<int>(gens.size()); i < device_count(); ++i) gens.push_back(make_generator(i));
  static bool done = false;
  if (done) return;
  done = true;
  at::setHostAllocator(kDevice, &PinnedAllocator::instance());
  register_allocator();
  at::RegisterPrivateUse1HooksInterface(new Hooks());  // lives as long as the process, as PyTorch expects
}

}  // namespace nativelab
