"""attnlib.distributed: ring attention on gloo processes, checked against one process.

Two spawns do the multi-process work (each process runs many cases and returns its
results through a file): 2 processes, with the errors a mismatched call must raise on
every rank, and 4 processes, with sub-groups of 1, 2 (ranks 1 and 3) and 3 processes.
Everything else runs in this process: the layouts, the schedule, the merge, the byte
formula and the errors that need no process group.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlib import distributed
from attnlib.bench import peak_memory_bytes
from attnlib.distributed import (
    RingStats,
    merge_partials,
    ring_attention,
    ring_bytes_per_rank,
    ring_schedule,
    run_on_ranks,
    shard_positions,
    shard_sequence,
    unshard_sequence,
    zigzag_shard,
    zigzag_unshard,
)
from attnlib.flash import flash_attention_forward

NUM_TOKENS = 24  # splits into 2P equal chunks for P = 1, 2, 3 and 4
CASES = [(causal, layout) for causal in (False, True) for layout in ("contiguous", "zigzag")]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _inputs(dtype, seed=0):
    """query, key (2, 3, 24, 8), value (2, 3, 24, 5) and grad_out (2, 3, 24, 5)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, NUM_TOKENS, 8)] * 2 + [(2, 3, NUM_TOKENS, 5)] * 2
    return [torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


def _ring_case(rank, world_size, group, dtype, is_causal, layout, stats=None):
    """This rank's output and gradients for one case, as float64 shards."""
    query, key, value, grad_out = (shard_sequence(t, rank, world_size, layout)
                                   for t in _inputs(dtype))
    query, key, value = (t.requires_grad_() for t in (query, key, value))
    out = ring_attention(query, key, value, is_causal, group=group, layout=layout,
                         block_size=5, stats=stats)
    out.backward(grad_out)
    return [t.double() for t in (out.detach(), query.grad, key.grad, value.grad)]


def _errors(rank, world_size):
    """What each mismatched call raises on this rank: (type name, message) per case."""
    query, key, value, _ = (shard_sequence(t, rank, world_size) for t in _inputs(torch.float64))
    calls = {
        # Rank 1 holds one token fewer: a sequence that does not split evenly.
        "uneven": lambda: ring_attention(query[..., : 12 - rank, :], key[..., : 12 - rank, :],
                                         value[..., : 12 - rank, :]),
        "head_dim": lambda: ring_attention(query[..., : 8 - 2 * rank], key[..., : 8 - 2 * rank],
                                           value),
        "is_causal": lambda: ring_attention(query, key, value, is_causal=rank == 0),
        "layout": lambda: ring_attention(query, key, value, layout=distributed.LAYOUTS[rank]),
        "scale": lambda: ring_attention(query, key, value, scale=1.0 + rank),
        "dtype": lambda: ring_attention(*(t.to(torch.float32 if rank else torch.float64)
                                          for t in (query, key, value))),
        "grad": lambda: ring_attention(query.requires_grad_(rank == 0), key, value),
        "refused": lambda: ring_attention(*(t[0] if rank == 1 else t for t in (query, key, value))),
    }
    outcomes = {}
    for name, call in calls.items():
        try:
            call()
            outcomes[name] = None
        except (TypeError, ValueError) as exc:
            outcomes[name] = (type(exc).__name__, str(exc))
        query.requires_grad_(False)
    return outcomes


def _second_derivative(rank, world_size):
    """What differentiating the ring's gradient again raises: (type name, message)."""
    query, key, value, _ = (shard_sequence(t, rank, world_size).requires_grad_()
                            for t in _inputs(torch.float64))
    out = ring_attention(query, key, value, True)
    (grad_query,) = torch.autograd.grad(out, query, torch.ones_like(out), create_graph=True)
    try:
        grad_query.sum().backward()
    except RuntimeError as exc:
        return type(exc).__name__, str(exc)
    return None


def worker_two(rank, world_size):
    """The 2-process spawn: every case in float64, float32 and bfloat16 (the bfloat16 one
    counted), then the errors, then one more good call (an error must not leave the
    ranks out of step), then a second derivative."""
    results = {(dtype, *case): _ring_case(rank, world_size, None, dtype, *case)
               for dtype in (torch.float64, torch.float32) for case in CASES}
    bf16_stats = RingStats()
    results[(torch.bfloat16, True, "zigzag")] = _ring_case(
        rank, world_size, None, torch.bfloat16, True, "zigzag", stats=bf16_stats)
    errors = _errors(rank, world_size)
    after = _ring_case(rank, world_size, None, torch.float64, True, "zigzag")
    return {"results": results, "errors": errors, "after": after,
            "bf16_stats": bf16_stats, "second": _second_derivative(rank, world_size)}


def worker_four(rank, world_size):
    """The 4-process spawn: every case on 4 ranks, on a sub-group of 1, of ranks 1 and 3,
    and of 3 ranks, with counted bytes and work."""
    out = {}
    groups = {4: (None, list(range(4)))}
    for members in ([0], [1, 3], [0, 1, 2]):
        groups[len(members)] = (dist.new_group(members), members)  # every rank calls it
    for size, (group, members) in groups.items():
        if rank not in members:
            continue
        local = members.index(rank)
        for case in CASES:
            stats = RingStats()
            shards = _ring_case(local, size, group, torch.float64, *case, stats=stats)
            out[(size, *case)] = (shards, stats)
        out[("memory", size)] = _forward_memory(local, size, group)
    return out


def _forward_memory(rank, world_size, group):
    """One forward pass's peak above its inputs, and a block: the rank's keys (float32)."""
    # A wide head makes a block (n * 256 floats) large against the tiles (64 * 64 floats)
    # and the row statistics (n floats), so that the count of blocks reads clearly.
    num_tokens, head_dim = 1536, 256  # 1536 / 3 and 1536 / 4 are multiples of block_size
    x = torch.randn(1, 1, num_tokens, head_dim, generator=torch.Generator().manual_seed(0))
    shard = shard_sequence(x, rank, world_size)
    block = shard.numel() * shard.element_size()
    with torch.no_grad():
        peak = peak_memory_bytes(lambda: ring_attention(shard, shard, shard, group=group,
                                                        block_size=64), "cpu")
    return peak, block


def _reference(dtype, is_causal):
    query, key, value, grad_out = _inputs(dtype)
    query, key, value = (t.double().requires_grad_() for t in (query, key, value))
    out = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)
    out.backward(grad_out.double())
    return [out.detach(), query.grad, key.grad, value.grad]


