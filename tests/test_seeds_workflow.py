"""The seeds' workflow (examples/seeds_workflow.py), step by step, on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from xla_kernels.bench import load_script

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "seeds_workflow.py"


@pytest.fixture(scope="module")
def seeds():
    if "seeds_workflow" in sys.modules:
        return sys.modules["seeds_workflow"]
    return load_script(EXAMPLE)


def test_the_user_op_is_an_ordinary_torch_custom_op(seeds):
    out = torch.ops.my_ops.add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0]))
    assert out.tolist() == [5.0, 7.0, 9.0]
    torch.library.opcheck(seeds.add, (torch.ones(3), torch.ones(3)))


def test_its_xla_implementation_is_the_declared_op(seeds):
    assert seeds.my_add.target == "my_ops.add"
    assert seeds.my_add.kernels["cpu"].handler == "XlaKernelsSimpleAddCpu"


def test_on_torchax_tensors_it_gives_5_7_9_eagerly_and_under_jax_jit(seeds):
    eager, jitted = seeds.run()
    assert eager == [5.0, 7.0, 9.0]
    assert jitted == [5.0, 7.0, 9.0]


def test_it_lowers_to_the_custom_call_in_the_jitted_hlo(seeds):
    from torchax import interop

    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    text = hlo_text(interop.jax_view(lambda x, y: torch.ops.my_ops.add(x, y)),
                    torch.ones(3).numpy(), torch.ones(3).numpy())
    assert_single_custom_call(text, "my_ops.add")


def test_the_xla_dump_has_the_custom_call(seeds, tmp_path):
    found = seeds.dumped_custom_calls(tmp_path)
    assert found, f"no custom-call to my_ops.add in {sorted(p.name for p in tmp_path.iterdir())}"
    optimized = {name: calls for name, calls in found.items() if "after_optimizations" in name}
    assert optimized, f"only unoptimized dumps have it: {sorted(found)}"
    for calls in optimized.values():
        assert len(calls) == 1
        assert calls[0].api_version == "API_VERSION_TYPED_FFI"
        assert 'custom_call_target="my_ops.add"' in calls[0].line
