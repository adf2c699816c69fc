"""The eager runtime calls typed XLA FFI handlers without XLA (CPU only here).

The handlers live in tests/fixtures/eager/handlers.cc; the same symbols also run through
XLA via jax.ffi.ffi_call, to show that eager and XLA run the very same function.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from xla_kernels import dtypes
from xla_kernels.errors import OpInputError, OpTypeError, XlaKernelsError
from xla_kernels.runtime import eager
from xla_kernels.runtime.eager import Buffer, DeviceAllocator, KernelError, call_handler

FIXTURE = Path(__file__).parent / "fixtures" / "eager" / "handlers.cc"


@pytest.fixture(scope="session")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not installed")
    import jax.ffi

    out = tmp_path_factory.mktemp("eager") / "libxk_eager_handlers.so"
    cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w", f"-I{jax.ffi.include_dir()}",
           str(FIXTURE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return ctypes.CDLL(str(out))


def fn(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def buf(array) -> Buffer:
    return Buffer.from_array(array)


ATTRS = {
    "i64": np.int64(-1234567890123),
    "i32": np.int32(-7),
    "f32": np.float32(2.5),
    "f64": np.float64(1e-300),
    "flag": np.bool_(True),
    "name": "héllo wörld",
    "ints": np.array([1, -2, 3_000_000_000_000], dtype=np.int64),
    "floats": np.array([0.5, -1.25, 3.0], dtype=np.float32),
    "blob": np.frombuffer(b"\x00\xffab\x7f", dtype=np.uint8).copy(),
}


def expected_summary(attrs: dict, size: int = 64) -> np.ndarray:
    """What xk_test_attrs writes into its summary output (see handlers.cc)."""
    name = attrs["name"].encode()
    values = [float(attrs["i64"]), float(attrs["i32"]), float(attrs["f32"]),
              float(attrs["f64"]), float(attrs["flag"]), float(len(name)), *map(float, name),
              float(len(attrs["ints"])), *map(float, attrs["ints"]),
              float(len(attrs["floats"])), *map(float, attrs["floats"]),
              float(len(attrs["blob"])), *map(float, attrs["blob"])]
    return np.array(values + [-1.0] * (size - len(values)))


def run_attrs(lib, attrs: dict, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(x.shape, np.nan, np.float32)
    summary = np.full(64, np.nan)
    call_handler(fn(lib, "xk_test_attrs"), args=[buf(x), buf(y)], rets=[buf(out), buf(summary)],
                 attrs=attrs, op_name="attrs_op")
    return out, summary


# --------------------------------------------------------------------------- attributes


def test_attributes_arrive_intact_and_outputs_are_written(lib):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 0.25, np.float32)
    out, summary = run_attrs(lib, ATTRS, x, y)
    np.testing.assert_array_equal(out, x * np.float32(2.5) + y)
    np.testing.assert_array_equal(summary, expected_summary(ATTRS))


@pytest.mark.parametrize("order", ["reversed", "sorted", "shuffled"])
def test_attribute_order_does_not_matter(lib, order):
    keys = list(ATTRS)
    if order == "reversed":
        keys.reverse()
    elif order == "sorted":
        keys.sort()
    else:
        random.Random(0).shuffle(keys)
    x = np.ones(4, np.float32)
    out, summary = run_attrs(lib, {k: ATTRS[k] for k in keys}, x, x)
    np.testing.assert_array_equal(out, np.full(4, 3.5, np.float32))
    np.testing.assert_array_equal(summary, expected_summary(ATTRS))


def test_empty_string_and_arrays(lib):
    attrs = {**ATTRS, "name": "", "ints": np.array([], np.int64),
             "floats": np.array([], np.float32), "blob": np.array([], np.uint8)}
    x = np.ones(3, np.float32)
    _, summary = run_attrs(lib, attrs, x, x)
    np.testing.assert_array_equal(summary, expected_summary(attrs))


def test_attrs_from_attr_coerce(lib):
    """Values exactly as xla_kernels.Attr.coerce returns them are accepted."""
    from xla_kernels.attrs import Attr

    decl = {"i64": int, "i32": np.int32, "f32": float, "f64": np.float64, "flag": bool,
            "name": str, "ints": list[int], "floats": list[float], "blob": bytes}
    raw = {"i64": 5, "i32": 6, "f32": 0.5, "f64": 0.1, "flag": False, "name": "n",
           "ints": [1, 2], "floats": [1.5], "blob": b"\x01\x02"}
    attrs = {k: Attr(k, t).coerce(raw[k], op="t") for k, t in decl.items()}
    x = np.ones(2, np.float32)
    _, summary = run_attrs(lib, attrs, x, x)
    np.testing.assert_array_equal(summary, expected_summary(attrs))


def test_many_arguments_and_attributes(lib):
    """Past the runtime's inline capacity (16 buffers, 32 attributes): heap path, sorting."""
    args = [np.array([i, 0], np.int64) for i in range(40)]
    attrs = {f"a{i:02d}_{'x' * (i % 5)}": np.int64(i) for i in reversed(range(40))}
    out = np.full(5, -99, np.int64)
    call_handler(fn(lib, "xk_test_many"), args=[buf(a) for a in args], rets=[buf(out)],
                 attrs=attrs)
    assert out.tolist() == [40, 40, sum(range(40)), 1, sum(range(40))]
    few = {"b": np.int64(2), "c": np.int64(3), "a": np.int64(1)}
    call_handler(fn(lib, "xk_test_many"), args=[], rets=[buf(out)], attrs=few)
    assert out.tolist() == [0, 3, 6, 1, 0]


