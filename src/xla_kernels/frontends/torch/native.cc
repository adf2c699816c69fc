// xla-kernels native torch kernels: the eager hot path of torch.ops.<ns>.<name>
// without Python.
//
// Built by frontends/torch/native.py (build_library) against the installed torch,
// together with runtime/eager_ffi.cc, into one shared library loaded with
// ctypes.PyDLL (so every entry point below runs with the GIL held).
//
// xk_native_install(qualname, dispatch_key, planner) registers a boxed kernel for
// one operator and dispatch key ("CPU" or "CUDA"). Per call the kernel:
//
//   1. reads the tensors (positional arguments) and attributes (keyword-only
//      arguments) from the stack and makes the tensors contiguous;
//   2. checks that every tensor is on one device (a call that mixes devices goes
//      to the planner, which raises), then looks up a plan keyed by (device, input
//      sizes, dtypes, attribute values); on a miss it takes the GIL and asks the
//      Python planner, which validates the call with the library's own rules (its
//      exceptions propagate unchanged) and returns the handler, the outputs and
//      the attributes already encoded for the XLA FFI call frame (runtime/eager.py
//      does that encoding, so it lives in one place);
//   3. on a hit no Python runs: outputs come from at::empty on the inputs'
//      device, the handler runs through xk_eager_call on torch's current stream
//      (CUDA) with scratch memory from torch's caching allocator;
//   4. pushes the visible outputs.
//
// No CUDA headers: the stream comes from c10's device-guard interface, which the
// CUDA build of torch registers.
//
// xk_native_install_autograd(qualname, differentiable) registers the operator's
// Autograd kernel (a gate): when no input needs a gradient (grad mode off, or no
// tensor requires grad) it goes straight to the backend kernel below autograd, in
// C++; otherwise it calls the Python `differentiable(*args, **kwargs)`, which runs
// the op under an autograd.Function (frontends/torch/autograd.py). Without the gate every
// call would pass through a Python autograd kernel (about 7 us of a 10 us call).
//
// Example (Python, what native.py does):
//   lib = ctypes.PyDLL(path)
//   lib.xk_native_install(b"xla_kernels::simple_add", b"CPU", planner, err, 2048)

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eager_ffi.h"

namespace {

// XLA_FFI_Error_Code names are not needed here: the Python factory builds the
// KernelError (same class and message as the Python path).
constexpr int64_t kErrLen = 2048;
constexpr size_t kMaxPlans = 512;  // like _MAX_PLANS in frontends/torch/eager.py

// Set once by xk_native_init: (op name, handler message, code) -> exception.
PyObject* g_make_kernel_error = nullptr;

// Holds the GIL for a scope (the kernel runs with it released when called from
// Python: torch.ops releases it around the dispatcher).
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// Raises the pending Python exception through the dispatcher. torch's own Python
// kernels do the same: pybind11 restores the original exception object when the
// call returns to Python, so the caller sees e.g. OpInputError, not RuntimeError.
[[noreturn]] void ThrowPython() { throw pybind11::error_already_set(); }

struct Output {
  c10::ScalarType scalar_type;
  int32_t ffi_dtype;
  std::vector<int64_t> shape;
  bool poison_float;  // NaN for float/complex outputs, all-ones bits otherwise
};

// One validated call shape. Immutable once built (shared by threads), and never
// moved: the XkAttr entries point into the strings it owns.
struct Plan {
  void* handler = nullptr;
  std::vector<int32_t> input_dtypes;  // XLA_FFI_DataType of each input
  std::vector<Output> outputs;
  std::vector<size_t> visible;
  std::vector<std::string> attr_names;
  std::vector<std::string> attr_payloads;
  std::vector<XkAttr> attrs;
  std::string op_name;
  bool poison = false;
};

// ---------------------------------------------------------------- parsing plans

[[noreturn]] void BadPlan(const std::string& what) {
  PyErr_SetString(PyExc_TypeError, ("xla_kernels native torch kernel: malformed plan from "
                                    "the planner: " + what).c_str());
  ThrowPython();
}

PyObject* Item(PyObject* tuple, Py_ssize_t i, const char* what) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) <= i) BadPlan(what);
  return PyTuple_GET_ITEM(tuple, i);
}

