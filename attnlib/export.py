"""The course's trained tiny models as ONNX files, for the book's live explorer.

The HTML book runs chapter 6's multi-head attention and chapter 10's trained
models in the reader's browser with onnxruntime-web (``explorer/``). This
module writes those models with :func:`torch.onnx.export`, each returning every
tensor the explorer draws (the logits and every layer's attention weights), and
checks every file against PyTorch with onnxruntime as it writes it.

* :func:`export_tiny_transformer` - a :class:`attnlib.TinyTransformer` whose
  graph returns ``logits`` and ``attn_weights_0``, ``attn_weights_1``, ...
* :func:`export_journey_attention` - a :class:`attnlib.MultiHeadAttention` on
  the journey sentence's embeddings, returning each head's weights, the
  heads' concatenated context vectors and the output projection.
* :func:`chapter_6_model`, :func:`chapter_10_models` - the layers the chapters
  build, from the chapters' seeds and training code.
* :func:`write_explorer_models` (also ``python -m attnlib.export OUT_DIR``) -
  every file the explorer loads, with ``models.json``, the metadata it reads.

``onnx`` and ``onnxruntime`` are not attnlib's dependencies: they are imported
when a file is checked (``pip install onnx onnxruntime``; the book pins them in
``requirements.txt``).
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ._heads import check_plain_multi_head
from ._validation import type_name
from .data import JOURNEY_TOKENS, induction_batch, journey_embeddings
from .models import TinyTransformer
from .multihead import MultiHeadAttention
from .training import train

__all__ = [
    "CHAPTER_10_INDUCTION",
    "EXPORT_ATOL",
    "JourneyAttentionGraph",
    "TinyTransformerGraph",
    "chapter_10_models",
    "chapter_6_model",
    "check_onnx",
    "export_journey_attention",
    "export_tiny_transformer",
    "write_explorer_models",
]

#: Largest absolute difference :func:`check_onnx` accepts between onnxruntime's
#: outputs and PyTorch's, the issue's bound for the page (the float64 graphs agree to
#: about 1e-12; the book's browser test holds the page to 1e-10).
EXPORT_ATOL = 1e-5

#: Chapter 10's induction task and models, as the chapter sets them up (prefix
#: length P, repetition length R, vocabulary size, model width, heads, training
#: steps, batch size, learning rate, and the seeds of the initial weights, the
#: batches and the held-out test batch).
CHAPTER_10_INDUCTION: dict[str, int | float] = {
    "prefix_len": 16,
    "repeat_len": 8,
    "vocab_size": 32,
    "d_model": 32,
    "num_heads": 2,
    "num_steps": 400,
    "batch_size": 64,
    "lr": 1e-2,
    "seed": 0,
    "test_seed": 999,
}

_OPSET = 17


class TinyTransformerGraph(nn.Module):
    """A :class:`attnlib.TinyTransformer` that returns a flat tuple, for export.

    ``forward(idx)`` returns ``(logits, attn_weights_0, attn_weights_1, ...)``:
    ``model(idx, return_weights=True)`` with the list of weights spread out,
    since an ONNX graph's outputs are single tensors.

    Args:
        model: the model; it is shared, not copied, and must have
            ``kv_sharing=1`` and ``attention="softmax"`` (models that return
            their attention weights).

    Raises:
        TypeError: ``model`` is not a :class:`attnlib.TinyTransformer`.
        ValueError: the model cannot return its attention weights.
    """

    def __init__(self, model: TinyTransformer) -> None:
        if not isinstance(model, TinyTransformer):
            raise TypeError(f"model must be an attnlib.TinyTransformer, got {type_name(model)}")
        if model.kv_sharing != 1 or model.attention != "softmax":
            raise ValueError(
                "model must return its attention weights (kv_sharing=1, attention='softmax'), "
                f"got kv_sharing={model.kv_sharing}, attention={model.attention!r}"
            )
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``idx``: int64 ``(batch, num_tokens)``. Returns ``logits``
        ``(batch, num_tokens, vocab_size)`` and one ``(batch, num_heads, num_tokens,
        num_tokens)`` tensor of attention weights per layer."""
        logits, attn_weights = self.model(idx, return_weights=True)
        return (logits, *attn_weights)


