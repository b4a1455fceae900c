"""Keras seed generators made to draw stateless seeds from (step, micro-batch, layer), so a recomputed forward redraws the same numbers.

A Keras layer that draws random numbers (attention dropout, an RNN's dropout
and recurrent dropout, SpatialDropout, GaussianNoise, keras_hub's
Transformer layers) passes a ``keras.random.SeedGenerator`` (or None, the
global one) to ``keras.random.*``, which asks it for the next seed with
``next()``: a read and an increment of a state variable. Two calls of the
same forward (a pipeline's forward and the recompute of it in the backward)
would therefore draw different masks, and the gradients would be wrong.

``StatelessDraws(layer, layer_seed)`` is a scope around one call of a Keras
layer. Inside it, the ``next()`` of every seed generator the layer (and its
sublayers) holds, and of Keras's global one, returns::

    seed(generator g, draw n) = FoldIn(FoldIn(LayerSeed(layer_seed), g), n)

where LayerSeed is this project's (step seed, micro-batch, layer) seed
(random_seeds), g the generator's place in the layer and n the number of
seeds it gave before in this call. No variable is read or written. So the
draws are a pure function of the step seed in scope, the micro-batch and the
layer, and the same whatever the pipeline's K, M, schedule or recompute:

    call of the layer              draws of generator 0     of generator 1
    forward of micro-batch m       FoldIn(s_m, 0, 0), ...    FoldIn(s_m, 1, 0)
    its recompute (backward)       the same                  the same

The state variables are left as they are (they are not weights: neither
trained nor checkpointed). This module deliberately does NOT make a layer
that draws with a fixed integer seed (``keras.random.normal(..., seed=3)``)
vary per step: such a draw is stateless already.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import keras
import tensorflow as tf
from keras.src.backend.common import global_state  # pylint: disable=g-direct-keras-import
from keras.src.random import seed_generator as seed_generator_lib  # pylint: disable=g-direct-keras-import

from gpipe_tf.layers import random_seeds

__all__ = ['SeedGenerators', 'StatelessDraws']


def SeedGenerators(layer: keras.layers.Layer) -> list:
  """The seed generators `layer` and its sublayers hold, in a fixed order."""
  found, seen = [], set()
  for sub in layer._flatten_layers(include_self=True):  # pylint: disable=protected-access
    for gen in getattr(sub, '_seed_generators', ()):
      if id(gen) not in seen:
        seen.add(id(gen))
        found.append(gen)
  return found


class _Draws:
  """The seeds of one call: the n-th draw of generator g (module
  docstring). The layer's seed is taken at the first draw, so a call that
  draws nothing (inference) adds no op."""

  def __init__(self, layer_seed: int) -> None:
    self._layer_seed = layer_seed
    self._base = None
    self._counts: dict[int, int] = {}

  def Next(self, g: int) -> tf.Tensor:
    if self._base is None:
      self._base = random_seeds.LayerSeed(self._layer_seed)
    n = self._counts[g] = self._counts.get(g, -1) + 1
    return random_seeds.FoldIn(random_seeds.FoldIn(self._base, g), n)


class _GlobalStandIn:
  """Keras's global seed generator for the call (``seed=None`` draws)."""

  def __init__(self, draws: _Draws, g: int) -> None:
    self._draws, self._g = draws, g

  def next(self, ordered: bool = True) -> tf.Tensor:  # pylint: disable=invalid-name
    del ordered
    return self._draws.Next(self._g)


@contextlib.contextmanager
def StatelessDraws(layer: keras.layers.Layer, layer_seed: int
                   ) -> Iterator[None]:
  """Inside, `layer`'s random draws are stateless seeds (module docstring).

  Args:
    layer: the Keras layer about to be called.
    layer_seed: the calling gpipe_tf layer's seed (BaseLayer.layer_seed).
  """
  gens = SeedGenerators(layer)
  draws = _Draws(layer_seed)
  saved = []
  for g, gen in enumerate(gens):
    saved.append(gen.__dict__.get('next'))
    gen.next = (lambda ordered=True, g=g: draws.Next(g))
  key = seed_generator_lib.GLOBAL_SEED_GENERATOR
  global_before = global_state.get_global_attribute(key)
  global_state.set_global_attribute(key, _GlobalStandIn(draws, len(gens)))
  try:
    yield
  finally:
    global_state.set_global_attribute(key, global_before)
    for gen, before in zip(gens, saved):
      if before is None:
        del gen.next
      else:
        gen.next = before