def _assert_matches(per_rank, layout, dtype, is_causal, what):
    for name, got, expected in zip(("output", "grad_query", "grad_key", "grad_value"),
                                   zip(*per_rank, strict=True), _reference(dtype, is_causal),
                                   strict=True):
        whole = unshard_sequence(list(got), layout)
        err = (whole - expected).abs().max().item()
        assert err <= TOLERANCE[dtype], f"{what}: {name} differs by {err:.2e}"


@pytest.fixture(scope="module")
def two():
    return run_on_ranks(worker_two, 2, timeout=240)


@pytest.fixture(scope="module")
def four():
    return run_on_ranks(worker_four, 4, timeout=240)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("is_causal", "layout"), CASES)
def test_two_ranks_give_the_single_device_output_and_gradients(two, dtype, is_causal, layout):
    per_rank = [r["results"][(dtype, is_causal, layout)] for r in two]
    _assert_matches(per_rank, layout, dtype, is_causal, f"P=2 {dtype} {is_causal} {layout}")


def test_bfloat16_is_merged_in_float32(two):
    per_rank = [r["results"][(torch.bfloat16, True, "zigzag")] for r in two]
    _assert_matches(per_rank, "zigzag", torch.bfloat16, True, "P=2 bfloat16")


def test_bfloat16_gradients_travel_in_float32_as_the_formula_says(two):
    """Keys (d_k = 8) and values (d_v = 5) in bfloat16, 2 bytes a number; their gradients
    in float32, 4: the backward sends 3 times the forward's bytes, not 2."""
    sizes = {"batch": 2, "num_heads": 3, "head_dim": 8, "value_head_dim": 5,
             "dtype": torch.bfloat16}
    key_and_value = 2 * 3 * (NUM_TOKENS // 2) * (8 + 5)  # numbers per hop, P = 2
    for rank in range(2):
        stats = two[rank]["bf16_stats"]
        assert stats.bytes_sent == ring_bytes_per_rank(NUM_TOKENS, 2, **sizes)
        assert stats.bytes_sent == key_and_value * 2
        assert stats.backward_bytes_sent == ring_bytes_per_rank(NUM_TOKENS, 2, backward=True,
                                                                 **sizes)
        assert stats.backward_bytes_sent == key_and_value * (2 + 4) == 3 * stats.bytes_sent


def test_a_second_derivative_through_the_ring_says_it_is_differentiable_once(two):
    for rank in range(2):
        name, message = two[rank]["second"]
        assert name == "RuntimeError"
        assert "ring_attention is differentiable once" in message


@pytest.mark.slow  # the 4-process spawn: over 15 s on 2 cores
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize(("is_causal", "layout"), CASES)
def test_four_processes_and_their_sub_groups_match(four, size, is_causal, layout):
    members = {1: [0], 2: [1, 3], 3: [0, 1, 2], 4: [0, 1, 2, 3]}[size]
    per_rank = [four[r][(size, is_causal, layout)][0] for r in members]
    _assert_matches(per_rank, layout, torch.float64, is_causal, f"P={size} {is_causal} {layout}")


@pytest.mark.slow  # the 4-process spawn: over 15 s on 2 cores
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize(("is_causal", "layout"), CASES)
def test_counted_bytes_and_work_match_the_formula_and_schedule(four, size, is_causal, layout):
    members = {1: [0], 2: [1, 3], 3: [0, 1, 2], 4: [0, 1, 2, 3]}[size]
    n = NUM_TOKENS // size
    key_and_value = 2 * 3 * n * (8 + 5) * 8  # one key block and one value block, float64
    sizes = {"batch": 2, "num_heads": 3, "head_dim": 8, "value_head_dim": 5,
             "dtype": torch.float64}
    schedule = ring_schedule(size, is_causal, layout)
    for local, r in enumerate(members):
        stats = four[r][(size, is_causal, layout)][1]
        assert stats.bytes_sent == (size - 1) * key_and_value
        assert stats.bytes_sent == ring_bytes_per_rank(NUM_TOKENS, size, **sizes)
        assert stats.backward_bytes_sent == 2 * (size - 1) * key_and_value
        assert stats.backward_bytes_sent == ring_bytes_per_rank(NUM_TOKENS, size,
                                                                backward=True, **sizes)
        assert stats.scores == sum(step.scores(n) for step in schedule[local])
        assert stats.score_blocks == pytest.approx(stats.scores / n**2, rel=1e-12)
        assert stats.backward_scores == stats.scores
        assert stats.backward_score_blocks == stats.score_blocks
        assert stats.steps == [step.kind for step in schedule[local]]
        assert stats.skipped_blocks == stats.steps.count("skip")


@pytest.mark.slow  # the 4-process spawn: over 15 s on 2 cores
def test_memory_per_rank_is_two_blocks_plus_two_per_visitor_in_flight(four):
    """Above its inputs a rank holds the running output and a step's partial result, and
    the keys and values of each visiting block it holds: none for P = 1, one visitor for
    P = 2, two (the one in use and the next arriving) from P = 3 on, whatever P; plus a
    workspace of the local loop that depends on block_size, not on P."""
    measured = {size: four[0 if size != 2 else 1][("memory", size)] for size in (1, 2, 3, 4)}
    blocks = {1: 2, 2: 4, 3: 6, 4: 6}
    workspace = {size: peak - blocks[size] * block for size, (peak, block) in measured.items()}
    smallest_block = measured[4][1]
    assert all(0 < w < smallest_block for w in workspace.values()), (measured, workspace)
    assert max(workspace.values()) - min(workspace.values()) < 0.05 * smallest_block, workspace


def test_the_formula_counts_key_and_value_blocks():
    # P = 4, N = 1024: a block is 256 tokens * 64 * 4 bytes = 64 KiB.
    assert ring_bytes_per_rank(1024, 4) == 2 * 3 * 65536
    assert ring_bytes_per_rank(1024, 4, backward=True) == 4 * 3 * 65536
    assert ring_bytes_per_rank(1024, 1) == 0
    assert ring_bytes_per_rank(8, 2, batch=3, num_heads=5, head_dim=7,
                               dtype=torch.float16) == 2 * 1 * 3 * 5 * 4 * 7 * 2
    # Keys of 16 numbers, values of 8: 24 per token, not 32 (P = 4, N = 192, float32).
    assert ring_bytes_per_rank(192, 4, head_dim=16, value_head_dim=8) == 3 * 48 * 24 * 4
    # bfloat16 blocks, float32 gradients: 2 (P - 1) blocks forward, 6 (P - 1) backward.
    bf16_block = 256 * 64 * 2
    assert ring_bytes_per_rank(1024, 4, dtype=torch.bfloat16) == 2 * 3 * bf16_block
    assert ring_bytes_per_rank(1024, 4, dtype=torch.bfloat16, backward=True) == (
        6 * 3 * bf16_block)
    assert ring_bytes_per_rank(1024, 4, dtype=torch.bfloat16, grad_dtype=torch.bfloat16,
                               backward=True) == 4 * 3 * bf16_block
    with pytest.raises(ValueError, match="not divisible by world_size=3"):
        ring_bytes_per_rank(1024, 3)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        ring_bytes_per_rank(1024, 4, head_dim=64.0)
    with pytest.raises(ValueError, match="value_head_dim must be a positive int"):
        ring_bytes_per_rank(1024, 4, value_head_dim=0)
    with pytest.raises(TypeError, match="backward must be a bool"):
        ring_bytes_per_rank(1024, 4, backward=1)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        ring_bytes_per_rank(1024, 4, dtype=2)
    with pytest.raises(TypeError, match="grad_dtype must be a floating-point torch.dtype"):
        ring_bytes_per_rank(1024, 4, grad_dtype=torch.int32)


EXPECTED_ERRORS = {
    "uneven": "different query on different ranks: rank 0: (2, 3, 12, 8), rank 1: (2, 3, 11, 8)",
    "head_dim": "different query on different ranks",
    "is_causal": "different is_causal on different ranks: rank 0: True, rank 1: False",
    "layout": "different layout on different ranks: rank 0: contiguous, rank 1: zigzag",
    "scale": "different scale on different ranks: rank 0: 1.0, rank 1: 2.0",
    "dtype": "different dtype on different ranks: rank 0: torch.float64, rank 1: torch.float32",
    "grad": "different grad on different ranks",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ERRORS))
