"""Small, fixed data sets used across the course.

The six-token sentence "Your journey starts with one step" with 3-dimensional
embeddings is the running example of the field's best-known teaching material
(Raschka, *Build a Large Language Model (From Scratch)*, 2024, ch. 3). Using the
same numbers lets a reader check this course's results against other books.

The toy tasks that chapter 10 trains on are seeded generators of token batches:
:func:`reversal_batch` (write a sequence backwards) and :func:`induction_batch`
(a random prefix, then a stretch of it again, at a random or fixed offset).
"""

from __future__ import annotations

import torch

from ._validation import check_int, check_positive_int, type_name

__all__ = [
    "IGNORE_INDEX",
    "JOURNEY_TOKENS",
    "SEPARATOR",
    "induction_batch",
    "journey_embeddings",
    "reversal_batch",
]

#: The tokens of the running example, in order (index 1 is "journey").
JOURNEY_TOKENS: tuple[str, ...] = ("Your", "journey", "starts", "with", "one", "step")

_JOURNEY_ROWS = (
    (0.43, 0.15, 0.89),  # Your     (x^1)
    (0.55, 0.87, 0.66),  # journey  (x^2)
    (0.57, 0.85, 0.64),  # starts   (x^3)
    (0.22, 0.58, 0.33),  # with     (x^4)
    (0.77, 0.25, 0.10),  # one      (x^5)
    (0.05, 0.80, 0.55),  # step     (x^6)
)


def journey_embeddings() -> torch.Tensor:
    """Embeddings of "Your journey starts with one step".

    Returns:
        A new ``(6, 3)`` float32 tensor, one row per token of
        :data:`JOURNEY_TOKENS` (``num_tokens = 6``, ``d_in = 3``). Each call
        returns a fresh tensor, so changing it never changes later calls.

    Source: the running example of Raschka (2024), *Build a Large Language
    Model (From Scratch)*, section 3.3.
    """
    return torch.tensor(_JOURNEY_ROWS, dtype=torch.float32)


# -- toy tasks for training (chapter 10) --------------------------------------

#: Target value that :func:`torch.nn.functional.cross_entropy` skips
#: (its default ``ignore_index``): positions whose next token cannot be known.
IGNORE_INDEX = -100

#: Token id of the separator of :func:`reversal_batch`; task tokens are 1 and up.
SEPARATOR = 0


def _check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type_name(generator)}"
        )


def reversal_batch(
    batch_size: int,
    num_tokens: int,
    vocab_size: int,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the reversal task: read a sequence, then write it backwards.

    Each row is ``x_0 ... x_{n-1}, SEP, x_{n-1} ... x_1`` with ``n = num_tokens``
    random tokens drawn uniformly from ``1 .. vocab_size - 1`` and the separator
    :data:`SEPARATOR` (token 0). A causal language model reading the row
    position by position must, from the separator on, predict the first half
    in reverse order: ``targets[:, n + k] = x_{n-1-k}`` for ``k = 0 .. n-1``.
    The first half is random, so its targets are :data:`IGNORE_INDEX`.

    Args:
        batch_size: rows in the batch.
        num_tokens: ``n``, the length of the sequence to reverse.
        vocab_size: size of the vocabulary including the separator (at least 2).
        generator: keyword-only; the ``torch.Generator`` to draw from, for a
            seeded batch. Default: torch's global generator.

    Returns:
        ``(inputs, targets)``, both int64 ``(batch_size, 2 * num_tokens)``.
        ``targets[:, t]`` is the token that should follow ``inputs[:, :t + 1]``,
        or :data:`IGNORE_INDEX`; ``targets[:, num_tokens:]`` equals
        ``inputs[:, :num_tokens].flip(-1)``.

    Raises:
        TypeError: a size is not an int, or ``generator`` is not a
            ``torch.Generator``.
        ValueError: a size is not positive, or ``vocab_size < 2``.

    Source: the sequence-reversal task of Grefenstette et al. (2015), "Learning
    to Transduce with Unbounded Memory", section 4 (synthetic transduction
    tasks), here in decoder-only form with a separator.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("num_tokens", num_tokens)
    check_int("vocab_size", vocab_size, minimum=2)
    _check_generator(generator)
    sequence = torch.randint(
        1, vocab_size, (batch_size, num_tokens), generator=generator
    )  # (batch_size, num_tokens), tokens 1 .. vocab_size - 1
    reversed_sequence = sequence.flip(-1)  # (batch_size, num_tokens)
    separator = torch.full((batch_size, 1), SEPARATOR, dtype=torch.long)
    inputs = torch.cat((sequence, separator, reversed_sequence[:, :-1]), dim=1)
    # inputs: (batch_size, 2 * num_tokens)
    unknown = torch.full((batch_size, num_tokens), IGNORE_INDEX, dtype=torch.long)
    targets = torch.cat((unknown, reversed_sequence), dim=1)  # (batch_size, 2 * num_tokens)
    return inputs, targets