class JourneyAttentionGraph(nn.Module):
    """Chapter 6's multi-head attention on token ids of the journey sentence, for export.

    The ids index :data:`attnlib.JOURNEY_TOKENS`; each is looked up in the
    ``(6, 3)`` table of :func:`attnlib.journey_embeddings` (or ``embeddings``),
    and the tokens go through ``mha`` on its readable path.

    Args:
        mha: a causal :class:`attnlib.MultiHeadAttention` with ``d_in`` equal
            to the embeddings' width; shared, not copied.
        embeddings: ``(vocab_size, d_in)`` float32 table; default
            :func:`attnlib.journey_embeddings`.

    Raises:
        TypeError: ``mha`` is not a :class:`attnlib.MultiHeadAttention` or
            ``embeddings`` is not a float tensor.
        ValueError: ``embeddings`` is not 2-D or its width is not ``mha.d_in``;
            ``mha`` shares key/value heads or has RoPE (a
            :class:`attnlib.GroupedQueryAttention`).
    """

    def __init__(self, mha: MultiHeadAttention, embeddings: torch.Tensor | None = None) -> None:
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"mha must be an attnlib.MultiHeadAttention, got {type_name(mha)}")
        check_plain_multi_head(mha, "mha", "JourneyAttentionGraph")
        if embeddings is None:
            embeddings = journey_embeddings()
        if not isinstance(embeddings, torch.Tensor) or not embeddings.is_floating_point():
            raise TypeError(f"embeddings must be a float torch.Tensor, got {type_name(embeddings)}")
        if embeddings.ndim != 2 or embeddings.shape[1] != mha.d_in:
            raise ValueError(
                f"embeddings must be (vocab_size, d_in={mha.d_in}), "
                f"got shape {tuple(embeddings.shape)}"
            )
        super().__init__()
        self.mha = mha
        self.register_buffer("embeddings", embeddings.clone())

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``idx``: int64 ``(batch, num_tokens)``, ids of the embedding table.

        Returns ``(attn_weights, concatenated, context_vec)``: each head's
        weights ``(batch, num_heads, num_tokens, num_tokens)``; the heads'
        context vectors side by side ``(batch, num_tokens, num_heads * head_dim)``
        (before the output projection); and ``mha``'s output
        ``(batch, num_tokens, d_out)``, ``out_proj(concatenated)``.
        """
        embeddings = self.embeddings
        assert isinstance(embeddings, torch.Tensor)  # a registered buffer
        x = embeddings[idx]  # (batch, num_tokens, d_in)
        context_vec, attn_weights = self.mha(x, return_weights=True)
        b, num_tokens, _ = x.shape
        values = self.mha.W_value(x).view(b, num_tokens, self.mha.num_heads, -1)
        # values: (b, num_tokens, num_heads, head_dim)
        per_head = attn_weights @ values.transpose(1, 2)  # (b, num_heads, num_tokens, head_dim)
        concatenated = per_head.transpose(1, 2).reshape(b, num_tokens, -1)
        # concatenated: (b, num_tokens, num_heads * head_dim)
        return attn_weights, concatenated, context_vec


def _check_idx_examples(examples: object) -> list[torch.Tensor]:
    if isinstance(examples, torch.Tensor):
        examples = [examples]
    if not isinstance(examples, (list, tuple)) or not examples:
        raise TypeError(f"examples must be a tensor or a non-empty list of tensors, "
                        f"got {type_name(examples)}")
    for example in examples:
        if not isinstance(example, torch.Tensor) or example.dtype != torch.long:
            raise TypeError(f"each example must be an int64 torch.Tensor of token ids, "
                            f"got {type_name(example)}")
        if example.ndim != 2 or example.shape[1] == 0:
            raise ValueError(f"each example must be (batch, num_tokens) with num_tokens >= 1, "
                             f"got shape {tuple(example.shape)}")
    return list(examples)


def check_onnx(
    path: str | Path,
    module: nn.Module,
    examples: torch.Tensor | Sequence[torch.Tensor],
    *,
    atol: float = EXPORT_ATOL,
) -> float:
    """Run an exported file with onnxruntime and compare it with ``module`` in PyTorch.

    Args:
        path: the ``.onnx`` file, whose one input is ``idx``.
        module: the module it was exported from (e.g. a
            :class:`TinyTransformerGraph`), returning a tuple of tensors in the
            file's output order.
        examples: int64 ``(batch, num_tokens)`` token ids, or a list of them
            (of different lengths, to check the graph's dynamic length).
        atol: keyword-only; the largest absolute difference allowed. Default
            :data:`EXPORT_ATOL`.

    Returns:
        The largest absolute difference over every output and example.

    Raises:
        TypeError: an example is not an int64 tensor.
        ValueError: an example is not 2-D or is empty; an output's shape
            differs from PyTorch's, or a difference exceeds ``atol``.
        ImportError: onnxruntime is not installed.
    """
    examples = _check_idx_examples(examples)
    import numpy as np
    import onnxruntime  # type: ignore[import-untyped]

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    was_training = module.training
    module.eval()
    worst = 0.0
    try:
        for idx in examples:
            with torch.no_grad():
                expected = module(idx)
            got = session.run(None, {"idx": idx.numpy()})
            for name, ours, theirs in zip(names, got, expected, strict=True):
                if tuple(ours.shape) != tuple(theirs.shape):
                    raise ValueError(f"{path}: output {name} has shape {tuple(ours.shape)}, "
                                     f"PyTorch's {tuple(theirs.shape)}")
                diff = float(np.abs(ours - theirs.numpy()).max())
                if not diff <= atol:  # also catches NaN
                    raise ValueError(f"{path}: output {name} differs from PyTorch by {diff:.3g} "
                                     f"> atol={atol} on idx of shape {tuple(idx.shape)}")
                worst = max(worst, diff)
    finally:
        module.train(was_training)
    return worst


def _export(module: nn.Module, example: torch.Tensor, path: Path, outputs: list[str]) -> None:
    """``torch.onnx.export`` with a dynamic ``num_tokens`` (TorchScript exporter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    module.eval()
    with warnings.catch_warnings():
        # The TorchScript exporter: one self-contained file, no onnxscript, and it
        # keeps the model's Python-side input checks out of the graph (they are
        # traced as constants, with a TracerWarning each).
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            module,
            (example,),
            str(path),
            input_names=["idx"],
            output_names=outputs,
            dynamic_axes={"idx": {0: "batch", 1: "num_tokens"}},
            opset_version=_OPSET,
            dynamo=False,
        )


def _check_dtype(dtype: object) -> None:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type_name(dtype)}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got dtype={dtype}")


