"""Runs a pipelined step: the GradientTape path (fill-drain) and the loss-inside path (any schedule).

Two entry points, one executor (executor.StepExecutor) and one action list
(schedule.Schedule.Order()):

* ``RunPipeline`` returns the merged outputs of the last stage. In training the
  whole pipeline is one ``tf.custom_gradient``, so a plain ``tf.GradientTape``
  around it (and a loss computed after it) yields the pipelined gradients. The
  loss exists only after every forward, so this path runs fill-drain schedules
  only ('gpipe'): all F actions in the forward, the B/W/BW actions when the
  tape asks for the gradient.

* ``RunLossAndGradients`` computes the loss of each micro-batch on the last
  stage's device right after its forward (pipeline/loss.py), so a backward can
  start while later micro-batches are still in their forward: 1F1B,
  interleaved 1F1B and zero-bubble schedules run here, as does GPipe.

Both merge outputs, compute the loss and split output gradients on the last
cell's device, so only cell-boundary tensors cross devices. BatchNorm moving
statistics move once per step from all micro-batches (normalization.
DeferMovingStats).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import executor as executor_lib
from gpipe_tf.pipeline import loop as loop_lib
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import schedule_loop as schedule_loop_lib

Remat = Callable[[int, int], bool]


class ScheduleNeedsLossError(errors.Error, ValueError):
  """A schedule that interleaves forwards and backwards asked for outputs only."""


def _Flatten(inputs: Any) -> tuple[list, list[int], list[tf.Tensor]]:
  flat = tf.nest.flatten(inputs)
  idx = [i for i, x in enumerate(flat) if x is not None]
  return flat, idx, [tf.convert_to_tensor(flat[i]) for i in idx]


def _Fill(flat: list, idx: list[int], tensors: Sequence[Any]) -> list:
  full = list(flat)
  for i, t in zip(idx, tensors):
    full[i] = t
  return full


def _StepSeed() -> tf.Tensor:
  seed = random_seeds.CurrentStepSeed()
  return random_seeds.NewStepSeed() if seed is None else seed


def _Actions(schedule: schedule_lib.Schedule, forward: bool) -> list:
  return [a for a in schedule.Order()
          if (a.kind == schedule_lib.F) == forward]


def _MergeOutputs(run: executor_lib.StepExecutor, cells) -> Any:
  with tf.device(cells[-1].device):
    merged = microbatch.Merge(run.outputs[-1])
  return core.FromTuple(tf.nest.pack_sequence_as(run.out_struct[-1], merged))


# The engine builds its ops explicitly and branches only on Python values, so
# AutoGraph has nothing to convert in it; left on (inside the user's
# tf.function) it re-converts the executor's methods and the layers they call
# action after action, which took a third of the trace time at M=32
# (docs/scale.md). Entry points are therefore marked do_not_convert; the
# cells' layers and the loss_fn then run as plain Python, as in Lingvo.
_NotConverted = tf.autograph.experimental.do_not_convert


@_NotConverted
def RunPipeline(cells: Sequence[cell_lib.Cell],
                schedule: schedule_lib.Schedule, remat: Remat, inputs: tuple,
                training: bool, trace: Any = None,
                trace_once: bool = False, loop: bool = False) -> Any:
  """Runs `inputs` through the cells in micro-batches; returns merged outputs.

  Args:
    cells: the S cells (stages), cell s on its device.
    schedule: the schedule to follow; in training it must be fill-drain.
    remat: remat(s, m) is True when F(s, m) is recomputed in the backward.
    inputs: the positional inputs of the first layer (any nest of tensors).
    training: training mode (dropout, batch statistics, custom gradient).
    trace: optional trace.ScheduleTrace recording each action.
    trace_once: build each cell once (a tf.function called per micro-batch).
    loop: run as loop.py's two tf.while_loops (the caller checked
      loop.Problem); a per-action trace is not available then.

  Raises:
    ScheduleNeedsLossError: training with a schedule that is not fill-drain.
  """
  if training and not schedule.IsFillDrain():
    raise ScheduleNeedsLossError(
        f"Schedule '{schedule.name}' starts backward passes before the last "
        'forward, so the loss must be computed inside the pipeline: train with '
        'PipeliningLayer.ComputeLossAndGradients(inputs, labels, loss_fn) (the '
        "tasks do this for you), or use schedule='gpipe'.")
  if trace is not None and trace.schedule is None:
    trace.schedule = schedule
  flat, idx, tensors = _Flatten(inputs)
  num_micro = schedule.num_micro_batches
  seed = _StepSeed()
  if loop:
    _NoTrace(trace)
    problem = loop_lib.FPropProblem(schedule, training)
    if problem:
      raise loop_lib.LoopNeedsLossError(
          f'micro_batch_loop: {problem}. Train with '
          'PipeliningLayer.ComputeLossAndGradients(inputs, labels, loss_fn), '
          'or set micro_batch_loop=False.')
    return _RunPipelineLoop(cells, num_micro, inputs, flat, idx, tensors,
                            training, seed)

  if not training:
    run = executor_lib.StepExecutor(cells, schedule, remat, False, seed,
                                    trace=trace, trace_once=trace_once)
    run.Run(_Actions(schedule, True),
            microbatch.Split(_Fill(flat, idx, tensors), num_micro), inputs)
    return _MergeOutputs(run, cells)

  # BatchNorm: each micro-batch is normalised with its own statistics; the
  # moving statistics move once, from all micro-batches (and replicas).
  bn_stats = normalization.DeferredMovingStats()
  run = executor_lib.StepExecutor(cells, schedule, remat, True, seed,
                                  trace=trace, bn_stats=bn_stats,
                                  trace_once=trace_once)

  @tf.custom_gradient
  def _Pipeline(*ts):
    micro = microbatch.Split(_Fill(flat, idx, ts), num_micro)
    with normalization.DeferMovingStats(bn_stats):
      run.Run(_Actions(schedule, True), micro, inputs)
    bn_stats.Apply()
    with tf.device(cells[-1].device):
      merged = microbatch.Merge(run.outputs[-1])

    def _Grad(*dys, variables=None):
      with tf.device(cells[-1].device):
        micro_dys = microbatch.SplitLike(list(dys), run.outputs[-1])
      run.ClearGradients()
      for m, dy in enumerate(micro_dys):
        run.dys[-1][m] = dy
      run.Run(_Actions(schedule, False))
      with tf.device(cells[0].device):
        input_grads = _InputGrads(run, ts, idx)
      return input_grads, [run.Gradient(v) for v in (variables or [])]

    return merged, _Grad

  merged = _Pipeline(*tensors)
  if not isinstance(merged, (list, tuple)):
    merged = [merged]
  return core.FromTuple(
      tf.nest.pack_sequence_as(run.out_struct[-1], list(merged)))


def _NoTrace(trace: Any) -> None:
  if trace is not None:
    raise loop_lib.LoopTraceError(
        'A per-action trace needs one op per action; micro_batch_loop runs '
        'them in two loops. Trace with micro_batch_loop=False (the schedule '
        'and the results are the same).')


def _RunPipelineLoop(cells, num_micro: int, inputs: tuple, flat: list,
                     idx: list[int], tensors: list, training: bool,
                     seed: tf.Tensor) -> Any:
  """RunPipeline as the two loops of loop.py."""
  if not training:
    run = loop_lib.FillDrainLoop(cells, num_micro, False, seed)
    merged = run.Forward(inputs, _Fill(flat, idx, tensors))
    return core.FromTuple(tf.nest.pack_sequence_as(run.out_struct, merged))
  bn_stats = normalization.DeferredMovingStats()
  run = loop_lib.FillDrainLoop(cells, num_micro, True, seed)

  @tf.custom_gradient
  def _Pipeline(*ts):
    merged = run.Forward(inputs, _Fill(flat, idx, ts), bn_stats=bn_stats)
    bn_stats.Apply()

    def _Grad(*dys, variables=None):
      input_dx, grads = run.Backward(list(dys), input_grads=True)
      return [input_dx[i] for i in idx], _Of(grads, variables or [])

    return merged, _Grad

  merged = _Pipeline(*tensors)
  if not isinstance(merged, (list, tuple)):
    merged = [merged]
  return core.FromTuple(tf.nest.pack_sequence_as(run.out_struct, list(merged)))


def _InputGrads(run: executor_lib.StepExecutor, ts: Sequence[tf.Tensor],
                idx: list[int]) -> list:
  """Gradients of the pipeline's tensor inputs, merged over micro-batches."""
  input_grads = []
  for j, t in enumerate(ts):
    parts = [dx[idx[j]] for dx in run.dxs]
    if not executor_lib.IsFloat(t) or any(p is None for p in parts):
      input_grads.append(None)
    elif t.shape.rank == 0:
      input_grads.append(tf.add_n(parts))
    else:
      input_grads.append(tf.concat(parts, axis=0) if len(parts) > 1
                         else parts[0])
  return input_grads


