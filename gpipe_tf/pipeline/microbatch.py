"""Splitting a mini-batch (any nest of tensors) into micro-batches, and merging outputs back.

The batch of N examples is cut into M contiguous micro-batches along axis 0.
When M does not divide N the first N % M micro-batches get one example more
than the rest, so all M micro-batches exist, the last ones are the smaller
ones, and no example is ever dropped::

    N = 10, M = 4  ->  sizes [3, 3, 2, 2]

Tensors of rank 0 (and None leaves) are not batched: every micro-batch sees
them unchanged. A statically unknown batch size is split with dynamic sizes.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf import errors

__all__ = ['BatchSize', 'Merge', 'MicroBatchError', 'MicroBatchSizes', 'Sizes',
           'Split', 'SplitLike']


class MicroBatchError(errors.Error, ValueError):
  """The inputs cannot be split into the requested micro-batches."""


def MicroBatchSizes(batch_size: int, num_micro_batches: int) -> list[int]:
  """Sizes of the M micro-batches of a batch of N (pure Python).

  Raises:
    MicroBatchError: M < 1, or N < M (some micro-batch would be empty).
  """
  if num_micro_batches < 1:
    raise MicroBatchError(
        f'num_micro_batches must be >= 1, got {num_micro_batches}.')
  if batch_size < num_micro_batches:
    raise MicroBatchError(
        f'A batch of {batch_size} examples cannot be split into '
        f'{num_micro_batches} micro-batches; use num_micro_batches <= '
        f'{batch_size} or a larger batch.')
  base, extra = divmod(batch_size, num_micro_batches)
  return [base + (1 if i < extra else 0) for i in range(num_micro_batches)]


def _IsBatched(x: Any) -> bool:
  return x is not None and getattr(x, 'shape', None) is not None and (
      x.shape.rank is None or x.shape.rank > 0)


def BatchSize(flat: Sequence[Any]) -> tf.Tensor | int:
  """The common batch size of the batched leaves: an int if static.

  Raises:
    MicroBatchError: no batched leaf, or leaves disagree on a static batch size.
  """
  batched = [x for x in flat if _IsBatched(x)]
  if not batched:
    raise MicroBatchError('No input has a batch dimension to split.')
  static = {int(x.shape[0]) for x in batched if x.shape[0] is not None}
  if len(static) > 1:
    raise MicroBatchError(
        f'Inputs disagree on the batch size (dimension 0): {sorted(static)}.')
  if static:
    return static.pop()
  return tf.shape(batched[0])[0]


def Sizes(flat: Sequence[Any], num_micro_batches: int) -> list[int] | tf.Tensor:
  """The sizes of the M micro-batches of the batched leaves of `flat`: a
  list of ints when the batch size is static, else an int tensor whose
  computation fails (tf.debugging) on a batch smaller than M.

  Raises:
    MicroBatchError: as MicroBatchSizes and BatchSize.
  """
  n = BatchSize(flat)
  if isinstance(n, int):
    return MicroBatchSizes(n, num_micro_batches)
  if num_micro_batches < 1:
    raise MicroBatchError(
        f'num_micro_batches must be >= 1, got {num_micro_batches}.')
  with tf.control_dependencies([tf.debugging.assert_greater_equal(
      n, num_micro_batches,
      message=f'batch smaller than num_micro_batches={num_micro_batches}')]):
    base = n // num_micro_batches
  extra = n % num_micro_batches
  return base + tf.cast(tf.range(num_micro_batches) < extra, n.dtype)


def Split(flat: Sequence[Any], num_micro_batches: int) -> list[list[Any]]:
  """Splits flat leaves into `num_micro_batches` lists of leaves (the
  engine splits into TensorArrays with the same Sizes).

  Returns:
    micro[m][i]: micro-batch m of leaf i.
  """
  sizes = Sizes(flat, num_micro_batches)
  columns = []
  for x in flat:
    if _IsBatched(x):
      columns.append(tf.split(x, sizes, num=num_micro_batches, axis=0))
    else:
      columns.append([x] * num_micro_batches)
  return [[col[m] for col in columns] for m in range(num_micro_batches)]


def Merge(micro: Sequence[Sequence[tf.Tensor]]) -> list[tf.Tensor]:
  """Concatenates per-micro-batch leaves back in order: inverse of Split."""
  if len(micro) == 1:
    return list(micro[0])
  merged = []
  for i in range(len(micro[0])):
    leaves = [mb[i] for mb in micro]
    if not _IsBatched(leaves[0]):
      raise MicroBatchError(
          f'Output {i} has no batch dimension (rank 0); a pipelined model '
          'must return batched tensors.')
    merged.append(tf.concat(leaves, axis=0))
  return merged


def SplitLike(flat: Sequence[tf.Tensor | None], like: Sequence[Sequence[Any]]
              ) -> list[list[tf.Tensor | None]]:
  """Splits `flat` (e.g. output gradients) with the sizes of micro-batches `like`."""
  num = len(like)
  out = [[None] * len(flat) for _ in range(num)]
  for i, x in enumerate(flat):
    if x is None:
      continue
    sizes = [tf.shape(mb[i])[0] for mb in like]
    parts = tf.split(x, tf.stack(sizes), num=num, axis=0) if num > 1 else [x]
    for m in range(num):
      out[m][i] = parts[m]
  return out
