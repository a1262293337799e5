// Zero tensors on the device (PyTorch's ZeroTensor key): autograd returns `_efficientzerotensor` for gradients a
// formula knows are zero (sgn's for real inputs, the gradient of an output that does not depend on an input),
// a tensor with sizes, strides and dtype but no memory. CPU and CUDA make them with a null-memory allocator;
// the device does the same, so every op PyTorch's ZeroTensor kernels do not answer themselves materializes it
// on the device (`clone`: an allocation and a queued `zero_`), and host views read its zeros (host_views.cpp).
// An allocation, not a computation: like `empty`, nothing the real device would fall back for.
#include "queue.h"

#include <ATen/core/Tensor.h>
#include <ATen/native/TensorFactories.h>  // at::native::ZeroTensorAllocator
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <array>
#include <memory>
#include <mutex>

namespace nativelab {
namespace {

at::native::ZeroTensorAllocator& allocator_for(int index) {
  // Per core, for the process: a storage keeps a pointer to the allocator it came from.
  static std::array<std::unique_ptr<at::native::ZeroTensorAllocator>, kMaxDevices> allocators;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& a = allocators.at(index);
  if (!a) a = std::make_unique<at::native::ZeroTensorAllocator>(c10::Device(kDevice, static_cast<c10::DeviceIndex>(index)));
  return *a;
}

// _efficientzerotensor(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory)
void efficient_zero_tensor_kernel(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto* a = stack->data() + stack->size() - 5;
  TORCH_CHECK(a[0].isIntList(), "neuron: aten::_efficientzerotensor: symbolic sizes are not supported");
  const auto sizes = a[0].toIntVector();
  for (auto s : sizes) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", c10::IntArrayRef(sizes));
  }
  const auto dtype = a[1].isNone() ? c10::typeMetaToScalarType(c10::get_default_dtype()) : a[1].toScalarType();
  TORCH_CHECK_NOT_IMPLEMENTED(a[2].isNone() || a[2].toLayout() == c10::kStrided,
                              "neuron: aten::_efficientzerotensor: only strided zero tensors, got layout ", a[2].toLayout());
  int index = current_device();
  if (!a[3].isNone() && a[3].toDevice().has_index()) index = check_device(a[3].toDevice().index());
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  auto t = zero_tensor(sizes, strides, dtype, index);
  torch::jit::drop(*stack, 5);
  stack->emplace_back(std::move(t));
}

}  // namespace

at::Tensor zero_tensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype, int index) {
  TORCH_CHECK(sizes.size() == strides.size(), "neuron: a zero tensor needs as many strides as sizes");
  int64_t n = 1;
  for (size_t d = 0; d < sizes.size(); ++d) n = sizes[d] == 0 || n == 0 ? 0 : n + (sizes[d] - 1) * strides[d];
  auto& alloc = allocator_for(index);
  const auto nbytes = n * static_cast<int64_t>(c10::elementSize(dtype));
  c10::Storage st(c10::Storage::use_byte_size_t(), nbytes, alloc.allocate(0), &alloc, /*resizable=*/false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(st), c10::DispatchKeySet({c10::DispatchKey::PrivateUse1, c10::DispatchKey::ZeroTensor}),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

void register_zero_tensors() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib->impl("_efficientzerotensor", torch::CppFunction::makeFromBoxedFunction<&efficient_zero_tensor_kernel>());
}

}  // namespace nativelab