# --------------------------------------------------------------------------- buffers


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64", "i8", "u64", "bool", "c64"])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4), (1, 2, 1, 3, 1)])
def test_buffer_rank_dims_and_dtype(lib, dtype, shape):
    x = np.zeros(shape, dtypes.to_numpy(dtype))
    out = np.full(16, -99, np.int64)
    call_handler(fn(lib, "xk_test_shape"), args=[buf(x)], rets=[buf(out)], attrs={})
    want = [dtypes.ffi_code(dtype), len(shape), *shape, x.nbytes]
    assert out.tolist() == want + [-1] * (16 - len(want))


def test_buffer_from_array():
    x = np.zeros((2, 3), ml_dtypes.bfloat16)
    assert Buffer.from_array(x) == Buffer(x.ctypes.data, "bf16", (2, 3))
    with pytest.raises(OpInputError, match="not C-contiguous"):
        Buffer.from_array(np.zeros((4, 4), np.float32)[:, ::2])
    with pytest.raises(OpTypeError, match="expected a NumPy array or torch tensor"):
        Buffer.from_array([1.0, 2.0])


def test_torch_cpu_tensors_zero_copy(lib):
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.ones(2, 3)
    out = torch.full((2, 3), float("nan"))
    summary = torch.full((64,), float("nan"), dtype=torch.float64)
    call_handler(fn(lib, "xk_test_attrs"), args=[buf(x), buf(y)],
                 rets=[buf(out), buf(summary)], attrs=ATTRS, op_name="torch_op")
    torch.testing.assert_close(out, x * 2.5 + y)
    np.testing.assert_array_equal(summary.numpy(), expected_summary(ATTRS))
    h = torch.zeros(3, 5, dtype=torch.bfloat16)
    shape_out = torch.full((16,), -99, dtype=torch.int64)
    call_handler(fn(lib, "xk_test_shape"), args=[buf(h)], rets=[buf(shape_out)], attrs={})
    assert shape_out[:5].tolist() == [dtypes.ffi_code("bf16"), 2, 3, 5, 30]


# --------------------------------------------------------------------------- errors


