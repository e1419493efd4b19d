"""Triton's import, the kernels' ``triton.jit`` and autotuning, the input checks,
the launch settings and the tile schedule of :mod:`attnlib.flash_triton`."""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import types
from collections.abc import Callable
from typing import Any, TypedDict

import torch

from .._validation import check_bool, check_int, type_name
from ._kernels import (
    delta_kernel,
    forward_kernel,
    forward_tiles,
    grad_key_value_kernel,
    grad_key_value_tiles,
    grad_query_kernel,
    grad_query_tiles,
    key_tile,
    key_tiles,
    query_tiles,
    visible_pairs,
)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The input dtypes the kernels take; accumulation is always float32."""

HEAD_DIMS = (16, 32, 64, 128)
"""The head sizes the kernels take (``tl.arange`` needs a power of two, ``tl.dot`` at least 16)."""

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
"""Where the causal triangle's corner sits when ``num_tokens_q != num_tokens_kv``."""

AUTOTUNE_CONFIGS = (  # (BLOCK_M, BLOCK_N, num_warps, num_stages), half precision on a GPU
    (64, 64, 4, 3), (64, 32, 4, 4), (128, 64, 8, 3), (128, 32, 8, 3), (128, 128, 8, 2),
)
"""The configurations ``autotune=True`` times on a GPU, per ``(N_q, N_kv, head_dim)``."""

SHARED_MEMORY_PER_PROGRAM = 232448  # bytes: an H100's or H200's 227 KiB per program
LOG2_E = math.log2(math.e)  # exp(x) == exp2(x * LOG2_E)
_BUILT: dict[bool, types.SimpleNamespace] = {}  # what jit_kernels() built, by interpret
_HELPERS: dict[str, Callable[..., Any]] = {  # the jitted functions the kernels call
    fn.__name__: fn for fn in (key_tile, key_tiles, query_tiles, visible_pairs, forward_tiles,
                               grad_query_tiles, grad_key_value_tiles)}


def import_triton() -> types.ModuleType:
    """Import Triton on first use, or explain how to install it."""
    try:
        import triton  # type: ignore[import-untyped]  # Triton ships no type hints
        import triton.language  # type: ignore[import-untyped]
    except ImportError as err:
        raise ImportError(
            "flash_attention_triton needs Triton, an optional dependency of attnlib: "
            "pip install 'attnlib[triton]' (or pip install triton)"
        ) from err
    module: types.ModuleType = triton  # untyped: Triton ships no hints
    return module


def _shared_memory_fits(configs: list[Any], named_args: dict[str, Any],
                        **kwargs: Any) -> list[Any]:
    """Autotuning's pruning: keep the configurations whose tiles fit in shared memory.

    The chapter's count: one Q tile and ``num_stages`` K and V tiles, in bytes.
    """
    size = named_args["q_ptr"].element_size()
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM", 128))
    fits = [c for c in configs if size * head_dim * (
        c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"]
    ) <= SHARED_MEMORY_PER_PROGRAM]
    return fits or configs[:1]


@functools.cache
def jit_kernels(interpret: bool) -> types.SimpleNamespace:
    """The kernels through ``triton.jit``, built once per interpreter setting.

    ``triton.jit`` returns an interpreted function when ``TRITON_INTERPRET=1``
    is set at the moment it decorates, and a GPU kernel otherwise; ``interpret``
    is that setting, which the caller has checked against the one Triton was
    imported with. Each kernel, and each helper it calls, is rebuilt from its
    code with globals of its own, in which ``tl`` is ``triton.language``:
    attnlib's namespace never imports Triton, and the interpreter, which runs a
    kernel in its globals and adds its own helpers there, leaves attnlib's
    modules untouched. On a GPU the forward and the two gradient kernels also
    come autotuned (``triton.autotune`` over :data:`AUTOTUNE_CONFIGS`, keyed on
    the token counts and ``head_dim``).
    """
    triton = import_triton()
    scope = {"tl": triton.language, "triton": triton, "__name__": __name__}

    def jit(fn: Callable[..., Any]) -> Any:  # a JITFunction, or an InterpretedFunction
        assert isinstance(fn, types.FunctionType)  # a def: it has __code__ and __defaults__
        rebound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
        # FunctionType drops the annotations, which tell Triton the tl.constexpr arguments
        # (compiled in as constants: tl.arange(0, HEAD_DIM) needs one).
        rebound.__annotations__ = dict(fn.__annotations__)
        rebound.__doc__ = fn.__doc__
        return triton.jit(rebound)

    for name, helper in _HELPERS.items():  # the kernels find them in their globals
        scope[name] = jit(helper)
    kernels = types.SimpleNamespace(
        interpret=interpret,
        forward=jit(forward_kernel),
        delta=jit(delta_kernel),
        grad_key_value=jit(grad_key_value_kernel),
        grad_query=jit(grad_query_kernel),
    )
    if not interpret:
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                   for m, n, w, s in AUTOTUNE_CONFIGS]
        for name in ("forward", "grad_key_value", "grad_query"):
            tuner = triton.autotune(configs, key=["N_Q", "N_KV", "HEAD_DIM"],
                                    prune_configs_by={"early_config_prune":
                                                      _shared_memory_fits})
            setattr(kernels, f"{name}_autotuned", tuner(getattr(kernels, name)))
    _BUILT[interpret] = kernels
    return kernels


