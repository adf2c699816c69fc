"""One declaration, a first-class PyTorch operator: eager, fake tensors, torch.compile.

``torch_op(simple_add)`` defines ``torch.ops.xla_kernels.simple_add``; its schema, its
fake (meta) kernel and its eager CPU/CUDA kernels all come from the op's declaration.
Eager calls run the op's XLA FFI handler directly on the tensors' memory (on CUDA, on
PyTorch's current stream).

Run: python examples/torch_ops.py
"""

from __future__ import annotations

import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xla_kernels as xk
from xla_kernels.frontends.torch import call, torch_op
from xla_kernels.kernels.simple_add import simple_add


def main() -> None:
    add = torch_op(simple_add)                       # torch.ops.xla_kernels.simple_add
    print(add.default._schema)        # xla_kernels::simple_add(Tensor a, Tensor b) -> Tensor

    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])
    print("eager cpu:", add(a, b))                   # tensor([5., 7., 9.])
    print("bf16:", call(simple_add, a.bfloat16(), b.bfloat16()))
    if torch.cuda.is_available():
        print("eager cuda:", add(a.cuda(), b.cuda()))

    with FakeTensorMode():                           # shapes from the declaration
        h = torch.empty(2, 8, dtype=torch.half)
        print("fake:", add(h, h))                    # FakeTensor(..., size=(2, 8), ...)

    compiled = torch.compile(lambda x, y: add(x, y) * 2, fullgraph=True, backend="aot_eager")
    print("torch.compile:", compiled(a, b))          # tensor([10., 14., 18.])

    try:
        add(a, torch.ones(4))
    except xk.OpInputError as e:
        print("error:", e)  # ...: argument 'b': shape (4,) differs from a's shape (3,). Fix: ...

    x, y = torch.randn(16), torch.randn(16)
    for _ in range(1000):
        add(x, y)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        add(x, y)
    print(f"per call (f32[16], cpu): {(time.perf_counter() - t0) / n * 1e6:.1f} us")


if __name__ == "__main__":
    main()
