"""Sharded inputs: under shard_map each device runs the custom-call on its shard; under
plain jit the partitioner keeps the call whole and the result is still right."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from xla_kernels.kernels.simple_add import simple_add
    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    mesh = Mesh(np.array(jax.devices()), ("x",))
    a = np.random.default_rng().standard_normal((8, 5)).astype(np.float32)
    b = np.random.default_rng().standard_normal((8, 5)).astype(np.float32)
    sharding = NamedSharding(mesh, P("x"))
    da, db = jax.device_put(a, sharding), jax.device_put(b, sharding)

    per_shard = jax.jit(jax.shard_map(simple_add, mesh=mesh, in_specs=(P("x"), P("x")),
                                      out_specs=P("x")))
    out = per_shard(da, db)
    assert np.array_equal(np.asarray(out), a + b)
    assert out.sharding.spec == P("x")
    call = assert_single_custom_call(hlo_text(per_shard, da, db), "xla_kernels.simple_add")
    assert call.result_shape.startswith("f32[2,5]"), call.line  # one shard per device

    whole = jax.jit(simple_add)(da, db)
    assert np.array_equal(np.asarray(whole), a + b)
    print("ok")
""")


def test_shard_map_runs_the_custom_call_per_shard_and_jit_stays_correct():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
