"""Forward hooks that read and change what a multi-head attention layer computes.

:mod:`attnlib.training` measures heads and cuts them out of a later layer's
inputs with these, inside a model's own forward pass (no copy of the forward):
:func:`recording_heads` reads what each head adds to the output, and
:func:`cutting_inputs` replaces what chosen projections of a block's attention
read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

from .multihead import MultiHeadAttention

__all__ = ["PROJECTIONS", "recording_heads", "cutting_inputs"]

#: The projections of a :class:`attnlib.MultiHeadAttention` that
#: :func:`cutting_inputs` can cut, by the name of what they make.
PROJECTIONS = {"queries": "W_query", "keys": "W_key", "values": "W_value"}


@contextmanager
def recording_heads(attn: MultiHeadAttention, record: list[torch.Tensor]) -> Iterator[None]:
    """While open, each call of ``attn`` appends what each head adds to its output.

    A hook on ``out_proj`` reads the merged heads ``(b, num_tokens, num_heads *
    head_dim)`` and appends ``(b, num_heads, num_tokens, d_out)``: head ``h``'s
    context vectors times its columns of ``W^O`` (summed over the heads and
    plus ``out_proj``'s bias, the attention's output).
    """

    def split(out_proj: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        b, num_tokens, _ = args[0].shape
        context_vec = args[0].view(b, num_tokens, attn.num_heads, attn.head_dim)
        w_out = attn.out_proj.weight.view(-1, attn.num_heads, attn.head_dim)
        # w_out: (d_out, num_heads, head_dim), head h's columns of W^O
        record.append(torch.einsum("bthd,mhd->bhtm", context_vec, w_out))

    handle = attn.out_proj.register_forward_pre_hook(split)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def cutting_inputs(
    block: nn.Module,
    attn: MultiHeadAttention,
    cut: set[str],
    removed: Callable[[], torch.Tensor],
) -> Iterator[list[str]]:
    """While open, ``attn``'s projections named in ``cut`` read ``block.norm_1(x - removed())``.

    ``x`` is ``block``'s input (the residual stream, ``(b, num_tokens, d_model)``);
    the other projections read ``norm_1(x)`` as usual. Yields the list of cut
    projections as they run: a forward that does not call a projection as a
    module (a fused path) leaves it out.
    """
    stream: list[torch.Tensor] = []  # block's input x
    ran: list[str] = []

    def read_without(name: str) -> Callable[..., torch.Tensor]:
        def hook(proj: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor
                 ) -> torch.Tensor:
            ran.append(name)
            norm_1 = block.get_submodule("norm_1")
            cut_out: torch.Tensor = proj.forward(norm_1(stream[-1] - removed()))
            return cut_out  # (b, num_tokens, d_out); .forward, not proj(): no hook again
        return hook

    handles = [block.register_forward_pre_hook(lambda _, args: stream.append(args[0]))]
    handles += [getattr(attn, PROJECTIONS[name]).register_forward_hook(read_without(name))
                for name in sorted(cut)]
    try:
        yield ran
    finally:
        for handle in handles:
            handle.remove()
