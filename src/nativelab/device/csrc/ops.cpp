// The kernel every ATen op on the device reaches (the PrivateUse1 fallback, and the structured native ops
// registered by name). Python decides once per op overload what the op is (schema.py: native / view / fallback,
// its out= form, what it returns) and once per call signature what its outputs are (meta kernels, the dtype
// and GEMM policies); this file does the per-call work of the common case without entering the interpreter:
// the signature key, the cached output spec, allocation on the core, host views and queueing. Anything
// unusual (a first call of a signature, fallbacks, random ops, the dtype policy, a watching tool, sync mode)
// goes to the Python kernel, dispatch.device_kernel, with the call's key built here (the one key: build_key).
#include "queue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace py = pybind11;

// From libtorch_python (torch/csrc/jit/python/pybind_utils.h, declared here: that header alone doubles the
// build time): IValue <-> Python object, as PyTorch's own Python kernels convert them.
namespace torch::jit {
py::object toPyObject(c10::IValue ivalue);
c10::IValue toIValue(py::handle obj, const c10::TypePtr& type, std::optional<int32_t> N);
}  // namespace torch::jit

namespace nativelab {

namespace {

constexpr size_t kMaxSpecs = 4096;   // call signatures cached per op overload

struct OutSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  int64_t nbytes;
};

struct Spec {
  bool fast = false;  // false: calls with this signature go to Python
  bool later = false;  // Python has not run this signature yet (its first call runs at once): ask again
  char kind = 't';    // 't' one tensor, 'u' a tuple, 'l' a list, 'm' writes its arguments
  std::vector<OutSpec> outs;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (auto v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return h;
  }
};

enum class Route { kUndecided, kPython, kFunctional, kMutating };

struct OpEntry {
  Route route = Route::kUndecided;
  std::string name;  // 'aten::mul.Tensor', as the tracking API names it
  py::object* py_op = nullptr;  // the OpOverload (held for the process)
  std::optional<c10::OperatorHandle> out_op;
  std::vector<int> out_map;  // per argument of the out= form: >= 0 an input, < 0 output -(k+1)
  std::vector<int> returns_alias;  // a mutating op: the argument each return is
  bool keyed = false;  // a native op: its calls are keyed (build_key), for this file's cache and Python's
  bool key_floats = false;  // an out= op: its float arguments can size the outputs (arange.start_out): Python's
  std::unordered_map<std::vector<int64_t>, Spec, KeyHash> specs;
  struct CountSlot* counted = nullptr;  // its executed count
};

// ---- op counts: every launch the device ran, whoever launched it (this file, dispatch.py, runtime_ops.py, the
// kernel interface, nki.jit: count_executed), the one count the tracking API reads ----------------------------

struct CountSlot {
  int64_t count = 0;
  uint64_t seq = 0;  // when it was first counted since the last clear (0: not yet): the order names are read in
};
std::mutex g_count_mu;
std::unordered_map<std::string, CountSlot> g_counts;  // node-based: a slot stays put
uint64_t g_count_seq = 0;

CountSlot* count_slot(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_count_mu);
  return &g_counts[name];
}

void bump(CountSlot* s) {
  std::lock_guard<std::mutex> lock(g_count_mu);
  if (s->seq == 0) s->seq = ++g_count_seq;
  s->count += 1;
}

std::mutex g_mu;  // never held while taking the GIL
std::unordered_map<const void*, OpEntry*> g_entries;
std::atomic<bool> g_fast{false};
py::object* g_python_kernel = nullptr;  // dispatch.device_kernel(op, key, *args, **kwargs)
py::object* g_decide = nullptr;         // dispatch.fast_route(op_name, overload) -> (op, name, route, keyed)
py::object* g_spec = nullptr;           // dispatch.fast_spec(op, key) -> None | False | (kind, [(sizes, strides, dtype)])

