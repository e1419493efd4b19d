"""Running a learner's Triton kernel for chapter 11's checkers (``attnlib.exercises.kernel``):
where it can run, whether it is a kernel that compiled Triton would accept, the launch,
and which addresses it read.

A kernel runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set
before Triton's first import) or compiled on CUDA tensors. Before any launch the
kernel's code is read for Python globals and plain functions, which the interpreter
runs but Triton's compiler refuses. Under the interpreter every ``tl.load`` is
recorded, so that a checker can tell which reads left the tensors. Triton is imported
only when a function here runs.

Private to ``attnlib.exercises``; it builds on :mod:`attnlib.exercises._common`.
"""

from __future__ import annotations

import contextlib
import dis
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .._validation import type_name
from ..flash_triton import import_triton, imported_interpreted
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    probe_device,
    require_callable,
)

__all__ = ["kernel_device", "require_kernel", "kernel_name", "launch", "reads_outside"]


def kernel_device(device: torch.device | str | None) -> torch.device:
    """Where the learner's kernel can run: the CPU under Triton's interpreter, or CUDA.

    Args:
        device: the checker's ``device`` argument; None picks the CPU under the
            interpreter, else CUDA where it exists.

    Returns:
        The device to put the probes on.

    Raises:
        TypeError: ``device`` is not a device, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.
        ImportError: Triton is not installed.
        RuntimeError: Triton was imported without ``TRITON_INTERPRET=1`` and there
            is no CUDA GPU, or ``device`` asks for the CPU in that case.
    """
    triton = import_triton()
    interpreted = imported_interpreted(triton)
    if device is None:
        if interpreted:
            return torch.device("cpu")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = probe_device(device)
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "a Triton kernel runs on CPU tensors only under Triton's interpreter: set "
            "os.environ['TRITON_INTERPRET'] = '1' before anything imports triton (at the top "
            "of the notebook; then restart the kernel), or run on a CUDA GPU"
        )
    return device


def require_kernel(kernel: object, what: str) -> None:
    """Refuse anything but a function decorated with ``@triton.jit`` that compiled
    Triton would accept.

    Args:
        kernel: the learner's answer.
        what: how a message names the expected kernel, such as ``"a log-sum-exp
            kernel(x_ptr, ...)"``.

    Raises:
        CheckFailed: ``kernel`` is a plain Python function (the message says to add
            ``@triton.jit``), not a function at all, or a kernel that reads a Python
            global or calls a plain function, which only the interpreter runs.
    """
    # Triton ships no type hints (no py.typed): both classes are Any to mypy.
    from triton.runtime.interpreter import InterpretedFunction  # type: ignore[import-untyped]
    from triton.runtime.jit import JITFunction  # type: ignore[import-untyped]

    if isinstance(kernel, (JITFunction, InterpretedFunction)):
        _refuse_python_globals(kernel)
        return
    if callable(kernel) and not isinstance(kernel, type):
        raise CheckFailed(
            f"expected {what}, a Triton kernel, but got the plain Python function "
            f"{answer_name(kernel, 'fn')}: put @triton.jit on the line above its def, run "
            "that cell again, and pass the decorated function."
        )
    require_callable(kernel, what)  # raises: a string, a tensor, a class, ...
    raise CheckFailed(f"expected {what}, a function decorated with @triton.jit, "
                      f"got {type_name(kernel)}")


def _is_jitted(value: object) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(value, (JITFunction, InterpretedFunction))


def _allowed_in_a_kernel(value: object) -> bool:
    """Whether compiled Triton lets a kernel read the global ``value``: a module, a
    ``@triton.jit`` function, a ``tl.constexpr``, a dtype or anything of
    ``triton.language`` (the rule of Triton's code generator, which the interpreter
    does not apply)."""
    import triton.language as tl  # type: ignore[import-untyped]

    return (isinstance(value, (types.ModuleType, tl.constexpr, tl.dtype)) or _is_jitted(value)
            or bool(getattr(value, "__triton_builtin__", False))
            or str(getattr(value, "__module__", "") or "").startswith("triton."))