def test_mismatched_shards_raise_the_same_error_on_every_rank(two, name):
    for rank in range(2):
        outcome = two[rank]["errors"][name]
        assert outcome is not None, f"rank {rank} accepted the {name} mismatch"
        assert outcome[0] == "ValueError"
        assert EXPECTED_ERRORS[name] in outcome[1]
    assert "does not pad" in two[0]["errors"]["uneven"][1]


def test_a_rank_that_refuses_its_input_stops_the_others_too(two):
    assert two[1]["errors"]["refused"][0] == "ValueError"
    assert "query must be (batch, num_heads" in two[1]["errors"]["refused"][1]
    assert two[0]["errors"]["refused"][0] == "ValueError"
    assert two[0]["errors"]["refused"][1].startswith("rank 1 refused its input (ValueError")


def test_the_ranks_stay_in_step_after_an_error(two):
    _assert_matches([r["after"] for r in two], "zigzag", torch.float64, True, "after errors")


# ---------------------------------------------------------------------------------------
# Without a process group


def test_without_a_process_group_the_error_says_how_to_start_one():
    assert not dist.is_initialized()
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda q: ring_attention(q[0], q[0], q[0]), ValueError, r"query must be \(batch"),
    (lambda q: ring_attention(q, q.double(), q), TypeError, "share a dtype"),
    (lambda q: ring_attention(q, q[..., :3, :], q[..., :3, :]), ValueError,
     "must hold the same tokens"),
    (lambda q: ring_attention(q, q, q, layout="spiral"), ValueError, "layout must be one of"),
    (lambda q: ring_attention(q, q, q, layout=2), TypeError, "layout must be a str"),
    (lambda q: ring_attention(q[..., :3, :], q[..., :3, :], q[..., :3, :], layout="zigzag"),
     ValueError, "even number of tokens per rank"),
    (lambda q: ring_attention(q, q, q, is_causal=1), TypeError, "is_causal must be a bool"),
    (lambda q: ring_attention(q, q, q, block_size=0), ValueError, "block_size"),
    (lambda q: ring_attention(q, q, q, stats={}), TypeError, "stats must be a RingStats"),
    (lambda q: ring_attention(q, q, q, group="world"), TypeError, "ProcessGroup"),
])
def test_bad_input_is_refused_before_any_communication(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(1, 2, 4, 8))