OpEntry* entry_for(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_entries.find(key);
    if (it != g_entries.end() && it->second->route != Route::kUndecided) return it->second;
  }
  // First call of this overload: ask Python (outside the lock, GIL taken)
  auto* e = new OpEntry();
  {
    py::gil_scoped_acquire gil;
    const auto& name = op.schema().operator_name();
    py::tuple d = (*g_decide)(name.name, name.overload_name);
    e->py_op = new py::object(d[0]);
    e->name = d[1].cast<std::string>();
    e->counted = count_slot(e->name);
    py::object keyed = d[3];  // None, or whether floats are part of the key (schema.py's OpRecord.out_args)
    e->keyed = !keyed.is_none();
    e->key_floats = e->keyed && keyed.cast<bool>();
    py::object route = d[2];
    if (route.is_none()) {
      e->route = Route::kPython;
    } else {
      py::tuple r = route;
      const auto kind = r[0].cast<std::string>();
      if (kind == "m") {
        e->route = Route::kMutating;
        for (auto h : py::reinterpret_borrow<py::tuple>(r[1])) e->returns_alias.push_back(h.cast<int>());
      } else {
        e->route = Route::kFunctional;
        const auto out = r[1].cast<std::string>();
        if (!out.empty()) {
          auto handle = c10::Dispatcher::singleton().findSchema({name.name, out});
          if (handle) {
            e->out_op = *handle;
            int j = 0, k = 0;
            for (const auto& a : handle->schema().arguments()) {
              const bool written = a.alias_info() != nullptr && a.alias_info()->isWrite();
              e->out_map.push_back(written ? -(++k) : j++);
            }
          }
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_entries[key];
  if (slot == nullptr || slot->route == Route::kUndecided) slot = e;
  else delete e;  // another thread decided first (its py_op stays held: harmless)
  return slot;
}

// ---- the per-call signature -----------------------------------------------------------------------------
// The one key of a call signature, for both paths: the C++ kernel's spec cache (OpEntry::specs) and the Python
// path's (schema.py's OpRecord.meta_cache, which dispatch.py fills and fast_spec reads), handed to Python as the
// key's bytes. It is complete for every call Python keys; whether the fast path may take the call is decided
// while it is built (`fast`): tensors strided, plain, on one core or 0-d CPU scalars, arguments of the kinds the
// fast path hands on as they are.

inline void put_tensor_meta(std::vector<int64_t>& key, const at::Tensor& t) {
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (auto s : t.sizes()) key.push_back(s);
  if (t.layout() == c10::kStrided) {
    for (auto s : t.strides()) key.push_back(s);
  }
}

inline void put_tensor(std::vector<int64_t>& key, const at::Tensor& t, int& index, bool& fast) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  const auto dev = t.device();
  if (t.layout() != c10::kStrided || t.is_conj() || t.is_neg() || t._is_zerotensor()) {
    // (Python's meta kernels see through conj and neg bits; a zero tensor or another layout is Python's case)
    key.push_back(-1000 - 8 * static_cast<int64_t>(t.layout()) - 4 * t.is_conj() - 2 * t.is_neg() - t._is_zerotensor());
    fast = false;
  }
  if (dev.type() == kDevice) {
    if (index < 0) index = dev.index();
    else if (index != dev.index()) fast = false;  // Python raises the device-mismatch error
    key.push_back(-100 - dev.index());
  } else if (dev.is_cpu() && t.dim() == 0) {
    key.push_back(-90);
  } else {  // a CPU operand where the op allows one (index_put_'s indices) or the error Python raises
    key.push_back(-60 - static_cast<int64_t>(dev.type()));
    fast = false;
  }
  put_tensor_meta(key, t);
}

inline int64_t bits_of(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

// false: an argument of a kind this does not key (none of native_ops.txt's ops has one: tests/test_engine.py)
bool put_other(std::vector<int64_t>& key, const c10::IValue& v, int& index, bool floats, bool& fast);

inline bool put_value(std::vector<int64_t>& key, const c10::IValue& v, int& index, bool floats, bool& fast) {
  if (v.isTensor()) {
    put_tensor(key, v.toTensor(), index, fast);
  } else if (v.isNone()) {
    key.push_back(-2);
  } else if (v.isInt()) {  // ints, dtypes, layouts and memory formats
    key.push_back(-3);
    key.push_back(v.toInt());
  } else if (v.isDouble()) {
    // Its value is left out unless the op sizes out= arguments (arange.start_out): the output metadata of
    // functional and in-place ops does not depend on a float's value (shape-giving floats come in float[]
    // lists, keyed by value), and optimizers pass a new step size at every step.
    key.push_back(-4);
    if (floats) key.push_back(bits_of(v.toDouble()));
  } else if (v.isBool()) {
    key.push_back(-5);
    key.push_back(v.toBool());
  } else if (v.isIntList()) {
    key.push_back(-6);
    auto l = v.toIntList();
    key.push_back(static_cast<int64_t>(l.size()));
    for (int64_t x : l) key.push_back(x);
  } else if (v.isTensorList()) {
    key.push_back(-7);
    auto l = v.toTensorList();
    key.push_back(static_cast<int64_t>(l.size()));
    for (size_t j = 0; j < l.size(); ++j) put_tensor(key, l.get(j), index, fast);
  } else if (v.isString()) {
    key.push_back(-8);
    key.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else {
    return put_other(key, v, index, floats, fast);
  }
  return true;
}

// The rarer kinds. The fast path hands non-tensor arguments to the queued op as they are: lists of numbers it
// takes; tensors inside a generic list (Tensor?[]), devices (the queued op would make device tensors), generators
// and complex numbers it leaves to Python.
bool put_other(std::vector<int64_t>& key, const c10::IValue& v, int& index, bool floats, bool& fast) {
  if (v.isDoubleList()) {  // scale factors: they size the output, keyed by value
    key.push_back(-9);
    auto l = v.toDoubleList();
    key.push_back(static_cast<int64_t>(l.size()));
    for (double x : l) key.push_back(bits_of(x));
  } else if (v.isBoolList()) {
    key.push_back(-10);
    auto l = v.toBoolList();
    key.push_back(static_cast<int64_t>(l.size()));
    for (bool x : l) key.push_back(x);
  } else if (v.isList()) {  // Tensor?[] (advanced indexing), Scalar[] (its floats as a float argument's)
    key.push_back(-11);
    auto l = v.toListRef();
    key.push_back(static_cast<int64_t>(l.size()));
    for (const auto& x : l) {
      if (x.isTensor() || x.isNone()) fast = false;
      if (!put_value(key, x, index, floats, fast)) return false;
    }
  } else if (v.isComplexDouble()) {
    fast = false;
    const auto c = v.toComplexDouble();
    key.push_back(-12);
    key.push_back(bits_of(c.real()));
    key.push_back(bits_of(c.imag()));
  } else if (v.isDevice()) {
    fast = false;
    const auto d = v.toDevice();
    key.push_back(-13);
    key.push_back(static_cast<int64_t>(d.type()));
    key.push_back(d.index());
  } else if (v.isGenerator()) {  // its state is read at the call, not part of the signature
    fast = false;
    key.push_back(-14);
  } else {
    return false;
  }
  return true;
}

enum class Keyed { kFast, kPython, kNone };  // the fast path may take it / the key is Python's only / no key

Keyed build_key(const c10::IValue* args, size_t n, std::vector<int64_t>& key, int& index, bool floats) {
  key.reserve(48);
  bool fast = true;
  for (size_t i = 0; i < n; ++i) {
    if (!put_value(key, args[i], index, floats, fast)) return Keyed::kNone;
  }
  return fast && index >= 0 ? Keyed::kFast : Keyed::kPython;
}

py::bytes key_bytes(const std::vector<int64_t>& key) {
  return py::bytes(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(int64_t));
}

// ---- host views -----------------------------------------------------------------------------------------

// What queued work reads: device tensors as host views; a CPU tensor copied now, as CUDA copies a CPU
// operand at launch (the caller may write it before the queue runs), unless it is a wrapped Python number.
c10::IValue to_host(const c10::IValue& v, const std::string& what) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) return v;
    if (t.device().type() == kDevice) return host_view(t, what);
    return t.unsafeGetTensorImpl()->is_wrapped_number() ? v : c10::IValue(t.clone());
  }
  if (v.isTensorList()) {
    auto l = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(l.size());
    for (size_t j = 0; j < l.size(); ++j) out.push_back(to_host(l.get(j), what).toTensor());
    return out;
  }
  return v;
}

at::Tensor device_tensor(const OutSpec& o, int index) {
  auto storage = mem_storage(index, o.nbytes);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(o.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes, o.strides);
  return t;
}

int64_t nbytes_for(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t itemsize) {
  int64_t last = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return 0;
    last += (sizes[i] - 1) * strides[i];
  }
  return (last + 1) * itemsize;
}

