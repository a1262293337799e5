// Host views: the CPU tensors over device memory that queued work, copies and the Python paths read and write,
// and what each of them assumes of the device tensor, checked. A device tensor that breaks an assumption (a
// layout other than strided, a wrapper or fake tensor with no memory behind it, a storage resized or freed
// under it, a dtype the host kernels cannot hold) becomes a Python exception naming the op and the cause,
// never a read through a null or out-of-bounds pointer. Zero tensors (the ZeroTensor key: no memory at all)
// are read as the zeros they are.
#include "queue.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>

namespace nativelab {

namespace {
std::string where(std::string_view what) {
  return what.empty() ? std::string("neuron") : "neuron: " + std::string(what);
}
}  // namespace

void check_device_tensor(const at::Tensor& t, std::string_view what) {
  TORCH_CHECK(t.defined(), where(what), ": an undefined tensor reached the device");
  TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, where(what), ": a tensor with layout ", t.layout(),
                              " reached the device, which holds strided tensors only");
  const auto dtype = t.scalar_type();
  TORCH_CHECK_TYPE(!c10::isQIntType(dtype) && !c10::isBitsType(dtype) && dtype != c10::ScalarType::Undefined,
                   where(what), ": dtype ", dtype, " is not supported on the device");
  auto* impl = t.unsafeGetTensorImpl();
  TORCH_CHECK(impl->has_storage(), where(what),
              ": the tensor has no storage (a storage-less wrapper tensor reached the device)");
  const auto& st = impl->unsafe_storage();
  TORCH_CHECK(st.device().type() == kDevice, where(what), ": the tensor's memory is on ", st.device(),
              ", not on the device (a meta, fake or wrapper tensor reached the device)");
  if (t.numel() == 0) return;  // nothing is read or written
  const int64_t itemsize = static_cast<int64_t>(t.element_size());
  int64_t last = t.storage_offset();
  bool overflow = last < 0;
  for (int64_t d = 0; d < t.dim() && !overflow; ++d) {
    const int64_t stride = t.stride(d);
    int64_t step = 0;
    overflow = stride < 0 || __builtin_mul_overflow(t.size(d) - 1, stride, &step) ||
               __builtin_add_overflow(last, step, &last);
  }
  int64_t need = 0;
  overflow = overflow || __builtin_mul_overflow(last + 1, itemsize, &need);
  const auto have = static_cast<int64_t>(st.nbytes());
  TORCH_CHECK(st.data() != nullptr, where(what), ": a tensor of ", t.numel(),
              " elements whose storage has no memory (a storage-less or wrapper tensor reached the device)");
  TORCH_CHECK(!overflow && need <= have, where(what), ": a tensor of sizes ", t.sizes(), ", strides ", t.strides(),
              " and storage offset ", t.storage_offset(), " needs ", overflow ? std::string("more") : std::to_string(need),
              " bytes of its storage, which has ", have, " (was the storage resized or freed under it?)");
}

at::Tensor host_view(const at::Tensor& t, std::string_view what) {
  if (t._is_zerotensor()) {  // no memory: its values are zeros (ZeroTensors are read-only)
    int64_t n = t.numel() == 0 ? 0 : 1;
    for (int64_t d = 0; d < t.dim() && n > 0; ++d) n += (t.size(d) - 1) * t.stride(d);
    return at::zeros({n}, t.options().device(c10::kCPU)).as_strided(t.sizes(), t.strides());
  }
  check_device_tensor(t, what);
  auto h = at::detail::make_tensor<c10::TensorImpl>(mem_host_storage(t.storage()),
                                                    c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  auto* impl = h.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) impl->_set_conj(true);
  if (t.is_neg()) impl->_set_neg(true);
  return h;
}

}  // namespace nativelab