def autotuned_configs() -> dict[str, dict[tuple[int, ...], dict[str, int]]]:
    """The configuration ``autotune=True`` chose, per kernel and per tuning key.

    Returns:
        ``{"forward": {key: config}, "grad_key_value": ..., "grad_query": ...}``
        where ``key`` is the tuple Triton tuned on (``N_q``, ``N_kv``,
        ``head_dim`` and the argument dtypes) and ``config`` is
        ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}``. Empty dicts
        before the first autotuned call on a GPU; under Triton's interpreter
        nothing is tuned (see :func:`flash_attention_triton`'s ``autotune``).

    Source: Triton's ``triton.autotune`` (its ``Autotuner.cache``).
    """
    kernels = _BUILT.get(False)  # the compiled kernels, if built: only they are tuned
    chosen: dict[str, dict[tuple[int, ...], dict[str, int]]] = {}
    for name in ("forward", "grad_key_value", "grad_query"):
        tuner = getattr(kernels, f"{name}_autotuned", None)
        cache = getattr(tuner, "cache", {})
        chosen[name] = {tuple(key): {**config.kwargs, "num_warps": config.num_warps,
                                     "num_stages": config.num_stages}
                        for key, config in cache.items()}
    return chosen


# --- input checks and launch settings --------------------------------------------------------