# ---------------------------------------------------------------------------------------
# Layouts, schedule, merge


def test_zigzag_gives_each_rank_an_early_and_a_late_chunk():
    assert shard_positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert shard_positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    assert shard_positions(8, 1, 2).tolist() == [4, 5, 6, 7]
    x = torch.arange(16).view(1, 16, 1)
    assert zigzag_shard(x, 3, 4).flatten().tolist() == [6, 7, 8, 9]
    assert zigzag_shard(x, 0, 4).flatten().tolist() == [0, 1, 14, 15]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_unshard_inverts_shard(layout, world_size):
    x = torch.randn(2, 3, NUM_TOKENS, 5)
    shards = [shard_sequence(x, r, world_size, layout) for r in range(world_size)]
    assert torch.equal(unshard_sequence(shards, layout), x)
    positions = torch.cat([shard_positions(NUM_TOKENS, r, world_size, layout)
                           for r in range(world_size)])
    assert sorted(positions.tolist()) == list(range(NUM_TOKENS))
    if layout == "zigzag":
        assert torch.equal(zigzag_unshard([zigzag_shard(x, r, world_size)
                                           for r in range(world_size)]), x)


def test_a_length_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="num_tokens=10 does not split into 4 equal parts"):
        shard_sequence(torch.randn(1, 10, 2), 0, 2, "zigzag")
    with pytest.raises(ValueError, match="does not pad"):
        shard_positions(10, 0, 3)
    with pytest.raises(ValueError, match="rank must be in"):
        shard_positions(8, 2, 2)
    with pytest.raises(ValueError, match="share one shape"):
        unshard_sequence([torch.ones(1, 2, 3), torch.ones(1, 3, 3)])
    with pytest.raises(TypeError, match="list of tensors"):
        unshard_sequence(torch.ones(2, 3))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_work_per_rank_before_and_after_zigzag(world_size):
    def work(is_causal, layout):
        return [sum(s.work for s in row) for row in ring_schedule(world_size, is_causal, layout)]

    # In half blocks: a diagonal block is half masked, so rank r computes r + 1/2.
    assert work(True, "contiguous") == [r + 0.5 for r in range(world_size)]
    assert work(True, "zigzag") == [world_size / 2] * world_size
    assert work(False, "contiguous") == work(False, "zigzag") == [world_size] * world_size
    for row_index, row in enumerate(ring_schedule(world_size)):
        assert [s.source for s in row] == [(row_index - s) % world_size
                                           for s in range(world_size)]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_the_schedule_computes_every_visible_pair_once_and_skips_only_hidden_ones(
        layout, world_size):
    """From the positions alone: the pairs each step computes (its slices, minus the mask
    inside a diagonal step) are exactly the causally visible (query, key) pairs."""
    num_tokens = 4 * world_size
    n = num_tokens // world_size
    for rank, row in enumerate(ring_schedule(world_size, True, layout)):
        q_pos = shard_positions(num_tokens, rank, world_size, layout)
        seen = torch.zeros(n, num_tokens, dtype=torch.int64)
        for step in row:
            if step.kind == "skip":
                continue
            k_pos = shard_positions(num_tokens, step.source, world_size, layout)
            rows, cols, causal = step.slices(n)
            computed = torch.zeros(n, n, dtype=torch.bool)
            computed[rows, cols] = True
            if causal:
                computed &= torch.ones(n, n, dtype=torch.bool).tril()
            assert step.scores(n) == computed.sum().item(), (rank, step)
            seen[:, k_pos] += computed.long()
        visible = (torch.arange(num_tokens) <= q_pos.unsqueeze(-1)).long()
        assert torch.equal(seen, visible), f"rank {rank}: {seen.tolist()}"