int64_t AsInt(PyObject* obj, const char* what) {
  int64_t v = PyLong_AsLongLong(obj);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    BadPlan(what);
  }
  return v;
}

std::string AsBytes(PyObject* obj, const char* what) {
  char* data = nullptr;
  Py_ssize_t len = 0;
  if (!PyBytes_Check(obj) || PyBytes_AsStringAndSize(obj, &data, &len) != 0) BadPlan(what);
  return std::string(data, static_cast<size_t>(len));
}

// The planner's answer, flattened by native.py:
//   (handler, input_dtypes, outputs, visible, attrs, op_name, poison)
//   outputs: ((torch.dtype, ffi_dtype, shape, is_float), ...)
//   attrs:   ((name, kind, ffi_dtype, inline8, payload, size), ...)
std::shared_ptr<Plan> ParsePlan(PyObject* t) {
  auto plan = std::make_shared<Plan>();
  plan->handler = reinterpret_cast<void*>(
      static_cast<uintptr_t>(AsInt(Item(t, 0, "handler"), "handler")));
  PyObject* ins = Item(t, 1, "input dtypes");
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ins); ++i) {
    plan->input_dtypes.push_back(static_cast<int32_t>(AsInt(Item(ins, i, "in"), "in")));
  }
  PyObject* outs = Item(t, 2, "outputs");
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); ++i) {
    PyObject* o = Item(outs, i, "output");
    PyObject* dtype = Item(o, 0, "output dtype");
    if (!THPDtype_Check(dtype)) BadPlan("output dtype is not a torch.dtype");
    Output out;
    out.scalar_type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    out.ffi_dtype = static_cast<int32_t>(AsInt(Item(o, 1, "output code"), "output code"));
    PyObject* shape = Item(o, 2, "output shape");
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) {
      out.shape.push_back(AsInt(Item(shape, d, "dim"), "dim"));
    }
    out.poison_float = PyObject_IsTrue(Item(o, 3, "output kind")) == 1;
    plan->outputs.push_back(std::move(out));
  }
  PyObject* visible = Item(t, 3, "visible");
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(visible); ++i) {
    int64_t v = AsInt(Item(visible, i, "visible"), "visible");
    if (v < 0 || static_cast<size_t>(v) >= plan->outputs.size()) BadPlan("visible index");
    plan->visible.push_back(static_cast<size_t>(v));
  }
  PyObject* attrs = Item(t, 4, "attrs");
  Py_ssize_t nattrs = PyTuple_GET_SIZE(attrs);
  // Own every string first, then point the XkAttrs at them (no reallocation after).
  plan->attr_names.reserve(nattrs);
  plan->attr_payloads.reserve(nattrs);
  plan->attrs.resize(nattrs);
  for (Py_ssize_t i = 0; i < nattrs; ++i) {
    PyObject* a = Item(attrs, i, "attr");
    plan->attr_names.push_back(AsBytes(Item(a, 0, "attr name"), "attr name"));
    plan->attr_payloads.push_back(AsBytes(Item(a, 4, "attr payload"), "attr payload"));
    XkAttr& x = plan->attrs[i];
    std::memset(&x, 0, sizeof(x));
    x.kind = static_cast<int32_t>(AsInt(Item(a, 1, "attr kind"), "attr kind"));
    x.dtype = static_cast<int32_t>(AsInt(Item(a, 2, "attr dtype"), "attr dtype"));
    std::string inline_value = AsBytes(Item(a, 3, "attr inline"), "attr inline");
    if (inline_value.size() != sizeof(x.inline_value)) BadPlan("inline value size");
    std::memcpy(x.inline_value, inline_value.data(), sizeof(x.inline_value));
    x.size = AsInt(Item(a, 5, "attr size"), "attr size");
  }
  for (Py_ssize_t i = 0; i < nattrs; ++i) {
    XkAttr& x = plan->attrs[i];
    x.name = plan->attr_names[i].data();
    x.name_len = static_cast<int64_t>(plan->attr_names[i].size());
    const std::string& payload = plan->attr_payloads[i];
    // Empty payload: a scalar in inline_value, or an empty string/array.
    x.data = payload.empty() ? nullptr : payload.data();
  }
  PyObject* name = Item(t, 5, "op name");
  const char* utf8 = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  if (utf8 == nullptr) {
    PyErr_Clear();
    BadPlan("op name");
  }
  plan->op_name = utf8;
  plan->poison = PyObject_IsTrue(Item(t, 6, "poison")) == 1;
  return plan;
}