def _check_block(name: str, value: object, low: int = 16, high: int = 256,
                 power_of_two: bool = True) -> int | None:
    """``value`` as an int from ``low`` to ``high`` (a power of two if asked), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type_name(value)} {name}={value!r}")
    value = int(value)
    if value < low or value > high or (power_of_two and value & (value - 1)):
        what = "a power of two" if power_of_two else "an int"
        raise ValueError(f"{name} must be {what} from {low} to {high}, got {name}={value}")
    return value


def check_variants(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   window: object, sinks: object, causal_alignment: object) -> int | None:
    """The window, the sinks and the alignment (after ``check_inputs``); returns the
    window as an int or None."""
    num_heads = query.shape[1]
    if window is not None:
        window = check_int("window", window, minimum=1)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
            what = sinks.dtype if isinstance(sinks, torch.Tensor) else type_name(sinks)
            raise TypeError(f"sinks must be a floating-point tensor or None, got {what}")
        if sinks.shape != (num_heads,):
            raise ValueError(
                f"sinks must have shape (num_heads,) = ({num_heads},), got "
                f"{tuple(sinks.shape)}"
            )
        if sinks.device != query.device:
            raise ValueError(
                f"sinks must be on the query's device {query.device}, got {sinks.device}"
            )
    if not isinstance(causal_alignment, str):
        raise TypeError(f"causal_alignment must be a str, got {type_name(causal_alignment)}")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got "
            f"causal_alignment={causal_alignment!r}"
        )
    return window


def check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 is_causal: bool, scale: float | None, block_m: object, block_n: object,
                 num_warps: object = None, num_stages: object = None
                 ) -> tuple[int | None, int | None, int | None, int | None]:
    """The reference's checks, then what the kernels need; returns the launch settings
    asked for, ``(block_m, block_n, num_warps, num_stages)``, each an int or None."""
    from .._validation import check_sdpa_inputs

    if all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (query, key, value)) \
            and key.shape[1] != query.shape[1]:
        # Grouped heads: check them, then the rest as if key and value had the query's.
        heads, num_kv_groups = query.shape[1], key.shape[1]
        if value.shape[1] != num_kv_groups:
            raise ValueError(
                f"key and value must have the same num_kv_groups, got key "
                f"{tuple(key.shape)} and value {tuple(value.shape)}"
            )
        if num_kv_groups == 0 or heads % num_kv_groups:
            raise ValueError(
                f"num_heads={heads} is not divisible by num_kv_groups={num_kv_groups}"
            )
        key = key[:, :1].expand(-1, heads, -1, -1)  # (b, num_heads, N_kv, head_dim), a view
        value = value[:, :1].expand(-1, heads, -1, -1)
    check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)
    check_bool("is_causal", is_causal)
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"flash_attention_triton takes float16, bfloat16 or float32 tensors, got {query.dtype}"
        )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, num_heads, num_tokens, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
    head_dim = query.shape[-1]
    if value.shape[-1] != head_dim:
        raise ValueError(
            f"value must have the query's head_dim={head_dim}, got value {tuple(value.shape)}"
        )
    if head_dim not in HEAD_DIMS:
        raise ValueError(
            f"head_dim must be a power of two from 16 to 128 ({', '.join(map(str, HEAD_DIMS))}), "
            f"got head_dim={head_dim}"
        )
    if query.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"flash_attention_triton runs on CUDA tensors, or on CPU tensors under Triton's "
            f"interpreter; got tensors on {query.device}"
        )
    return (_check_block("block_m", block_m), _check_block("block_n", block_n),
            _check_block("num_warps", num_warps, 1, 32),
            _check_block("num_stages", num_stages, 1, 8, power_of_two=False))


class LaunchSettings(TypedDict):
    """What :func:`launch_settings` returns: a plain dict at run time."""

    kernels: types.SimpleNamespace  # the kernels, from jit_kernels()
    block_m: int
    block_n: int
    launch: dict[str, int]  # num_warps and num_stages on a GPU; empty under the interpreter
    precision: str  # tl.dot's input_precision: "ieee" or "tf32"
    autotune: bool  # launch the autotuned kernels (a GPU, no launch setting asked)


def launch_settings(query: torch.Tensor, block_m: int | None, block_n: int | None,
                    num_warps: int | None = None, num_stages: int | None = None,
                    autotune: bool = False) -> LaunchSettings:
    """Kernels (interpreted or compiled), block sizes, warps and stages for these inputs."""
    triton = import_triton()
    interpret = interpreting(triton)
    if query.device.type == "cpu" and not interpret:
        raise RuntimeError(
            "flash_attention_triton got CPU tensors, which Triton runs only under its "
            "interpreter: set the environment variable TRITON_INTERPRET=1 before Triton is "
            "first imported (os.environ['TRITON_INTERPRET'] = '1' at the top of the notebook "
            "or script, or in the shell), or pass CUDA tensors"
        )
    if interpret != imported_interpreted(triton):
        # Triton decorates its own library (tl.zeros, tl.max, ...) when first imported;
        # kernels of the other kind cannot call those functions.
        now, then = ("set", "not set") if interpret else ("not set", "set")
        raise RuntimeError(
            f"TRITON_INTERPRET=1 is {now} now but was {then} when this process first "
            "imported Triton, which reads it then: set or unset it before the first import "
            "of triton and restart the process (in a notebook: restart the kernel)"
        )
    if interpret and query.dtype == torch.bfloat16:
        # Triton's interpreter keeps bfloat16 as its 16-bit pattern and tl.dot multiplies
        # the patterns as integers (triton-lang/triton#11584): refuse rather than return junk.
        raise TypeError(
            "Triton's interpreter cannot run bfloat16 kernels (its tl.dot multiplies "
            "bfloat16 bit patterns as integers): use float16 or float32 under "
            "TRITON_INTERPRET=1, or bfloat16 on a CUDA GPU without it"
        )
    asked = {"block_m": block_m, "block_n": block_n, "num_warps": num_warps,
             "num_stages": num_stages}
    if autotune and any(x is not None for x in asked.values()):
        given = {k: v for k, v in asked.items() if v is not None}
        raise ValueError(
            "autotune=True chooses block_m, block_n, num_warps and num_stages itself: "
            f"pass none of them, got {given}"
        )
    if interpret:  # few, small programs: the interpreter is slow per program; it runs
        default_m = default_n = 32  # each program as one, so warps and stages do not apply
        launch: dict[str, int] = {}
    else:
        # 64 x 64 tiles, 4 warps, 3 stages: a plain textbook setting, not tuned. float32
        # tiles are twice as large in shared memory, so they get half the rows.
        default_m = default_n = 64 if query.element_size() == 2 else 32
        launch = {"num_warps": num_warps or 4,
                  "num_stages": num_stages or (3 if query.element_size() == 2 else 2)}
    return {
        "kernels": jit_kernels(interpret),
        "block_m": block_m or default_m,
        "block_n": block_n or default_n,
        "launch": launch,
        # float32 inputs get full float32 products (not TF32, Triton's default on a GPU),
        # so that float32 results agree with torch's to float32 accuracy.
        "precision": "ieee" if query.dtype == torch.float32 else "tf32",
        # Under the interpreter nothing is timed: autotune=True runs the default blocks.
        "autotune": bool(autotune) and not interpret,
    }


def interpreting(triton: types.ModuleType) -> bool:
    """Whether ``TRITON_INTERPRET`` is on now, as Triton reads it."""
    knobs = getattr(triton, "knobs", None)  # Triton's settings object, in recent versions
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def imported_interpreted(triton: types.ModuleType) -> bool:
    """Whether Triton's own library was decorated under the interpreter at import."""
    from triton.runtime.interpreter import (  # type: ignore[import-untyped]  # no hints
        InterpretedFunction,
    )

    return isinstance(triton.language.zeros, InterpretedFunction)


