"""The Triton kernels of :mod:`attnlib.flash_triton`, as plain Python functions.

They become Triton kernels only in ``_launch._kernels()``, which hands each to
``triton.jit`` with globals of its own in which ``tl`` is ``triton.language``:
this module never imports Triton. A program is one block of rows of one
(batch, head) pair: grid axis 0 picks the block, axis 1 the pair. The tensors are
contiguous ``(batch, heads, num_tokens, head_dim)``, so row ``r`` of pair ``bh``
starts at element ``(bh * num_tokens + r) * HEAD_DIM``. Scores are kept in base-2
units, ``s = q.k * scale * log2(e)``, so that ``exp2(s - m)`` is the softmax's
``exp(x - max)``.

**Grouped-query heads.** The query has ``num_heads`` heads and key and value
``num_heads // GROUP`` (``num_kv_groups``); query head ``h`` reads key/value head
``h // GROUP``. Since ``num_heads`` is a multiple of ``GROUP``, the pair
``bh = b * num_heads + h`` reads the key/value pair ``bh // GROUP``: nothing is
repeated in memory. The dK/dV kernel runs one program per key block of a
key/value head and loops over the ``GROUP`` query heads that read it, so the
group's sum is taken in registers, without atomics.

**Which keys a query sees.** Query ``i`` sits at position ``i + OFFSET``
(``OFFSET`` is 0 when the causal triangle is aligned at the top-left, as torch's
``is_causal``, and ``N_KV - N_Q`` at the bottom-right). With ``IS_CAUSAL`` it
sees keys ``j <= i + OFFSET``; with ``HAS_WINDOW`` also only ``j > i + OFFSET -
WINDOW`` (the last ``WINDOW`` keys, itself included: chapter 9's sliding window).

**Three stages.** For its block, a program splits the tiles of the other
sequence into those it skips (they hold no visible pair), those every pair of
which is visible, run without any mask, and those in between, cut by the
diagonal, the window's edge or the end of the sequence, run with the mask. The
bounds come from ``key_tiles`` (a block of queries) and ``query_tiles`` (a
block of keys): ``[lo, mid_lo)`` masked (the window's edge), ``[mid_lo,
mid_hi)`` unmasked, ``[mid_hi, hi)`` masked (the diagonal and the last, partial
tile); everything outside ``[lo, hi)`` is skipped. ``attnlib.flash_triton``'s
``tile_counts`` computes the same bounds in Python.

**The backward pass** is :func:`attnlib.flash.flash_attention_backward`'s loop, the one
chapter 8's flash attention and ring attention share, with the same formulas: each tile
recomputes ``P = exp2(S - L)`` from the saved log-sum-exp, then ``dP = dO V^T``,
``dS = P * (dP - D)`` with ``D = rowsum(dO * O)`` (``delta_kernel``, as ring attention
computes it), ``dV += P^T dO``, ``dK += dS^T Q`` and ``dQ += dS K``, both times
``scale`` at the end. The PyTorch loop's two sums run here as two kernels, one program
per key block (``grad_key_value_kernel``) and one per query block
(``grad_query_kernel``).

**Sinks.** With ``HAS_SINKS`` each head has a logit ``sink`` (gpt-oss) that joins
the softmax's denominator without a value. The forward starts each row's running
maximum at the sink and its running sum at ``exp2(sink - sink) = 1``, so the
log-sum-exp it saves includes the sink and the backward needs nothing more.

The annotations are the types the arguments have inside a kernel: every
run-time argument is a ``tl.tensor``, a launch constant a ``tl.constexpr``.
Triton ships no type hints, so mypy sees ``tl`` as Any and does not check the
kernels' bodies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the kernels' `tl`; at run time _kernels() supplies it
    import triton.language as tl  # type: ignore[import-untyped]  # no hints


def key_tiles(start_m: tl.tensor, N_KV: tl.tensor, OFFSET: tl.tensor,
              WINDOW: tl.tensor, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
              ) -> tuple[tl.tensor, tl.tensor, tl.tensor, tl.tensor]:
    """(lo, mid_lo, mid_hi, hi): the key tiles of queries start_m .. start_m+BLOCK_M-1."""
    lo = 0  # first key tile any query of the block sees
    mid_lo = 0  # first tile all of whose keys every query sees (window's edge)
    hi = N_KV  # keys past hi are seen by no query of the block
    # last tile with no key past the end, nor (causal) past the first query's position
    mid_hi = (N_KV // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + OFFSET, 0), N_KV)
        full = tl.minimum(tl.maximum(start_m + OFFSET + 1, 0), N_KV)
        mid_hi = (full // BLOCK_N) * BLOCK_N
    if HAS_WINDOW:
        first_seen = tl.maximum(start_m + OFFSET - WINDOW + 1, 0)
        lo = (first_seen // BLOCK_N) * BLOCK_N
        hi = tl.where(first_seen < hi, hi, lo)  # the window lies past the last key
        first_full = tl.maximum(start_m + BLOCK_M + OFFSET - WINDOW, 0)
        mid_lo = ((first_full + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = tl.maximum(mid_hi, mid_lo)
    return lo, mid_lo, mid_hi, hi


def query_tiles(start_n: tl.tensor, N_Q: tl.tensor, N_KV: tl.tensor,
                OFFSET: tl.tensor, WINDOW: tl.tensor, IS_CAUSAL: tl.constexpr,
                HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
                ) -> tuple[tl.tensor, tl.tensor, tl.tensor, tl.tensor]:
    """(lo, mid_lo, mid_hi, hi): the query tiles of keys start_n .. start_n+BLOCK_N-1."""
    lo = 0  # first query tile that sees any key of the block
    mid_lo = 0  # first tile every query of which sees every key (causal: below it)
    hi = N_Q
    mid_hi = (N_Q // BLOCK_M) * BLOCK_M  # last tile with no query past the end
    if IS_CAUSAL:  # query i sees key j when i >= j - OFFSET
        first_seen = tl.maximum(start_n - OFFSET, 0)
        lo = (first_seen // BLOCK_M) * BLOCK_M
        first_full = tl.maximum(start_n + BLOCK_N - 1 - OFFSET, 0)
        mid_lo = ((first_full + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if HAS_WINDOW:  # and when i <= j - OFFSET + WINDOW - 1
        hi = tl.minimum(tl.maximum(start_n + BLOCK_N - OFFSET + WINDOW - 1, 0), N_Q)
        full = tl.minimum(tl.maximum(start_n - OFFSET + WINDOW, 0), N_Q)
        mid_hi = (full // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:  # the keys lie past the last query's position
        hi = tl.where(first_seen < hi, hi, lo)
    # The last key block, if partial, is masked in every tile.
    mid_hi = tl.where(start_n + BLOCK_N > N_KV, 0, mid_hi)
    mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = tl.maximum(mid_hi, mid_lo)
    return lo, mid_lo, mid_hi, hi


def visible_pairs(rows: tl.tensor, keys: tl.tensor, N_KV: tl.tensor, OFFSET: tl.tensor,
                  WINDOW: tl.tensor, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr
                  ) -> tl.tensor:
    """(BLOCK_M, BLOCK_N) bool: which (query, key) pairs of a tile are attended."""
    visible = (keys < N_KV)[None, :]  # keys past the end do not exist
    if IS_CAUSAL:  # key j <= the query's position i + OFFSET
        visible = visible & (keys[None, :] <= rows[:, None] + OFFSET)
    if HAS_WINDOW:  # and among its last WINDOW keys
        visible = visible & (keys[None, :] > rows[:, None] + OFFSET - WINDOW)
    return visible


def key_tile(q: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor, rows: tl.tensor,
             keys: tl.tensor, dims: tl.tensor, qk_scale: tl.tensor, N_KV: tl.tensor,
             OFFSET: tl.tensor, WINDOW: tl.tensor, MASKED: tl.constexpr,
             IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr,
             DOT_PRECISION: tl.constexpr) -> tuple[tl.tensor, tl.tensor, tl.tensor]:
    """K_j, V_j and the scores S_ij (base 2; -inf where not attended) of one key tile."""
    kv_offsets = keys[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_N, HEAD_DIM)
    if MASKED:  # the tile may run past the last key
        key_ok = (keys < N_KV)[:, None]
        k = tl.load(k_ptr + kv_offsets, mask=key_ok, other=0.0)
        v = tl.load(v_ptr + kv_offsets, mask=key_ok, other=0.0)
    else:  # every key exists and is seen: no mask at all
        k = tl.load(k_ptr + kv_offsets)
        v = tl.load(v_ptr + kv_offsets)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        visible = visible_pairs(rows, keys, N_KV, OFFSET, WINDOW, IS_CAUSAL, HAS_WINDOW)
        s = tl.where(visible, s, float("-inf"))
    return k, v, s


def forward_tiles(acc: tl.tensor, row_max: tl.tensor, row_sum: tl.tensor,
                  q: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor, rows: tl.tensor,
                  dims: tl.tensor, qk_scale: tl.tensor, N_KV: tl.tensor,
                  OFFSET: tl.tensor, WINDOW: tl.tensor, lo: tl.tensor, hi: tl.tensor,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr
                  ) -> tuple[tl.tensor, tl.tensor, tl.tensor]:
    """The online softmax over the key tiles lo, lo + BLOCK_N, ... below hi."""
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
        # K_j and V_j, and S_ij = Q_i K_j^T times scale * log2(e): (BLOCK_M, BLOCK_N)
        k, v, s = key_tile(q, k_ptr, v_ptr, rows, keys, dims, qk_scale, N_KV, OFFSET,
                           WINDOW, MASKED, IS_CAUSAL, HAS_WINDOW, HEAD_DIM,
                           DOT_PRECISION)
        new_max = tl.maximum(row_max, tl.max(s, 1))
        shift = new_max
        if MASKED:  # a row that has seen no key yet keeps m = -inf: subtract 0 instead
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp2(s - shift[:, None])  # unnormalised weights
        rescale = tl.exp2(row_max - shift)  # for what was summed under the old max
        row_sum = row_sum * rescale + tl.sum(p, 1)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * rescale[:, None] + pv
        row_max = new_max
    return acc, row_max, row_sum


def forward_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                   sinks_ptr: tl.tensor, out_ptr: tl.tensor, lse_ptr: tl.tensor,
                   qk_scale: tl.tensor, N_Q: tl.tensor, N_KV: tl.tensor,
                   NUM_HEADS: tl.tensor, GROUP: tl.tensor, OFFSET: tl.tensor,
                   WINDOW: tl.tensor, IS_CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr) -> None:
    """O_i and L_i for BLOCK_M query rows: Dao (2023), Algorithm 1, in three stages."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * N * HEAD_DIM may pass 2**31
    kv_bh = bh // GROUP  # the key/value head this query head reads
    q_ptr += bh * N_Q * HEAD_DIM
    out_ptr += bh * N_Q * HEAD_DIM
    lse_ptr += bh * N_Q
    k_ptr += kv_bh * N_KV * HEAD_DIM
    v_ptr += kv_bh * N_KV * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    row_ok = rows < N_Q  # the edge mask: False past the last query
    q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)

    if HAS_SINKS:  # the sink is a key of score `sink` and value 0, seen first
        sink = tl.load(sinks_ptr + bh % NUM_HEADS)  # base 2 already
        row_max = tl.zeros([BLOCK_M], tl.float32) + sink  # m_i
        row_sum = tl.full([BLOCK_M], 1.0, tl.float32)  # l_i = exp2(sink - m_i)
    else:
        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # O_i, not yet divided by l_i
    lo, mid_lo, mid_hi, hi = key_tiles(start_m, N_KV, OFFSET, WINDOW, IS_CAUSAL,
                                       HAS_WINDOW, BLOCK_M, BLOCK_N)
    # Stage 1: the window's edge, masked. Stage 2: the tiles every query sees in
    # full, no mask. Stage 3: the diagonal and the partial last tile, masked.
    acc, row_max, row_sum = forward_tiles(
        acc, row_max, row_sum, q, k_ptr, v_ptr, rows, dims, qk_scale, N_KV, OFFSET,
        WINDOW, lo, mid_lo, True, IS_CAUSAL, HAS_WINDOW, HEAD_DIM, BLOCK_N,
        DOT_PRECISION)
    acc, row_max, row_sum = forward_tiles(
        acc, row_max, row_sum, q, k_ptr, v_ptr, rows, dims, qk_scale, N_KV, OFFSET,
        WINDOW, mid_lo, mid_hi, False, IS_CAUSAL, HAS_WINDOW, HEAD_DIM, BLOCK_N,
        DOT_PRECISION)
    acc, row_max, row_sum = forward_tiles(
        acc, row_max, row_sum, q, k_ptr, v_ptr, rows, dims, qk_scale, N_KV, OFFSET,
        WINDOW, mid_hi, hi, True, IS_CAUSAL, HAS_WINDOW, HEAD_DIM, BLOCK_N,
        DOT_PRECISION)
    # Divide once, at the end (Section 3.1.1). A row that saw no key (nor sink) has
    # l_i = 0 and m_i = -inf: its output stays 0 and its L_i is -inf.
    row_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
    out = (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + q_offsets, out, mask=row_ok[:, None])
    # L_i = m_i + log2(l_i): all the backward needs to rebuild the weights.
    tl.store(lse_ptr + rows, row_max + tl.log2(row_sum), mask=row_ok)