// ---------------------------------------------------------------- IValues to Python

PyObject* ToPython(const c10::IValue& v) {
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  }
  if (v.isIntList()) {
    auto list = v.toIntList();
    PyObject* out = PyList_New(static_cast<Py_ssize_t>(list.size()));
    if (out == nullptr) return nullptr;
    for (size_t i = 0; i < list.size(); ++i) {
      PyList_SET_ITEM(out, i, PyLong_FromLongLong(list.get(i)));
    }
    return out;
  }
  if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    PyObject* out = PyList_New(static_cast<Py_ssize_t>(list.size()));
    if (out == nullptr) return nullptr;
    for (size_t i = 0; i < list.size(); ++i) {
      PyList_SET_ITEM(out, i, PyFloat_FromDouble(list.get(i)));
    }
    return out;
  }
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  PyErr_Format(PyExc_TypeError, "xla_kernels native torch kernel: unsupported argument type %s",
               v.tagKind().c_str());
  return nullptr;
}

// The keyword-only arguments of a call (the op's attributes) as a new dict, or null
// with a Python error set.
PyObject* KeywordOnlyArgs(const std::vector<c10::Argument>& arguments,
                          c10::ArrayRef<c10::IValue> args) {
  PyObject* kwargs = PyDict_New();
  for (size_t i = 0; i < args.size() && kwargs != nullptr; ++i) {
    if (!arguments[i].kwarg_only()) continue;
    PyObject* value = ToPython(args[i]);
    if (value == nullptr ||
        PyDict_SetItemString(kwargs, arguments[i].name().c_str(), value) != 0) {
      Py_CLEAR(kwargs);
    }
    Py_XDECREF(value);
  }
  return kwargs;
}

// ---------------------------------------------------------------- cache keys

void Put(std::string& key, const void* data, size_t n) {
  key.append(static_cast<const char*>(data), n);
}

template <typename T>
void Put(std::string& key, T value) {
  Put(key, &value, sizeof(value));
}