def cdiv(n: int, block: int) -> int:
    return (n + block - 1) // block  # blocks needed to cover n rows


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# --- the tile schedule, in Python ------------------------------------------------------------


def key_tile_bounds(start_m: int, n_kv: int, offset: int, window: int | None,
                    is_causal: bool, block_m: int, block_n: int
                    ) -> tuple[int, int, int, int]:
    """``kernels.key_tiles`` in Python: the key tiles one block of queries visits.

    The kernels' schedule, as :func:`attnlib.flash_triton.tile_counts` counts it and the
    chapter 11 exercise on causal stages checks it: keys ``lo ... mid_lo - 1`` are
    masked tiles (the sliding window's edge), ``mid_lo ... mid_hi - 1`` unmasked ones,
    ``mid_hi ... hi - 1`` masked ones again (the diagonal, the sequence's end); keys at
    or past ``hi`` and before ``lo`` are skipped.

    Args:
        start_m: the block's first query row.
        n_kv: the number of keys.
        offset: the position of query 0 among the keys (``n_kv - n_q`` bottom-right,
            0 top-left).
        window: the sliding window, or None.
        is_causal: the causal mask.
        block_m, block_n: queries and keys per tile.

    Returns:
        ``(lo, mid_lo, mid_hi, hi)``, key positions, ``lo``, ``mid_lo`` and ``mid_hi``
        multiples of ``block_n``.

    It raises nothing and checks nothing, like the kernel it mirrors:
    :func:`attnlib.flash_triton.tile_counts` checks the arguments it passes on.

    Source: the three-stage loop of Triton's fused-attention tutorial
    (``_attn_fwd_inner``'s STAGE), extended to sliding windows.
    """
    lo, mid_lo, hi = 0, 0, n_kv
    mid_hi = n_kv // block_n * block_n
    if is_causal:
        hi = min(max(start_m + block_m + offset, 0), n_kv)
        mid_hi = min(max(start_m + offset + 1, 0), n_kv) // block_n * block_n
    if window is not None:
        first_seen = max(start_m + offset - window + 1, 0)
        lo = first_seen // block_n * block_n
        hi = hi if first_seen < hi else lo
        mid_lo = cdiv(max(start_m + block_m + offset - window, 0), block_n) * block_n
    mid_lo = min(max(mid_lo, lo), hi)
    return lo, mid_lo, max(mid_hi, mid_lo), hi


def query_tile_bounds(start_n: int, n_q: int, n_kv: int, offset: int,
                      window: int | None, is_causal: bool, block_m: int, block_n: int
                      ) -> tuple[int, int, int, int]:
    """``kernels.query_tiles`` in Python: (lo, mid_lo, mid_hi, hi) for a key block."""
    lo, mid_lo, hi = 0, 0, n_q
    mid_hi = n_q // block_m * block_m
    if is_causal:
        first_seen = max(start_n - offset, 0)
        lo = first_seen // block_m * block_m
        mid_lo = cdiv(max(start_n + block_n - 1 - offset, 0), block_m) * block_m
    if window is not None:
        hi = min(max(start_n + block_n - offset + window - 1, 0), n_q)
        mid_hi = min(max(start_n - offset + window, 0), n_q) // block_m * block_m
    if is_causal and first_seen >= hi:
        hi = lo
    if start_n + block_n > n_kv:
        mid_hi = 0
    mid_lo = min(max(mid_lo, lo), hi)
    return lo, mid_lo, max(mid_hi, mid_lo), hi


