"""Figures for the course. matplotlib is imported only when a figure is drawn,
so ``import attnlib`` stays light."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_attention"]

#: Colour-blind-safe, perceptually uniform colormap used for every attention map.
ATTENTION_CMAP = "viridis"

#: Widest default figure, in inches: 500 px at 100 dpi. The book shows figures at
#: 100 CSS px per inch; a 390-px phone's 342 px column shrinks anything wider, and
#: at 5.0 in the book style's 12 pt text still shows at 11 CSS px there.
MAX_FIGURE_WIDTH = 5.0

#: Font size, in points, of the weights written in the cells: the book style's
#: smallest size (``tests/test_figure_style.py`` checks nothing is smaller).
ANNOTATION_FONTSIZE = 12


def plot_attention(
    attn_weights: torch.Tensor,
    tokens: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    *,
    annotate: bool | None = None,
    vmax: float | None = None,
) -> Axes:
    """Heatmap of an attention-weight matrix: rows are queries, columns keys.

    Args:
        attn_weights: ``(num_tokens_q, num_tokens_kv)`` tensor (or anything
            ``torch.as_tensor`` accepts). A leading dimension of size 1 is
            squeezed; anything else with more than 2 dimensions is an error:
            plot one head or one batch element at a time.
        tokens: labels for the axes. Length ``num_tokens_kv`` labels the
            columns (keys); it also labels the rows when the matrix is square.
        ax: a matplotlib ``Axes`` to draw on; when None a new figure is made,
            sized to the matrix but at most 5.0 in wide (legible on a phone).
        title: the axes' title.
        annotate: write each weight in its cell (12 pt); default on for
            matrices of at most 10 x 10.
        vmax: the weight drawn in the brightest colour (the colour scale starts
            at 0); default the largest weight. Give several maps one ``vmax``
            to compare them on one scale.

    Returns:
        The matplotlib ``Axes`` drawn on.

    Raises:
        TypeError: ``attn_weights`` is not numeric.
        ValueError: ``attn_weights`` is not 2-dimensional after squeezing, or
            ``tokens`` has the wrong length, or ``vmax`` is not positive.
    """
    weights = torch.as_tensor(attn_weights).detach()
    if not (weights.is_floating_point() or weights.dtype == torch.bool):
        raise TypeError(f"attn_weights must be numeric floating point, got {weights.dtype}")
    while weights.ndim > 2 and weights.shape[0] == 1:
        weights = weights[0]
    if weights.ndim != 2:
        raise ValueError(
            "attn_weights must be (num_tokens_q, num_tokens_kv), got shape "
            f"{tuple(torch.as_tensor(attn_weights).shape)}"
        )
    n_q, n_kv = weights.shape
    if tokens is not None:
        tokens = list(tokens)
        if len(tokens) != n_kv:
            raise ValueError(f"tokens has {len(tokens)} labels but attn_weights has {n_kv} columns")
    weights = weights.float().cpu()
    if vmax is not None and not vmax > 0:
        raise ValueError(f"vmax must be positive, got {vmax}")
    if annotate is None:
        annotate = n_q <= 10 and n_kv <= 10

    import matplotlib.pyplot as plt

    if ax is None:
        width, height = 1.0 + 0.7 * n_kv, 0.8 + 0.6 * n_q
        if width > MAX_FIGURE_WIDTH:  # keep the cells' aspect, shrink both sides
            width, height = MAX_FIGURE_WIDTH, height * MAX_FIGURE_WIDTH / width
        # constrained layout keeps the labels inside the figure's width
        _, ax = plt.subplots(figsize=(width, height), layout="constrained")
    image = ax.imshow(weights.numpy(), cmap=ATTENTION_CMAP, vmin=0.0, vmax=vmax, aspect="auto")
    ax.figure.colorbar(image, ax=ax, label="attention weight")
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_xticks(range(n_kv))
    ax.set_yticks(range(n_q))
    if tokens is not None:
        ax.set_xticklabels(tokens, rotation=45, ha="right")
        if n_q == n_kv:
            ax.set_yticklabels(tokens)
    if annotate:
        top = vmax if vmax is not None else float(weights.max()) if weights.numel() else 0.0
        threshold = 0.6 * top
        for i in range(n_q):
            for j in range(n_kv):
                value = float(weights[i, j])
                ax.text(j, i, f"{value:.2f}", ha="center", va="center",
                        fontsize=ANNOTATION_FONTSIZE,
                        color="black" if value > threshold else "white")
    if title is not None:
        ax.set_title(title)
    return ax