// Appends an attribute to the key: a tag, then its value. Returns false for a
// value it cannot key (then the call is planned, and not cached).
bool PutAttr(std::string& key, const c10::IValue& v) {
  if (v.isNone()) {
    Put<char>(key, 'n');
  } else if (v.isBool()) {
    Put<char>(key, 'b');
    Put<char>(key, v.toBool() ? 1 : 0);
  } else if (v.isInt()) {
    Put<char>(key, 'i');
    Put<int64_t>(key, v.toInt());
  } else if (v.isDouble()) {
    Put<char>(key, 'd');
    Put<double>(key, v.toDouble());  // bitwise: -0.0 and NaNs key apart, which is safe
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    Put<char>(key, 's');
    Put<uint64_t>(key, s.size());
    Put(key, s.data(), s.size());
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    Put<char>(key, 'I');
    Put<uint64_t>(key, list.size());
    for (size_t i = 0; i < list.size(); ++i) Put<int64_t>(key, list.get(i));
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    Put<char>(key, 'D');
    Put<uint64_t>(key, list.size());
    for (size_t i = 0; i < list.size(); ++i) Put<double>(key, list.get(i));
  } else {
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- CUDA scratch

// Scratch for one CUDA call, from torch's caching allocator (allocate() uses the
// current stream of the current device, i.e. the stream the handler runs on, so
// a block freed here is only reused by work queued after it on that stream).
struct DeviceScratch {
  c10::Allocator* allocator = nullptr;
  // (address handed out, its block): released at the latest when the call ends.
  c10::SmallVector<std::pair<void*, c10::DataPtr>, 2> blocks;

  static void* Alloc(void* user, size_t size, size_t alignment, int32_t, void*) {
    auto* self = static_cast<DeviceScratch*>(user);
    try {
      // The caching allocator aligns to 512 bytes; over-allocate for larger alignments.
      size_t extra = alignment > 512 ? alignment : 0;
      c10::DataPtr block = self->allocator->allocate(size + extra);
      auto address = reinterpret_cast<uintptr_t>(block.get());
      address = (address + alignment - 1) & ~(static_cast<uintptr_t>(alignment) - 1);
      void* ptr = reinterpret_cast<void*>(address);
      self->blocks.emplace_back(ptr, std::move(block));
      return ptr;
    } catch (const std::exception&) {  // out of memory: the runtime reports the failure
      return nullptr;
    }
  }

  static void Free(void* user, void* ptr, size_t, int32_t, void*) {
    auto* self = static_cast<DeviceScratch*>(user);
    for (auto it = self->blocks.begin(); it != self->blocks.end(); ++it) {
      if (it->first == ptr) {
        self->blocks.erase(it);
        return;
      }
    }
  }
};

// ---------------------------------------------------------------- the kernel

class Kernel final : public c10::OperatorKernel {
 public:
  Kernel(PyObject* planner, bool cuda) : planner_(planner), cuda_(cuda) {
    Py_INCREF(planner_);  // kept for the life of the process, as the registration
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet,
                  torch::jit::Stack* stack) {
    const auto& arguments = op.schema().arguments();
    const size_t nargs = arguments.size();
    auto args = torch::jit::last(*stack, nargs);

    c10::SmallVector<at::Tensor, 8> tensors;
    thread_local std::string key;
    key.clear();
    bool cacheable = true;
    // Every tensor must be on the first one's device (type and index): a kernel reads
    // them all through pointers on that device. Checked on every call, cached plan or
    // not; a call that mixes devices is never cached and goes to the planner, whose
    // check raises the library's error naming the argument.
    bool one_device = true;
    c10::Device device(c10::DeviceType::CPU);
    for (size_t i = 0; i < nargs; ++i) {
      const c10::IValue& v = args[i];
      if (!arguments[i].kwarg_only() && v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (tensors.empty()) {
          device = t.device();
          Put<int8_t>(key, static_cast<int8_t>(device.type()));
          Put<int8_t>(key, device.index());
        } else if (t.device() != device) {
          one_device = false;
        }
        tensors.push_back(t.is_contiguous() ? t : t.contiguous());
        Put<int8_t>(key, static_cast<int8_t>(t.scalar_type()));
        Put<int64_t>(key, t.dim());
        for (int64_t d : t.sizes()) Put<int64_t>(key, d);
      } else {
        cacheable = PutAttr(key, v) && cacheable;
      }
    }
    TORCH_CHECK(!tensors.empty(), op.schema().name(), ": takes no tensor input");
    cacheable = cacheable && one_device;

    std::shared_ptr<const Plan> plan;
    if (cacheable) {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) plan = it->second;
    }
    if (!plan) {
      // A copy: the planner is Python and may run native kernels itself on this
      // thread, which reuse the thread's key buffer.
      std::string own_key = key;
      plan = MakePlan(op, args, tensors);
      if (cacheable) {
        std::unique_lock<std::shared_mutex> lock(mutex_);
        if (plans_.size() >= kMaxPlans) plans_.clear();
        plans_.emplace(std::move(own_key), plan);
      }
    }
    TORCH_CHECK(one_device, plan->op_name, ": the planner accepted inputs on more than one "
                "device");
    TORCH_CHECK(plan->input_dtypes.size() == tensors.size(), plan->op_name,
                ": the plan has ", plan->input_dtypes.size(), " inputs, the call ",
                tensors.size());

    // A device guard makes `device` current, so that at::empty, the stream and the
    // caching allocator all refer to the tensors' device.
    c10::OptionalDeviceGuard guard;
    if (cuda_) guard.reset_device(device);

    // Outputs straight from the allocator (at::empty without the dispatcher round
    // trip): the CPU allocator, or torch's CUDA caching allocator on the current
    // stream of `device` (made current by the guard above).
    c10::Allocator* cuda_allocator = cuda_ ? c10::GetAllocator(device.type()) : nullptr;
    const at::Context& ctx = at::globalContext();
    // Fill (NaN, or all-ones bits for integers) when asked to poison, and when
    // deterministic algorithms ask for uninitialized memory to be filled, as
    // at::empty then does.
    const bool fill = plan->poison || (ctx.deterministicAlgorithms() &&
                                       ctx.deterministicFillUninitializedMemory());
    c10::SmallVector<at::Tensor, 4> outs;
    for (const Output& o : plan->outputs) {
      outs.emplace_back(cuda_ ? at::detail::empty_generic(
                                    o.shape, cuda_allocator,
                                    c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                    o.scalar_type, std::nullopt)
                              : at::detail::empty_cpu(o.shape, o.scalar_type));
      if (fill) {
        if (o.poison_float) {
          outs.back().fill_(std::numeric_limits<double>::quiet_NaN());
        } else {
          outs.back().fill_(-1);
        }
      }
    }
    Call(*plan, device, tensors, outs);

    torch::jit::drop(*stack, nargs);
    for (size_t i : plan->visible) torch::jit::push(*stack, std::move(outs[i]));
  }

  void Clear() {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    plans_.clear();
  }

 private:
  // Asks the Python planner; its exceptions reach the caller unchanged.
  std::shared_ptr<const Plan> MakePlan(const c10::OperatorHandle& op,
                                       c10::ArrayRef<c10::IValue> args,
                                       const c10::SmallVector<at::Tensor, 8>& tensors) {
    const auto& arguments = op.schema().arguments();
    Gil gil;
    PyObject* py_tensors = PyTuple_New(static_cast<Py_ssize_t>(tensors.size()));
    PyObject* kwargs = KeywordOnlyArgs(arguments, args);
    if (py_tensors == nullptr || kwargs == nullptr) {
      Py_XDECREF(py_tensors);
      Py_XDECREF(kwargs);
      ThrowPython();
    }
    bool ok = true;
    for (size_t i = 0; i < tensors.size() && ok; ++i) {
      PyObject* t = THPVariable_Wrap(tensors[i]);
      ok = t != nullptr;
      if (ok) PyTuple_SET_ITEM(py_tensors, i, t);
    }
    PyObject* result =
        ok ? PyObject_CallFunctionObjArgs(planner_, py_tensors, kwargs, nullptr) : nullptr;
    Py_DECREF(py_tensors);
    Py_DECREF(kwargs);
    if (result == nullptr) ThrowPython();
    std::shared_ptr<Plan> plan;
    try {
      plan = ParsePlan(result);
    } catch (...) {
      Py_DECREF(result);
      throw;
    }
    Py_DECREF(result);
    return plan;
  }

  void Call(const Plan& plan, c10::Device device, const c10::SmallVector<at::Tensor, 8>& tensors,
            const c10::SmallVector<at::Tensor, 4>& outs) {
    const size_t n = tensors.size() + outs.size();
    size_t ndims = 0;
    for (const auto& t : tensors) ndims += static_cast<size_t>(t.dim());
    for (const auto& o : outs) ndims += static_cast<size_t>(o.dim());
    c10::SmallVector<XkBuffer, 8> buffers(n);
    c10::SmallVector<int64_t, 32> dims(ndims);
    size_t pos = 0;
    auto fill = [&](XkBuffer& b, const at::Tensor& t, int32_t dtype) {
      b.data = t.data_ptr();
      b.rank = t.dim();
      b.dims = b.rank ? dims.data() + pos : nullptr;
      for (int64_t d : t.sizes()) dims[pos++] = d;
      b.dtype = dtype;
      b.reserved = 0;
    };
    for (size_t i = 0; i < tensors.size(); ++i) {
      fill(buffers[i], tensors[i], plan.input_dtypes[i]);
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      fill(buffers[tensors.size() + i], outs[i], plan.outputs[i].ffi_dtype);
    }

    XkDevice dev;
    std::memset(&dev, 0, sizeof(dev));
    DeviceScratch scratch;
    if (cuda_) {
      const c10::impl::DeviceGuardImplInterface* impl =
          c10::impl::getDeviceGuardImpl(device.type());
      dev.platform = XK_PLATFORM_DEVICE;
      dev.device_ordinal = device.index();
      dev.stream = impl->getStream(device).native_handle();
      scratch.allocator = c10::GetAllocator(device.type());
      dev.alloc = &DeviceScratch::Alloc;
      dev.free = &DeviceScratch::Free;
      dev.alloc_user = &scratch;
    } else {
      dev.platform = XK_PLATFORM_HOST;
    }

    char err[kErrLen];
    int32_t rc = xk_eager_call(plan.handler, &dev, buffers.data(),
                               static_cast<int64_t>(tensors.size()),
                               buffers.data() + tensors.size(),
                               static_cast<int64_t>(outs.size()), plan.attrs.data(),
                               static_cast<int64_t>(plan.attrs.size()), err, kErrLen);
    if (rc != 0) KernelFailed(plan, err, rc);
  }

  [[noreturn]] static void KernelFailed(const Plan& plan, const char* message, int32_t code) {
    if (g_make_kernel_error != nullptr) {
      Gil gil;
      PyObject* error = PyObject_CallFunction(g_make_kernel_error, "ssi", plan.op_name.c_str(),
                                              message, static_cast<int>(code));
      if (error != nullptr) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error)), error);
        Py_DECREF(error);
      }
      ThrowPython();
    }
    TORCH_CHECK(false, plan.op_name, ": kernel failed: ", message);
  }

  PyObject* planner_;
  bool cuda_;
  std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans_;
};

