"""The ops xla-kernels ships, each in its own folder: declaration, kernels, reference."""
