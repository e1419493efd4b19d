"""Which ATen operators a contestant runs (:func:`operator_counts`), and whether
attnlib's layer runs the same ones as the bare kernels (:func:`operator_parity`),
read from :mod:`torch.profiler` on any device. Import from :mod:`attnlib.bench`.

A time ratio mixes two things: the work the device does (kernels) and the
Python that launches it. The operator counts separate the first: two callables
whose profiles list the same compute operators the same number of times launch
the same kernels, and any gap in their times is launch overhead.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from .._validation import type_name
from ._constants import MODES
from ._contestants import Contestant

#: The launching operators of the query/key/value projection, whose counts may
#: differ between attnlib and the bare kernels (one fused ``F.linear`` of a
#: weight packed once): attnlib keeps three ``nn.Linear`` layers with their own
#: storage, projects with the three of them without gradients (three GEMMs,
#: ``linear`` -> ``addmm`` or ``matmul`` -> ``mm``; as fast on the CPU as one
#: GEMM of the stacked weight) and, with gradients, with one ``F.linear`` of the
#: weights concatenated on the call (two more ``cat``: weights and biases).
PROJECTION_OPERATORS = frozenset({
    "aten::linear", "aten::addmm", "aten::matmul", "aten::mm", "aten::_unsafe_view",
    "aten::copy_", "aten::cat",
})


@functools.cache
def is_view_operator(name: str) -> bool:
    """Whether the ATen operator ``name`` only makes a view (launches no kernel).

    True when every overload's schema returns aliases of its inputs without
    writing to them (``Tensor(a)``: ``view``, ``transpose``, ``split``,
    ``as_strided``, ``detach``, ...). Operators that may copy
    (``reshape``, ``contiguous``, ``to``) are annotated so too, but when they
    copy, the profiler records the copying operator (``clone``, ``_to_copy``)
    as well, and that one counts. In-place operators (``Tensor(a!)``) and
    unknown names count as launching. Overloads that take no tensor
    (TorchScript's ``slice.str``) are not looked at.

    Args:
        name: a profiler event name, ``"aten::transpose"``.

    Returns:
        True for a view operator, False otherwise.

    Source: the alias annotations of ATen's operator schemas,
    ``aten/src/ATen/native/README.md`` ("Annotations").
    """
    if not name.startswith("aten::"):
        return False
    try:
        packet = getattr(torch.ops.aten, name[len("aten::"):])
        overloads = [getattr(packet, o) for o in packet.overloads()]
    except (AttributeError, RuntimeError):
        return False
    # Overloads returning tensors only: TorchScript's ``slice.str`` and
    # ``split.str`` act on strings.
    returns = [op._schema.returns for op in overloads]
    returns = [r for r in returns if r and all("Tensor" in str(x.type) for x in r)]
    if not returns:
        return False
    return all(x.alias_info is not None and not x.alias_info.is_write
               for r in returns for x in r)


def operator_counts(
    contestant: Contestant,
    x: torch.Tensor,
    mode: str,
    *,
    launching_only: bool = False,
) -> dict[str, int]:
    """The ATen operators one call of ``contestant`` runs, with their counts.

    One untimed call first (lazy initialisation), then one profiled call as
    the benchmark times it: ``forward`` under :func:`torch.inference_mode`,
    ``forward_backward`` with ``out.backward(grad_output)`` (a fixed tensor of
    ones) into the inputs and the parameters.

    Args:
        contestant: from :func:`attnlib.bench.make_contestants`.
        x: input ``(batch, num_tokens, d_model)`` on the contestant's device.
        mode: ``"forward"`` or ``"forward_backward"``.
        launching_only: leave out the view operators (:func:`is_view_operator`).

    Returns:
        A dict from operator name (``"aten::linear"``) to its count, sorted by name.

    Raises:
        TypeError: ``contestant`` is not a :class:`Contestant`, or ``x`` is not
            a tensor.
        ValueError: unknown ``mode``.
    """
    if not isinstance(contestant, Contestant):
        raise TypeError(f"contestant must be a Contestant, got {type_name(contestant)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    inputs = contestant.make_inputs(x)

    def call() -> None:
        for t in (*contestant.params, *inputs):
            t.grad = None
        if mode == "forward":
            with torch.inference_mode():
                contestant.fn(*inputs)
        else:
            out = contestant.fn(*inputs)
            out.backward(torch.ones_like(out))

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    for t in (*contestant.params, *inputs):
        t.grad = None
    counts = Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    if launching_only:
        counts = Counter({k: v for k, v in counts.items() if not is_view_operator(k)})
    return dict(sorted(counts.items()))


def _difference(a: dict[str, int], b: dict[str, int]) -> dict[str, list[int]]:
    return {k: [a.get(k, 0), b.get(k, 0)] for k in sorted(set(a) | set(b))
            if a.get(k, 0) != b.get(k, 0)}


def operator_parity(
    contestants: dict[str, Contestant],
    x: torch.Tensor,
    *,
    modes: tuple[str, ...] = MODES,
    name: str = "attnlib",
    floor: str = "bare_kernels",
) -> dict[str, Any]:
    """Compare the ATen operators of ``name`` and ``floor``, per mode.

    Operators that launch a kernel must agree in name and count, apart from
    those of the query/key/value projection (:data:`PROJECTION_OPERATORS`):
    attnlib's layer keeps separate ``W_query``, ``W_key`` and ``W_value``
    parameters where the bare kernels hold one packed weight, so it runs three
    GEMMs in ``forward`` and concatenates the weights once per training step.
    Everything else (no upcast, no mask built, no copy of activations) must
    be the bare kernels'. View operators (:func:`is_view_operator`) are
    reported but may differ.

    Why it matters: on an H200 in bfloat16 (b=4, d=768, h=12) attnlib took
    1.45x the bare kernels' time forward at N=1024 and 1.13x at N=4096,
    float32 1.05x and 1.01x, while on the CPU the two launched the same
    kernels in either dtype (before the fix: two ``torch.cat`` of the weights
    in ``forward_backward``, and views). Such ratios fit one fixed host cost
    per call (Python, about 30 us there), which a GPU's short bfloat16 call
    exposes and its float32 call hides; the operator counts show which part
    of a gap is work on the device and which is launch overhead.

    Args:
        contestants: from :func:`attnlib.bench.make_contestants`, holding
            ``name`` and ``floor``.
        x: input ``(batch, num_tokens, d_model)``.
        modes: which modes to profile.
        name: the contestant checked. Default ``"attnlib"``.
        floor: the contestant it must match. Default ``"bare_kernels"``.

    Returns:
        A dict with ``dtype`` (str), ``device`` (str), ``num_tokens`` (int)
        and ``modes``: one dict per mode with ``mode``, ``launching`` (the
        number of launching operators ``name`` runs), ``same_launching``
        (True when both run the same launching operators, each as often),
        ``same_all`` (True when all operators, views included, agree),
        ``launching_difference`` and ``view_difference`` (operator name ->
        ``[count in name, count in floor]`` where they differ), and ``passed``
        (the launching operators differ at most in the QKV projection's,
        :data:`PROJECTION_OPERATORS`).

    Raises:
        KeyError: ``name`` or ``floor`` is not among ``contestants``.
        TypeError, ValueError: as :func:`operator_counts`.
    """
    for key in (name, floor):
        if key not in contestants:
            raise KeyError(f"operator_parity needs the contestant {key!r}; got {list(contestants)}")
    results = []
    for mode in modes:
        ours, theirs = (operator_counts(contestants[k], x, mode) for k in (name, floor))
        difference = _difference(ours, theirs)
        launching = {k: v for k, v in difference.items() if not is_view_operator(k)}
        results.append({
            "mode": mode,
            "launching": sum(v for k, v in ours.items() if not is_view_operator(k)),
            "same_launching": not launching,
            "same_all": not difference,
            "launching_difference": launching,
            "view_difference": {k: v for k, v in difference.items() if k not in launching},
            "passed": set(launching) <= PROJECTION_OPERATORS,
        })
    return {"name": name, "floor": floor, "dtype": str(x.dtype).replace("torch.", ""),
            "device": str(x.device), "num_tokens": int(x.shape[1]), "modes": results}


def format_operator_parity(parity: dict[str, Any]) -> str:
    """:func:`operator_parity`'s result as ``PASS``/``FAIL`` lines, one per mode."""
    lines = [f"Operators (torch.profiler, {parity['dtype']}, {parity['device']}, "
             f"N={parity['num_tokens']}): {parity['name']} against {parity['floor']}"]
    for r in parity["modes"]:
        if r["same_all"]:
            how = "the same ATen operators, views included"
        elif r["same_launching"]:
            views = ", ".join(f"{k.removeprefix('aten::')} {a}/{b}"
                              for k, (a, b) in r["view_difference"].items())
            how = f"the same launching operators; views differ ({views})"
        elif r["passed"]:
            how = "the same launching operators apart from the QKV projection's: " + ", ".join(
                f"{k.removeprefix('aten::')} {a}/{b}"
                for k, (a, b) in r["launching_difference"].items())
        else:
            how = "different launching operators: " + ", ".join(
                f"{k.removeprefix('aten::')} {a}/{b}"
                for k, (a, b) in r["launching_difference"].items())
        lines.append(f"{'PASS' if r['passed'] else 'FAIL'}  {r['mode']:<16} "
                     f"{r['launching']} launching operators: {how}")
    return "\n".join(lines)
