"""fused_moe's workspaces: the Python twin of the formulas in ``moe_limits.h``.

Three scratch arrays travel with every call (the CPU kernel leaves them alone; the CUDA
kernels keep the routing, the sort, the activations and the per-pair outputs there):

* int32: top-k expert ids, the pairs sorted by expert, each pair's sorted row, the expert
  offsets and the tile table (``3 * pairs + experts + 1 + 2 * max_tiles + 1``);
* float32: the top-k routing weights (``pairs``);
* hidden's dtype: the activation rows ``[pairs, intermediate]`` and each pair's weighted
  output ``[pairs, hidden]``.

``pairs = tokens * top_k``. Each size is at least 1 (XLA allocates no empty operand) and
computed without comparisons, so that a symbolic token count (``xk.export``) goes through.

Example:
    >>> workspace_sizes(tokens=4, experts=8, top_k=2, intermediate=16, hidden=32)
    (52, 9, 385)
"""

from __future__ import annotations

from pathlib import Path

from xla_kernels.kernel_kit import read_constants

LIMITS_HEADER = Path(__file__).with_name("moe_limits.h")
LIMITS = read_constants(LIMITS_HEADER)
MAX_EXPERTS: int = LIMITS["kMaxExperts"]  # type: ignore[assignment]
MAX_TOP_K: int = LIMITS["kMaxTopK"]  # type: ignore[assignment]
MAX_PAIRS: int = LIMITS["kMaxPairs"]  # type: ignore[assignment]
MIN_TILE_ROWS: int = LIMITS["kMinTileRows"]  # type: ignore[assignment]


def max_tiles(pairs: int, experts: int) -> int:
    """Tiles of at most MIN_TILE_ROWS rows of one expert that ``pairs`` rows can need (at
    most one partial tile per expert)."""
    return -(-pairs // MIN_TILE_ROWS) + experts


def workspace_sizes(tokens: int, experts: int, top_k: int, intermediate: int,
                    hidden: int) -> tuple[int, int, int]:
    """Elements of the (int32, float32, hidden-dtype) workspaces of one call."""
    pairs = tokens * top_k
    i32 = 3 * pairs + experts + 1 + 2 * max_tiles(pairs, experts) + 1
    return i32, pairs + 1, pairs * (intermediate + hidden) + 1
