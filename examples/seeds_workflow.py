"""The seeds' workflow: a PyTorch user's custom op, run on torchax as one XLA custom-call.

1. A PyTorch user defines ``my_ops::add`` with ``torch.library.custom_op``, as usual.
2. Its XLA implementation is an ``xk.Op`` whose custom-call target is ``my_ops.add``; it
   reuses the CPU and CUDA kernels of xla-kernels' ``simple_add``.
3. ``register_torchax(op, torch_target=add)``: on torchax tensors ``my_ops::add`` now
   lowers to that custom-call, eagerly and under ``torchax.interop.jax_jit``.
4. ``[1, 2, 3] + [4, 5, 6]`` gives ``[5, 7, 9]``.
5. With ``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`` (set before JAX starts its
   backend, so in a fresh process) XLA's HLO dump shows the ``custom-call`` to
   ``my_ops.add``.

Run: python examples/seeds_workflow.py [--dump-to DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import xla_kernels as xk
from xla_kernels.frontends.torchax import import_torchax, register_torchax
from xla_kernels.hlo import CustomCall, custom_calls

TARGET = "my_ops.add"
SIMPLE_ADD_DIR = Path(xk.__file__).parent / "kernels" / "simple_add"


# 1. The PyTorch user's op (its own eager implementation, in torch).
@torch.library.custom_op("my_ops::add", mutates_args=())
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@add.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


# 2. Its XLA implementation: one declaration, simple_add's kernels.
def _same_shape_and_dtype(a: xk.Spec, b: xk.Spec) -> xk.Spec:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise xk.Invalid("b", f"{b.dtype}{list(b.shape)} differs from a's "
                              f"{a.dtype}{list(a.shape)}", "pass arrays of one shape and dtype")
    return xk.like(a)


my_add = xk.Op(
    TARGET,
    inputs=[xk.Tensor("a", dtypes=("f16", "bf16", "f32")),
            xk.Tensor("b", dtypes=("f16", "bf16", "f32"))],
    outputs=_same_shape_and_dtype,
    kernels={"cpu": xk.Kernel([str(SIMPLE_ADD_DIR / "simple_add_cpu.cc")],
                              handler="XlaKernelsSimpleAddCpu"),
             "cuda": xk.Kernel([str(SIMPLE_ADD_DIR / "simple_add.cu")],
                               handler="XlaKernelsSimpleAddCuda")},
    doc="my_ops::add as an XLA custom-call.",
)

# 3. On torchax tensors, my_ops::add becomes the custom-call.
register_torchax(my_add, torch_target=add)


def run() -> tuple[list[float], list[float]]:
    """4. Call my_ops::add on torchax tensors, eagerly and under jax_jit."""
    torchax = import_torchax()
    with torchax.default_env():
        a = torch.tensor([1.0, 2.0, 3.0], device="jax")
        b = torch.tensor([4.0, 5.0, 6.0], device="jax")
        eager = add(a, b)
        jitted = torchax.interop.jax_jit(lambda x, y: torch.ops.my_ops.add(x, y))(a, b)
        return eager.to("cpu").tolist(), jitted.to("cpu").tolist()


def dumped_custom_calls(dump_dir: Path) -> dict[str, list[CustomCall]]:
    """5. Run :func:`run` in a fresh process that dumps its HLO to ``dump_dir``; return the
    custom-calls to ``my_ops.add`` found in each dumped file (by file name)."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text")
    src = str(Path(xk.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, __file__, "--no-dump"], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the dumping process failed:\n{proc.stdout}\n{proc.stderr}")
    found = {}
    for path in sorted(dump_dir.glob("*.txt")):
        calls = [c for c in custom_calls(path.read_text()) if c.target == TARGET]
        if calls:
            found[path.name] = calls
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-to", type=Path, help="keep the HLO dump in this folder")
    parser.add_argument("--no-dump", action="store_true", help="only run the op")
    args = parser.parse_args()
    eager, jitted = run()
    print("eager torchax:", eager, " jax_jit:", jitted)           # [5.0, 7.0, 9.0] twice
    if args.no_dump:
        return
    with tempfile.TemporaryDirectory() as tmp:
        dump_dir = args.dump_to or Path(tmp)
        dump_dir.mkdir(parents=True, exist_ok=True)
        for name, calls in dumped_custom_calls(dump_dir).items():
            for call in calls:
                print(f"{name}: {call.line[:160]}")


if __name__ == "__main__":
    main()