def test_handler_error_propagates_with_op_name(lib):
    x = np.zeros(2, np.float32)
    with pytest.raises(KernelError) as info:
        call_handler(fn(lib, "xk_test_fail"), args=[buf(x)], rets=[buf(x)],
                     attrs={"code": np.int64(42)}, op_name="my_op")
    e = info.value
    assert str(e) == "my_op: kernel failed: bad things happened: code 42"
    assert isinstance(e, XlaKernelsError) and isinstance(e, RuntimeError)
    assert (e.op, e.code, e.code_name) == ("my_op", 3, "INVALID_ARGUMENT")
    assert e.handler_message == "bad things happened: code 42"


def test_cpp_exception_becomes_kernel_error(lib):
    x = np.zeros(2, np.float32)
    with pytest.raises(KernelError, match=r"^thrower: kernel failed: XLA FFI call failed: "
                                          r"kernel threw$") as info:
        call_handler(fn(lib, "xk_test_throw"), args=[buf(x)], rets=[buf(x)], attrs={},
                     op_name="thrower")
    assert info.value.code_name == "UNKNOWN"


@pytest.mark.parametrize("change, message", [
    (lambda a: a.pop("blob"), "Wrong number of attributes: expected 9 but got 8"),
    (lambda a: a.update(i64=np.int32(1)), "Wrong scalar data type"),
    (lambda a: a.update(ints=np.array([1], np.int32)), "Wrong array data type"),
    (lambda a: a.update(name=np.int64(1)), "Wrong attribute type"),
    (lambda a: a.update(bogus=np.int64(1)), "Wrong number of attributes"),
])
def test_decoding_errors_are_reported(lib, change, message):
    attrs = dict(ATTRS)
    change(attrs)
    x = np.ones(2, np.float32)
    with pytest.raises(KernelError, match=message):
        run_attrs(lib, attrs, x, x)


def test_wrong_buffers_are_reported(lib):
    x, x64 = np.ones(2, np.float32), np.ones(2, np.float64)
    out, summary = np.empty(2, np.float32), np.empty(64)
    f = fn(lib, "xk_test_attrs")
    with pytest.raises(KernelError, match="Wrong buffer dtype: expected F32 but got F64"):
        call_handler(f, args=[buf(x64), buf(x)], rets=[buf(out), buf(summary)], attrs=ATTRS)
    with pytest.raises(KernelError, match="Wrong number of arguments: expected 2 but got 1"):
        call_handler(f, args=[buf(x)], rets=[buf(out), buf(summary)], attrs=ATTRS)
    with pytest.raises(KernelError, match="y must be f32"):  # the handler's own check
        call_handler(f, args=[buf(x), buf(x64)], rets=[buf(out), buf(summary)], attrs=ATTRS)


def test_malformed_python_inputs(lib):
    f, x = fn(lib, "xk_test_fail"), buf(np.zeros(1, np.float32))
    call = dict(args=[x], rets=[x], op_name="op")
    with pytest.raises(OpTypeError, match="expected a NumPy scalar"):
        call_handler(f, attrs={"code": 3}, **call)
    with pytest.raises(OpTypeError, match="1-D"):
        call_handler(f, attrs={"code": np.zeros((2, 2), np.int64)}, **call)
    with pytest.raises(OpTypeError, match="1-D"):
        call_handler(f, attrs={"code": np.zeros(2, ml_dtypes.bfloat16)}, **call)
    with pytest.raises(OpTypeError, match="non-empty str"):
        call_handler(f, attrs={"": np.int64(1)}, **call)
    with pytest.raises(OpTypeError, match=r"eager\.Buffer"):
        call_handler(f, args=[np.zeros(1)], rets=[x], attrs={"code": np.int64(1)})
    with pytest.raises(OpTypeError, match="unknown dtype"):
        call_handler(f, args=[Buffer(x.ptr, "f128", (1,))], rets=[x],
                     attrs={"code": np.int64(1)})
    with pytest.raises(OpInputError, match="negative dimension"):
        call_handler(f, args=[Buffer(x.ptr, "f32", (-1,))], rets=[x],
                     attrs={"code": np.int64(1)})
    with pytest.raises(OpInputError, match="null address"):
        call_handler(f, args=[Buffer(0, "f32", (2,))], rets=[x], attrs={"code": np.int64(1)})
    with pytest.raises(OpInputError, match="unknown platform"):
        call_handler(f, attrs={"code": np.int64(1)}, platform="tpu", **call)
    with pytest.raises(OpInputError, match="CPU call takes no stream"):
        call_handler(f, attrs={"code": np.int64(1)}, stream=1234, **call)
    with pytest.raises(OpInputError, match="null"):
        call_handler(0, attrs={"code": np.int64(1)}, **call)
    with pytest.raises(OpTypeError, match="function address"):
        call_handler("xk_test_fail", attrs={"code": np.int64(1)}, **call)


