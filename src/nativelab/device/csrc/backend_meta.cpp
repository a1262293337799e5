// Backend metadata of a device tensor: the flags `torch._utils.set_tensor_metadata` gives it, kept on its
// TensorImpl, returned by `get_tensor_metadata`, written by `torch.save` and restored by `torch.load`, copied by
// `torch._C._copy_backend_meta` and to FakeTensors. PyTorch stores no such flags itself for PrivateUse1: it asks
// the backend through the pair of functions registered here (as OpenReg registers its own). A tensor loaded with
// `map_location="cpu"` has none, as on OpenReg: CPU registers no such functions.
#include "runtime.h"

#include <c10/core/TensorImpl.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <map>
#include <string>
#include <unordered_map>

namespace nativelab {
namespace {

// The flags of one tensor, sorted by name so that a saved file does not depend on hashing.
struct DeviceBackendMeta : c10::BackendMeta {
  std::map<std::string, bool> flags;

  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& /*self*/) const override {
    auto copy = c10::make_intrusive<DeviceBackendMeta>();
    copy->flags = flags;
    return copy;
  }
};

// For serialization: add the tensor's flags to the metadata PyTorch writes ("conj"/"neg" are PyTorch's own).
void get_flags(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  auto* meta = dynamic_cast<DeviceBackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  if (meta == nullptr) return;
  for (const auto& [name, value] : meta->flags) metadata[name] = value;
}

// For deserialization and set_tensor_metadata: what is left after PyTorch took "conj"/"neg" becomes the flags.
// Setting an empty map leaves a tensor's flags as they are, as get-then-set of a tensor without flags must.
void set_flags(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (metadata.empty()) return;
  auto meta = c10::make_intrusive<DeviceBackendMeta>();
  auto* old = dynamic_cast<DeviceBackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  if (old != nullptr) meta->flags = old->flags;
  for (const auto& [name, value] : metadata) meta->flags[name] = value;
  t.unsafeGetTensorImpl()->set_backend_meta(meta);
}

// At load of the runtime. A second copy of the runtime in one process (another build of it) must not fail.
const bool registered = [] {
  auto& registry = torch::jit::GetBackendMetaSerialization();
  if (!registry[static_cast<int>(kDevice)].has_value()) {
    torch::jit::TensorBackendMetaRegistry(kDevice, &get_flags, &set_flags);
  }
  return true;
}();

}  // namespace
}  // namespace nativelab
