"""Tests for attnlib.data, attnlib.device, attnlib.viz and attnlib.show_source."""

import html
import importlib.util
import inspect
import re
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

import attnlib


def test_journey_embeddings_are_the_reference_numbers():
    x = attnlib.journey_embeddings()
    assert x.shape == (6, 3) and x.dtype == torch.float32
    expected = [
        [0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
        [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55],
    ]
    torch.testing.assert_close(x, torch.tensor(expected))
    assert attnlib.JOURNEY_TOKENS == ("Your", "journey", "starts", "with", "one", "step")
    assert len(attnlib.JOURNEY_TOKENS) == x.shape[0]


def test_journey_embeddings_returns_a_fresh_tensor_each_call():
    first = attnlib.journey_embeddings()
    first.zero_()
    assert attnlib.journey_embeddings()[0, 0].item() == pytest.approx(0.43)


def test_get_device_matches_cuda_availability():
    device = attnlib.get_device()
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert attnlib.device.cuda_available() == torch.cuda.is_available()
    with pytest.raises(TypeError, match="allow_mps must be a bool, got str"):
        attnlib.get_device("yes")


def test_plot_attention_draws_labelled_heatmap():
    weights = torch.softmax(torch.randn(6, 6, generator=torch.Generator().manual_seed(0)), -1)
    ax = attnlib.plot_attention(weights, tokens=attnlib.JOURNEY_TOKENS, title="demo")
    try:
        image = ax.images[0]
        assert image.get_cmap().name == "viridis"
        torch.testing.assert_close(torch.as_tensor(image.get_array()), weights)
        assert [t.get_text() for t in ax.get_xticklabels()] == list(attnlib.JOURNEY_TOKENS)
        assert [t.get_text() for t in ax.get_yticklabels()] == list(attnlib.JOURNEY_TOKENS)
        assert ax.get_title() == "demo"
        assert ax.get_xlabel() and ax.get_ylabel()
        assert len(ax.figure.axes) == 2, "a colour bar is drawn beside the map"
        assert len(ax.texts) == 36, "small maps are annotated with each weight"
    finally:
        plt.close(ax.figure)


@pytest.mark.parametrize("num_tokens", [2, 6, 10, 24, 64])
def test_plot_attention_default_figure_fits_the_book_column(num_tokens):
    """At most MAX_FIGURE_WIDTH (5.0 in, 500 px at 100 dpi) wide, so that a phone's
    column shrinks it little and its text stays legible."""
    weights = torch.full((num_tokens, num_tokens), 1.0 / num_tokens)
    ax = attnlib.plot_attention(weights)
    try:
        width, height = ax.figure.get_size_inches()
        assert attnlib.viz.MAX_FIGURE_WIDTH == 5.0
        assert width <= 5.0 + 1e-9, f"{num_tokens} tokens: {width:.2f} in wide"
        assert height > 0.5 * width or num_tokens < 6, "cells keep roughly their aspect"
        sizes = [t.get_fontsize() for t in ax.texts]
        assert all(size >= 10 for size in sizes), f"annotation fonts {sorted(set(sizes))} pt"
        assert bool(sizes) == (num_tokens <= 10), "small maps are annotated, large ones not"
    finally:
        plt.close(ax.figure)


def test_plot_attention_squeezes_batch_of_one_and_uses_given_axes():
    fig, ax = plt.subplots()
    try:
        out = attnlib.plot_attention(torch.full((1, 1, 3, 4), 0.25), ax=ax, annotate=False, vmax=0.5)
        assert out is ax and ax.images[0].get_array().shape == (3, 4)
        assert ax.images[0].get_clim() == (0.0, 0.5)
        assert len(ax.texts) == 0
    finally:
        plt.close(fig)


def test_plot_attention_rejects_bad_input():
    with pytest.raises(ValueError, match=r"got shape \(2, 3, 3\)"):
        attnlib.plot_attention(torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="tokens has 2 labels but attn_weights has 3 columns"):
        attnlib.plot_attention(torch.zeros(3, 3), tokens=["a", "b"])
    with pytest.raises(ValueError, match="vmax must be positive, got 0"):
        attnlib.plot_attention(torch.zeros(3, 3), vmax=0)
    with pytest.raises(TypeError, match="floating point, got torch.int64"):
        attnlib.plot_attention(torch.zeros(3, 3, dtype=torch.int64))


def _frames(page):
    """The PNG frames that a player embeds, decoded (Pillow images, RGBA)."""
    import base64
    import io

    from PIL import Image

    found = re.findall(r'frames\[\d+\] = "data:image/png;base64,([^"]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(re.sub(r"[^A-Za-z0-9+/=]", "", f))))
            .convert("RGBA") for f in found]


def test_animate_attention_maps_embeds_one_transparent_frame_per_step():
    torch.manual_seed(0)
    maps = torch.softmax(torch.randn(3, 2, 6, 6), dim=-1)  # 3 frames, 2 panels
    figures_before = plt.get_fignums()
    page = attnlib.viz.animate_attention_maps(
        maps, ["layer 0", "layer 1"], ["step 0", "step 5", "step 10"],
        alt='Maps "before" & after', split=3)
    assert plt.get_fignums() == figures_before, "the figure is closed, not shown twice"
    frames = _frames(page)
    assert len(frames) == 3
    # one column of panels, 5 in wide at 100 dpi; the corners keep the page's background
    assert all(f.width == 500 and f.height > f.width for f in frames)
    assert all(f.getpixel((0, 0))[3] == 0 for f in frames), "frames are not transparent"
    assert frames[0].tobytes() != frames[1].tobytes(), "the frames do not change"
    assert 'alt="Maps &quot;before&quot; &amp; after"' in page
    assert "font-awesome" not in page and "<link" not in page, "the player links a CDN"
    assert '<div class="animation"' in page
    # Paper shows the last frame (the default still_frame), in its own image.
    embedded = dict(re.findall(r'frames\[(\d+)\] = "(data:image/png;base64,[^"]+)"', page))
    still = re.search(r'<img class="animation-still" alt="[^"]*" src="([^"]+)">', page)
    assert still and still.group(1) == embedded["2"] != embedded["0"]
    assert re.search(r"@media print \{[^}]*_anim_img[^}]*display: none", page)
    page = attnlib.viz.animate_attention_maps(maps, ["a", "b"], ["0", "5", "10"], alt="x",
                                              still_frame=1)
    still = re.search(r'<img class="animation-still" alt="x" src="([^"]+)">', page)
    assert still.group(1) == dict(re.findall(
        r'frames\[(\d+)\] = "(data:image/png;base64,[^"]+)"', page))["1"]


def test_animate_attention_maps_rejects_bad_input():
    maps = torch.full((2, 1, 4, 4), 0.25)
    ok = {"panel_titles": ["head"], "headlines": ["a", "b"], "alt": "maps"}
    animate = attnlib.viz.animate_attention_maps
    with pytest.raises(ValueError, match=r"got shape \(1, 4, 4\)"):
        animate(maps[0], **ok)
    with pytest.raises(TypeError, match="floating-point tensor, got torch.int64"):
        animate(maps.long(), **ok)
    with pytest.raises(TypeError, match="floating-point tensor, got list"):
        animate([[0.5]], **ok)
    with pytest.raises(ValueError, match=r"in \[0, 1\], got values from 2 to 2"):
        animate(maps * 8, **ok)
    with pytest.raises(ValueError, match="headlines has 3 entries, expected 2"):
        animate(maps, **{**ok, "headlines": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="panel_titles has 2 entries, expected 1"):
        animate(maps, **{**ok, "panel_titles": ["x", "y"]})
    with pytest.raises(TypeError, match="headlines must be a sequence of strings"):
        animate(maps, **{**ok, "headlines": "ab"})
    with pytest.raises(ValueError, match="empty string"):
        animate(maps, **{**ok, "alt": "  "})
    with pytest.raises(ValueError, match=r"split must be in \[1, 3\], got 4"):
        animate(maps, **ok, split=4)
    with pytest.raises(ValueError, match="fps must be positive, got 0"):
        animate(maps, **ok, fps=0)
    with pytest.raises(ValueError, match=r"still_frame must be in \[-2, 1\], got 2"):
        animate(maps, **ok, still_frame=2)
    with pytest.raises(TypeError, match="still_frame must be an int, got float"):
        animate(maps, **ok, still_frame=1.0)


def test_show_source_returns_the_package_code():
    src = attnlib.show_source(attnlib.softmax)
    assert str(src).startswith("def softmax(")
    assert "Numerically stable softmax" in str(src)
    assert "<span" in src._repr_html_()
    bare = attnlib.show_source(attnlib.softmax, docstring=False)
    assert "Numerically stable softmax" not in str(bare)
    assert "x.amax(dim=dim, keepdim=True)" in str(bare)
    method = attnlib.show_source(attnlib.MultiHeadAttention.forward, docstring=False)
    assert str(method).startswith("def forward(")
    assert '"""' not in str(method) and "return" in str(method)
    with pytest.raises(TypeError, match="cannot show the source of"):
        attnlib.show_source(len)


def test_show_source_html_uses_css_classes_not_fixed_colours():
    """The book's light and dark themes colour the code; fixed colours would not adapt."""
    html = attnlib.show_source(attnlib.softmax)._repr_html_()
    assert html.startswith('<div class="highlight">'), html[:60]
    assert 'style="' not in html, "inline colours cannot follow the theme"
    assert '<span class="k">def</span>' in html
    assert '<span class="nf">softmax</span>' in html


SAMPLE_MODULE = '''"""A module for show_source's tests."""


def marked_up(x):
    """Scale ``x`` like :func:`~attnlib.softmax`; see :class:`attnlib.KVCache`,
    :meth:`the append method <attnlib.KVCache.append>`, :py:func:`len` and
    `the docs <https://example.org>`_. A literal over two lines: ``(batch,
    num_tokens)``.
    """
    marker = "``kept`` :class:`kept`"  # code, not a docstring: kept verbatim
    return x, marker


class Marked:
    """A class whose method has a docstring too: ``Marked``."""

    def method(self):
        """Return :data:`None`."""
        return "``also kept``"


def short_function():
    return 1
'''


def _load_module(tmp_path, monkeypatch, name, source):
    """Import ``source`` as the module ``name`` (inspect finds a class's source
    through ``sys.modules``)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def _long_function_source(num_lines):
    """The source of ``long_function``, which has exactly ``num_lines`` lines."""
    body = [f"    x{i} = {i}" for i in range(num_lines - 2)]
    return "\n".join(["def long_function():", *body, "    return x0"]) + "\n"


def _html_text(fragment):
    """The text a browser shows for an HTML fragment."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_show_source_shows_docstrings_without_rest_markup(tmp_path, monkeypatch):
    module = _load_module(tmp_path, monkeypatch, "sample_markup", SAMPLE_MODULE)
    src = attnlib.show_source(module.marked_up)
    shown = repr(src)
    assert "Scale `x` like `softmax`; see `attnlib.KVCache`," in shown
    assert "`the append method`, `len` and\n    the docs (https://example.org)." in shown
    assert "`(batch,\n    num_tokens)`" in shown
    docstring_part = shown.split('"""')[1]
    assert "``" not in docstring_part and ":class:" not in docstring_part
    assert ":meth:" not in docstring_part and "<attnlib" not in docstring_part
    # The code is shown verbatim, and str() is the source itself.
    assert 'marker = "``kept`` :class:`kept`"  # code, not a docstring' in shown
    assert str(src) == inspect.getsource(module.marked_up).rstrip("\n")
    assert shown.count("\n") == str(src).count("\n")
    # The HTML shows the same text as the plain representation.
    assert _html_text(src._repr_html_()).rstrip("\n") == shown
    # Every docstring of a class is rewritten, its methods' included; code is not.
    shown_class = repr(attnlib.show_source(module.Marked))
    assert "whose method has a docstring too: `Marked`." in shown_class
    assert "Return `None`." in shown_class and 'return "``also kept``"' in shown_class


def test_show_source_of_attnlib_shows_no_rest_markup():
    """Every public attnlib object with a docstring, as a chapter would show it."""
    role = re.compile(r":[a-z]+:`")
    seen = 0
    for name in attnlib.__all__:
        obj = getattr(attnlib, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        shown = repr(attnlib.show_source(obj))
        docstrings = shown.split('"""')[1::2]
        seen += len(docstrings)
        for text in docstrings:
            assert "``" not in text and not role.search(text), f"{name}: {text[:300]}"
    assert seen > 30, f"only {seen} docstrings seen"


OVERLOADED_MODULE = '''import typing
from typing import Literal, overload


class Overloaded:
    """A class whose forward has @overload stubs, as in attnlib."""

    @overload
    def forward(self, x: int, flag: Literal[False] = ...) -> int: ...

    @typing.overload
    def forward(
        self, x: int, flag: Literal[True]
    ) -> tuple[int, int]: ...

    def forward(self, x: int, flag: bool = False) -> int | tuple[int, int]:
        """Return ``x``, or ``(x, x)`` with ``flag``."""
        return (x, x) if flag else x

    def other(self) -> None:
        return None
'''

OVERLOADED_SHOWN = '''class Overloaded:
    """A class whose forward has @overload stubs, as in attnlib."""

    def forward(self, x: int, flag: bool = False) -> int | tuple[int, int]:
        """Return ``x``, or ``(x, x)`` with ``flag``."""
        return (x, x) if flag else x

    def other(self) -> None:
        return None'''


def test_show_source_leaves_out_overload_stubs(tmp_path, monkeypatch):
    """A chapter shows a class's forward once, as it runs, without the type checker's stubs."""
    module = _load_module(tmp_path, monkeypatch, "sample_overloads", OVERLOADED_MODULE)
    src = attnlib.show_source(module.Overloaded)
    # Both spellings of the decorator go, with the blank line after each stub.
    assert str(src) == OVERLOADED_SHOWN
    assert src.num_lines == OVERLOADED_SHOWN.count("\n") + 1
    bare = str(attnlib.show_source(module.Overloaded, docstring=False))
    docstring = '    """A class whose forward has @overload stubs, as in attnlib."""\n'
    assert bare == OVERLOADED_SHOWN.replace(docstring, "") != OVERLOADED_SHOWN
    # Chapter 5 prints CausalAttention, whose forward has three stubs.
    shown = str(attnlib.show_source(attnlib.CausalAttention, docstring=False))
    assert "@overload" in inspect.getsource(attnlib.CausalAttention)
    assert "overload" not in shown and shown.count("def forward(") == 1
    forward = inspect.getsource(attnlib.CausalAttention.forward).rstrip("\n")
    assert forward.split('"""')[-1] in shown  # the body after the docstring, verbatim


def test_long_show_source_is_collapsed_in_html(tmp_path, monkeypatch):
    limit = attnlib.source.SourceCode.COLLAPSE_AFTER
    at_limit = _load_module(tmp_path, monkeypatch, "at_limit", _long_function_source(limit))
    over = _load_module(tmp_path, monkeypatch, "over_limit", _long_function_source(limit + 1))

    short = attnlib.show_source(at_limit.long_function)
    assert short.num_lines == limit and not short.collapsed
    assert short._repr_html_().startswith('<div class="highlight">')

    long = attnlib.show_source(over.long_function)
    page = long._repr_html_()
    assert long.num_lines == limit + 1 and long.collapsed
    # Closed (no "open" attribute), with a summary that names the object and its
    # length, and the highlighted code inside.
    assert page.startswith('<details class="attnlib-source"><summary>'), page[:80]
    assert page.endswith("</details>") and " open" not in page.split(">", 1)[0]
    summary = re.search(r"<summary>(.*?)</summary>", page).group(1)
    assert _html_text(summary) == f"Show the source of long_function ({limit + 1} lines)"
    assert '<div class="highlight">' in page and "x0 = 0" in _html_text(page)
    # The plain text is never cut.
    assert repr(long) == str(long) and repr(long).count("\n") == limit

    # collapse= overrides the length.
    assert attnlib.show_source(over.long_function, collapse=False)._repr_html_().startswith(
        '<div class="highlight">')
    forced = attnlib.show_source(at_limit.long_function, collapse=True)._repr_html_()
    assert forced.startswith("<details") and f"({limit} lines)" in forced


def test_show_source_rejects_bad_options():
    with pytest.raises(TypeError, match="collapse must be None or a bool, got 'yes'"):
        attnlib.show_source(attnlib.softmax, collapse="yes")
    with pytest.raises(TypeError, match="docstring must be a bool, got 1"):
        attnlib.show_source(attnlib.softmax, docstring=1)


def test_public_api_is_documented():
    for name in attnlib.__all__:
        obj = getattr(attnlib, name)
        if callable(obj) and not name.startswith("_"):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, f"{name} has no docstring"
