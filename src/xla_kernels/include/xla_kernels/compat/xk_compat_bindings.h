// Compile-only stand-ins for the parts of nanobind and pybind11 that registration blocks use.
//
// xla-kernels searches this folder last (-idirafter, after the system's include dirs), so a
// kernel source that carries an NB_MODULE or PYBIND11_MODULE block builds unchanged when the
// real headers are not on the include path. The block becomes an unused static function: it
// is type-checked but never runs, and the library is not a Python module. xla-kernels
// registers the handlers itself, through xk.Op. Real nanobind/pybind11 headers anywhere on
// the include path win over these.
//
// Covered: module_ (def, attr, doc, def_submodule, import_), object/handle, dict, list,
// tuple, set, str, int_, float_, bool_, bytes, capsule, none, args, kwargs, callable,
// iterable, sequence, arg (with defaults and "x"_a), cast, borrow/steal, make_tuple, len,
// isinstance, print, rv_policy / return_value_policy, gil_scoped_acquire/release.
// Not covered: bound classes (class_, init, enum_), ndarray/array_t, exceptions
// translation, and the Python C API. XLA_KERNELS_COMPAT_BINDINGS is defined here, so a
// source can test for the stand-ins with #ifdef.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <type_traits>
#include <utility>

#define XLA_KERNELS_COMPAT_BINDINGS 1

namespace xla_kernels::compat {

class object;

namespace detail {
// True unless the pack is one object (or derived) argument: then the copy/move
// constructors apply, not the catch-all one.
template <typename... A>
inline constexpr bool kNotOneObject = true;
template <typename A>
inline constexpr bool kNotOneObject<A> = !std::is_base_of_v<object, std::decay_t<A>>;
}  // namespace detail

// Stands for any Python object. Every operation type-checks and none may run: the code
// that uses it lives in a module function that is never called.
class object {
 public:
  object() = default;
  template <typename... A, typename = std::enable_if_t<detail::kNotOneObject<A...>>>
  object(A&&...) {}  // NOLINT: implicit, like a value converted to a Python object

  template <typename T>
  object& operator=(T&&) {
    return *this;
  }
  template <typename K>
  object operator[](K&&) const {
    return {};
  }
  template <typename... A>
  object operator()(A&&...) const {
    return {};
  }
  object attr(const char*) const { return {}; }
  template <typename T>
  T cast() const {
    std::abort();
  }
  explicit operator bool() const { return false; }
  bool is_none() const { return true; }
  bool is_valid() const { return false; }
  void* ptr() const { return nullptr; }
  object* begin() const { return nullptr; }
  object* end() const { return nullptr; }
};

using handle = object;

#define XLA_KERNELS_COMPAT_TYPE(name) \
  class name : public object {        \
   public:                            \
    using object::object;             \
    name() = default;                 \
  }

XLA_KERNELS_COMPAT_TYPE(dict);
XLA_KERNELS_COMPAT_TYPE(tuple);
XLA_KERNELS_COMPAT_TYPE(set);
XLA_KERNELS_COMPAT_TYPE(str);
XLA_KERNELS_COMPAT_TYPE(int_);
XLA_KERNELS_COMPAT_TYPE(float_);
XLA_KERNELS_COMPAT_TYPE(bool_);
XLA_KERNELS_COMPAT_TYPE(bytes);
XLA_KERNELS_COMPAT_TYPE(none);
XLA_KERNELS_COMPAT_TYPE(args);
XLA_KERNELS_COMPAT_TYPE(kwargs);
XLA_KERNELS_COMPAT_TYPE(callable);
XLA_KERNELS_COMPAT_TYPE(iterable);
XLA_KERNELS_COMPAT_TYPE(sequence);
#undef XLA_KERNELS_COMPAT_TYPE

class list : public object {
 public:
  using object::object;
  list() = default;
  template <typename T>
  void append(T&&) const {}
};

// nb::capsule(ptr), nb::capsule(ptr, "name"), nb::capsule(ptr, cleanup), ...
class capsule : public object {
 public:
  using object::object;
  capsule() = default;
  void* data() const { return nullptr; }
  const char* name() const { return nullptr; }
};

class module_ : public object {
 public:
  using object::object;
  module_() = default;
  template <typename F, typename... Extra>
  module_& def(const char*, F&&, Extra&&...) {
    return *this;
  }
  module_ def_submodule(const char*, const char* = nullptr) { return {}; }
  object doc() const { return {}; }
  static module_ import_(const char*) { return {}; }
};
using module = module_;

class arg_v;
class arg {
 public:
  explicit constexpr arg(const char*) {}
  template <typename T>
  arg_v operator=(T&&) const;
  arg& noconvert(bool = true) { return *this; }
  arg& none(bool = true) { return *this; }
};
class arg_v : public arg {
 public:
  using arg::arg;
};
template <typename T>
arg_v arg::operator=(T&&) const {
  return arg_v(nullptr);
}

namespace literals {
inline arg operator""_a(const char*, std::size_t) { return arg(nullptr); }
}  // namespace literals

enum class rv_policy {
  automatic,
  automatic_reference,
  take_ownership,
  copy,
  move,
  reference,
  reference_internal,
  none
};
using return_value_policy = rv_policy;

// User-provided constructor and destructor, as the real guards have: no unused warnings.
struct gil_scoped_acquire {
  gil_scoped_acquire() {}
  ~gil_scoped_acquire() {}
};
struct gil_scoped_release {
  gil_scoped_release() {}
  ~gil_scoped_release() {}
};

// nb::cast(value) -> object; nb::cast<T>(handle) -> T.
template <typename T = void, typename A>
std::conditional_t<std::is_void_v<T>, object, T> cast(A&&) {
  if constexpr (std::is_void_v<T>) {
    return object();
  } else {
    std::abort();
  }
}
template <typename T = object, typename A>
T borrow(A&&) {
  return T();
}
template <typename T = object, typename A>
T steal(A&&) {
  return T();
}
template <typename T, typename A>
T reinterpret_borrow(A&&) {
  return T();
}
template <typename T, typename A>
T reinterpret_steal(A&&) {
  return T();
}
template <typename... A>
tuple make_tuple(A&&...) {
  return {};
}
template <typename A>
std::size_t len(A&&) {
  return 0;
}
template <typename T, typename A>
bool isinstance(A&&) {
  return false;
}
template <typename... A>
void print(A&&...) {}

}  // namespace xla_kernels::compat