def _stage_counts(bounds: tuple[int, int, int, int], block: int) -> tuple[int, int]:
    """(unmasked, masked) tiles of one program's three ranges."""
    lo, mid_lo, mid_hi, hi = bounds

    def tiles(a: int, b: int) -> int:
        return cdiv(b - a, block) if b > a else 0

    return tiles(mid_lo, mid_hi), tiles(lo, mid_lo) + tiles(mid_hi, hi)


def tile_counts(num_tokens_q: int, num_tokens_kv: int, *, block_m: int = 64,
                block_n: int = 64, is_causal: bool = False, window: int | None = None,
                causal_alignment: str = "top_left") -> dict[str, dict[str, int]]:
    """How many tiles each stage of the kernels does, for one (batch, head) pair.

    The forward and the dQ kernel give each block of ``block_m`` queries a loop
    over the tiles of ``block_n`` keys; the dK/dV kernel gives each block of
    keys a loop over the query tiles (per query head of its group). Each loop
    runs some tiles **unmasked** (every pair visible, no ``tl.where``), some
    **masked** (cut by the diagonal, the window's edge or the sequence's end)
    and **skips** the rest (no pair visible: nothing loaded). The bounds are the
    kernels' own, computed here in Python.

    Args:
        num_tokens_q, num_tokens_kv: the token counts, ``>= 0``.
        block_m: keyword-only; queries per tile. Default 64.
        block_n: keyword-only; keys per tile. Default 64.
        is_causal: keyword-only; the causal mask. Default ``False``.
        window: keyword-only; the sliding window (implies causal), or None.
        causal_alignment: keyword-only; ``"top_left"`` (torch's ``is_causal``)
            or ``"bottom_right"``.

    Returns:
        ``{"forward": {...}, "grad_key_value": {...}}``, each
        ``{"unmasked", "masked", "skipped", "total"}`` tile counts; ``total``
        is the number of tiles of the whole score matrix, and the dQ kernel's
        counts are the forward's.

    Raises:
        TypeError: a count, block or ``window`` is not an int; ``is_causal`` is
            not a bool; ``causal_alignment`` is not a str.
        ValueError: a count is negative, a block not a power of two from 16 to
            256, ``window < 1`` or ``causal_alignment`` another string.

    Source: the causal loop in two stages of Triton's fused-attention tutorial
    (``06-fused-attention.py``, ``STAGE`` 1 and 2), extended to the sliding window.
    """
    n_q = check_int("num_tokens_q", num_tokens_q, minimum=0)
    n_kv = check_int("num_tokens_kv", num_tokens_kv, minimum=0)
    bm, bn = _check_block("block_m", block_m), _check_block("block_n", block_n)
    assert bm is not None and bn is not None  # they are not None: checked above
    check_bool("is_causal", is_causal)
    if window is not None:
        window = check_int("window", window, minimum=1)
    if not isinstance(causal_alignment, str):
        raise TypeError(f"causal_alignment must be a str, got {type_name(causal_alignment)}")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got "
                         f"causal_alignment={causal_alignment!r}")
    causal = is_causal or window is not None
    offset = n_kv - n_q if causal_alignment == "bottom_right" else 0
    total = cdiv(n_q, bm) * cdiv(n_kv, bn)
    result = {}
    for name, blocks, bounds, step in (
        ("forward", range(0, n_q, bm),
         lambda s: key_tile_bounds(s, n_kv, offset, window, causal, bm, bn), bn),
        ("grad_key_value", range(0, n_kv, bn),
         lambda s: query_tile_bounds(s, n_q, n_kv, offset, window, causal, bm, bn), bm),
    ):
        unmasked = masked = 0
        for start in blocks:
            u, m = _stage_counts(bounds(start), step)
            unmasked, masked = unmasked + u, masked + m
        result[name] = {"unmasked": unmasked, "masked": masked,
                        "skipped": total - unmasked - masked, "total": total}
    return result