def test_the_exact_score_counts_of_the_chapter_run():
    """N = 2048 on P = 4 ranks, n = 512: a diagonal block computes 512 * 513 / 2 scores,
    (n + 1) / (2 n) = 0.501 of a block; the busiest rank 3.501 blocks contiguous, 2.001
    zigzag, 8.004 in all for both (16 without a mask)."""
    n = 512

    def blocks(layout):
        return [sum(s.scores(n) for s in row) / n**2
                for row in ring_schedule(4, True, layout)]

    diagonal = n * (n + 1) // 2 / n**2
    assert blocks("contiguous") == [r + diagonal for r in range(4)]
    assert blocks("zigzag") == [1.5 + diagonal] * 4
    assert sum(blocks("contiguous")) == sum(blocks("zigzag")) == 6 + 4 * diagonal
    with pytest.raises(ValueError, match="tokens_per_rank must be a positive int"):
        ring_schedule(2)[0][0].scores(0)


def test_merge_of_two_halves_equals_attention_over_all_keys():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 7, d, generator=gen, dtype=torch.float64) * 4
               for d in (6, 6, 5))
    k2, v2 = k + 3.0, v - 1.0
    out_a, lse_a = flash_attention_forward(q, k, v)
    out_b, lse_b = flash_attention_forward(q, k2, v2)
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    keys, values = torch.cat([k, k2], dim=-2), torch.cat([v, v2], dim=-2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, keys, values))
    scores = q @ keys.transpose(-2, -1) / math.sqrt(6)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1, keepdim=True))