// ---------------------------------------------------------------- the autograd gate

class AutogradGate final : public c10::OperatorKernel {
 public:
  explicit AutogradGate(PyObject* differentiable) : differentiable_(differentiable) {
    Py_INCREF(differentiable_);  // kept for the life of the process, as the registration
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const size_t nargs = op.schema().arguments().size();
    if (!NeedsGrad(torch::jit::last(*stack, nargs))) {
      at::AutoDispatchBelowAutograd below;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
      return;
    }
    CallDifferentiable(op, stack, nargs);
  }

 private:
  static bool NeedsGrad(c10::ArrayRef<c10::IValue> args) {
    if (!at::GradMode::is_enabled()) return false;
    for (const c10::IValue& v : args) {
      if (v.isTensor() && v.toTensor().requires_grad()) return true;
    }
    return false;
  }

  // differentiable(*positional, **keyword_only) -> None | Tensor | tuple of Tensors.
  void CallDifferentiable(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                          size_t nargs) {
    const auto& arguments = op.schema().arguments();
    auto args = torch::jit::last(*stack, nargs);
    Gil gil;
    size_t npositional = 0;
    for (const auto& a : arguments) npositional += a.kwarg_only() ? 0 : 1;
    PyObject* positional = PyTuple_New(static_cast<Py_ssize_t>(npositional));
    PyObject* kwargs = KeywordOnlyArgs(arguments, args);
    bool ok = positional != nullptr && kwargs != nullptr;
    for (size_t i = 0, p = 0; i < nargs && ok; ++i) {
      if (arguments[i].kwarg_only()) continue;
      PyObject* value = ToPython(args[i]);
      ok = value != nullptr;
      if (ok) PyTuple_SET_ITEM(positional, static_cast<Py_ssize_t>(p++), value);
    }
    PyObject* result = ok ? PyObject_Call(differentiable_, positional, kwargs) : nullptr;
    Py_XDECREF(positional);
    Py_XDECREF(kwargs);
    if (result == nullptr) ThrowPython();
    torch::jit::drop(*stack, nargs);
    const size_t nreturns = op.schema().returns().size();
    bool pushed = true;
    if (nreturns == 1 && THPVariable_Check(result)) {
      torch::jit::push(*stack, THPVariable_Unpack(result));
    } else if (nreturns == 0 && result == Py_None) {
    } else if (PyTuple_Check(result) && static_cast<size_t>(PyTuple_GET_SIZE(result)) == nreturns) {
      for (size_t i = 0; i < nreturns && pushed; ++i) {
        PyObject* item = PyTuple_GET_ITEM(result, static_cast<Py_ssize_t>(i));
        pushed = THPVariable_Check(item);
        if (pushed) torch::jit::push(*stack, THPVariable_Unpack(item));
      }
    } else {
      pushed = false;
    }
    Py_DECREF(result);
    TORCH_CHECK(pushed, op.schema().name(), ": the autograd path returned values that do not "
                "match the schema's ", nreturns, " tensor result(s)");
  }