def test_aliases_and_ctypes_function_accepted(lib):
    x = np.zeros((2, 2), np.float16)
    out = np.full(16, -99, np.int64)
    call_handler(lib.xk_test_shape, args=[Buffer(x.ctypes.data, "float16", (2, 2))],
                 rets=[buf(out)], attrs={})
    assert out[:4].tolist() == [dtypes.ffi_code("f16"), 2, 2, 2]


# --------------------------------------------------------------------------- context


def test_cpu_context_stream_ordinal_threadpool_scratch(lib):
    out = np.full(6, -99, np.int64)
    call_handler(fn(lib, "xk_test_context"), args=[], rets=[buf(out)],
                 attrs={"scratch_bytes": np.int64(1000)}, device_ordinal=3)
    # stream, ordinal, run id, threads, tasks run inline, scratch 64-byte aligned
    assert out.tolist() == [0, 3, 0, 0, 3, 1]


def test_unavailable_services_fail_cleanly(lib):
    f = fn(lib, "xk_test_probe")
    out = np.full(8, -99, np.int64)
    call_handler(f, args=[], rets=[buf(out)], attrs={"message_of": np.int64(-1)})
    # context/state/type/handler/future unavailable, bad alignment rejected, CPU scratch ok
    assert out.tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
    for index, message in [(0, "not available in eager mode"), (1, "not available in eager"),
                           (3, "cannot register FFI types"), (5, "asynchronous handlers"),
                           (6, "Unsupported alignment: 3")]:
        with pytest.raises(KernelError, match=message):
            call_handler(f, args=[], rets=[buf(out)], attrs={"message_of": np.int64(index)})


def test_async_handlers_are_rejected(lib):
    x = np.zeros(1, np.float32)
    with pytest.raises(KernelError, match=r"asynchronous handlers .* not supported in eager"):
        call_handler(fn(lib, "xk_test_async"), args=[buf(x)], rets=[buf(x)], attrs={})


class HostBackedAllocator:
    """A DeviceAllocator stand-in that hands out host memory and records calls."""

    def __init__(self):
        self.live: dict[int, np.ndarray] = {}
        self.calls: list[tuple] = []
        self.allocator = DeviceAllocator(self.alloc, self.free)

    def alloc(self, size, alignment, device, stream):
        self.calls.append(("alloc", size, alignment, device, stream))
        mem = np.zeros(size + alignment, np.uint8)
        ptr = mem.ctypes.data + (-mem.ctypes.data % alignment)
        self.live[ptr] = mem
        return ptr

    def free(self, ptr, size, device, stream):
        self.calls.append(("free", size, device, stream))
        del self.live[ptr]


def test_cuda_platform_plumbing_with_python_allocator(lib):
    """Stream, ordinal and scratch travel as on CUDA (host memory stands in for device)."""
    host = HostBackedAllocator()
    out = np.full(6, -99, np.int64)
    call_handler(fn(lib, "xk_test_context"), args=[], rets=[buf(out)],
                 attrs={"scratch_bytes": np.int64(256)}, platform="cuda", stream=0x1234,
                 device_ordinal=1, allocator=host.allocator)
    assert out.tolist() == [0x1234, 1, 0, 0, 3, 1]
    assert host.calls == [("alloc", 256, 64, 1, 0x1234), ("free", 256, 1, 0x1234)]
    assert host.live == {}


