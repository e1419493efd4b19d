"""Chapter 13's count of what one decoding step costs per cached token, for
chapter 11's roofline.

At each decoding step a new token's queries attend to every cached token. Per
cached token, a layer does a fixed number of FLOPs and reads a fixed number of
bytes of cache from HBM, so their ratio, the *arithmetic intensity* of decoding
attention, does not depend on the context length. :func:`decode_cost` counts
both for multi-head, grouped-query and multi-head latent attention (MLA, naive
and absorbed), and :func:`attainable_flops` places an intensity on the roofline
of :data:`H100_SXM` (NVIDIA's datasheet numbers).

Only the attention over the cache is counted: not the projections of the new
token, nor the model's weights, whose reads are shared by every sequence of a
batch while each sequence reads its own cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import check_positive_int, type_name

__all__ = [
    "DECODE_ATTENTION_KINDS",
    "DEEPSEEK_V3_ATTENTION",
    "H100_SXM",
    "DecodeCost",
    "decode_cost",
    "attainable_flops",
]

#: The kinds :func:`decode_cost` counts.
DECODE_ATTENTION_KINDS = ("mha", "gqa", "mla_naive", "mla_absorbed")

#: DeepSeek-V3's attention shapes, from ``deepseek-ai/DeepSeek-V3``'s
#: ``config.json``: 128 heads, queries and keys of 128 + 64 numbers (the part
#: without position and the RoPE part), values of 128, a latent of 512.
DEEPSEEK_V3_ATTENTION = {
    "num_heads": 128,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "kv_lora_rank": 512,
}

#: An NVIDIA H100 SXM by its datasheet, the dense bfloat16 Tensor Core rate (half
#: the 1979 TFLOP/s quoted "with sparsity") and the HBM3 bandwidth, as chapter 11
#: uses them.
H100_SXM = {"peak_flops": 989.5e12, "hbm_bytes_per_second": 3.35e12}


@dataclass(frozen=True)
class DecodeCost:
    """What one layer does and reads per cached token, for one new query token.

    Attributes:
        kind: one of :data:`DECODE_ATTENTION_KINDS`.
        flops_per_head: FLOPs per cached token and query head (a multiply-add
            counts 2).
        flops: FLOPs per cached token, all heads: ``num_heads * flops_per_head``.
        cache_bytes: bytes of cache read per cached token.
    """

    kind: str
    flops_per_head: int
    flops: int
    cache_bytes: int

    @property
    def intensity(self) -> float:
        """The FLOPs per byte of cache read, ``flops / cache_bytes``."""
        return self.flops / self.cache_bytes


def decode_cost(
    kind: str,
    *,
    num_heads: int,
    qk_nope_head_dim: int,
    v_head_dim: int,
    qk_rope_head_dim: int = 0,
    num_kv_groups: int | None = None,
    kv_lora_rank: int | None = None,
    bytes_per_number: int = 2,
) -> DecodeCost:
    """FLOPs and cache bytes per cached token of one decoding step of one layer.

    A new token's query heads attend to ``num_tokens`` cached tokens; every
    count here is per cached token, so the step costs ``num_tokens`` times it.
    With ``d_qk = qk_nope_head_dim + qk_rope_head_dim``:

    * ``"mha"``: each head reads its key (``d_qk``) and value (``v_head_dim``)
      and does ``2 d_qk`` FLOPs for the score and ``2 v_head_dim`` for the
      weighted value: ``2 (d_qk + v_head_dim)`` per head, and as many numbers
      read. The intensity is ``1 / bytes_per_number`` FLOP per byte.
    * ``"gqa"``: the same FLOPs, but only ``num_kv_groups`` key/value heads are
      read, each shared by ``num_heads / num_kv_groups`` query heads.
    * ``"mla_naive"``: the cache holds the latent (``kv_lora_rank``) and the
      shared RoPE key (``qk_rope_head_dim``); each head first up-projects the
      latent to its key part and value (``2 kv_lora_rank (qk_nope_head_dim +
      v_head_dim)`` FLOPs), then attends as ``"mha"``.
    * ``"mla_absorbed"``: the up-projections moved onto the query and the
      output (computed once per step, not per cached token), each head attends
      to the latent directly, multi-query style: ``2 (kv_lora_rank +
      qk_rope_head_dim)`` FLOPs for the score and ``2 kv_lora_rank`` for the
      weighted latent.

    Args:
        kind: one of :data:`DECODE_ATTENTION_KINDS`.
        num_heads: keyword-only; query heads.
        qk_nope_head_dim: keyword-only; query/key numbers per head without
            RoPE (all of them for a model without MLA's split).
        v_head_dim: keyword-only; value numbers per head.
        qk_rope_head_dim: keyword-only; the RoPE part of queries and keys.
            Default 0.
        num_kv_groups: keyword-only; key/value heads, for ``"gqa"`` (required
            there, and must divide ``num_heads``); ignored otherwise.
        kv_lora_rank: keyword-only; the latent's size, required for the MLA
            kinds.
        bytes_per_number: keyword-only; 2 for bfloat16 (default), 1 for fp8.

    Returns:
        A :class:`DecodeCost`.

    Raises:
        TypeError: ``kind`` is not a str, or a size is not an int.
        ValueError: ``kind`` is not one of :data:`DECODE_ATTENTION_KINDS`; a
            size is not positive (``qk_rope_head_dim`` may be 0); ``"gqa"``
            without ``num_kv_groups`` or with one that does not divide
            ``num_heads``; an MLA kind without ``kv_lora_rank``.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1 and appendix C
    (MLA, and absorbing ``W^UK`` into the query and ``W^UV`` into the output);
    Ainslie et al. (2023), "GQA", section 2.2; Williams, Waterman and Patterson
    (2009), "Roofline" (arithmetic intensity).
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type_name(kind)}")
    if kind not in DECODE_ATTENTION_KINDS:
        raise ValueError(f"kind must be one of {DECODE_ATTENTION_KINDS}, got kind={kind!r}")
    for name, value in (("num_heads", num_heads), ("qk_nope_head_dim", qk_nope_head_dim),
                        ("v_head_dim", v_head_dim), ("bytes_per_number", bytes_per_number)):
        check_positive_int(name, value)
    if isinstance(qk_rope_head_dim, bool) or not isinstance(qk_rope_head_dim, int):
        raise TypeError(f"qk_rope_head_dim must be an int, got {type_name(qk_rope_head_dim)}")
    if qk_rope_head_dim < 0:
        raise ValueError(f"qk_rope_head_dim must be >= 0, got qk_rope_head_dim={qk_rope_head_dim}")
    d_qk = qk_nope_head_dim + qk_rope_head_dim
    if kind in ("mha", "gqa"):
        key_value_heads = num_heads
        if kind == "gqa":
            if num_kv_groups is None:
                raise ValueError("kind='gqa' needs num_kv_groups")
            check_positive_int("num_kv_groups", num_kv_groups)
            if num_heads % num_kv_groups != 0:
                raise ValueError(
                    f"num_heads={num_heads} is not divisible by num_kv_groups={num_kv_groups}"
                )
            key_value_heads = num_kv_groups
        per_head = 2 * (d_qk + v_head_dim)  # score q.k, then weight * value
        numbers = key_value_heads * (d_qk + v_head_dim)  # a key and a value per KV head
    else:
        if kv_lora_rank is None:
            raise ValueError(f"kind={kind!r} needs kv_lora_rank")
        check_positive_int("kv_lora_rank", kv_lora_rank)
        numbers = kv_lora_rank + qk_rope_head_dim  # the latent and the shared RoPE key
        if kind == "mla_naive":
            up_projection = 2 * kv_lora_rank * (qk_nope_head_dim + v_head_dim)
            per_head = up_projection + 2 * (d_qk + v_head_dim)
        else:  # scores against [latent, rope key], then the weighted latent
            per_head = 2 * (kv_lora_rank + qk_rope_head_dim) + 2 * kv_lora_rank
    return DecodeCost(kind, per_head, num_heads * per_head, bytes_per_number * numbers)


def attainable_flops(
    intensity: float,
    *,
    peak_flops: float = H100_SXM["peak_flops"],
    bytes_per_second: float = H100_SXM["hbm_bytes_per_second"],
) -> float:
    """The roofline: ``min(peak_flops, intensity * bytes_per_second)``, in FLOP/s.

    Args:
        intensity: FLOPs per byte of memory traffic, > 0.
        peak_flops: keyword-only; the arithmetic peak. Default: the H100 SXM's
            dense bfloat16 rate by its datasheet (:data:`H100_SXM`).
        bytes_per_second: keyword-only; the memory bandwidth. Default: its
            HBM3's 3.35 TB/s.

    Raises:
        TypeError: an argument is not a real number.
        ValueError: an argument is not positive.

    Source: Williams, Waterman and Patterson (2009), "Roofline: An Insightful
    Visual Performance Model for Multicore Architectures".
    """
    values = (("intensity", intensity), ("peak_flops", peak_flops),
              ("bytes_per_second", bytes_per_second))
    for name, value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a real number, got {type_name(value)}")
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {name}={value}")
    return float(min(peak_flops, intensity * bytes_per_second))
