"""A pipeline cell: a contiguous run of layers placed on one device.

A ``Cell`` is what one stage of a schedule runs. It owns no variables itself:
its layers (children of the PipeliningLayer) do, created on the cell's device.
Cells take and return *flat* lists of tensors plus the nest structure they came
in, so the executor can pass boundary tensors between devices without knowing
what a layer returns.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds


class Cell:
  """Stage `index` of a pipeline: its layers and the device they run on."""

  def __init__(self, index: int, layers: Sequence[base_layer.BaseLayer],
               device: str) -> None:
    self.index = index
    self.layers = list(layers)
    self.device = device
    self.variables = [v for l in self.layers for v in l.trainable_variables]
    self._functions: dict[tuple, Any] = {}

  def Run(self, structure: Any, flat: Sequence[Any], training: bool) -> tuple:
    """Runs the layers on the inputs `flat` packed as `structure`."""
    xs = tf.nest.pack_sequence_as(structure, list(flat))
    return core.AsTuple(core.RunSequence(self.layers, xs, training))

  def OnDevice(self, device: str) -> 'Cell':
    """The same layers placed on another device (a data-parallel replica).

    The copy traces its own functions: a function traced in one replica's
    context captures that replica's copies of the variables.
    """
    return Cell(self.index, self.layers, device)

  def RunTraced(self, structure: Any, flat: Sequence[Any], training: bool,
                seed: tf.Tensor, recompute: bool = False) -> list:
    """Like Run, through one tf.function per cell: traced once, called M times.

    The step seed is an argument (a captured tensor would freeze the first
    micro-batch's dropout masks), and BatchNorm statistics deferred inside are
    returned and added to the caller's DeferMovingStats scope, so the
    function has no hidden inputs or outputs. Returns the outputs, as Run.
    """
    key = (repr(tf.nest.map_structure(lambda _: 0, structure)), training,
           recompute)
    fn = self._functions.get(key)
    if fn is None:
      holder = {}

      def _Body(step_seed, *xs):
        scope = (base_layer.RecomputeScope() if recompute else
                 contextlib.nullcontext())
        with random_seeds.StepSeedScope(step_seed), scope, (
            normalization.DeferMovingStats()) as stats:
          y = self.Run(structure, xs, training)
        holder['struct'] = y
        holder['bn'], sums = stats.Export()
        return tf.nest.flatten(y), sums

      fn = (tf.function(tf.autograph.experimental.do_not_convert(_Body),
                        autograph=False,
                        experimental_attributes={'_noinline': True}), holder)
      self._functions[key] = fn
    function, holder = fn
    flat_y, sums = function(seed, *flat)
    deferred = normalization.CurrentDeferral()
    if deferred is not None:
      for layer, stats in zip(holder.get('bn', []), sums):
        deferred.Add(layer, *stats)
    return tf.nest.pack_sequence_as(holder['struct'], list(flat_y))
