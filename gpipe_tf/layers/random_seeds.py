"""Explicit seeds for stateless randomness, so a recomputed forward redraws the same masks.

A layer that needs randomness in its forward pass (dropout) asks for
``LayerSeed(layer_seed)``. The seed it gets is derived from the *step seed* in
scope: the trainer opens a scope per training step, and the pipeline opens one
per micro-batch (folding the micro-batch index into the step seed). The
recomputation in the backward pass re-enters the very same scope with the very
same seed tensor, so every dropout mask is reproduced exactly.

Outside any scope a fresh random seed is drawn on every call (the behaviour of
ordinary stateful dropout); such a forward must not be recomputed.
"""

from __future__ import annotations

import contextlib
import contextvars
import zlib
from typing import Iterator

import tensorflow as tf

__all__ = ['CurrentStepSeed', 'FoldIn', 'LayerSeed', 'LayerSeedsScope',
           'NameSeed', 'NewStepSeed', 'StepSeedScope', 'TracedLayerSeed']

_STEP_SEED: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_step_seed', default=None)
_LAYER_SEEDS: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_layer_seeds', default=None)


@contextlib.contextmanager
def StepSeedScope(seed: tf.Tensor) -> Iterator[tf.Tensor]:
  """Makes `seed` (an int64 tensor of shape [2]) the step seed in this scope."""
  seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
  token = _STEP_SEED.set(seed)
  try:
    yield seed
  finally:
    _STEP_SEED.reset(token)


@contextlib.contextmanager
def LayerSeedsScope(seeds: dict) -> Iterator[None]:
  """In here, the layer with id i takes the tensor `seeds[i]` as its
  layer_seed: a trace shared by several layers (layers/shared_trace.py)
  takes each layer's seed as an argument instead of a constant."""
  token = _LAYER_SEEDS.set(seeds)
  try:
    yield
  finally:
    _LAYER_SEEDS.reset(token)


def TracedLayerSeed(layer) -> tf.Tensor | None:
  """The tensor standing in for `layer`'s layer_seed (LayerSeedsScope), or
  None."""
  seeds = _LAYER_SEEDS.get()
  return None if seeds is None else seeds.get(id(layer))


def CurrentStepSeed() -> tf.Tensor | None:
  """The step seed in scope, or None."""
  return _STEP_SEED.get()


def NewStepSeed() -> tf.Tensor:
  """Draws a fresh step seed (stateful: a different value on every call)."""
  return tf.random.uniform([2], minval=0, maxval=2**31 - 1, dtype=tf.int64)


def FoldIn(seed: tf.Tensor, data: int | tf.Tensor) -> tf.Tensor:
  """A new seed derived from `seed` and the integer `data` (a Python int, or
  an int32 tensor in [0, 2**31) such as a loop's micro-batch index: the
  same value gives the same seed either way; an int64 tensor of the same
  value gives another seed, measured with TF 2.21)."""
  if not isinstance(data, tf.Tensor):
    data = int(data) % 2**31
  return tf.cast(tf.random.experimental.stateless_fold_in(seed, data),
                 tf.int64)


def NameSeed(name: str) -> int:
  """A stable 31-bit integer from a layer path (the default layer seed)."""
  return zlib.crc32(name.encode('utf-8')) % 2**31


def LayerSeed(layer_seed: int) -> tf.Tensor:
  """The stateless seed a layer uses for this forward pass."""
  step = CurrentStepSeed()
  if step is None:
    step = NewStepSeed()
  return FoldIn(step, layer_seed)