def _global_names(code: types.CodeType) -> Iterator[str]:
    """The global names ``code`` (and any code nested in it) reads."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            yield str(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _global_names(constant)


def _refuse_python_globals(kernel: Any) -> None:
    """Refuse a kernel (or a ``@triton.jit`` function it calls) that reads a Python global
    other than a module, a jitted function or a ``tl.constexpr``.

    Triton's interpreter runs the kernel as Python and lets it read any global, such as
    ``LOG2_E = math.log2(math.e)``; the compiler refuses it (a ``CompilationError``
    naming a global that is not a constexpr), so such a kernel would fail on a GPU.
    """
    seen: set[int] = set()
    pending = [kernel]
    while pending:
        jitted = pending.pop()
        fn = getattr(jitted, "fn", jitted)
        if id(fn) in seen or not isinstance(getattr(fn, "__code__", None), types.CodeType):
            continue
        seen.add(id(fn))
        namespace = getattr(fn, "__globals__", {})
        for name in dict.fromkeys(_global_names(fn.__code__)):
            if name not in namespace:
                continue  # a builtin such as range or float
            value = namespace[name]
            if _is_jitted(value):
                pending.append(value)
                continue
            if _allowed_in_a_kernel(value):
                continue
            where = ("" if jitted is kernel else
                     f" (in {answer_name(fn, 'a helper')}, which {kernel_name(kernel)} calls)")
            kind = ("calls the plain Python function" if callable(value)
                    else "reads the Python global")
            raise CheckFailed(
                f"{kernel_name(kernel)} {kind} {name} ({type_name(value)}) inside the "
                f"kernel{where}. Triton's interpreter allows that, but the compiler accepts "
                "only literals, arguments, tl.constexpr globals and @triton.jit functions "
                "there, so on a GPU the kernel fails to compile. See the comment beside "
                "log2(e) in the row-softmax kernel of 'Triton's model: programs and blocks'.")


def kernel_name(kernel: Any) -> str:
    """The name a message calls the learner's kernel by: its Python function's name
    (``"logsumexp_kernel"``), or ``"kernel"`` where it has none."""
    return answer_name(getattr(kernel, "fn", kernel), "kernel")


@contextlib.contextmanager
def _recorded_reads(interpreted: bool) -> Iterator[list[Any]]:
    """While the block runs, the addresses of every lane Triton's interpreter loads (its
    mask True), one NumPy array per ``tl.load``; nothing is recorded for a compiled
    kernel, or where this Triton's interpreter has no ``create_masked_load`` to watch."""
    reads: list[Any] = []
    try:
        from triton.runtime import interpreter  # type: ignore[import-untyped]

        builder = interpreter.interpreter_builder
        original = builder.create_masked_load
    except (ImportError, AttributeError):
        interpreted = False
    if not interpreted:
        yield reads
        return
    import numpy as np

    def recording(ptrs: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # the record must never break the load
            addresses = np.asarray(ptrs.data)
            lanes = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
            reads.append(addresses[lanes].astype(np.uint64))
        return original(ptrs, mask, *args, **kwargs)

    patched_before = "create_masked_load" in vars(builder)
    builder.create_masked_load = recording
    try:
        yield reads
    finally:
        if patched_before:
            builder.create_masked_load = original
        else:
            del builder.create_masked_load


def launch(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...],
            kwargs: dict[str, Any], what: str) -> list[Any]:
    """Run ``kernel[grid](*args, **kwargs)``; an error in it becomes a CheckFailed.

    Triton's interpreter wraps an exception raised inside a kernel in its own
    ``InterpreterError``; the learner's exception (a ``NotImplementedError`` from
    the stub, a shape error from ``tl.store``) is reported instead.

    Args:
        kernel: the ``@triton.jit`` function (checked by :func:`require_kernel`).
        grid: the launch grid, such as ``(num_rows,)``.
        args: the kernel's positional arguments, tensors on one device.
        kwargs: its keyword arguments (the ``tl.constexpr`` block sizes).
        what: the launch as a message shows it.

    Returns:
        Under the interpreter, the addresses the kernel loaded, one NumPy array of
        uint64 per ``tl.load`` (see :func:`_recorded_reads`); for a compiled kernel
        an empty list.

    Raises:
        CheckFailed: the kernel raised; the message names its exception.
    """
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    reads: list[Any] = []

    def run() -> None:
        try:
            with warnings.catch_warnings():  # NumPy's overflow warnings: the check explains
                warnings.simplefilter("ignore", RuntimeWarning)
                with _recorded_reads(not on_gpu) as recorded:
                    kernel[grid](*args, **kwargs)
                reads.extend(recorded)
            if on_gpu:
                torch.cuda.synchronize()
        except Exception as exc:
            cause = exc.__cause__
            if type(exc).__name__ == "InterpreterError" and isinstance(cause, Exception):
                raise cause from None
            raise

    call_answer(run, what=what)
    return reads


def reads_outside(reads: list[Any], tensors: list[torch.Tensor]) -> Any:
    """The addresses in ``reads`` outside every tensor of ``tensors``, sorted.

    Args:
        reads: what :func:`launch` returned, NumPy arrays of byte addresses.
        tensors: the tensors the kernel may read (each buffer it was given).

    Returns:
        A 1-D NumPy array of uint64 addresses, empty when every read stays inside
        the tensors.
    """
    import numpy as np

    if not reads:
        return np.zeros(0, dtype=np.uint64)
    addresses = np.concatenate(reads)
    inside = np.zeros(addresses.shape, dtype=bool)
    for tensor in tensors:
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        inside |= (addresses >= start) & (addresses < end)
    return np.sort(addresses[~inside])