@_NotConverted
def RunLossAndGradients(cells: Sequence[cell_lib.Cell],
                        schedule: schedule_lib.Schedule, remat: Remat,
                        inputs: tuple, labels: Any,
                        loss_fn: loss_lib.LossFn,
                        variables: Sequence[tf.Variable], trace: Any = None,
                        trace_once: bool = False, loop: bool = False
                        ) -> tuple[tf.Tensor, dict[str, tf.Tensor], list]:
  """One training step's loss, metrics and gradients, the loss inside the pipeline.

  Args:
    cells, schedule, remat, inputs, trace, trace_once, loop: as for
      RunPipeline;
      any valid schedule runs.
    labels: any nest of tensors split into micro-batches like the inputs
      (rank-0 leaves are shared); loss_fn sees micro-batch m's.
    loss_fn: (outputs, labels) -> loss.LossTerms of one micro-batch.
    variables: the variables to return gradients for.

  Returns:
    (loss, metrics, grads): the weighted mean loss and metrics over the
    mini-batch, and the gradient of the loss for each of `variables` (None
    for a variable the pipeline does not read), summed over micro-batches.
  """
  if trace is not None and trace.schedule is None:
    trace.schedule = schedule
  num_micro = schedule.num_micro_batches
  flat, idx, tensors = _Flatten(inputs)
  if loop:
    _NoTrace(trace)
    return _LossAndGradientsLoop(cells, schedule, inputs,
                                 _Fill(flat, idx, tensors), labels, loss_fn,
                                 variables)
  micro = microbatch.Split(_Fill(flat, idx, tensors), num_micro)
  label_flat = tf.nest.flatten(labels)
  with tf.device(cells[-1].device):
    micro_labels = microbatch.Split(label_flat, num_micro)
  bn_stats = normalization.DeferredMovingStats()
  run = executor_lib.StepExecutor(
      cells, schedule, remat, True, _StepSeed(), loss_fn=loss_fn,
      input_grads=False, trace=trace, bn_stats=bn_stats,
      trace_once=trace_once)
  run.labels = [tf.nest.pack_sequence_as(labels, mb) for mb in micro_labels]
  with normalization.DeferMovingStats(bn_stats):
    run.Run(schedule.Order(), micro, inputs)
  bn_stats.Apply()
  with tf.device(cells[-1].device):
    total = loss_lib.Total(run.loss_sums)
  grads = [run.Gradient(v) for v in variables]
  run.Release()
  return _Scaled(cells, total, variables, grads)


