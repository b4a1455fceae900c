"""What each layer's backward keeps, per example, read from a trace of the layer's training step: tools.plan --activations=traced.

tools.plan estimates a layer's activations as its FPropMeta outputs, without
building anything. That is right for an FC layer (its backward reads its
input and its output) and far under for a Transformer block, whose backward
reads its attention probabilities, its 4d-wide hidden layer and its layer
norms' inputs (16x its output in tools.benchmark's Transformer). Here each
distinct layer (same Params but for the name, same input shapes) is built
once and its training step traced as the engine traces a cell's
(cell_program.CellProgram, one layer, a small batch): what its kept forward
stashes for the backward, less its inputs, and what its B stashes for its W
(the weight gradients' inputs), each buffer once (tools.benchmark_memory),
divided by the batch.

A layer the trace cannot build on float inputs of its FPropMeta shapes (an
embedding that reads integer ids, a layer that stashes or pops a skip) keeps
its output size: KeptBytes gives None for it.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ['KeptBytes']


def _Key(layer_params: Any, shapes: tuple) -> tuple:
  """The same layer but for its name, on the same input shapes."""
  return (layer_params.Copy().Set(name='layer').ToText(), shapes)


def _Trace(layer_params: Any, shapes: tuple, batch: int
           ) -> tuple[int, int] | None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import cell as cell_lib  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import cell_program  # pylint: disable=g-import-not-at-top
  from tools import benchmark_memory  # pylint: disable=g-import-not-at-top
  specs = [tf.TensorSpec([batch] + [int(d or 1) for d in s[1:]], tf.float32)
           for s in shapes]
  try:
    layer = layer_params.Copy().Instantiate()
    cell = cell_lib.Cell(0, [layer], '/device:CPU:0')
    program = cell_program.CellProgram(
        cell, tuple(specs), specs, tf.TensorSpec([2], tf.int64), True)
  except Exception:  # pylint: disable=broad-except
    # Anything the trace cannot build keeps the estimate (module docstring).
    return None
  stage = benchmark_memory.ProgramBytes(program)
  if stage is None:
    return None
  return int(stage.activations // batch), int(stage.wcut // batch)


def KeptBytes(layer_params: Sequence[Any], input_shapes: Sequence,
              batch: int = 2) -> list[tuple[int, int] | None]:
  """Per layer, (the bytes per example its kept forward stashes for its
  backward beyond its inputs, those its B stashes for its W), or None where
  the trace cannot tell.

  Args:
    layer_params: the layers' Params, in order (as tools.plan_lib.ModelOf).
    input_shapes: the first layer's input shapes (batch dimension None).
    batch: examples of the traced step.
  """
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import skips as skips_lib  # pylint: disable=g-import-not-at-top
  layer_params = list(layer_params)
  metas = core.MetaOfSequence(layer_params, tuple(input_shapes))
  inputs = [tuple(tuple(s) for s in input_shapes)] + [
      tuple(tuple(s) for s in m.out_shapes) for m in metas[:-1]]
  cache: dict = {}
  out = []
  for lp, shapes in zip(layer_params, inputs):
    if skips_lib.Names(lp, 'stash') or skips_lib.Names(lp, 'pop'):
      out.append(None)
      continue
    key = _Key(lp, shapes)
    if key not in cache:
      cache[key] = _Trace(lp, shapes, batch)
    out.append(cache[key])
  return out
