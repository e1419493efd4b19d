"""Figures for the course. matplotlib is imported only when a figure is drawn,
so ``import attnlib`` stays light."""

from __future__ import annotations

import base64
import html
import io
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ._validation import type_name

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["animate_attention_maps", "plot_attention"]

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


def _palette_frames(page: str) -> str:
    """``page`` with each embedded PNG frame reduced to 256 colours (Pillow's fast
    octree, alpha kept): about a quarter of the bytes, no visible change on a
    map drawn in one colormap."""
    from PIL import Image

    def shrink(match: re.Match[str]) -> str:
        # matplotlib's player splits the base64 text over lines
        data = base64.b64decode(re.sub(r"[^A-Za-z0-9+/=]", "", match.group(1)))
        with Image.open(io.BytesIO(data)) as frame:
            small = frame.quantize(256, method=Image.Quantize.FASTOCTREE)
            out = io.BytesIO()
            small.save(out, format="PNG", optimize=True, dpi=frame.info.get("dpi", (100, 100)))
        return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

    return re.sub(r'data:image/png;base64,([^"]+)', shrink, page)


def animate_attention_maps(
    maps: torch.Tensor,
    panel_titles: Sequence[str],
    headlines: Sequence[str],
    *,
    alt: str,
    split: int | None = None,
    fps: float = 5 / 3,
    still_frame: int = -1,
) -> str:
    """An offline HTML player of attention maps changing over frames (training steps).

    matplotlib's JavaScript player (the one ``FuncAnimation.to_jshtml`` makes): play,
    pause and step buttons and a slider, with every frame embedded in the page as a
    PNG, so it plays with no network and no server. Show it in a notebook with
    ``IPython.display.HTML(page)``. Unlike ``to_jshtml`` the frames keep a transparent
    background, as the book's figures do on the light and the dark page, are reduced
    to 256 colours (a quarter of the bytes), and the player links no outside style
    sheet (matplotlib's links Font Awesome from a CDN). A printed page, which
    cannot play, shows ``still_frame`` instead of the player (its own ``<img>``,
    shown by a ``@media print`` rule in the returned HTML).

    Each frame draws one map per panel, stacked in one column (legible on a phone),
    on one colour scale from 0 to 1 (:data:`ATTENTION_CMAP`), with the frame's
    headline above the maps.

    Args:
        maps: ``(num_frames, num_panels, num_tokens_q, num_tokens_kv)`` attention
            weights, floating point, every value in ``[0, 1]``; for example a head's
            weights at several training steps, one panel per layer or head.
        panel_titles: ``num_panels`` titles, one above each map.
        headlines: ``num_frames`` lines of text, one above the maps of each frame
            (say, the training step and the accuracy at that step).
        alt: the alternative text of the player's image, for screen readers; not
            empty.
        split: when given, a white line is drawn before row and column ``split``
            (for example between a prompt and its continuation);
            ``1 <= split < min(num_tokens_q, num_tokens_kv)``.
        fps: frames a second when playing; positive.
        still_frame: the frame a printed page shows, counted as a Python index
            (``-1``, the default, is the last frame); the player itself opens on
            the first frame.

    Returns:
        The player as one HTML string (a ``<div class="animation">`` and its
        script); its ``<img>`` carries ``alt``.

    Raises:
        TypeError: ``maps`` is not a floating-point tensor, or a title, headline or
            ``alt`` is not a string.
        ValueError: ``maps`` is not 4-dimensional or has an empty dimension, a value
            lies outside ``[0, 1]`` or is NaN, ``panel_titles`` or ``headlines`` has
            the wrong length, ``alt`` is empty, ``split`` is out of range, or
            ``fps`` is not positive, or ``still_frame`` is not an index of a frame.

    Source: no formula; the player is ``matplotlib.animation.HTMLWriter``.
    """
    if not isinstance(maps, torch.Tensor) or not maps.is_floating_point():
        kind = maps.dtype if isinstance(maps, torch.Tensor) else type_name(maps)
        raise TypeError(f"maps must be a floating-point tensor, got {kind}")
    if maps.ndim != 4 or 0 in maps.shape:
        raise ValueError(
            "maps must be (num_frames, num_panels, num_tokens_q, num_tokens_kv) with no "
            f"empty dimension, got shape {tuple(maps.shape)}"
        )
    weights = maps.detach().float().cpu()
    if weights.isnan().any() or weights.min() < 0 or weights.max() > 1:
        raise ValueError(
            "maps must hold attention weights in [0, 1], got values from "
            f"{weights.min().item():.4g} to {weights.max().item():.4g}"
        )
    num_frames, num_panels, n_q, n_kv = weights.shape
    for name, texts, count in (("panel_titles", panel_titles, num_panels),
                               ("headlines", headlines, num_frames)):
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{name} must be a sequence of strings, got {texts!r}")
        if len(texts) != count:
            raise ValueError(f"{name} has {len(texts)} entries, expected {count}")
    if not isinstance(alt, str):
        raise TypeError(f"alt must be a string, got {type_name(alt)}")
    if not alt.strip():
        raise ValueError("alt must describe the animation, got an empty string")
    if split is not None and not 1 <= split < min(n_q, n_kv):
        raise ValueError(f"split must be in [1, {min(n_q, n_kv) - 1}], got {split}")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if isinstance(still_frame, bool) or not isinstance(still_frame, int):
        raise TypeError(f"still_frame must be an int, got {type_name(still_frame)}")
    if not -num_frames <= still_frame < num_frames:
        raise ValueError(
            f"still_frame must be in [{-num_frames}, {num_frames - 1}], got {still_frame}"
        )

    import matplotlib.pyplot as plt

    height = 0.9 + 3.9 * num_panels * min(n_q / n_kv, 1.5)
    with plt.style.context("attnlib.book"):  # the book's text sizes, transparent face
        fig, axes = plt.subplots(num_panels, 1, figsize=(MAX_FIGURE_WIDTH, height),
                                 layout="constrained", squeeze=False)
        page = _draw_player(fig, axes, weights, panel_titles, headlines, alt, split, fps)
    return _with_still(page, still_frame % num_frames, alt)