def test_merge_gives_a_part_that_saw_no_key_no_weight():
    out_a, lse_a = torch.randn(1, 4, 3), torch.randn(1, 4, 1)
    empty_out, empty_lse = torch.zeros(1, 4, 3), torch.full((1, 4, 1), -math.inf)
    out, lse = merge_partials(out_a, lse_a, empty_out, empty_lse)
    assert torch.equal(out, out_a) and torch.equal(lse, lse_a)
    out, lse = merge_partials(empty_out, empty_lse, empty_out, empty_lse)
    assert torch.equal(out, empty_out) and bool((lse == -math.inf).all())
    with pytest.raises(ValueError, match=r"lse_a, lse_b of shape \(\.\.\., n, 1\)"):
        merge_partials(out_a, lse_a.squeeze(-1), out_a, lse_a)
    with pytest.raises(TypeError, match="lse_b must be a floating-point tensor"):
        merge_partials(out_a, lse_a, out_a, [1.0])
    with pytest.raises(TypeError, match="in_place must be a bool"):
        merge_partials(out_a, lse_a, out_a, lse_a, in_place=1)


def test_merge_in_place_writes_the_running_result_and_equals_the_new_tensors():
    gen = torch.Generator().manual_seed(6)
    out_a, out_b = torch.randn(2, 3, 5, 4, generator=gen), torch.randn(2, 3, 5, 4, generator=gen)
    lse_a, lse_b = torch.randn(2, 3, 5, 1, generator=gen), torch.randn(2, 3, 5, 1, generator=gen)
    lse_a[0, 0, 0] = -math.inf  # a row whose first part saw no key
    expected = merge_partials(out_a, lse_a, out_b, lse_b)
    running_out, running_lse = out_a.clone(), lse_a.clone()
    rows = slice(1, 4)  # views of the running result, as ring_forward passes them
    got = merge_partials(running_out[..., rows, :], running_lse[..., rows, :],
                         out_b[..., rows, :], lse_b[..., rows, :], in_place=True)
    assert got[0].data_ptr() == running_out[..., rows, :].data_ptr()
    torch.testing.assert_close(running_out[..., rows, :], expected[0][..., rows, :])
    torch.testing.assert_close(running_lse[..., rows, :], expected[1][..., rows, :])
    assert torch.equal(running_out[..., :1, :], out_a[..., :1, :])  # other rows untouched
    assert torch.equal(running_lse[..., 4:, :], lse_a[..., 4:, :])


def failing_worker(rank, world_size):
    if rank == 1:
        raise KeyError("rank one broke")
    dist.barrier()  # waits for rank 1 for ever: the parent must stop it
    return rank


def test_run_on_ranks_reports_a_failing_rank_and_stops_the_others():
    # Were rank 0 left waiting, the call would end after the timeout with another error.
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed:(.|\n)*rank one broke"):
        run_on_ranks(failing_worker, 2, timeout=100)


def test_run_on_ranks_checks_its_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        run_on_ranks("worker", 2)
    with pytest.raises(ValueError, match="backend must be"):
        run_on_ranks(failing_worker, 2, backend="mpi")
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        run_on_ranks(failing_worker, 0)