def induction_batch(
    batch_size: int,
    prefix_len: int,
    repeat_len: int,
    vocab_size: int,
    *,
    offset: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of the induction task: a random prefix, then a stretch of it again.

    Each row is a prefix ``x_0 ... x_{P-1}`` of ``P = prefix_len`` *distinct*
    tokens drawn from ``0 .. vocab_size - 1``, followed by the repetition
    ``x_k, x_{k+1}, ..., x_{k+R-1}`` of ``R = repeat_len`` of its tokens,
    starting at the row's offset ``k``. Inside the repetition every next token
    is fixed by the prefix: the token after ``x_{k+j}`` is the one that followed
    ``x_{k+j}`` earlier. With a random offset per row, finding it needs the
    earlier occurrence of the current token (an induction head); with a fixed
    offset the answer always sits at the same position, and absolute
    positions alone solve the task.

    Args:
        batch_size: rows in the batch.
        prefix_len: ``P``, tokens in the prefix; at most ``vocab_size``
            (they are distinct).
        repeat_len: ``R``, tokens in the repetition; ``2 <= R <= P``.
        vocab_size: size of the vocabulary.
        offset: keyword-only; ``k``, the same for every row, in
            ``0 .. P - R``. Default None: each row draws its own ``k``
            uniformly from ``0 .. P - R``.
        generator: keyword-only; the ``torch.Generator`` to draw from, for a
            seeded batch. Default: torch's global generator.

    Returns:
        ``(inputs, targets, offsets)``: ``inputs`` and ``targets`` int64
        ``(batch_size, P + R)``, ``offsets`` int64 ``(batch_size,)``.
        ``targets[:, t]`` is the token that should follow ``inputs[:, :t + 1]``
        where that is determined by the prefix (``t = P .. P + R - 2``, so
        ``targets[:, t] = inputs[:, t + 1]`` there) and :data:`IGNORE_INDEX`
        elsewhere.

    Raises:
        TypeError: a size or ``offset`` is not an int, or ``generator`` is
            not a ``torch.Generator``.
        ValueError: a size is not positive, ``prefix_len > vocab_size``,
            ``repeat_len`` is outside ``2 .. prefix_len``, or ``offset`` is
            outside ``0 .. prefix_len - repeat_len``.

    Source: the repeated random tokens on which Olsson et al. (2022),
    "In-context Learning and Induction Heads", section 2 (and the prefix
    matching and copying that define an induction head), study induction
    heads; the random offset is this course's variant.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("prefix_len", prefix_len)
    check_positive_int("repeat_len", repeat_len)
    check_positive_int("vocab_size", vocab_size)
    if prefix_len > vocab_size:
        raise ValueError(
            f"prefix_len={prefix_len} exceeds vocab_size={vocab_size}: "
            "the prefix's tokens are distinct"
        )
    if not 2 <= repeat_len <= prefix_len:
        raise ValueError(
            f"repeat_len must be in 2 .. prefix_len={prefix_len}, got repeat_len={repeat_len}"
        )
    max_offset = prefix_len - repeat_len
    if offset is not None:
        check_int("offset", offset)
        if not 0 <= offset <= max_offset:
            raise ValueError(
                f"offset must be in 0 .. prefix_len - repeat_len = {max_offset}, "
                f"got offset={offset}"
            )
    _check_generator(generator)
    # Distinct tokens: the first prefix_len entries of a random permutation per row.
    noise = torch.rand(batch_size, vocab_size, generator=generator)  # (batch_size, vocab_size)
    prefix = noise.argsort(dim=1)[:, :prefix_len]  # (batch_size, prefix_len)
    if offset is None:
        offsets = torch.randint(0, max_offset + 1, (batch_size,), generator=generator)
    else:
        offsets = torch.full((batch_size,), int(offset), dtype=torch.long)
    where = offsets[:, None] + torch.arange(repeat_len)  # (batch_size, repeat_len)
    repeat = prefix.gather(1, where)  # (batch_size, repeat_len)
    inputs = torch.cat((prefix, repeat), dim=1)  # (batch_size, prefix_len + repeat_len)
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[:, prefix_len:-1] = inputs[:, prefix_len + 1 :]
    return inputs, targets, offsets