#: Shown instead of the player where the page is printed (the player's own image is
#: whichever frame was on screen, and its controls do nothing on paper).
_STILL_CSS = """<style>
.animation .animation-still { display: none; }
@media print {
  .animation img[id^="_anim_img"] { display: none !important; }
  .animation img.animation-still { display: block !important; max-width: 100%; }
}
</style>
"""


def _with_still(page: str, frame: int, alt: str) -> str:
    """``page`` with frame ``frame`` as a second, print-only image in its player."""
    frames = re.findall(r'frames\[(\d+)\] = "(data:image/png;base64,[^"]+)"', page)
    source = dict(frames)[str(frame)]
    still = f'<img class="animation-still" alt="{html.escape(alt)}" src="{source}">'
    page = re.sub(r'(<img alt="[^"]*" id="_anim_img\w*">)', lambda m: m.group(1) + still,
                  page, count=1)
    return _STILL_CSS + page


def _draw_player(fig: Figure, axes: np.ndarray, weights: torch.Tensor,
                 panel_titles: Sequence[str], headlines: Sequence[str], alt: str,
                 split: int | None, fps: float) -> str:
    """animate_attention_maps' drawing, inside the book's style."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation, HTMLWriter

    class TransparentFrames(HTMLWriter):
        # matplotlib paints an animation's frames onto the figure's face colour,
        # because most video formats have no alpha channel; the player's PNG frames
        # have one, so they can stay transparent like the book's figures.
        def _supports_transparency(self) -> bool:
            return True

    num_frames, num_panels, n_q, n_kv = weights.shape
    images = []
    step = 4 if max(n_q, n_kv) <= 16 else 8
    for panel, (ax, title) in enumerate(zip(axes[:, 0], panel_titles, strict=True)):
        images.append(ax.imshow(weights[0, panel].numpy(), cmap=ATTENTION_CMAP,
                                vmin=0.0, vmax=1.0))
        if split is not None:
            ax.axhline(split - 0.5, color="white", lw=0.8)
            ax.axvline(split - 0.5, color="white", lw=0.8)
        ax.set_title(title)
        ax.set_xticks(range(0, n_kv, step))
        ax.set_yticks(range(0, n_q, step))
        ax.set_ylabel("query position")
    axes[-1, 0].set_xlabel("key position")
    fig.colorbar(images[0], ax=axes, shrink=0.6, label="attention weight")
    suptitle = fig.suptitle(headlines[0])

    def draw(frame: int) -> list:
        for panel, image in enumerate(images):
            image.set_data(weights[frame, panel].numpy())
        suptitle.set_text(headlines[frame])
        return images

    player = FuncAnimation(fig, draw, frames=num_frames)
    try:
        with tempfile.TemporaryDirectory() as folder:  # to_jshtml's steps, but with
            path = Path(folder, "player.html")  # transparent frames
            # matplotlib's type stub says int; the player takes any positive rate
            writer = TransparentFrames(fps=fps, embed_frames=True,  # type: ignore[arg-type]
                                       default_mode="once")
            player.save(path, writer=writer)
            page = _palette_frames(path.read_text())
    finally:
        plt.close(fig)  # the player shows the frames; no still figure below it
    page = re.sub(r"<link[^>]*font-awesome[^>]*>", "", page)
    return page.replace("<img id=", f'<img alt="{html.escape(alt)}" id=', 1)
