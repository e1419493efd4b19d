"""attnlib.exercises.beyond: chapter 13's checkers accept right answers and name wrong ones.

Each typical mistake is written here as a learner would write it, one answer per mistake;
each right alternative (another einsum, a matmul, a list for the pair, torch.softmax over
the scores and the sink) is accepted. The global random state is left alone.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import CheckFailed
from attnlib.exercises.beyond import (
    check_absorbed_query,
    check_delta_rule_step,
    check_sink_softmax,
)
from attnlib.linear_attention import delta_rule_step
from attnlib.sinks import softmax_with_sinks

# ---------------------------------------------------------------------------
# check_absorbed_query
# ---------------------------------------------------------------------------


def right_query(q_nope, w_uk):
    """The solution printed in chapter 13."""
    return torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)


def test_absorbed_query_accepts_right_forms(capsys):
    assert check_absorbed_query(right_query) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_absorbed_query(lambda q, w: q @ w) is True  # batched matmul broadcasts
    assert check_absorbed_query(lambda q, w: torch.stack(
        [q[:, h] @ w[h] for h in range(w.shape[0])], dim=1)) is True  # a loop over heads
    assert check_absorbed_query(lambda q, w: (q.float() @ w.float()).double()) is True


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(lambda q, w: torch.einsum("bhnd,dr->bhnr", q, w[0]), "uses W_UK\\[0\\] for "
                 "every head", id="first-head"),
    pytest.param(lambda q, w: q @ w.transpose(-2, -1), "W_UK\\[h\\] transposed", id="transposed"),
    pytest.param(lambda q, w: q @ w.sum(0), "sums W_UK over the heads", id="summed"),
    pytest.param(lambda q, w: q @ w.mean(0), "averages W_UK over the heads", id="averaged"),
    pytest.param(lambda q, w: (q @ w).sum(1, keepdim=True).expand(-1, w.shape[0], -1, -1),
                 "sums the heads' results", id="heads-summed"),
    pytest.param(lambda q, w: q @ w / q.shape[-1] ** 0.5, "scales by 1 / "
                 "sqrt\\(qk_nope_head_dim\\)", id="scaled-d"),
    pytest.param(lambda q, w: q @ w / math.sqrt(w.shape[-1]), "scales by 1 / "
                 "sqrt\\(kv_lora_rank\\)", id="scaled-r"),
    pytest.param(lambda q, w: (q @ w).transpose(-2, -1), "last two dimensions are transposed",
                 id="out-transposed"),
    pytest.param(lambda q, w: torch.einsum("bhnd,hdr->bnhr", q, w), "puts the heads after "
                 "the tokens", id="heads-after-tokens"),
    pytest.param(lambda q, w: torch.einsum("bnhd,hdr->bnhr", q.transpose(1, 2), w).reshape(
        q.shape[0], w.shape[0], q.shape[2], w.shape[2]), "reshapes .* instead of transposing",
                 id="reshaped"),
    pytest.param(lambda q, w: q.mul_(2.0) @ w, "changed its argument q_nope", id="in-place"),
    pytest.param(lambda q, w: (q @ w).tolist(), "returned list; expected a torch.Tensor",
                 id="not-a-tensor"),
    pytest.param(lambda q, w: q @ w + 1.0, "differs from the absorbed query by up to 1 .*"
                 "matches none", id="something-else"),
])
def test_absorbed_query_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_absorbed_query(wrong)
    message = str(failure.value)
    assert "einsum(" not in message and "hdr" not in message  # the answer is not given away
    if "(seen on" in message or "typical" in message or "raised on" in message:
        assert "See 'Multi-head latent attention'" in message


# ---------------------------------------------------------------------------
# check_delta_rule_step
# ---------------------------------------------------------------------------


def right_step(state, query, key, value, beta, g):
    """The solution printed in chapter 13."""
    state = state * g.exp()[..., None, None]
    recalled = (state * key[..., :, None]).sum(-2)
    state = state + key[..., :, None] * (beta[..., None] * (value - recalled))[..., None, :]
    return (state * query[..., :, None]).sum(-2) / math.sqrt(key.shape[-1]), state


def einsum_step(state, query, key, value, beta, g):
    """Right, with einsum and the write as an outer product."""
    s = torch.exp(g)[..., None, None] * state
    recalled = torch.einsum("bhdv,bhd->bhv", s, key)
    s = s + torch.einsum("bhd,bhv->bhdv", key, beta.unsqueeze(-1) * (value - recalled))
    return torch.einsum("bhdv,bhd->bhv", s, query) * key.shape[-1] ** -0.5, s


def learner_step(decay="exp", recall="decayed", sign=1.0, use_beta=True, beta_on_v=False,
                 subtract_recall=True, recall_with="key", write_sign=1.0, read="new",
                 scale="d", outer="k,delta", read_transposed=False):
    """A learner's step written with matmuls, right or with one slip."""
    def step(state, query, key, value, beta, g):
        gate = {"exp": g.exp(), "none": torch.ones_like(g), "raw": g, "neg": torch.exp(-g),
                "after": torch.ones_like(g)}[decay][..., None, None]
        s = state * gate
        source = s if recall == "decayed" else state
        probe = key if recall_with == "key" else query
        recalled = (source.transpose(-2, -1) @ probe.unsqueeze(-1)).squeeze(-1)
        diff = sign * (value - recalled) if subtract_recall else value
        if beta_on_v:
            diff = beta[..., None] * value - recalled
        elif use_beta:
            diff = beta[..., None] * diff
        outer_product = (key.unsqueeze(-1) @ diff.unsqueeze(-2) if outer == "k,delta"
                         else diff.unsqueeze(-1) @ key.unsqueeze(-2))
        new = s + write_sign * outer_product
        if decay == "after":
            new = new * g.exp()[..., None, None]
        read_state = {"new": new, "decayed": s, "old": state}[read]
        matrix = read_state if read_transposed else read_state.transpose(-2, -1)
        out = (matrix @ query.unsqueeze(-1)).squeeze(-1)
        factor = {"d": key.shape[-1] ** -0.5, "none": 1.0, "dv": value.shape[-1] ** -0.5,
                  "times": key.shape[-1] ** 0.5}[scale]
        return out * factor, new
    return step


