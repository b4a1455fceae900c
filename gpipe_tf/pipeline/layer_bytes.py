"""What each layer's backward keeps, per example, read from a trace of the layer's training step.

A layer's FPropMeta outputs are what an FC layer's backward reads (its input
and its output), and far under what a Transformer block's keeps: its
attention probabilities, its 4d-wide hidden layer and its layer norms'
inputs (16x its output in tools.benchmark's Transformer). Here each distinct
layer (same Params but for the name, same input shapes) is built once and
its training step traced as the engine traces a cell's
(introspect.TraceCell, one layer, a small batch): what its kept forward
stashes for the backward, less its inputs, and what its B stashes for its W
(the weight gradients' inputs), each buffer once (introspect.ProgramBytes),
divided by the batch. schedule='auto' (auto_schedule.py) and tools.plan
(--activations=traced) size the memory model with it.

A layer that stashes or pops a skip (layers/skips.py) is traced as a cell of
its own, as the pipeline runs it at a cell boundary: what it pops comes in
as the cell's skip_in, what it stashes leaves as its skip_out. Under a
16-bit precision policy (layers/precision.py) the layer is traced in it, on
inputs of its compute dtype, as a pipeline cell receives them.

A layer the trace cannot build on float inputs of its FPropMeta shapes (an
embedding that reads integer ids) keeps its output size: KeptBytes gives
None for it. The traced copies are dropped; nothing is kept.

A layer's own trace leaves out its inputs, which its stage's first layer
gets from the stage's input; a later layer's inputs are the layer before's
outputs, made in the stage. Where the layer before does not keep them
itself and this one's backward reads them (a Transformer block's residual
input: its output is a sum, which no backward reads), the stage keeps them
once more. JoinedBytes traces each distinct pair of neighbours as one cell
and gives what the pair keeps beyond its two layers traced alone (0 for FC
layers, whose ReLU output the next layer reads; one block's input for a
Transformer block after another): a stage's layers' KeptBytes plus its
later layers' JoinedBytes equal the stage traced whole where no buffer is
shared past a neighbour.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ['JoinedBytes', 'KeptBytes']


def _Key(layer_params: Any, shapes: tuple) -> tuple:
  """The same layer but for its name, on the same input shapes."""
  return (layer_params.Copy().Set(name='layer').ToText(), shapes)


def _Trace(layer_params: Any, shapes: tuple, batch: int, policy: str,
           after: Any = None) -> tuple[int, int] | None:
  """(kept, wcut) per example of `layer_params` traced as a cell of its own,
  or of `after` and it traced as one cell on `after`'s input `shapes`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import precision  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import skips as skips_lib  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import introspect  # pylint: disable=g-import-not-at-top
  dtype = precision.ComputeDtype(policy)
  specs = [tf.TensorSpec([batch] + [int(d or 1) for d in s[1:]], dtype)
           for s in shapes]
  pops = skips_lib.Names(layer_params, 'pop')
  xs, skips = specs[:len(specs) - len(pops)], specs[len(specs) - len(pops):]
  try:
    with precision.Policy(policy):
      program = introspect.TraceCell(
          [p.Copy().Instantiate() for p in (after, layer_params)
           if p is not None], xs, skip_in=pops,
          skip_out=skips_lib.Names(layer_params, 'stash'), skip_specs=skips)
  except Exception:  # pylint: disable=broad-except
    # Anything the trace cannot build keeps the estimate (module docstring).
    return None
  stage = introspect.ProgramBytes(program)
  if stage is None:
    return None
  return int(stage.activations // batch), int(stage.wcut // batch)


def KeptBytes(layer_params: Sequence[Any], input_shapes: Sequence,
              batch: int = 2, policy: str = 'float32'
              ) -> list[tuple[int, int] | None]:
  """Per layer, (the bytes per example its kept forward stashes for its
  backward beyond its inputs, those its B stashes for its W), or None where
  the trace cannot tell.

  Args:
    layer_params: the layers' Params, in order.
    input_shapes: the first layer's input shapes (batch dimension None).
    batch: examples of the traced step.
    policy: the precision policy the layers run under
      (layers/precision.py).

  Raises:
    precision.PolicyError: an unknown policy.
  """
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import precision  # pylint: disable=g-import-not-at-top
  precision.ComputeDtype(policy)  # PolicyError if unknown.
  chain = core.InputsAndMetaOfSequence(list(layer_params),
                                       tuple(input_shapes))
  cache: dict = {}
  out = []
  for lp, (shapes, _) in zip(layer_params, chain):
    shapes = tuple(tuple(s) for s in shapes)
    key = _Key(lp, shapes)
    if key not in cache:
      cache[key] = _Trace(lp, shapes, batch, policy)
    out.append(cache[key])
  return out


def _HasSkips(layer_params: Any) -> bool:
  from gpipe_tf.layers import skips as skips_lib  # pylint: disable=g-import-not-at-top
  return bool(skips_lib.Names(layer_params, 'pop') or
              skips_lib.Names(layer_params, 'stash'))


def JoinedBytes(layer_params: Sequence[Any], input_shapes: Sequence,
                batch: int = 2, policy: str = 'float32',
                kept: Sequence[tuple[int, int] | None] | None = None
                ) -> list[tuple[int, int] | None]:
  """Per layer, (the bytes per example its stage keeps for the backwards,
  those its B stashes for the W) beyond its own KeptBytes and the layer
  before's when the two run in one stage: the two traced as one cell less
  each traced alone (module docstring). None for the first layer, and
  where a trace cannot tell or either layer stashes or pops a skip (its
  neighbour's inputs are then not its outputs). Args and Raises as
  KeptBytes's; `kept`, KeptBytes's answer for the same arguments where the
  caller has it (else traced here).
  """
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  alone = (KeptBytes(layer_params, input_shapes, batch, policy)
           if kept is None else kept)
  chain = core.InputsAndMetaOfSequence(list(layer_params),
                                       tuple(input_shapes))
  cache: dict = {}
  out: list[tuple[int, int] | None] = [None]
  for i in range(1, len(layer_params)):
    before, lp = layer_params[i - 1], layer_params[i]
    shapes = tuple(tuple(s) for s in chain[i - 1][0])
    if (alone[i - 1] is None or alone[i] is None or _HasSkips(before) or
        _HasSkips(lp)):
      out.append(None)
      continue
    key = (_Key(before, shapes), _Key(lp, ()))
    if key not in cache:
      pair = _Trace(lp, shapes, batch, policy, after=before)
      cache[key] = None if pair is None else tuple(
          p - a - b for p, a, b in zip(pair, alone[i - 1], alone[i]))
    out.append(cache[key])
  return out