def _lengths(num_tokens: int) -> list[int]:
    return sorted({1, 2, max(1, num_tokens // 2), num_tokens})


def export_tiny_transformer(
    model: TinyTransformer,
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    atol: float = EXPORT_ATOL,
    seed: int = 0,
) -> float:
    """Write ``model`` as an ONNX file returning its logits and attention weights.

    The graph's input is ``idx``, int64 ``(batch, num_tokens)`` with any
    ``num_tokens`` from 1 to ``model.context_length``; its outputs are
    ``logits`` ``(batch, num_tokens, vocab_size)`` and ``attn_weights_0``,
    ``attn_weights_1``, ... ``(batch, num_heads, num_tokens, num_tokens)``, one
    per layer, as ``model(idx, return_weights=True)`` returns them. The file is
    then run by onnxruntime on random sequences of several lengths and
    compared with PyTorch (:func:`check_onnx`).

    Args:
        model: the model (put in eval mode; its weights are not changed).
        path: the file to write.
        dtype: keyword-only; the graph's float type, ``torch.float32``
            (default) or ``torch.float64``: a copy of the model is cast to it
            and checked against the same copy in PyTorch. The book's explorer
            uses float64, so that the page and PyTorch agree to far below
            float32's roundoff (about 1e-5 on logits near 15).
        atol: keyword-only; the check's tolerance. Default :data:`EXPORT_ATOL`.
        seed: keyword-only; seeds the check's random sequences. Default 0.

    Returns:
        The largest absolute difference between onnxruntime and PyTorch.

    Raises:
        TypeError: ``model`` is not a :class:`attnlib.TinyTransformer`, or
            ``dtype`` is not a ``torch.dtype``.
        ValueError: the model cannot return attention weights, ``dtype`` is
            not float32 or float64, or the check fails.

    Source: the ONNX format (https://onnx.ai/onnx/intro/concepts.html), written by
    :func:`torch.onnx.export`.
    """
    _check_dtype(dtype)
    graph = TinyTransformerGraph(copy.deepcopy(model).to(dtype))
    path = Path(path)
    generator = torch.Generator().manual_seed(seed)
    n = model.context_length
    full = torch.randint(0, model.vocab_size, (1, n), generator=generator)
    outputs = ["logits"] + [f"attn_weights_{i}" for i in range(model.num_layers)]
    _export(graph, full, path, outputs)
    examples = [full[:, :length] for length in _lengths(n)]
    examples.append(torch.randint(0, model.vocab_size, (3, n), generator=generator))
    return check_onnx(path, graph, examples, atol=atol)


def export_journey_attention(
    mha: MultiHeadAttention,
    path: str | Path,
    *,
    embeddings: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    atol: float = EXPORT_ATOL,
    seed: int = 0,
) -> float:
    """Write chapter 6's multi-head attention on the journey's tokens as an ONNX file.

    The graph (:class:`JourneyAttentionGraph`) takes ``idx``, int64
    ``(batch, num_tokens)`` ids of the embedding table's rows (any
    ``num_tokens`` up to ``mha.context_length``), and returns
    ``attn_weights`` ``(batch, num_heads, num_tokens, num_tokens)``,
    ``concatenated`` ``(batch, num_tokens, num_heads * head_dim)`` and
    ``context_vec`` ``(batch, num_tokens, d_out)``. The file is checked
    against PyTorch with onnxruntime (:func:`check_onnx`).

    Args:
        mha: a causal :class:`attnlib.MultiHeadAttention` with ``d_in = 3``
            (or the embeddings' width).
        path: the file to write.
        embeddings: keyword-only; ``(vocab_size, d_in)`` table. Default
            :func:`attnlib.journey_embeddings`.
        dtype: keyword-only; the graph's float type, ``torch.float32``
            (default) or ``torch.float64`` (as :func:`export_tiny_transformer`).
        atol: keyword-only; the check's tolerance. Default :data:`EXPORT_ATOL`.
        seed: keyword-only; seeds the check's random sequences. Default 0.

    Returns:
        The largest absolute difference between onnxruntime and PyTorch.

    Raises:
        TypeError, ValueError: as :class:`JourneyAttentionGraph`; ValueError
            also when the check fails or ``dtype`` is not float32 or float64.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (multi-head attention: heads, concatenation, output projection).
    """
    _check_dtype(dtype)
    graph = JourneyAttentionGraph(mha, embeddings)
    graph = copy.deepcopy(graph).to(dtype)
    path = Path(path)
    table = graph.embeddings
    assert isinstance(table, torch.Tensor)  # a registered buffer
    vocab = int(table.shape[0])
    generator = torch.Generator().manual_seed(seed)
    n = mha.context_length
    full = torch.arange(n).remainder(vocab).unsqueeze(0)  # (1, n)
    _export(graph, full, path, ["attn_weights", "concatenated", "context_vec"])
    examples = [full[:, :length] for length in _lengths(n)]
    examples.append(torch.randint(0, vocab, (2, n), generator=generator))
    return check_onnx(path, graph, examples, atol=atol)


def chapter_6_model() -> MultiHeadAttention:
    """Chapter 6's worked multi-head layer, from the chapter's seed.

    Returns:
        ``MultiHeadAttention(d_in=3, d_out=12, context_length=6, dropout=0.0,
        num_heads=3)`` built right after ``torch.manual_seed(123)``, in eval
        mode: the layer whose eight steps chapter 6 follows by hand. Torch's
        global generator is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        mha = MultiHeadAttention(d_in=3, d_out=12, context_length=6, dropout=0.0, num_heads=3)
    return mha.eval()


def chapter_10_models() -> dict[str, TinyTransformer]:
    """Chapter 10's two-layer induction model and its one-layer control, trained.

    The chapter's code, step for step: each model is
    ``TinyTransformer(32, 24, d_model=32, num_heads=2, num_layers=L)`` built
    after ``torch.manual_seed(0)``, and trained by :func:`attnlib.training.train`
    for 400 steps of 64 fresh :func:`attnlib.data.induction_batch` sequences
    (random offsets) with ``lr=1e-2, seed=0``, on one thread as in the chapter
    (:data:`CHAPTER_10_INDUCTION`). Under the same arithmetic (the book's
    ``_ext/numerics.env``) the weights equal the chapter's bit for bit. About
    ten seconds on a laptop's CPU. Torch's global generator and thread count
    are restored afterwards.

    Returns:
        ``{"two_layer": ..., "one_layer": ...}``, both in eval mode.
    """
    cfg = CHAPTER_10_INDUCTION
    p, r, vocab = int(cfg["prefix_len"]), int(cfg["repeat_len"]), int(cfg["vocab_size"])
    batch_size = int(cfg["batch_size"])

    def random_offsets(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return induction_batch(batch_size, p, r, vocab, generator=generator)

    threads = torch.get_num_threads()
    models = {}
    try:
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):
            for name, num_layers in (("two_layer", 2), ("one_layer", 1)):
                torch.manual_seed(int(cfg["seed"]))
                model = TinyTransformer(vocab, p + r, d_model=int(cfg["d_model"]),
                                        num_heads=int(cfg["num_heads"]), num_layers=num_layers)
                train(model, random_offsets, int(cfg["num_steps"]), lr=float(cfg["lr"]),
                      seed=int(cfg["seed"]))
                models[name] = model.eval()
    finally:
        torch.set_num_threads(threads)
    return models


def write_explorer_models(
    out_dir: str | Path, *, models: dict[str, TinyTransformer] | None = None
) -> dict[str, object]:
    """Write every file the book's explorer loads into ``out_dir``.

    ``ch06_multihead.onnx`` (:func:`chapter_6_model`),
    ``ch10_two_layer.onnx`` and ``ch10_one_layer.onnx``
    (:func:`chapter_10_models`), each checked against PyTorch with
    onnxruntime, and ``models.json``: for each file its inputs and outputs,
    sizes, token names, the chapter's example sequences (the first held-out
    test sequences of chapter 10), and the check's largest difference.

    Args:
        out_dir: the folder (created if missing).
        models: keyword-only; chapter 10's models, if already trained (as
            :func:`chapter_10_models` returns them). Default: trained here.

    Returns:
        The metadata written to ``models.json``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mha = chapter_6_model()
    meta: dict[str, object] = {"atol": EXPORT_ATOL}
    meta["ch06"] = {
        "file": "ch06_multihead.onnx",
        "tokens": list(JOURNEY_TOKENS),
        "context_length": mha.context_length,
        "num_heads": mha.num_heads,
        "head_dim": mha.head_dim,
        "d_out": mha.d_out,
        "outputs": ["attn_weights", "concatenated", "context_vec"],
        "dtype": "float64",
        "max_diff": export_journey_attention(mha, out / "ch06_multihead.onnx",
                                             dtype=torch.float64),
    }
    trained = chapter_10_models() if models is None else models
    cfg = CHAPTER_10_INDUCTION
    p, r, vocab = int(cfg["prefix_len"]), int(cfg["repeat_len"]), int(cfg["vocab_size"])
    test_inputs, _, test_offsets = induction_batch(
        512, p, r, vocab, generator=torch.Generator().manual_seed(int(cfg["test_seed"]))
    )[:3]
    examples = [{"offset": int(test_offsets[i]), "tokens": test_inputs[i].tolist()}
                for i in range(4)]
    for name, model in trained.items():
        file = f"ch10_{name}.onnx"
        meta[f"ch10_{name}"] = {
            "file": file,
            "vocab_size": model.vocab_size,
            "context_length": model.context_length,
            "prefix_len": p,
            "num_layers": model.num_layers,
            "num_heads": model.num_heads,
            "outputs": ["logits"] + [f"attn_weights_{i}" for i in range(model.num_layers)],
            "examples": examples,
            "dtype": "float64",
            "max_diff": export_tiny_transformer(model, out / file, dtype=torch.float64),
        }
    (out / "models.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _main(argv: Sequence[str] | None = None) -> None:
    """``python -m attnlib.export OUT_DIR``: :func:`write_explorer_models`."""
    parser = argparse.ArgumentParser(description=write_explorer_models.__doc__.splitlines()[0]
                                     if write_explorer_models.__doc__ else None)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    meta = write_explorer_models(args.out_dir)
    for value in meta.values():
        if isinstance(value, dict):
            print(f"{args.out_dir / value['file']}: onnxruntime vs PyTorch, "
                  f"max |difference| {value['max_diff']:.2g}")


if __name__ == "__main__":
    _main()