def test_cuda_scratch_without_allocator_is_an_error(lib):
    out = np.full(8, -99, np.int64)
    f = fn(lib, "xk_test_probe")
    with pytest.raises(KernelError, match="without an allocator"):
        call_handler(f, args=[], rets=[buf(out)], attrs={"message_of": np.int64(7)},
                     platform="cuda")
    with pytest.raises(KernelError, match="scratch allocation failed"):
        call_handler(fn(lib, "xk_test_context"), args=[], rets=[buf(out[:6])],
                     attrs={"scratch_bytes": np.int64(16)}, platform="cuda")


def test_allocator_exception_is_the_cause(lib):
    def alloc(size, alignment, device, stream):
        raise MemoryError("pool exhausted")

    out = np.full(8, -99, np.int64)
    with pytest.raises(KernelError, match="failed to allocate 16 bytes") as info:
        call_handler(fn(lib, "xk_test_probe"), args=[], rets=[buf(out)],
                     attrs={"message_of": np.int64(7)}, platform="cuda",
                     allocator=DeviceAllocator(alloc, lambda *a: None))
    assert isinstance(info.value.__cause__, MemoryError)


def test_nested_call_from_allocator_callback(lib):
    """A call made while another is in flight on the same thread must not clobber it."""
    x = np.ones(3, np.float32)
    host = HostBackedAllocator()
    inner = []

    def alloc(size, alignment, device, stream):
        inner.append(run_attrs(lib, ATTRS, x, x))
        return host.alloc(size, alignment, device, stream)

    out = np.full(6, -99, np.int64)
    call_handler(fn(lib, "xk_test_context"), args=[], rets=[buf(out)],
                 attrs={"scratch_bytes": np.int64(64)}, platform="cuda", stream=7,
                 device_ordinal=2, allocator=DeviceAllocator(alloc, host.free))
    assert out.tolist() == [7, 2, 0, 0, 3, 1]
    np.testing.assert_array_equal(inner[0][1], expected_summary(ATTRS))


def test_concurrent_calls_from_threads(lib):
    def one(i: int) -> bool:
        x = np.full(8, i, np.float32)
        out, summary = run_attrs(lib, {**ATTRS, "i64": np.int64(i)}, x, x)
        return bool(np.all(out == x * 2.5 + x)) and summary[0] == i

    barrier = threading.Barrier(4)

    def many(t: int) -> bool:
        barrier.wait()
        return all(one(t * 1000 + i) for i in range(200))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(many, range(4)))


# --------------------------------------------------------------------------- metadata, API


def test_handler_metadata(lib):
    version = eager.ffi_api_version()
    shape = eager.handler_metadata(fn(lib, "xk_test_shape"))
    attrs = eager.handler_metadata(lib.xk_test_attrs)
    assert shape.api_version == attrs.api_version == version
    assert shape.command_buffer_compatible and not attrs.command_buffer_compatible
    assert shape.state_type_id == attrs.state_type_id == 0


def test_handler_built_for_newer_api_is_refused(lib):
    from xla_kernels.errors import RegistrationError

    major, minor = eager.ffi_api_version()
    x = buf(np.zeros(1, np.float32))
    with pytest.raises(RegistrationError, match=rf"newer_op: the handler was built against "
                                                rf"XLA FFI API {major}\.{minor + 1}"):
        call_handler(lib.xk_test_newer_api, args=[x], rets=[x], attrs={}, op_name="newer_op")


