"""The all-reduce of the GPUs of one host, fused with the residual add and RMSNorm (issue 53).

What is here runs on the CPU and specifies the GPU op; the op itself is not declared yet (its
CUDA kernel needs two GPUs to be tested). docs/design/allreduce.md is the design.

- ``protocol.h``: the workspace layout, the partition of a message into units, shares and
  blocks, and the epoch barrier, written once for the CPU simulation and the CUDA kernel.
- ``protocol_cpu.cc`` and :mod:`.simulation`: the protocol run by processes (or threads) on
  shared memory, one-shot and two-shot, with a timeout that names a lost rank.
- :mod:`.reference`: the float64 references.
"""