  PyObject* differentiable_;
};

// ---------------------------------------------------------------- in-place updates

class VersionBump final : public c10::OperatorKernel {
 public:
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const auto& arguments = op.schema().arguments();
    auto args = torch::jit::last(*stack, arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::AliasInfo* alias = arguments[i].alias_info();
      if (alias == nullptr || !alias->isWrite() || !args[i].isTensor()) continue;
      // Inference tensors have no version counter (torch's increment_version skips them).
      const at::Tensor& t = args[i].toTensor();
      if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
    }
    at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
};

// Registrations live as long as the process: torch::Library objects and the
// kernels they own are never destroyed (deregistering during interpreter
// shutdown races torch's own static destructors).
std::mutex g_registry_mutex;
std::unordered_map<std::string, std::vector<Kernel*>>* g_kernels = nullptr;

int32_t Fail(const std::string& message, char* err, int64_t err_len) {
  if (err != nullptr && err_len > 0) {
    size_t n = std::min(message.size(), static_cast<size_t>(err_len - 1));
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" {

// Sets the factory of kernel-failure exceptions: (op name, message, code) -> exception.
int32_t xk_native_init(PyObject* make_kernel_error) {
  Py_XINCREF(make_kernel_error);
  Py_XDECREF(g_make_kernel_error);
  g_make_kernel_error = make_kernel_error;
  return 0;
}

// Registers the native kernel of `qualname` ("ns::name") for `dispatch_key`
// ("CPU" or "CUDA"). Returns 0, or 1 with a message in err.
int32_t xk_native_install(const char* qualname, const char* dispatch_key, PyObject* planner,
                          char* err, int64_t err_len) {
  try {
    std::string q(qualname);
    size_t sep = q.find("::");
    if (sep == std::string::npos) return Fail("qualname must be 'ns::name': " + q, err, err_len);
    std::string key(dispatch_key);
    bool cuda = key == "CUDA";
    if (!cuda && key != "CPU") return Fail("dispatch key must be CPU or CUDA: " + key, err,
                                           err_len);
    if (!PyCallable_Check(planner)) return Fail("planner is not callable", err, err_len);
    auto kernel = std::make_unique<Kernel>(planner, cuda);
    Kernel* raw = kernel.get();
    auto* lib = new torch::Library(torch::Library::IMPL, q.substr(0, sep),
                                   cuda ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU,
                                   __FILE__, __LINE__);
    lib->impl(q.substr(sep + 2).c_str(),
              torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    if (g_kernels == nullptr) g_kernels = new std::unordered_map<std::string, std::vector<Kernel*>>();
    (*g_kernels)[q].push_back(raw);
    return 0;
  } catch (const std::exception& e) {
    return Fail(e.what(), err, err_len);
  }
}

// Registers the Autograd kernel of `qualname` ("ns::name"): the gate above, which
// calls `differentiable` when an input needs a gradient. Returns 0, or 1 with a
// message in err.
int32_t xk_native_install_autograd(const char* qualname, PyObject* differentiable, char* err,
                                   int64_t err_len) {
  try {
    std::string q(qualname);
    size_t sep = q.find("::");
    if (sep == std::string::npos) return Fail("qualname must be 'ns::name': " + q, err, err_len);
    if (!PyCallable_Check(differentiable)) return Fail("differentiable is not callable", err,
                                                       err_len);
    auto* lib = new torch::Library(torch::Library::IMPL, q.substr(0, sep),
                                   c10::DispatchKey::Autograd, __FILE__, __LINE__);
    lib->impl(q.substr(sep + 2).c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                             std::make_unique<AutogradGate>(differentiable)));
    return 0;
  } catch (const std::exception& e) {
    return Fail(e.what(), err, err_len);
  }
}

// Registers the ADInplaceOrView kernel of `qualname` ("ns::name"): VersionBump above.
// Returns 0, or 1 with a message in err.
int32_t xk_native_install_version_bump(const char* qualname, char* err, int64_t err_len) {
  try {
    std::string q(qualname);
    size_t sep = q.find("::");
    if (sep == std::string::npos) return Fail("qualname must be 'ns::name': " + q, err, err_len);
    auto* lib = new torch::Library(torch::Library::IMPL, q.substr(0, sep),
                                   c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    lib->impl(q.substr(sep + 2).c_str(),
              torch::CppFunction::makeFromBoxedFunctor(std::make_unique<VersionBump>()));
    return 0;
  } catch (const std::exception& e) {
    return Fail(e.what(), err, err_len);
  }
}

// Forgets the cached plans of `qualname`'s native kernels (all operators if NULL).
int32_t xk_native_clear(const char* qualname) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  if (g_kernels == nullptr) return 0;
  for (auto& [name, kernels] : *g_kernels) {
    if (qualname != nullptr && name != qualname) continue;
    for (Kernel* k : kernels) k->Clear();
  }
  return 0;
}

}  // extern "C"
