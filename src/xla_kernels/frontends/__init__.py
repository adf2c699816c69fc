"""Frontends: the same declared op as a JAX function, a torch op, torchax and torch_xla."""