def test_delta_rule_step_accepts_right_forms(capsys):
    assert check_delta_rule_step(right_step) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_delta_rule_step(einsum_step) is True
    assert check_delta_rule_step(learner_step()) is True
    assert check_delta_rule_step(lambda *args: list(right_step(*args))) is True
    assert check_delta_rule_step(delta_rule_step) is True  # attnlib's own


def in_place_step(state, *rest):
    out, new = right_step(state, *rest)
    state.copy_(new)
    return out, new


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(learner_step(decay="none"), "never decays the state", id="no-decay"),
    pytest.param(learner_step(decay="raw"), "decays the state by g itself", id="g-without-exp"),
    pytest.param(learner_step(decay="neg"), "decays the state by exp\\(-g\\)", id="exp-minus-g"),
    pytest.param(learner_step(decay="after"), "decays the state after the update",
                 id="decay-after-update"),
    pytest.param(learner_step(recall="old"), "recalls from the state as it came in",
                 id="recall-before-decay"),
    pytest.param(learner_step(recall_with="query"), "recalls with the query", id="recall-query"),
    pytest.param(learner_step(sign=-1.0), "flips the correction's sign", id="sign-flipped"),
    pytest.param(learner_step(write_sign=-1.0), "or subtracts the write", id="subtracted"),
    pytest.param(learner_step(subtract_recall=False), "linear attention, not the delta rule",
                 id="no-recall"),
    pytest.param(learner_step(use_beta=False), "leaves out beta", id="no-beta"),
    pytest.param(learner_step(beta_on_v=True), "multiplies only the value by beta",
                 id="beta-on-v"),
    pytest.param(learner_step(outer="delta,k"), "outer product the wrong way round",
                 id="outer-transposed"),
    pytest.param(learner_step(read="decayed"), "reads the output from the decayed state "
                 "before the update", id="read-before-update"),
    pytest.param(learner_step(read="old"), "reads the output from the state as it came in",
                 id="read-old-state"),
    pytest.param(learner_step(read_transposed=True), "reads S q instead of S\\^T q",
                 id="read-transposed"),
    pytest.param(learner_step(scale="none"), "does not scale the output", id="unscaled"),
    pytest.param(learner_step(scale="dv"), "1 / sqrt\\(head_dim_v\\)", id="scaled-dv"),
    pytest.param(learner_step(scale="times"), "multiplies the output by sqrt\\(head_dim\\)",
                 id="times-sqrt-d"),
    pytest.param(lambda *a: (right_step(*a)[0], a[0]), "returns the state it was given",
                 id="old-state-returned"),
    pytest.param(lambda *a: right_step(*a)[::-1], "returns \\(new_state, output\\)",
                 id="pair-swapped"),
    pytest.param(in_place_step, "changed its argument state in place", id="in-place"),
    pytest.param(lambda *a: right_step(*a)[0], "expected the pair \\(output, new_state\\)",
                 id="output-only"),
    pytest.param(lambda *a: (right_step(*a)[0] + 1.0, right_step(*a)[1]),
                 "matches none of the typical mistakes", id="something-else"),
    pytest.param(lambda *a: (_ for _ in ()).throw(NotImplementedError("x")),
                 "NotImplementedError", id="stub"),
])
def test_delta_rule_step_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_delta_rule_step(wrong)
    message = str(failure.value)
    if "(seen on" in message or "typical" in message or "raised on" in message:
        assert "See 'Linear attention and Gated DeltaNet'" in message


