"""attnlib.export: the ONNX files of the book's live explorer, checked with onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import attnlib
from attnlib.export import (
    EXPORT_ATOL,
    JourneyAttentionGraph,
    TinyTransformerGraph,
    chapter_6_model,
    chapter_10_models,
    check_onnx,
    export_journey_attention,
    export_tiny_transformer,
    write_explorer_models,
)


def _model(num_layers: int = 2, seed: int = 0) -> attnlib.TinyTransformer:
    torch.manual_seed(seed)
    return attnlib.TinyTransformer(11, 9, d_model=8, num_heads=2, num_layers=num_layers).eval()


def _run(path, idx: torch.Tensor) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"idx": idx.numpy()})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_transformer_file_returns_logits_and_every_layers_weights(tmp_path, dtype):
    model = _model(num_layers=3)
    path = tmp_path / "model.onnx"
    worst = export_tiny_transformer(model, path, dtype=dtype)
    assert 0 <= worst <= EXPORT_ATOL
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["idx"]
    assert [o.name for o in graph.output] == [
        "logits", "attn_weights_0", "attn_weights_1", "attn_weights_2"]
    reference = model.to(dtype)
    for num_tokens in (1, 4, 9):  # one file, any length up to context_length
        idx = torch.randint(0, 11, (2, num_tokens), generator=torch.Generator().manual_seed(5))
        got = _run(path, idx)
        with torch.no_grad():
            logits, weights = reference(idx, return_weights=True)
        assert got[0].dtype == (np.float64 if dtype == torch.float64 else np.float32)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        np.testing.assert_allclose(got[0], logits.numpy(), rtol=0, atol=tol)
        assert len(got) == 4
        for ours, theirs in zip(got[1:], weights, strict=True):
            assert ours.shape == (2, 2, num_tokens, num_tokens)
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=tol)
            np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-6)  # rows are softmaxes
            assert np.all(np.triu(ours, k=1) == 0)  # causal: nothing above the diagonal


def test_export_leaves_the_model_unchanged(tmp_path):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_tiny_transformer(model, tmp_path / "m.onnx", dtype=torch.float64)
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v)
               for k, v in before.items())


def test_journey_attention_file_matches_chapter_6_layer(tmp_path):
    mha = chapter_6_model()
    path = tmp_path / "journey.onnx"
    assert export_journey_attention(mha, path, dtype=torch.float64) <= 1e-12
    order = torch.tensor([[5, 1, 1, 0]])  # "step journey journey Your": edited, repeated
    attn_weights, concatenated, context_vec = _run(path, order)
    x = attnlib.journey_embeddings()[order].double()  # (1, 4, 3)
    reference = mha.double()
    with torch.no_grad():
        expected, expected_weights = reference(x, return_weights=True)
        projected = reference.out_proj(torch.from_numpy(concatenated))
    np.testing.assert_allclose(attn_weights, expected_weights.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(context_vec, expected.numpy(), rtol=0, atol=1e-12)
    assert concatenated.shape == (1, 4, 12)  # 3 heads of 4 side by side
    np.testing.assert_allclose(projected.numpy(), context_vec, rtol=0, atol=1e-12)


def test_chapter_6_model_is_the_chapters_layer_and_keeps_the_generator():
    torch.manual_seed(7)
    state = torch.get_rng_state()
    mha = chapter_6_model()
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    chapter = attnlib.MultiHeadAttention(d_in=3, d_out=12, context_length=6, dropout=0.0,
                                         num_heads=3)
    assert not mha.training
    for name, value in chapter.state_dict().items():
        assert torch.equal(mha.state_dict()[name], value), name


def test_check_onnx_catches_a_file_that_differs(tmp_path):
    model = _model()
    path = tmp_path / "m.onnx"
    export_tiny_transformer(model, path)
    with torch.no_grad():
        model.out_head.weight[0, 0] += 1e-3
    idx = torch.arange(9).unsqueeze(0)
    with pytest.raises(ValueError, match="logits differs from PyTorch"):
        check_onnx(path, TinyTransformerGraph(model), idx)
    assert check_onnx(path, TinyTransformerGraph(model), idx, atol=1.0) > 1e-4


def test_bad_input_is_named_before_any_export(tmp_path):
    path = tmp_path / "never.onnx"
    with pytest.raises(TypeError, match="attnlib.TinyTransformer, got torch.nn.Linear"):
        export_tiny_transformer(torch.nn.Linear(2, 2), path)  # type: ignore[arg-type]
    shared = attnlib.TinyTransformer(11, 9, d_model=8, num_heads=2, num_layers=2, kv_sharing=2)
    with pytest.raises(ValueError, match="kv_sharing=2"):
        export_tiny_transformer(shared, path)
    with pytest.raises(ValueError, match="dtype=torch.float16"):
        export_tiny_transformer(_model(), path, dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got str"):
        export_tiny_transformer(_model(), path, dtype="float64")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attnlib.MultiHeadAttention, got torch.nn.Linear"):
        JourneyAttentionGraph(torch.nn.Linear(3, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(vocab_size, d_in=3\), got shape \(6, 4\)"):
        JourneyAttentionGraph(chapter_6_model(), torch.zeros(6, 4))
    with pytest.raises(TypeError, match="int64 torch.Tensor of token ids, got torch.Tensor"):
        check_onnx(path, TinyTransformerGraph(_model()), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"got shape \(3,\)"):
        check_onnx(path, TinyTransformerGraph(_model()), torch.zeros(3, dtype=torch.long))
    assert not path.exists()


def test_write_explorer_models_writes_checked_files_and_metadata(tmp_path):
    models = {"two_layer": _model(2), "one_layer": _model(1)}
    meta = write_explorer_models(tmp_path, models=models)
    written = json.loads((tmp_path / "models.json").read_text())
    assert written == json.loads(json.dumps(meta))
    assert written["ch06"]["tokens"] == list(attnlib.JOURNEY_TOKENS)
    assert written["ch10_two_layer"]["outputs"] == ["logits", "attn_weights_0",
                                                    "attn_weights_1"]
    assert written["ch10_one_layer"]["num_layers"] == 1
    for key in ("ch06", "ch10_two_layer", "ch10_one_layer"):
        assert (tmp_path / written[key]["file"]).stat().st_size < 200_000
        assert written[key]["max_diff"] <= 1e-12  # float64 graphs
    example = written["ch10_two_layer"]["examples"][0]
    tokens, offset = example["tokens"], example["offset"]
    assert len(tokens) == 24 and tokens[16:] == tokens[offset:offset + 8]


@pytest.mark.slow
def test_chapter_10_models_learn_the_induction_task_as_in_the_chapter():
    threads = torch.get_num_threads()
    models = chapter_10_models()
    assert torch.get_num_threads() == threads
    inputs, targets, _ = attnlib.data.induction_batch(
        512, 16, 8, 32, generator=torch.Generator().manual_seed(999))
    with torch.no_grad():
        two = attnlib.training.accuracy(models["two_layer"](inputs), targets)
        one = attnlib.training.accuracy(models["one_layer"](inputs), targets)
    assert two > 0.9 and one < 0.2  # chapter 10: only two layers learn random offsets
