"""Running ``P`` processes on this machine, and chapter 12's measurement with them (see
:mod:`attnlib.distributed`)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .._validation import (
    check_bool,
    check_positive_int,
    type_name,
)
from ..bench import peak_memory_bytes
from ._ring import RingStats, ring_attention
from ._sharding import (
    DEFAULT_BLOCK_SIZE,
    check_layout,
    check_split,
    shard_sequence,
    unshard_sequence,
)

# ---------------------------------------------------------------------------------------
# Running P processes on this machine


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, backend: str, num_threads: int,
               timeout: float, fn: Callable[..., Any], args: tuple[Any, ...], path: str) -> None:
    """One worker: join the group on 127.0.0.1, run ``fn``, save its result or error."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(num_threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        result = {"result": fn(rank, world_size, *args)}
    except BaseException:  # reported to the parent, which raises it
        # The time tells the parent which rank failed first: the others' errors (a closed
        # connection, say) may be consequences. Exit without waiting for stuck ranks.
        _leave({"error": traceback.format_exc(), "time": time.time()}, path, 1)
    dist.destroy_process_group()
    _leave(result, path, 0)


def _leave(outcome: dict[str, Any], path: str, code: int) -> None:
    """Save ``outcome`` and end the process at once: the interpreter's teardown of torch
    would add a few tenths of a second to every run and has nothing left to do."""
    torch.save(outcome, path)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                 timeout: float = 120.0, num_threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined in a group.

    The processes are started with the ``"spawn"`` method of ``torch.multiprocessing``
    (so ``fn`` must be importable: a module-level function, not one defined in a notebook),
    find each other on ``127.0.0.1`` at a free port (``MASTER_ADDR``, ``MASTER_PORT``),
    call ``torch.distributed.init_process_group(backend)``, run ``fn`` and return its
    result through a file. Each uses ``num_threads`` threads.

    Args:
        fn: called as ``fn(rank, world_size, *args)`` inside the group; its return value
            must be picklable (tensors are).
        world_size: the number of processes, ``P``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank: rank ``r`` uses
            ``cuda:r``).
        timeout: seconds before the processes are stopped and an error raised; also the
            process group's timeout.
        num_threads: ``torch.set_num_threads`` in each process.

    Returns:
        ``[fn's result on rank 0, ..., on rank P - 1]``.

    Raises:
        TypeError: ``fn`` is not callable or a count is not an int.
        ValueError: ``world_size`` or ``num_threads`` is below 1; unknown ``backend``.
        RuntimeError: a rank raised (the traceback of the first to fail is in the
            message; the others are stopped) or the run took longer than ``timeout``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type_name(fn)}")
    world_size = check_positive_int("world_size", world_size)
    num_threads = check_positive_int("num_threads", num_threads)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    context = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        paths = [os.path.join(folder, f"rank{r}.pt") for r in range(world_size)]
        port = _free_port()
        processes = [context.Process(target=_rank_main, daemon=True, args=(
            r, world_size, port, backend, num_threads, timeout, fn, args, paths[r]))
            for r in range(world_size)]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        while any(p.is_alive() for p in processes):
            stopped = any(p.exitcode not in (None, 0) for p in processes)
            if stopped or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        outcomes: list[Any] = [torch.load(p, weights_only=False) if os.path.exists(p)
                               else None for p in paths]
    failed = [(outcome["time"], r) for r, outcome in enumerate(outcomes)
              if outcome is not None and "error" in outcome]
    if failed:
        first = min(failed)[1]
        raise RuntimeError(f"rank {first} of {world_size} failed:\n"
                           f"{outcomes[first]['error']}")
    if any(outcome is None for outcome in outcomes):
        raise RuntimeError(f"the {world_size} processes did not finish within {timeout} s "
                           f"(exit codes {[p.exitcode for p in processes]})")
    return [outcome["result"] for outcome in outcomes]


# ---------------------------------------------------------------------------------------
# The chapter's measurement