# ---------------------------------------------------------------------------
# check_sink_softmax
# ---------------------------------------------------------------------------


def right_sink(scores, sinks):
    """The solution printed in chapter 13."""
    sink = sinks[None, :, None, None]
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    e = (scores - m).exp()
    return e / (e.sum(-1, keepdim=True) + (sink - m).exp())


def concat_and_drop(scores, sinks):
    """Right: torch.softmax over the scores and the sink as one more column, then drop it."""
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def logsumexp_form(scores, sinks):
    """Right: exp(s - logsumexp over the scores and the sink)."""
    sink = sinks[None, :, None, None].expand(*scores.shape[:-1], 1)
    return torch.exp(scores - torch.logsumexp(torch.cat([scores, sink], -1), -1, keepdim=True))


def test_sink_softmax_accepts_right_forms(capsys):
    assert check_sink_softmax(right_sink) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_sink_softmax(concat_and_drop) is True
    assert check_sink_softmax(logsumexp_form) is True
    assert check_sink_softmax(softmax_with_sinks) is True


def shifted(scores, sink, dim=-1):
    """exp(scores - m) and exp(sink - m), m the larger of the row's maximum and the sink."""
    top = torch.maximum(scores.amax(dim, keepdim=True), sink)
    return (scores - top).exp(), (sink - top).exp()


def per_head(sinks):
    return sinks.view(1, -1, 1, 1)


def sink_in_numerator(scores, sinks):
    e, e_sink = shifted(scores, per_head(sinks))
    return (e + e_sink) / (e_sink + e.sum(-1, keepdim=True))


def sink_not_exponentiated(scores, sinks):
    return scores.exp() / (scores.exp().sum(-1, keepdim=True) + per_head(sinks))


def sink_of_zero(scores, sinks):  # the "softmax plus one"
    zero = torch.zeros_like(scores[..., :1])
    return torch.softmax(torch.cat([scores, zero], dim=-1), dim=-1)[..., :-1]


def sink_subtracted(scores, sinks):
    e, e_sink = shifted(scores, per_head(sinks))
    return e / (e.sum(-1, keepdim=True) - e_sink)


def sum_over_queries(scores, sinks):
    e, e_sink = shifted(scores, per_head(sinks), dim=-2)
    return e / (e_sink + e.sum(-2, keepdim=True))


def sinks_along(view):
    def fn(scores, sinks):
        e, e_sink = shifted(scores, sinks[view])
        return e / (e_sink + e.sum(-1, keepdim=True))
    return fn


def shift_by_row_max_only(scores, sinks):
    row_max = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - row_max)
    return e / (torch.exp(per_head(sinks) - row_max) + e.sum(-1, keepdim=True))


def shift_by_global_max(scores, sinks):
    e = (scores - scores.max()).exp()
    return e / ((per_head(sinks) - scores.max()).exp() + e.sum(-1, keepdim=True))


def clamped(scores, sinks):
    e = scores.clamp(max=50.0).exp()
    return e / (e.sum(-1, keepdim=True) + sinks[None, :, None, None].exp())


def naive(scores, sinks):
    e = scores.exp()
    return e / (e.sum(-1, keepdim=True) + sinks[None, :, None, None].exp())


def times_mask(scores, sinks):
    keep = torch.isfinite(scores)
    return right_sink(scores * keep, sinks)


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(lambda s, k: s.softmax(-1), "is the plain softmax", id="plain-softmax"),
    pytest.param(lambda s, k: torch.cat([s, k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)],
                                        -1).softmax(-1), "returns the sink's column too",
                 id="column-kept"),
    pytest.param(lambda s, k: torch.cat([k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1), s],
                                        -1).softmax(-1)[..., :-1], "drops the last key's column",
                 id="key-dropped"),
    pytest.param(lambda s, k: concat_and_drop(s, k) / concat_and_drop(s, k).sum(-1, keepdim=True),
                 "drops the sink's column .* then renormalises", id="renormalised"),
    pytest.param(sink_in_numerator, "sink's exponential to every numerator",
                 id="sink-in-numerator"),
    pytest.param(sink_not_exponentiated, "adds the sink logit itself", id="sink-not-exp"),
    pytest.param(sink_of_zero, "sink logit of 0 for every head", id="sink-zero"),
    pytest.param(sink_subtracted, "subtracts the sink's exponential", id="sink-subtracted"),
    pytest.param(sum_over_queries, "sums over the queries", id="wrong-dim"),
    pytest.param(sinks_along((None, None, slice(None), None)), "gives query i the sink "
                 "of head i", id="sinks-along-queries"),
    pytest.param(sinks_along((None, None, None, slice(None))), "gives key j the sink of "
                 "head j", id="sinks-along-keys"),
    pytest.param(shift_by_row_max_only, "nan in a row whose keys are all masked",
                 id="shift-without-sink"),
    pytest.param(shift_by_global_max, "one maximum for the whole tensor", id="global-max"),
    pytest.param(naive, "overflows on large scores", id="overflow"),
    pytest.param(lambda s, k: torch.nan_to_num(naive(s, k)), "replaces the nan of an overflow "
                 "by 0 \\(nan_to_num\\)", id="nan-to-num"),
    pytest.param(clamped, "right on ordinary scores but not on scores near \\+800.*clamping",
                 id="clamped"),
    pytest.param(lambda s, k: right_sink(torch.where(torch.isinf(s), 0.0, s), k),
                 "gives masked keys \\(-inf\\) a weight", id="masked-as-zero"),
    pytest.param(times_mask, "multiplies the scores by a 0/1 mask: -inf \\* 0 is nan",
                 id="scores-times-mask"),
    pytest.param(lambda s, k: right_sink(s.sub_(1.0), k), "changed its argument attn_scores",
                 id="in-place"),
    pytest.param(lambda s, k: right_sink(s, k) * 1.01, "matches none of the typical",
                 id="something-else"),
])
def test_sink_softmax_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_sink_softmax(wrong)
    message = str(failure.value)
    assert "by up to nan" not in message
    if "(seen on" in message or "typical" in message or "raised on" in message:
        assert "See 'Attention sinks and QK-norm'" in message