def _LossAndGradientsLoop(cells, schedule: schedule_lib.Schedule,
                          inputs: tuple, flat: list, labels: Any,
                          loss_fn: loss_lib.LossFn,
                          variables: Sequence[tf.Variable]) -> tuple:
  """RunLossAndGradients as loop.py's two loops (GPipe) or
  schedule_loop.py's one (any other schedule)."""
  bn_stats = normalization.DeferredMovingStats()
  if loop_lib.RunsTwoLoops(schedule):
    run = loop_lib.FillDrainLoop(cells, schedule.num_micro_batches, True,
                                 _StepSeed())
    total = run.Forward(inputs, flat, labels, loss_fn, bn_stats=bn_stats)
    bn_stats.Apply()
    _, grads = run.Backward()
  else:
    run = schedule_loop_lib.ScheduleLoop(cells, schedule, _StepSeed())
    total, grads = run.LossAndGradients(inputs, flat, labels, loss_fn,
                                        bn_stats)
    bn_stats.Apply()
  return _Scaled(cells, total, variables, _Of(grads, variables))


def _Of(grads: dict, variables: Sequence[tf.Variable]) -> list:
  """Each variable's gradient from FillDrainLoop.Backward's {ref: (v, g)}
  (None for a variable the loss does not depend on)."""
  return [grads[v.ref()][1] if v.ref() in grads else None for v in variables]


def _Scaled(cells, total: loss_lib.Sums, variables: Sequence[tf.Variable],
            summed: Sequence[Any]) -> tuple[tf.Tensor, dict, list]:
  """(loss, metrics, gradients / total weight) from the step's sums."""
  with tf.device(cells[-1].device):
    loss, metrics = loss_lib.Means(total)
    scale = 1.0 / tf.maximum(total.weight, 1e-12)
  grads = []
  for v, g in zip(variables, summed):
    if g is None:
      grads.append(None)
      continue
    with tf.device(v.device):
      if isinstance(g, tf.IndexedSlices):
        grads.append(tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype),
                                      g.indices, g.dense_shape))
      else:
        grads.append(g * tf.cast(scale, g.dtype))
  return loss, metrics, grads