def delta_kernel(out_ptr: tl.tensor, dout_ptr: tl.tensor, delta_ptr: tl.tensor,
                 N_Q: tl.tensor, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr) -> None:
    """D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij for BLOCK_M rows (Algorithm 2)."""
    bh = tl.program_id(1).to(tl.int64)
    out_ptr += bh * N_Q * HEAD_DIM
    dout_ptr += bh * N_Q * HEAD_DIM
    delta_ptr += bh * N_Q
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < N_Q
    offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(dout_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=row_ok)


def grad_key_value_tiles(dk: tl.tensor, dv: tl.tensor, k: tl.tensor, v: tl.tensor,
                         q_ptr: tl.tensor, dout_ptr: tl.tensor, lse_ptr: tl.tensor,
                         delta_ptr: tl.tensor, keys: tl.tensor, dims: tl.tensor,
                         qk_scale: tl.tensor, N_Q: tl.tensor, N_KV: tl.tensor,
                         OFFSET: tl.tensor, WINDOW: tl.tensor, lo: tl.tensor,
                         hi: tl.tensor, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                         HAS_WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr
                         ) -> tuple[tl.tensor, tl.tensor]:
    """dK_j and dV_j summed over the query tiles lo, lo + BLOCK_M, ... below hi."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
        if MASKED:  # the tile may run past the last query
            row_ok = rows < N_Q
            q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
            do = tl.load(dout_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)  # L_i
            d_row = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)  # D_i
        else:
            q = tl.load(q_ptr + q_offsets)
            do = tl.load(dout_ptr + q_offsets)
            lse = tl.load(lse_ptr + rows)
            d_row = tl.load(delta_ptr + rows)
        # A row that saw no key has L = -inf; +inf makes its weights exp2(-inf) = 0.
        lse = tl.where(lse == float("-inf"), float("inf"), lse)
        # P_ij recomputed as the forward computed it: same scores, same mask.
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = visible_pairs(rows, keys, N_KV, OFFSET, WINDOW, IS_CAUSAL, HAS_WINDOW)
            s = tl.where(visible & row_ok[:, None], s, float("-inf"))
        p = tl.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N), the softmax weights
        # dV_j += P^T dO_i
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO_i V_j^T
        ds = p * (dp - d_row[:, None])  # dS = P * (dP - D): the scores' gradient
        # dK_j += dS^T Q_i
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)
    return dk, dv


def grad_key_value_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                          dout_ptr: tl.tensor, lse_ptr: tl.tensor, delta_ptr: tl.tensor,
                          dk_ptr: tl.tensor, dv_ptr: tl.tensor, scale: tl.tensor,
                          qk_scale: tl.tensor, N_Q: tl.tensor, N_KV: tl.tensor,
                          GROUP: tl.tensor, OFFSET: tl.tensor, WINDOW: tl.tensor,
                          IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr) -> None:
    """dK_j and dV_j for BLOCK_N keys of one key/value head, summed over its GROUP
    query heads and their query tiles (Algorithm 2), in three stages: the formulas of
    attnlib.flash.flash_attention_backward."""
    start_n = tl.program_id(0) * BLOCK_N
    kv_bh = tl.program_id(1).to(tl.int64)  # a key/value head: (b, num_kv_groups)
    k_ptr += kv_bh * N_KV * HEAD_DIM
    v_ptr += kv_bh * N_KV * HEAD_DIM
    dk_ptr += kv_bh * N_KV * HEAD_DIM
    dv_ptr += kv_bh * N_KV * HEAD_DIM
    keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    dims = tl.arange(0, HEAD_DIM)
    key_ok = keys < N_KV
    kv_offsets = keys[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_N, HEAD_DIM)
    k = tl.load(k_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
    v = tl.load(v_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo, mid_lo, mid_hi, hi = query_tiles(start_n, N_Q, N_KV, OFFSET, WINDOW, IS_CAUSAL,
                                         HAS_WINDOW, BLOCK_M, BLOCK_N)
    for g in range(0, GROUP):  # the query heads that share this key/value head
        bh = kv_bh * GROUP + g
        q_g = q_ptr + bh * N_Q * HEAD_DIM
        dout_g = dout_ptr + bh * N_Q * HEAD_DIM
        lse_g = lse_ptr + bh * N_Q
        delta_g = delta_ptr + bh * N_Q
        dk, dv = grad_key_value_tiles(
            dk, dv, k, v, q_g, dout_g, lse_g, delta_g, keys, dims, qk_scale, N_Q, N_KV,
            OFFSET, WINDOW, lo, mid_lo, True, IS_CAUSAL, HAS_WINDOW, HEAD_DIM, BLOCK_M,
            DOT_PRECISION)
        dk, dv = grad_key_value_tiles(
            dk, dv, k, v, q_g, dout_g, lse_g, delta_g, keys, dims, qk_scale, N_Q, N_KV,
            OFFSET, WINDOW, mid_lo, mid_hi, False, IS_CAUSAL, HAS_WINDOW, HEAD_DIM,
            BLOCK_M, DOT_PRECISION)
        dk, dv = grad_key_value_tiles(
            dk, dv, k, v, q_g, dout_g, lse_g, delta_g, keys, dims, qk_scale, N_Q, N_KV,
            OFFSET, WINDOW, mid_hi, hi, True, IS_CAUSAL, HAS_WINDOW, HEAD_DIM, BLOCK_M,
            DOT_PRECISION)
    dk = dk * scale  # the scores were Q K^T * scale
    tl.store(dk_ptr + kv_offsets, dk.to(dk_ptr.dtype.element_ty), mask=key_ok[:, None])
    tl.store(dv_ptr + kv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=key_ok[:, None])


def grad_query_tiles(dq: tl.tensor, q: tl.tensor, do: tl.tensor, lse: tl.tensor,
                     d_row: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                     rows: tl.tensor, dims: tl.tensor, qk_scale: tl.tensor,
                     N_KV: tl.tensor, OFFSET: tl.tensor, WINDOW: tl.tensor,
                     lo: tl.tensor, hi: tl.tensor, MASKED: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     DOT_PRECISION: tl.constexpr) -> tl.tensor:
    """dQ_i summed over the key tiles lo, lo + BLOCK_N, ... below hi."""
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        k, v, s = key_tile(q, k_ptr, v_ptr, rows, keys, dims, qk_scale, N_KV, OFFSET,
                           WINDOW, MASKED, IS_CAUSAL, HAS_WINDOW, HEAD_DIM,
                           DOT_PRECISION)
        p = tl.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - d_row[:, None])
        # dQ_i += dS K_j, summed here instead of with atomic adds to main memory
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


def grad_query_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                      dout_ptr: tl.tensor, lse_ptr: tl.tensor, delta_ptr: tl.tensor,
                      dq_ptr: tl.tensor, scale: tl.tensor, qk_scale: tl.tensor,
                      N_Q: tl.tensor, N_KV: tl.tensor, GROUP: tl.tensor,
                      OFFSET: tl.tensor, WINDOW: tl.tensor, IS_CAUSAL: tl.constexpr,
                      HAS_WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      DOT_PRECISION: tl.constexpr) -> None:
    """dQ_i for BLOCK_M queries, looping over key tiles in the forward's three stages
    (dQ as in attnlib.flash.flash_attention_backward)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    kv_bh = bh // GROUP
    q_ptr += bh * N_Q * HEAD_DIM
    dout_ptr += bh * N_Q * HEAD_DIM
    dq_ptr += bh * N_Q * HEAD_DIM
    lse_ptr += bh * N_Q
    delta_ptr += bh * N_Q
    k_ptr += kv_bh * N_KV * HEAD_DIM
    v_ptr += kv_bh * N_KV * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < N_Q
    q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(dout_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)  # L_i
    lse = tl.where(lse == float("-inf"), float("inf"), lse)  # rows that saw no key
    d_row = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)  # D_i
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    lo, mid_lo, mid_hi, hi = key_tiles(start_m, N_KV, OFFSET, WINDOW, IS_CAUSAL,
                                       HAS_WINDOW, BLOCK_M, BLOCK_N)
    dq = grad_query_tiles(dq, q, do, lse, d_row, k_ptr, v_ptr, rows, dims, qk_scale,
                          N_KV, OFFSET, WINDOW, lo, mid_lo, True, IS_CAUSAL,
                          HAS_WINDOW, HEAD_DIM, BLOCK_N, DOT_PRECISION)
    dq = grad_query_tiles(dq, q, do, lse, d_row, k_ptr, v_ptr, rows, dims, qk_scale,
                          N_KV, OFFSET, WINDOW, mid_lo, mid_hi, False, IS_CAUSAL,
                          HAS_WINDOW, HEAD_DIM, BLOCK_N, DOT_PRECISION)
    dq = grad_query_tiles(dq, q, do, lse, d_row, k_ptr, v_ptr, rows, dims, qk_scale,
                          N_KV, OFFSET, WINDOW, mid_hi, hi, True, IS_CAUSAL,
                          HAS_WINDOW, HEAD_DIM, BLOCK_N, DOT_PRECISION)
    dq = dq * scale
    tl.store(dq_ptr + q_offsets, dq.to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])