// ---- the Python side ------------------------------------------------------------------------------------

py::object to_python(const c10::IValue& v);

// An argument as PyTorch's Python kernels see it: dtypes, layouts and memory formats (ints in an IValue) as
// their torch objects, wrapped scalars as Python numbers.
py::object to_python(const c10::IValue& v, const c10::Argument& arg) {
  if (v.isInt()) {
    auto type = arg.real_type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(v.toScalarType())));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(v.toLayout())));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(v.toMemoryFormat()));
      default:
        break;
    }
  }
  return to_python(v);
}

py::object to_python(const c10::IValue& v) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number()) {  // as PyTorch's Python kernels see it
      const auto s = t.item();
      if (s.isFloatingPoint()) return py::float_(s.toDouble());
      if (s.isBoolean()) return py::bool_(s.toBool());
      if (s.isIntegral(false)) return py::int_(s.toLong());
    }
  }
  return torch::jit::toPyObject(v);
}

Spec python_spec(OpEntry* e, const std::vector<int64_t>& key) {
  py::gil_scoped_acquire gil;
  py::object r = (*g_spec)(*e->py_op, key_bytes(key));
  Spec s;
  if (r.is_none()) return s;
  if (PyBool_Check(r.ptr())) {
    s.later = true;
    return s;
  }
  py::tuple t = r;
  const auto kind = t[0].cast<std::string>();
  s.kind = kind == "mutating" ? 'm' : kind == "list" ? 'l' : kind == "tuple" ? 'u' : 't';
  for (auto o : py::reinterpret_borrow<py::list>(t[1])) {
    py::tuple ot = py::reinterpret_borrow<py::tuple>(o);
    OutSpec os;
    os.sizes = ot[0].cast<std::vector<int64_t>>();
    os.strides = ot[1].cast<std::vector<int64_t>>();
    TORCH_CHECK(THPDtype_Check(ot[2].ptr()), "neuron: fast_spec returned a bad dtype");
    os.dtype = reinterpret_cast<THPDtype*>(ot[2].ptr())->scalar_type;
    os.nbytes = nbytes_for(os.sizes, os.strides, static_cast<int64_t>(c10::elementSize(os.dtype)));
    s.outs.push_back(std::move(os));
  }
  s.fast = true;
  return s;
}

