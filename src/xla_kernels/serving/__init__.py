"""A serving loop: a Llama-style decoder generating with a paged KV cache, from JAX and from
PyTorch (through torchax), on the library's own kernels.

One module per job:

* :mod:`.config`: presets (``tiny``, ``1b``, ``8b``), engine limits, workloads, option names.
* :mod:`.weights`: seeded random weights, one set for both frontends.
* :mod:`.backend`: what computes each role of the step, resolved once from the options.
* :mod:`.model_jax`, :mod:`.model_torch`: the decoder in JAX and as torch modules, and their
  runners (one jitted, cache-donating step per bucket).
* :mod:`.attention`: the switchable attention (``xla-kernels``, ``plain-xla``, dense).
* :mod:`.blocks`, :mod:`.batch`, :mod:`.engine`: block allocator, a step's inputs, the
  continuous-batching scheduler.
* :mod:`.reference`: the dense (unpaged) reference the engine must match token for token.
* :mod:`.options`, :mod:`.bench`, :mod:`.cli`: ``xla-kernels serve-bench`` (its options,
  the run, the command).

Design and step anatomy: ``docs/serving.md``.
"""
