"""A pipeline cell: a contiguous run of layers placed on one device.

A ``Cell`` is what one stage of a schedule runs. It owns no variables itself:
its layers (children of the PipeliningLayer) do, created on the cell's device.
Cells take and return *flat* lists of tensors plus the nest structure they came
in, so the executor can pass boundary tensors between devices without knowing
what a layer returns.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

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

  def _Traced(self, key: tuple, make_body: Callable[[dict], Callable],
              inline: bool) -> tuple[Any, dict]:
    """The (tf.function, holder) cached under `key` + `inline`; the body
    fills holder with what its trace learns (output structure, variables
    read)."""
    key += (inline,)
    entry = self._functions.get(key)
    if entry is None:
      holder: dict = {}
      entry = (_Function(make_body(holder), inline), holder)
      self._functions[key] = entry
    return entry

  def ForwardFunction(self, structure: Any, training: bool,
                      recompute: bool = False, inline: bool = False
                      ) -> tuple[Any, dict]:
    """The cell's forward as (fn, holder): fn(seed, *flat) returns
    (flat outputs, BatchNorm sums); after a trace holder['struct'] is the
    output nest and holder['bn'] the BatchNorm layers the sums belong to.
    `inline`: whether TensorFlow may inline the calls (see _Function)."""
    key = ('forward', _StructKey(structure), training, recompute)

    def _Make(holder):
      def _Body(step_seed, *xs):
        scope = (base_layer.RecomputeScope() if recompute else
                 contextlib.nullcontext())
        with random_seeds.StepSeedScope(step_seed), scope, (
            normalization.DeferMovingStats()) as stats:
          y = self.Run(structure, xs, training)
        holder['struct'] = y
        holder['bn'], sums = stats.Export()
        return tf.nest.flatten(y), sums
      return _Body

    return self._Traced(key, _Make, inline)

  def RunTraced(self, structure: Any, flat: Sequence[Any], training: bool,
                seed: tf.Tensor, recompute: bool = False) -> list:
    """Like Run, through one tf.function per cell: traced once, called M times.

    The step seed is an argument (a captured tensor would freeze the first
    micro-batch's dropout masks), and BatchNorm statistics deferred inside are
    returned and added to the caller's DeferMovingStats scope, so the
    function has no hidden inputs or outputs. Returns the outputs, as Run.
    """
    function, holder = self.ForwardFunction(structure, training, recompute)
    flat_y, sums = function(seed, *flat)
    deferred = normalization.CurrentDeferral()
    if deferred is not None:
      for layer, stats in zip(holder.get('bn', []), sums):
        deferred.Add(layer, *stats)
    return tf.nest.pack_sequence_as(holder['struct'], list(flat_y))

  def BackwardFunction(self, structure: Any, training: bool,
                       present: Sequence[bool], wanted: Sequence[bool],
                       summed: Sequence[bool] | None,
                       inline: bool = False) -> tuple[Any, dict]:
    """The rematerialising backward as (fn, holder); see BackwardTraced.

    fn(seed, flat, dys, sums) returns (dx, dws); after a trace
    holder['variables'] lists the variables dws belong to. `inline`: as for
    ForwardFunction.
    """
    key = ('backward', _StructKey(structure), training, tuple(present),
           tuple(wanted), None if summed is None else tuple(summed))

    def _Make(holder):
      def _Backward(step_seed, xs, gys, prev):
        xs = list(xs)
        tape, ys, _ = self._Recorded(structure, xs, wanted, training,
                                     step_seed, recompute=True)
        return self._Differentiate(tape, xs, wanted, ys, gys, prev, holder)
      return _Backward

    return self._Traced(key, _Make, inline)

  def ForwardBackwardFunction(self, structure: Any, training: bool,
                              wanted: Sequence[bool],
                              summed: Sequence[bool] | None,
                              head: Callable, inline: bool = False
                              ) -> tuple[Any, dict]:
    """The forward and its backward in one function, keeping the
    activations in between instead of recomputing them, as (fn, holder).

    fn(seed, flat, head_args, sums) runs the forward (BatchNorm statistics
    deferred, as ForwardFunction), then ``head(flat_outputs, *head_args)``
    -> (output gradients, aux), e.g. the loss of the micro-batch and its
    gradient, then differentiates the forward against those gradients as
    BackwardFunction does. It returns (dx, dws, BatchNorm sums, aux); after a
    trace holder['variables'] and holder['bn'] are as for BackwardFunction
    and ForwardFunction. The loop of pipeline/schedule_loop.py runs the last
    stage this way where each backward directly follows its forward.
    """
    key = ('forward_backward', _StructKey(structure), training,
           tuple(wanted), None if summed is None else tuple(summed), head)

    def _Make(holder):
      def _ForwardBackward(step_seed, xs, head_args, prev):
        xs = list(xs)
        tape, ys, stats = self._Recorded(structure, xs, wanted, training,
                                         step_seed, recompute=False)
        holder['bn'], bn_sums = stats.Export()
        gys, aux = head(list(ys), *head_args)
        dx, dws = self._Differentiate(tape, xs, wanted, ys, gys, prev,
                                      holder)
        return dx, dws, bn_sums, aux
      return _ForwardBackward

    return self._Traced(key, _Make, inline)

  def _Recorded(self, structure: Any, xs: list, wanted: Sequence[bool],
                training: bool, step_seed: tf.Tensor, recompute: bool
                ) -> tuple[tf.GradientTape, list, Any]:
    """Runs the layers on `xs` under a tape that watches the `wanted` inputs,
    with BatchNorm statistics deferred (and, if `recompute`, in a
    RecomputeScope): (the tape, the flat outputs, the deferral)."""
    scope = (base_layer.RecomputeScope() if recompute else
             contextlib.nullcontext())
    with tf.GradientTape() as tape:
      tape.watch([x for x, w in zip(xs, wanted) if w])
      with random_seeds.StepSeedScope(step_seed), scope, (
          normalization.DeferMovingStats()) as stats:
        ys = tf.nest.flatten(self.Run(structure, xs, training))
    return tape, ys, stats

  def _Differentiate(self, tape: tf.GradientTape, xs: list,
                     wanted: Sequence[bool], ys: list, gys: Sequence[Any],
                     prev: Sequence[Any] | None, holder: dict
                     ) -> tuple[list, list]:
    """(dx, dws) of the forward `tape` recorded from `xs` to `ys` against the
    output gradients `gys`: dx per input (None where not `wanted`), dws per
    variable read (the cell's own, then any other trainable one, listed in
    holder['variables']), added to `prev` where given."""
    own = {v.ref() for v in self.variables}
    variables = list(self.variables) + [
        v for v in tape.watched_variables()
        if v.trainable and v.ref() not in own]
    holder['variables'] = variables
    pairs = [(y, g) for y, g in zip(ys, gys)
             if g is not None and IsFloat(y)]
    sources = [x for x, w in zip(xs, wanted) if w] + variables
    if pairs:
      grads = tape.gradient([y for y, _ in pairs], sources,
                            output_gradients=[g for _, g in pairs])
    else:
      grads = [None] * len(sources)
    grads = iter(grads)
    dx = [next(grads) if w else None for w in wanted]
    dws = list(grads)
    if prev is not None:
      dws = [_Sum(g, p) for g, p in zip(dws, prev)]
    return dx, dws

  def BackwardTraced(self, structure: Any, flat: Sequence[Any],
                     dys: Sequence[Any], training: bool, seed: tf.Tensor,
                     input_grads: Sequence[bool],
                     sums: Sequence[Any] | None = None
                     ) -> tuple[list, list, list]:
    """A rematerialised backward through one tf.function per cell.

    The function recomputes the cell's forward from its boundary input `flat`
    (step seed `seed`: dropout masks repeat) and differentiates it against the
    output gradients `dys` (None where an output gets none), all inside: the
    caller's graph holds one call per micro-batch, not TensorFlow's
    forward-with-intermediates and backward pair, and no tape.

    Args:
      structure, flat, training, seed: as for RunTraced.
      dys: one gradient (or None) per flat output.
      input_grads: per flat input, whether to return its gradient.
      sums: the weight gradients an earlier call returned (None where it
        returned none), added to this micro-batch's inside the function, so
        a step's graph holds no sum op per variable and micro-batch. A sparse
        gradient (IndexedSlices) is made dense when it is summed.

    Returns:
      (dx, variables, dws): the input gradients (None where not asked or not
      a float), the variables differentiated (the cell's own, then any other
      trainable variable it read, e.g. a tied embedding) and their gradients,
      plus `sums` where given (None for a variable the outputs do not depend
      on; without `sums`, IndexedSlices stay sparse).
    """
    present = [d is not None for d in dys]
    wanted = [bool(w) and IsFloat(x) for w, x in zip(input_grads, flat)]
    summed = None if sums is None else [g is not None for g in sums]
    function, holder = self.BackwardFunction(structure, training, present,
                                             wanted, summed)
    dx, dws = function(seed, list(flat), list(dys),
                       None if sums is None else list(sums))
    return list(dx), list(holder['variables']), list(dws)


def _StructKey(structure: Any) -> str:
  return repr(tf.nest.map_structure(lambda _: 0, structure))


def _Sum(grad: Any, prev: Any) -> Any:
  if prev is None:
    return grad
  if grad is None:
    return prev
  return tf.convert_to_tensor(grad) + prev


def IsFloat(x: Any) -> bool:
  """Whether `x` is a floating-point tensor (one that gets gradients)."""
  return x is not None and x.dtype.is_floating


def _Function(body: Callable, inline: bool) -> Any:
  """A tf.function of `body`, not converted by AutoGraph.

  inline=False marks it not to be inlined: the step's runtime graph keeps
  one call op per action (``trace_once``), so TensorFlow prepares the cell's
  ops once, not once per micro-batch. A graph that calls the function once
  for all micro-batches (the loops of loop.py) lets it be inlined: the
  cell's ops then run in the loop's own executor, without a function call
  per tick (docs/scale.md).
  """
  return tf.function(tf.autograph.experimental.do_not_convert(body),
                     autograph=False,
                     experimental_attributes=(
                         {} if inline else {'_noinline': True}))