// Call a Python kernel with an op's boxed arguments (keyword-only ones by name) and push what it returns.
// `lead`: what goes before the arguments (the OpOverload and the call's key, for dispatch.device_kernel).
void call_python(const py::object& fn, std::initializer_list<py::handle> lead, const c10::OperatorHandle& op,
                 torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  auto* args = stack->data() + stack->size() - n;
  size_t npos = 0;
  while (npos < n && !arguments[npos].kwarg_only()) ++npos;
  py::tuple pargs(npos + lead.size());
  size_t j = 0;
  for (auto h : lead) pargs[j++] = h;
  py::dict kwargs;
  for (size_t i = 0; i < n; ++i) {
    if (i < npos) pargs[i + lead.size()] = to_python(args[i], arguments[i]);
    else kwargs[py::str(arguments[i].name())] = to_python(args[i], arguments[i]);
  }
  py::object out = fn(*pargs, **kwargs);
  torch::jit::drop(*stack, n);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].real_type(), std::nullopt));
  } else if (returns.size() > 1) {
    py::tuple t = out;
    for (size_t i = 0; i < returns.size(); ++i) {
      stack->push_back(torch::jit::toIValue(t[i], returns[i].real_type(), std::nullopt));
    }
  }
}

// The Python kernel, with the call's key (None: an op Python does not key, or an argument the key cannot hold)
void run_python(OpEntry* e, const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<int64_t>* key) {
  py::gil_scoped_acquire gil;
  py::object k = key != nullptr ? py::object(key_bytes(*key)) : py::none();
  call_python(*g_python_kernel, {*e->py_op, k}, op, stack);
}

// ---- the fast path --------------------------------------------------------------------------------------