def test_api_table_is_complete():
    import jax.ffi

    header = Path(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h").read_text()
    eager.ffi_api_version()  # loads the library
    api = eager._lib.xk_eager_api()
    size = ctypes.c_size_t.from_address(api).value
    major, minor = (ctypes.c_int.from_address(api + 32 + 4 * i).value for i in range(2))
    assert (major, minor) == eager.ffi_api_version()
    assert f"#define XLA_FFI_API_MAJOR {major}" in header
    assert f"#define XLA_FFI_API_MINOR {minor}" in header
    # struct_size, extension_start, api_version (24 bytes), internal_api, then functions.
    functions = [ctypes.c_void_p.from_address(api + off).value for off in range(48, size, 8)]
    assert len(functions) == header.count("_XLA_FFI_API_STRUCT_FIELD(XLA_FFI_")
    assert all(functions)


# --------------------------------------------------------------------------- same as XLA


def test_same_handler_runs_through_xla(lib):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    jax.ffi.register_ffi_target("xk_test_eager_attrs", jax.ffi.pycapsule(lib.xk_test_attrs),
                                platform="cpu")
    jax.ffi.register_ffi_target("xk_test_eager_shape", jax.ffi.pycapsule(lib.xk_test_shape),
                                platform="cpu")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    eager_out, eager_summary = run_attrs(lib, ATTRS, x, y)
    h = np.zeros((2, 3, 4), ml_dtypes.bfloat16)
    eager_shape = np.full(16, -99, np.int64)
    call_handler(fn(lib, "xk_test_shape"), args=[buf(h)], rets=[buf(eager_shape)], attrs={})

    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        out, summary = jax.ffi.ffi_call(
            "xk_test_eager_attrs",
            (jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float64)),
        )(x, y, **ATTRS)
        shape = jax.ffi.ffi_call("xk_test_eager_shape",
                                 jax.ShapeDtypeStruct((16,), jnp.int64))(h)
    np.testing.assert_array_equal(np.asarray(out), eager_out)
    np.testing.assert_array_equal(np.asarray(summary), eager_summary)
    np.testing.assert_array_equal(np.asarray(shape), eager_shape)


# --------------------------------------------------------------------------- CUDA (GPU only)


@pytest.mark.gpu
def test_cuda_handler_on_torch_stream_with_torch_scratch():
    """A CUDA handler runs eagerly on a torch stream, with scratch from torch's allocator,
    and gives what the same handler gives through XLA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU visible to torch")
    from xla_kernels.builder import build_library

    so = build_library("xk_eager_cuda_test", [FIXTURE.with_name("cuda_handlers.cu")],
                       platform="cuda")
    cuda_lib = ctypes.CDLL(str(so))
    f = fn(cuda_lib, "xk_test_cuda_axpy")

    x = torch.randn(100_003, device="cuda")
    y = torch.randn(100_003, device="cuda")
    out = torch.full_like(x, float("nan"))
    info = torch.full((2,), -1, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call_handler(f, args=[buf(x), buf(y)], rets=[buf(out), buf(info)],
                     attrs={"a": np.float32(3.0)}, platform="cuda", stream=stream.cuda_stream,
                     device_ordinal=x.device.index or 0, op_name="axpy",
                     allocator=DeviceAllocator.torch_cuda())
    stream.synchronize()
    torch.testing.assert_close(out, 3.0 * x + y)
    assert info.tolist() == [stream.cuda_stream, x.device.index or 0]

    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    jax.ffi.register_ffi_target("xk_test_eager_cuda_axpy",
                                jax.ffi.pycapsule(cuda_lib.xk_test_cuda_axpy), platform="CUDA")
    xj, yj = jax.device_put(x.cpu().numpy()), jax.device_put(y.cpu().numpy())
    with jax.enable_x64(True):
        out_j, _ = jax.ffi.ffi_call(
            "xk_test_eager_cuda_axpy",
            (jax.ShapeDtypeStruct(xj.shape, np.float32), jax.ShapeDtypeStruct((2,), np.int64)),
        )(xj, yj, a=np.float32(3.0))
    np.testing.assert_array_equal(np.asarray(out_j), out.cpu().numpy())
