"""A pipeline cell: a contiguous run of layers placed on one device.

A ``Cell`` is what one stage of a schedule runs. It owns no variables itself:
its layers (children of the PipeliningLayer) do, created on the cell's device.
Cells take and return *flat* lists of tensors plus the nest structure they came
in, so the executor can pass boundary tensors between devices without knowing
what a layer returns.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core


class Cell:
  """Stage `index` of a pipeline: its layers and the device they run on."""

  def __init__(self, index: int, layers: Sequence[base_layer.BaseLayer],
               device: str) -> None:
    self.index = index
    self.layers = list(layers)
    self.device = device
    self.variables = [v for l in self.layers for v in l.trainable_variables]

  def Run(self, structure: Any, flat: Sequence[Any], training: bool) -> tuple:
    """Runs the layers on the inputs `flat` packed as `structure`."""
    xs = tf.nest.pack_sequence_as(structure, list(flat))
    return core.AsTuple(core.RunSequence(self.layers, xs, training))

  def OnDevice(self, device: str) -> 'Cell':
    """The same layers placed on another device (a data-parallel replica)."""
    return Cell(self.index, self.layers, device)