bool run_fast(OpEntry* e, const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<int64_t>& key,
              int index) {
  const size_t n = op.schema().arguments().size();
  c10::IValue* args = stack->data() + stack->size() - n;
  const Spec* spec = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = e->specs.find(key);
    if (it != e->specs.end()) spec = &it->second;
  }
  if (spec == nullptr) {  // first call of this signature: Python works out the outputs and the policies
    Spec s = python_spec(e, key);
    if (s.later) return false;  // the signature's first call: Python runs it at once (dispatch._first_call)
    std::lock_guard<std::mutex> lock(g_mu);
    if (e->specs.size() >= kMaxSpecs) return false;  // a signature zoo: Python (and its own cache) serves it
    spec = &e->specs.emplace(key, std::move(s)).first->second;  // node-based: stays put
  }
  if (!spec->fast) return false;

  DeviceWork q;
  q.kind = WorkKind::kOp;
  q.core = static_cast<int16_t>(index);
  q.op_name = &e->name;
  std::vector<c10::IValue> results;
  if (spec->kind == 'm') {
    q.op = op;
    q.stack.reserve(n);
    for (size_t i = 0; i < n; ++i) q.stack.push_back(to_host(args[i], e->name));
    for (int a : e->returns_alias) results.push_back(args[a]);
  } else {
    std::vector<at::Tensor> outs, houts;
    for (const auto& o : spec->outs) {
      outs.push_back(device_tensor(o, index));
      houts.push_back(host_view(outs.back(), e->name));
    }
    if (e->out_op) {
      q.op = *e->out_op;
      q.stack.reserve(e->out_map.size());
      for (int m : e->out_map) q.stack.push_back(m >= 0 ? to_host(args[m], e->name) : c10::IValue(houts[-m - 1]));
    } else {
      q.op = op;
      q.stack.reserve(n);
      for (size_t i = 0; i < n; ++i) q.stack.push_back(to_host(args[i], e->name));
      q.copy_into = std::move(houts);
    }
    if (spec->kind == 'l') {
      results.emplace_back(c10::List<at::Tensor>(outs));
    } else {
      for (auto& o : outs) results.emplace_back(std::move(o));
    }
  }
  bump(e->counted);
  const size_t pending = launch(std::move(q));
  torch::jit::drop(*stack, n);
  for (auto& r : results) stack->push_back(std::move(r));
  if (pending >= kMaxPending) queue_callbacks().drain();
  return true;
}

void device_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* stack) {
  OpEntry* e = entry_for(op);
  DispatchNote note(e->name.c_str());  // what a crash report names
  if (!e->keyed) return run_python(e, op, stack, nullptr);  // a view or a fallback: no signature cache
  const size_t n = op.schema().arguments().size();
  std::vector<int64_t> key;
  int index = -1;
  const Keyed k = build_key(stack->data() + stack->size() - n, n, key, index, e->key_floats);
  if (k == Keyed::kFast && e->route != Route::kPython && g_fast.load(std::memory_order_relaxed) &&
      run_fast(e, op, stack, key, index)) {
    return;
  }
  run_python(e, op, stack, k == Keyed::kNone ? nullptr : &key);
}

// ---- the runtime's own ops: allocation and copies ---------------------------------------------------------
// The common case in C++, the rest (first allocation's notice, other layouts, transfers a profiler times, errors
// worded by the Python kernels) through runtime_ops.py's kernel of the same name.

std::unordered_map<std::string, py::object*> g_runtime;  // op name -> runtime_ops kernel (set once, then read)
std::atomic<bool> g_noticed{false};  // the "emulated device" line was printed (runtime_ops._notice)
CountSlot* const g_copy_count = count_slot(kCopyName);

void count(const std::string& name) { bump(count_slot(name)); }

void python_runtime(const char* name, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  call_python(*g_runtime.at(name), {}, op, stack);
}