def test_a_nan_in_masked_rows_is_named_without_a_known_mistake():
    # A nan from -inf * 0 in a form the check does not model is still said to come from
    # the masked keys, not reported as a difference of nan.
    def masked_product(scores, sinks):
        weights = right_sink(torch.where(torch.isinf(scores), 0.0, scores), sinks)
        return weights * torch.where(torch.isinf(scores), math.inf, 1.0) * 0.5 + weights * 0.5

    with pytest.raises(CheckFailed, match="nan in rows that have masked keys"):
        check_sink_softmax(masked_product)


# ---------------------------------------------------------------------------
# every checker
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("check", "answer"), [(check_absorbed_query, right_query),
                                               (check_delta_rule_step, right_step),
                                               (check_sink_softmax, right_sink)])
def test_checkers_leave_the_random_state_alone_and_use_the_answers_name(check, answer,
                                                                        capsys):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert check(answer) is True
    assert torch.equal(torch.rand(3), expected)

    def stub(*args):
        raise NotImplementedError("fill me in")

    with pytest.raises(CheckFailed, match="^stub\\(.*raised NotImplementedError"):
        check(stub)
    with pytest.raises(CheckFailed, match="a function"):
        check("answer")


def test_probes_unit_keys_and_decay_in_range():
    # The arguments check_delta_rule_step passes, recorded by a right answer.
    probes = []

    def recording(*args):
        probes.append([arg.clone() for arg in args])
        return right_step(*args)

    assert check_delta_rule_step(recording) is True
    assert len(probes) == 3
    for _, _, key, _, beta, g in probes:
        torch.testing.assert_close(key.norm(dim=-1), torch.ones_like(beta))
        assert bool((g < 0).all() and (beta > 0).all() and (beta < 1).all())
        assert torch.allclose(F.normalize(key, dim=-1), key)


@pytest.mark.parametrize(("modules", "notebook", "sections"), [
    (("kernel", "kernel_tiles", "_triton_runner"), "11_writing_the_kernel", [
        "Triton's model: programs and blocks", "The forward kernel", "Masks at the edges",
        "Where the data is", "The backward pass, derived", "Block sizes, warps and stages"]),
    (("distributed",), "12_attention_across_devices", [
        "The merge is the online softmax", "The ring, step by step",
        "The causal imbalance, before and after zigzag"]),
    (("beyond",), "13_beyond_full_attention", [
        "Multi-head latent attention", "Linear attention and Gated DeltaNet",
        "Attention sinks and QK-norm"]),
])
def test_every_section_a_message_points_to_is_in_the_chapter(modules, notebook, sections):
    # The hints of chapters 11-13's checkers name sections of their chapter ("See 'The
    # forward kernel'"): a renamed heading would send the learner to a section that is
    # not there. (Importing these modules does not import Triton.)
    import importlib
    import json
    import pathlib

    chapter = pathlib.Path(__file__).parent.parent / "chapters" / f"{notebook}.ipynb"
    text = " ".join("".join(cell["source"]) for cell in json.loads(chapter.read_text())["cells"]
                    if cell["cell_type"] == "markdown")
    source = "".join(
        pathlib.Path(importlib.import_module(f"attnlib.exercises.{module}").__file__).read_text()
        for module in modules)
    for section in sections:
        assert f"'{section}'" in source, section  # a hint names it
        assert section in text, section  # and the chapter has it