def demo_inputs(num_tokens: int, *, batch: int = 1, num_heads: int = 4, head_dim: int = 64,
                dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded ``(query, key, value, grad_out)``, each ``(batch, num_heads, num_tokens,
    head_dim)``: drawn in float64 from ``torch.Generator().manual_seed(seed)`` and cast to
    ``dtype``, so every process (and the notebook) builds the same tensors.

    Raises:
        TypeError, ValueError: a size is not a positive int.
    """
    shape = [check_positive_int(name, v) for name, v in (
        ("batch", batch), ("num_heads", num_heads), ("num_tokens", num_tokens),
        ("head_dim", head_dim))]
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
                 for _ in range(4))


def _demo_run(rank: int, world_size: int, group: Any, tensors: tuple[torch.Tensor, ...],
              config: dict[str, Any]) -> dict[str, Any]:
    """Every case on one group of ``world_size`` ranks: forward, backward, timed, counted."""
    results: dict[str, Any] = {"cases": {}}
    for is_causal, layout in config["cases"]:
        q, k, v, g = (shard_sequence(t, rank, world_size, layout) for t in tensors)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        stats = RingStats()
        kwargs = {"group": group, "layout": layout, "block_size": config["block_size"],
                  "stats": stats}
        dist.barrier(group)
        start = time.perf_counter()
        out = ring_attention(q, k, v, is_causal, **kwargs)
        forward_seconds = time.perf_counter() - start
        start = time.perf_counter()
        out.backward(g)
        results["cases"][(is_causal, layout)] = {
            "output": out.detach(), "grads": (q.grad, k.grad, v.grad), "stats": stats,
            "forward_seconds": forward_seconds,
            "backward_seconds": time.perf_counter() - start}
    if config["measure_memory"]:
        is_causal, layout = config["cases"][0]
        q, k, v = (shard_sequence(t, rank, world_size, layout) for t in tensors[:3])
        results["input_bytes"] = sum(t.numel() * t.element_size() for t in (q, k, v))
        with torch.no_grad():
            results["peak_bytes"] = peak_memory_bytes(lambda: ring_attention(
                q, k, v, is_causal, group=group, layout=layout,
                block_size=config["block_size"]), "cpu")
    return results


def _demo_worker(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """One process of :func:`run_ring_demo`: a run on ranks ``0 .. P-1`` for each ``P``."""
    tensors = demo_inputs(
        config["num_tokens"], batch=config["batch"], num_heads=config["num_heads"],
        head_dim=config["head_dim"], dtype=config["dtype"], seed=config["seed"])
    warm = torch.ones(1, 1, 2, 2, requires_grad=True)  # the first backward pays start-up
    ring_attention(warm, warm, warm).sum().backward()
    results: dict[Any, Any] = {}
    for size in config["world_sizes"]:
        # Every process takes part in creating a group, members or not.
        group = None if size == world_size else dist.new_group(list(range(size)))
        if rank < size:
            results[size] = _demo_run(rank, size, group, tensors, config)
        dist.barrier()
    if config["try_context_parallel"]:
        query, key, value = tensors[:3]
        results["context_parallel"] = _try_context_parallel(query, key, value, world_size)
    return results


def _try_context_parallel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          world_size: int) -> str:
    """Run torch's ``context_parallel`` on these tensors; return what happened, in words."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(query.device.type, (world_size,))
    buffers = [query.clone(), key.clone(), value.clone()]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            # Looked up inside the context: context_parallel replaces F's attribute.
            F.scaled_dot_product_attention(buffers[0], buffers[1], buffers[2], is_causal=True)
    except Exception as exc:  # the outcome is the result
        return f"{type_name(exc)}: {exc}"
    return "ran"


def run_ring_demo(world_sizes: Sequence[int] = (1, 2, 4), *, num_tokens: int = 2048,
                  batch: int = 1, num_heads: int = 2, head_dim: int = 64,
                  dtype: torch.dtype = torch.float32,
                  cases: Sequence[tuple[bool, str]] = ((False, "contiguous"),),
                  block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                  measure_memory: bool = True, try_context_parallel: bool = False,
                  timeout: float = 180.0) -> dict[str, Any]:
    """Run :func:`ring_attention` on ``P`` gloo processes for each ``P`` in ``world_sizes``.

    One :func:`run_on_ranks` call starts ``max(world_sizes)`` processes (one thread each);
    the run for ``P`` uses ranks ``0 .. P-1`` in a group of their own. Every process builds
    :func:`demo_inputs` (seeded, the same everywhere) and takes its shard; for each
    ``(is_causal, layout)`` in ``cases`` it runs the forward pass, then the backward pass
    with ``grad_out`` as the output's gradient. If asked, it then measures the peak memory
    of one forward pass of the first case with :func:`attnlib.bench.peak_memory_bytes`
    (the allocations PyTorch's CPU allocator records: a deterministic count, not the
    process's resident size), and tries ``torch.distributed.tensor.experimental.
    context_parallel`` on the whole sequence with all the processes.

    Returns:
        ``{"runs": {P: run}, "context_parallel": outcome}``. Each ``run["cases"]`` maps
        ``(is_causal, layout)`` to ``"output"`` (the whole ``(batch, num_heads,
        num_tokens, head_dim)`` output, unsharded), ``"grads"`` (``(grad_query,
        grad_key, grad_value)``, unsharded), ``"stats"`` (a :class:`RingStats` per rank),
        ``"forward_seconds"`` and ``"backward_seconds"`` (per rank; they vary from run to
        run). With ``measure_memory``, ``run["peak_bytes"]`` (per rank, above its inputs)
        and ``run["input_bytes"]`` (per rank: its query, key and value shards). The
        outcome is ``None``, or per rank ``"ran"`` or the error ``context_parallel``
        raised.

    Raises:
        TypeError, ValueError: bad sizes or ``cases``, or a length that does not split.
        RuntimeError: a process failed or the run timed out.
    """
    if isinstance(world_sizes, (int, str)) or not world_sizes:
        raise TypeError(f"world_sizes must be a non-empty sequence of ints, got {world_sizes!r}")
    world_sizes = tuple(check_positive_int("world_size", p) for p in world_sizes)
    cases = tuple((check_bool("is_causal", c), check_layout(lay)) for c, lay in cases)
    if not cases:
        raise ValueError("cases must name at least one (is_causal, layout) pair")
    for size in world_sizes:
        for _, layout in cases:
            check_split(num_tokens, 0, size, layout)
    for name, value in (("batch", batch), ("num_heads", num_heads), ("head_dim", head_dim)):
        check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    config = {"num_tokens": num_tokens, "batch": batch, "num_heads": num_heads,
              "head_dim": head_dim, "dtype": dtype, "cases": cases, "seed": seed,
              "world_sizes": world_sizes,
              "block_size": check_positive_int("block_size", block_size),
              "measure_memory": check_bool("measure_memory", measure_memory),
              "try_context_parallel": check_bool("try_context_parallel", try_context_parallel)}
    ranks = run_on_ranks(_demo_worker, max(world_sizes), config, timeout=timeout)
    runs: dict[int, dict[str, Any]] = {}
    for size in world_sizes:
        members = [r[size] for r in ranks[:size]]
        run: dict[str, Any] = {"cases": {}}
        for case in cases:
            per_rank = [m["cases"][case] for m in members]
            run["cases"][case] = {
                "output": unshard_sequence([r["output"] for r in per_rank], case[1]),
                "grads": tuple(unshard_sequence([r["grads"][i] for r in per_rank], case[1])
                               for i in range(3)),
                **{name: [r[name] for r in per_rank]
                   for name in ("stats", "forward_seconds", "backward_seconds")}}
        for name in ("peak_bytes", "input_bytes"):
            if name in members[0]:
                run[name] = [m[name] for m in members]
        runs[size] = run
    outcome = [r["context_parallel"] for r in ranks] if try_context_parallel else None
    return {"runs": runs, "context_parallel": outcome}