std::vector<int64_t> contiguous_strides(c10::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

// The core an allocation goes to, when the fast path may make it: -1 otherwise.
int alloc_index(const c10::IValue& layout, const c10::IValue& device, const c10::IValue& pin) {
  if (!g_fast.load(std::memory_order_relaxed) || !g_noticed.load(std::memory_order_relaxed)) return -1;
  if (!layout.isNone() && layout.toLayout() != c10::kStrided) return -1;
  if (!pin.isNone() && pin.toBool()) return -1;
  if (device.isNone()) return current_device();
  const auto d = device.toDevice();
  if (d.type() != kDevice) return -1;
  if (!d.has_index()) return current_device();
  return d.index() < device_count() ? d.index() : -1;
}

at::ScalarType dtype_of(const c10::IValue& v) {
  return v.isNone() ? c10::typeMetaToScalarType(c10::get_default_dtype()) : v.toScalarType();
}

// Whether sizes and strides make an allocation CPU would make: none negative, no overflow in the element count or
// the bytes. Anything else goes to the Python kernel, whose CPU allocation raises CPU's own error.
bool allocatable(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t itemsize) {
  int64_t numel = 1, last = 0, bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0 || __builtin_mul_overflow(numel, sizes[i], &numel)) return false;
  }
  if (numel == 0) return true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t step = 0;
    if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &step) || __builtin_add_overflow(last, step, &last)) return false;
  }
  return !__builtin_mul_overflow(last + 1, itemsize, &bytes);
}

void push_empty(torch::jit::Stack* stack, size_t n, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                at::ScalarType dtype, int index) {
  OutSpec o{std::move(sizes), std::move(strides), dtype, 0};
  o.nbytes = nbytes_for(o.sizes, o.strides, static_cast<int64_t>(c10::elementSize(dtype)));
  auto t = device_tensor(o, index);
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(t));
}

bool has_negative(const std::vector<int64_t>& sizes) {
  return std::any_of(sizes.begin(), sizes.end(), [](int64_t s) { return s < 0; });
}

// empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory)
void empty_strided_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto* a = stack->data() + stack->size() - 6;
  const int index = alloc_index(a[3], a[4], a[5]);
  if (index < 0 || !a[0].isIntList() || !a[1].isIntList()) return python_runtime("empty_strided", op, stack);
  auto sizes = a[0].toIntVector();
  auto strides = a[1].toIntVector();
  if (sizes.size() != strides.size() || !allocatable(sizes, strides, c10::elementSize(dtype_of(a[2])))) {
    return python_runtime("empty_strided", op, stack);
  }
  push_empty(stack, 6, std::move(sizes), std::move(strides), dtype_of(a[2]), index);
}

// empty.memory_format(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory,
//                     MemoryFormat? memory_format)
void empty_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto* a = stack->data() + stack->size() - 6;
  const int index = alloc_index(a[2], a[3], a[4]);
  const bool plain = a[5].isNone() || a[5].toMemoryFormat() == c10::MemoryFormat::Contiguous ||
                     a[5].toMemoryFormat() == c10::MemoryFormat::Preserve;
  if (index < 0 || !plain || !a[0].isIntList()) return python_runtime("empty.memory_format", op, stack);
  auto sizes = a[0].toIntVector();
  if (has_negative(sizes)) return python_runtime("empty.memory_format", op, stack);  // CPU's error, worded there
  auto strides = contiguous_strides(sizes);
  if (!allocatable(sizes, strides, c10::elementSize(dtype_of(a[1])))) return python_runtime("empty.memory_format", op, stack);
  push_empty(stack, 6, std::move(sizes), std::move(strides), dtype_of(a[1]), index);
}

bool plain_tensor(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_conj() && !t.is_neg();
}

