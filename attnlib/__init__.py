"""attnlib: the small PyTorch package behind *Self-Attention, Step by Step*.

Functions are grouped by concept, not by chapter:

* :mod:`attnlib.data` - the running example sentence and toy data sets.
* :mod:`attnlib.functional` - softmax, weight-free attention, causal masks,
  a readable reference of scaled dot-product attention, its tiled form
  ``flash_attention`` (FlashAttention in PyTorch, :mod:`attnlib.flash`), and
  ``attention``, which the modules call to run either of them or torch's
  fused kernel.
* :mod:`attnlib.attention` - the single-head attention modules, from
  ``SelfAttention_v1`` to ``CausalAttention``.
* :mod:`attnlib.multihead` - ``MultiHeadAttentionWrapper`` and
  ``MultiHeadAttention`` (which ``GroupedQueryAttention`` extends).
* :mod:`attnlib.positional` - positional encodings, rotary embeddings (RoPE).
* :mod:`attnlib.kv_cache` - the key-value cache for generating token by token.
* :mod:`attnlib.gqa` - grouped-query (and multi-query) attention.
* :mod:`attnlib.flash_triton` - FlashAttention-2's forward and backward as Triton
  kernels (chapter 11; needs ``pip install attnlib[triton]``, imported lazily).
* :mod:`attnlib.interop` - weights to and from Hugging Face's Llama-family and
  GPT-2 attention layers.
* :mod:`attnlib.latent` - multi-head latent attention (MLA) and its latent cache.
* :mod:`attnlib.linear_attention` - linear attention, the delta rule and Gated
  DeltaNet, in recurrent, parallel and chunked forms.
* :mod:`attnlib.sparse` - DeepSeek Sparse Attention: an indexer and top-k keys.
* :mod:`attnlib.sinks` - attention sinks and QK-norm, and ``QKNormSinkAttention``
  (``GroupedQueryAttention`` with both and a sliding window, chapter 13).
* :mod:`attnlib.variants` - chapter 13's attention variants as blocks of
  ``TinyTransformer`` (linear, Gated DeltaNet, MLA, sparse, shared KV) and the
  cache each keeps per sequence.
* :mod:`attnlib.models` - ``TinyTransformer``, the small decoder-only model
  chapter 10 trains.
* :mod:`attnlib.training` - a seeded training loop that records losses and
  attention snapshots, and the heads' previous-token and prefix-matching scores.
* :mod:`attnlib.experiments` - the measured experiments the chapters plot (a
  package: chapter 3's scaling experiments, chapter 4's initialisation one).
* :mod:`attnlib.viz` - figures (matplotlib is imported only when drawing).
* :mod:`attnlib.device` - picking CPU or GPU.
* :mod:`attnlib.bench` - ``python -m attnlib.bench``, the timing and memory
  benchmark (a package: contestants, timing, memory, sweeps, report, CLI).
* :mod:`attnlib.exercises` - the checkers of the chapters' exercises (a package).
* :mod:`attnlib.source` - ``show_source`` and ``expect``, for the notebooks.

Mask convention everywhere: a bool mask is True where a query may attend.
"""

from . import (
    data,
    device,
    experiments,
    functional,
    interop,
    latent,
    linear_attention,
    models,
    positional,
    sinks,
    sparse,
    training,
    variants,
    viz,
)
from .attention import CausalAttention, SelfAttention_v1, SelfAttention_v2
from .data import JOURNEY_TOKENS, journey_embeddings
from .device import get_device
from .functional import (
    bottom_right_causal_mask,
    causal_mask,
    flash_attention,
    scaled_dot_product_attention,
    simplified_attention,
    sliding_window_mask,
    softmax,
    softmax_naive,
)
from .gqa import GroupedQueryAttention
from .kv_cache import KVCache
from .latent import MultiHeadLatentAttention
from .linear_attention import GatedDeltaNet
from .models import TinyTransformer, TransformerBlock
from .multihead import MultiHeadAttention, MultiHeadAttentionWrapper
from .positional import (
    LearnedPositionalEmbedding,
    RotaryPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from .sinks import QKNormSinkAttention
from .source import expect, show_source
from .viz import plot_attention

__version__ = "0.6.0"

__all__ = [
    "CausalAttention",
    "GatedDeltaNet",
    "GroupedQueryAttention",
    "JOURNEY_TOKENS",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadLatentAttention",
    "QKNormSinkAttention",
    "RotaryPositionalEmbedding",
    "SelfAttention_v1",
    "SelfAttention_v2",
    "SinusoidalPositionalEncoding",
    "TinyTransformer",
    "TransformerBlock",
    "bottom_right_causal_mask",
    "causal_mask",
    "data",
    "device",
    "expect",
    "experiments",
    "flash_attention",
    "functional",
    "get_device",
    "interop",
    "journey_embeddings",
    "latent",
    "linear_attention",
    "models",
    "plot_attention",
    "positional",
    "scaled_dot_product_attention",
    "show_source",
    "simplified_attention",
    "sinks",
    "sliding_window_mask",
    "sinusoidal_encoding",
    "softmax",
    "softmax_naive",
    "sparse",
    "training",
    "variants",
    "viz",
    "__version__",
]
