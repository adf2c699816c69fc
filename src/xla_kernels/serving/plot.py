"""Step time vs batch size and vs context length, as a plot file.

``.svg`` is written by hand (no dependency: it works wherever the benchmark runs); ``.png``
needs matplotlib. Two panels, one point per engine step, decode steps and steps with
prefill in two colours: step time (ms) against the sequences in the step, and against the
context tokens it attended (sum of ``kv_lens``).

Example:
    >>> import os, tempfile
    >>> steps = [{"num_seqs": 2, "context_tokens": 40, "ms": 1.5, "kind": "decode"},
    ...          {"num_seqs": 1, "context_tokens": 30, "ms": 3.0, "kind": "prefill"}]
    >>> path = os.path.join(tempfile.mkdtemp(), "steps.svg")
    >>> write_step_plot(steps, path, title="tiny")
    >>> open(path).read().startswith("<svg")
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xla_kernels.serving.config import ServingConfigError

COLOURS = {"decode": "#1f77b4", "prefill": "#d62728"}
PANELS = (("num_seqs", "sequences in the step (batch size)"),
          ("context_tokens", "context tokens attended (sum of kv_lens)"))


def write_step_plot(steps: Sequence[dict[str, Any]], path: str | Path, *, title: str) -> None:
    """Plot ``steps`` (dicts with num_seqs, context_tokens, ms, kind) to ``path``."""
    path = Path(path)
    check_plot_path(path)
    if path.suffix == ".png":
        _png(steps, path, title)
    else:
        path.write_text(_svg(steps, title))


def check_plot_path(path: str | Path) -> None:
    """Refuse a plot path :func:`write_step_plot` cannot write: checked before a run, so
    that a bad ``--plot`` does not fail after it.

    Example:
        >>> try:
        ...     check_plot_path("steps.pdf")
        ... except ServingConfigError as e:
        ...     print(e)                                  # doctest: +NORMALIZE_WHITESPACE
        --plot steps.pdf: unknown format '.pdf'. Fix: end the path in .svg (no dependency)
        or .png (needs matplotlib).
    """
    path = Path(path)
    if path.suffix not in (".png", ".svg"):
        raise ServingConfigError(f"--plot {path}: unknown format {path.suffix!r}. Fix: end "
                                 "the path in .svg (no dependency) or .png (needs matplotlib).")
    if path.is_dir():
        raise ServingConfigError(f"--plot {path}: is a directory. Fix: pass a file path "
                                 "ending in .svg or .png.")
    if path.suffix == ".png":
        _pyplot(path)


def _pyplot(path: Path) -> Any:
    """matplotlib's pyplot (headless), or the error naming ``--plot``'s fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ServingConfigError(f"--plot {path}: a .png needs matplotlib ({e}). Fix: pip "
                                 "install matplotlib, or pass a .svg path.") from e
    return plt


def _png(steps: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    plt = _pyplot(path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for kind, colour in COLOURS.items():
            pts = [s for s in steps if s["kind"] == kind]
            ax.scatter([s[key] for s in pts], [s["ms"] for s in pts], s=8, c=colour,
                       label=kind)
        ax.set_xlabel(label)
        ax.set_ylabel("step time (ms)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _svg(steps: Sequence[dict[str, Any]], title: str) -> str:
    width, height, pad = 480, 320, 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" '
             f'height="{height + 30}" font-family="sans-serif" font-size="11">',
             f'<text x="{width}" y="16" text-anchor="middle" font-size="13">'
             f'{_escape(title)}</text>']
    ys = [float(s["ms"]) for s in steps] or [1.0]
    y_max = max(ys) * 1.05 or 1.0
    for panel, (key, label) in enumerate(PANELS):
        x0 = panel * width
        xs = [float(s[key]) for s in steps] or [1.0]
        x_max = max(xs) * 1.05 or 1.0

        def px(x: float, y: float, x0: int = x0, x_max: float = x_max) -> tuple[float, float]:
            return (x0 + pad + x / x_max * (width - 2 * pad),
                    30 + (height - pad) - y / y_max * (height - pad - 10))

        (ax, ay), (bx, _) = px(0, 0), px(x_max, 0)
        _, ty = px(0, y_max)
        parts.append(f'<line x1="{ax}" y1="{ay}" x2="{bx}" y2="{ay}" stroke="black"/>')
        parts.append(f'<line x1="{ax}" y1="{ay}" x2="{ax}" y2="{ty}" stroke="black"/>')
        for frac in (0.0, 0.5, 1.0):
            tx, _ = px(frac * x_max / 1.05, 0)
            _, tyy = px(0, frac * y_max / 1.05)
            parts.append(f'<text x="{tx}" y="{ay + 14}" text-anchor="middle">'
                         f'{frac * x_max / 1.05:.0f}</text>')
            parts.append(f'<text x="{ax - 4}" y="{tyy + 4}" text-anchor="end">'
                         f'{frac * y_max / 1.05:.3g}</text>')
        parts.append(f'<text x="{x0 + width / 2}" y="{ay + 30}" text-anchor="middle">'
                     f'{_escape(label)}</text>')
        parts.append(f'<text x="{x0 + 12}" y="{30 + height / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 {x0 + 12} {30 + height / 2})">step time (ms)'
                     '</text>')
        for s in steps:
            cx, cy = px(float(s[key]), float(s["ms"]))
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" '
                         f'fill="{COLOURS.get(s["kind"], "gray")}" fill-opacity="0.7"/>')
        for i, (kind, colour) in enumerate(COLOURS.items()):
            parts.append(f'<text x="{x0 + width - pad}" y="{40 + 14 * i}" text-anchor="end" '
                         f'fill="{colour}">{kind}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["check_plot_path", "write_step_plot"]