// copy_(Tensor(a!) self, Tensor src, bool non_blocking=False): device to device and host to device queued in
// program order (the source snapshotted, as CUDA does for pageable memory); device to host stays Python (it
// drains, and the profiler times the transfer).
void copy_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto* a = stack->data() + stack->size() - 3;
  const auto& dst = a[0].toTensor();
  const auto& src = a[1].toTensor();
  // A zero tensor has no memory: it cannot be written, and copying one writes zeros (CPU's and CUDA's copy_)
  TORCH_CHECK(!dst._is_zerotensor(), "ZeroTensors are immutable. Please materialize the tensor using `.clone()`, "
              "if you want a mutable zero tensor.");
  if (src._is_zerotensor()) {
    auto result = a[0];
    torch::jit::drop(*stack, 3);
    result.toTensor().zero_();
    stack->push_back(std::move(result));
    return;
  }
  const bool dst_dev = dst.device().type() == kDevice;
  const bool src_dev = src.device().type() == kDevice;
  if (!g_fast.load(std::memory_order_relaxed) || !dst_dev || !plain_tensor(dst) || !plain_tensor(src) ||
      !(src_dev || (src.device().is_cpu() && (src.dim() == 0 || src.sizes() == dst.sizes()))) ||
      (src_dev && src.sizes() != dst.sizes() && !at::is_expandable_to(src.sizes(), dst.sizes()))) {
    // (a source that does not broadcast to dst: the Python kernel raises CPU's error at the call, as CUDA does)
    return python_runtime("copy_", op, stack);
  }
  if (!src_dev && queue_size() == 0) {  // nothing queued may still read dst: copy now
    trace_run(WorkKind::kCopy, kMemcpyH2DName, dst.device().index(), [&] { host_view(dst, kCopyName).copy_(src); });
    bump(g_copy_count);
    auto result = a[0];
    torch::jit::drop(*stack, 3);
    stack->push_back(std::move(result));
    return;
  }
  DeviceWork q;
  q.kind = WorkKind::kCopy;
  q.core = static_cast<int16_t>(dst.device().index());
  q.op = op;
  q.op_name = src_dev ? &kCopyName : &kCopyH2DQueuedName;
  q.stack = {host_view(dst, kCopyName), src_dev ? c10::IValue(host_view(src, kCopyName)) : c10::IValue(src.clone()), false};
  bump(g_copy_count);
  const size_t pending = launch(std::move(q));
  auto result = a[0];
  torch::jit::drop(*stack, 3);
  stack->push_back(std::move(result));
  if (pending >= kMaxPending) queue_callbacks().drain();
}

// _to_copy: PyTorch's composite kernel (empty + copy_, both above), made blocking as runtime_ops.to_copy is.
void to_copy_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  // (self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
  (*stack)[stack->size() - 3] = false;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
}

}  // namespace

std::vector<std::string> install_runtime_kernels(const py::dict& kernels) {
  auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  std::vector<std::string> taken;
  auto take = [&](const char* name, torch::CppFunction fn) {
    if (!kernels.contains(name)) return;
    g_runtime[name] = new py::object(kernels[name]);
    aten->impl(name, std::move(fn));
    taken.emplace_back(name);
  };
  take("empty_strided", torch::CppFunction::makeFromBoxedFunction<&empty_strided_kernel>());
  take("empty.memory_format", torch::CppFunction::makeFromBoxedFunction<&empty_kernel>());
  take("copy_", torch::CppFunction::makeFromBoxedFunction<&copy_kernel>());
  take("_to_copy", torch::CppFunction::makeFromBoxedFunction<&to_copy_kernel>());
  return taken;
}

void set_noticed() { g_noticed.store(true); }


void install_kernels(py::function python_kernel, py::function decide, py::function spec,
                     const std::vector<std::string>& direct) {
  g_python_kernel = new py::object(std::move(python_kernel));
  g_decide = new py::object(std::move(decide));
  g_spec = new py::object(std::move(spec));
  // Held for the process: the registrations live as long as these objects.
  auto* fallback = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&device_kernel>());
  auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& name : direct) aten->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&device_kernel>());
  // Views: metadata over the same device storage, as every backend answers them (OpenReg's minimal set).
  aten->impl("view", TORCH_FN(at::native::view));
  aten->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  aten->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
}

void set_fast(bool on) { g_fast.store(on); }

py::list spec_keys(const std::string& name) {
  std::vector<std::vector<int64_t>> keys;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& kv : g_entries) {
      if (kv.second->name != name) continue;
      for (const auto& spec : kv.second->specs) keys.push_back(spec.first);
    }
  }
  py::list out;
  for (const auto& k : keys) out.append(key_bytes(k));
  return out;
}

void count_executed(const std::string& name) { count(name); }

py::dict executed_counts() {
  std::vector<std::tuple<uint64_t, std::string, int64_t>> counts;
  {
    std::lock_guard<std::mutex> lock(g_count_mu);
    for (const auto& kv : g_counts) {
      if (kv.second.count) counts.emplace_back(kv.second.seq, kv.first, kv.second.count);
    }
  }
  std::sort(counts.begin(), counts.end());
  py::dict d;
  for (const auto& [seq, name, n] : counts) d[py::str(name)] = n;
  return d;
}

void clear_executed() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  for (auto& kv : g_counts) kv.second = CountSlot{};
  g_count_seq = 0;
}

}  // namespace nativelab
