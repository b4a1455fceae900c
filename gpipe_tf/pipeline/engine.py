"""Runs a pipelined step: the tape path (fill-drain) and the loss-inside path (any schedule), both through the interpreter.

* ``RunPipeline`` returns the merged outputs of the last stage. In training
  the whole pipeline is one ``tf.custom_gradient``: its forward runs the
  schedule's F actions (tick program phase 'forward'), its gradient the rest
  (phase 'backward'), so a plain ``tf.GradientTape`` around it (and a loss
  computed after it) yields the pipelined gradients. The loss exists only
  after every forward, so training this way needs a fill-drain schedule
  ('gpipe', any V). Inference runs any schedule's F actions.

* ``RunLossAndGradients`` computes the loss of each micro-batch on the last
  stage right after its forward, so a backward can start while later
  micro-batches are still in their forward: every schedule trains here, in
  one tick program (phase 'all').

BatchNorm moving statistics move once per step from all micro-batches
(normalization.DeferredMovingStats).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import core
from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import aux_carry
from gpipe_tf.pipeline import cell_program as program_lib
from gpipe_tf.pipeline import interpreter
from gpipe_tf.pipeline import leaves
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import tensor_loop as tl
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = ['ScheduleNeedsLossError']  # The rest is PipeliningLayer's.

Keep = Callable[[int, int], bool]


class ScheduleNeedsLossError(errors.Error, ValueError):
  """A schedule that interleaves forwards and backwards asked for outputs only."""


def _Inputs(cells: Sequence[Any], schedule: schedule_lib.Schedule,
            inputs: Any) -> tuple[list, tf.Tensor, list, int | None]:
  """(the flat leaves of `inputs`, the step seed, one micro-batch's spec of
  each leaf, the examples per micro-batch).

  The leaves are tensors (None stays None), cast as the first layer will
  cast them under the precision policy (so that the micro-batches the first
  stage holds are 16-bit); the seed is the one in scope, else a new one.
  The specs' batch dimension (None stays None) is the micro-batch's size
  when all are equal, else None, as is the examples per micro-batch.

  Raises:
    microbatch.MicroBatchError: fewer examples than micro-batches.
  """
  flat = [None if x is None else tf.convert_to_tensor(x)
          for x in tf.nest.flatten(inputs)]
  with tf.device(cells[0].device):
    flat = precision.AsLayerInputs(cells[0].layers[0], flat)
  seed = random_seeds.CurrentStepSeed()
  seed = random_seeds.NewStepSeed() if seed is None else seed
  n = microbatch.BatchSize(flat)
  batch = None
  if isinstance(n, int):
    sizes = microbatch.MicroBatchSizes(n, schedule.num_micro_batches)
    batch = sizes[0] if len(set(sizes)) == 1 else None  # Static: faster.
  # SpecOf gives `batch` only to a leaf with a batch dimension.
  return flat, seed, [tl.SpecOf(x, batch) for x in flat], batch


def _Packed(compiled: interpreter.Compiled, flat: Sequence[Any]) -> Any:
  """The last stage's merged outputs in their nest. Where they carry the
  batch's auxiliary losses (the tape path), those go to the auxiliary losses
  in scope (aux_losses.Add), for the loss the caller computes."""
  struct = compiled.programs[-1].out_struct
  if isinstance(struct, aux_carry.Carried):
    aux_losses.Add(aux_carry.MergedAux(flat), 'PipeliningLayer')
    struct, flat = struct.outputs, flat[:-1]
  return core.FromTuple(tf.nest.pack_sequence_as(struct, list(flat)))


# The engine builds its ops explicitly and branches only on Python values, so
# AutoGraph has nothing to convert in it; left on (inside the user's
# tf.function) it would re-convert the interpreter and the layers it calls.
_NotConverted = tf.autograph.experimental.do_not_convert


@_NotConverted
def RunPipeline(cells: Sequence[Any], schedule: schedule_lib.Schedule,
                keep: Keep, inputs: tuple, training: bool, trace: Any,
                execution: str, jit_compile: bool, budget: float) -> Any:
  """Runs `inputs` through the cells in micro-batches; returns merged outputs.

  Args:
    cells: the S cells (stages), cell s on its device.
    schedule: the schedule to follow; in training it must be fill-drain.
    keep: keep(s, m) is True when F(s, m) keeps its activations for its
      backward (False: the backward recomputes them).
    inputs: the positional inputs of the first layer (any nest of tensors).
    training: training mode (dropout, batch statistics, custom gradient).
    trace: optional trace.ScheduleTrace recording each action.
    execution: how the step's tick programs are built (periods.Plan).
    jit_compile: compile the cells' pieces with XLA.
    budget: the ops a 'loop' execution builds a program whole or folded
      within (periods.Plan).

  Raises:
    ScheduleNeedsLossError: training with a schedule that is not fill-drain.
  """
  if training and not schedule.IsFillDrain():
    raise ScheduleNeedsLossError(
        f"Schedule '{schedule.name}' starts backward passes before the last "
        'forward, so the loss must be computed inside the pipeline: train with '
        'PipeliningLayer.ComputeLossAndGradients(inputs, labels, loss_fn) (the '
        "tasks do this for you), or use schedule='gpipe'.")
  flat, seed, specs, _ = _Inputs(cells, schedule, inputs)
  programs = tuple(  # (forward,) or (forward, backward)
      ticks_lib.Lower(schedule, phase=phase,
                      keep=keep if training else lambda s, m: True,
                      skips=interpreter.SkipPairs(cells))
      for phase in (('forward', 'backward') if training else ('forward',)))
  compiled = interpreter.Compile(cells, schedule, inputs, specs, training,
                                 programs, seed, jit_compile, execution,
                                 budget)
  if not training:
    feeds, state = interpreter.Start(compiled, flat, (), seed)
    state = interpreter.Run(compiled, feeds, programs[0], state, trace)
    outputs = interpreter.Merged(compiled, state, -1, Role.Y)
    interpreter.Done(state)
    return _Packed(compiled, outputs)

  @tf.custom_gradient
  def _Pipeline(*ts):
    feeds, state = interpreter.Start(
        compiled, leaves.Fill(flat, ts), (), seed)
    state = interpreter.Run(compiled, feeds, programs[0], state, trace)
    interpreter.MoveBatchNormStats(compiled, state)
    outputs = interpreter.Merged(compiled, state, -1, Role.Y)

    def _Grad(*dys, variables=None):
      after = interpreter.FeedOutputGradients(
          compiled, feeds, state, leaves.Fill(outputs, dys))
      after = interpreter.Run(compiled, feeds, programs[1], after, trace)
      dx = interpreter.Merged(compiled, after, 0, Role.DX)
      grads = interpreter.Gradients(compiled, after)
      interpreter.Done(after)
      return ([g for g, x in zip(dx, flat) if x is not None],
              [grads.get(v.ref()) for v in variables or []])

    return leaves.Present(outputs), _Grad

  # The outputs that exist (an output may be None) at their places; one
  # comes back alone, not in a list.
  merged = tf.nest.flatten(_Pipeline(*leaves.Present(flat)))
  return _Packed(compiled, leaves.Fill(compiled.programs[-1].out_specs,
                                       merged))


@_NotConverted
def RunLossAndGradients(
    cells: Sequence[Any], schedule: schedule_lib.Schedule, keep: Keep,
    inputs: tuple, labels: Any, loss_fn: loss_lib.LossFn,
    variables: Sequence[tf.Variable], trace: Any, execution: str,
    jit_compile: bool, loss_scale: tf.Tensor | None, budget: float
) -> tuple[tf.Tensor, dict[str, tf.Tensor], list]:
  """One training step's loss, metrics and gradients, the loss inside the pipeline.

  Args:
    cells, schedule, keep, inputs, trace, execution, jit_compile, budget: as
      for RunPipeline; any valid schedule runs.
    labels: any nest of tensors split into micro-batches like the inputs
      (rank-0 leaves are shared); loss_fn sees micro-batch m's.
    loss_fn: (outputs, labels) -> loss.LossTerms of one micro-batch.
    variables: the variables to return gradients for.
    loss_scale: optional float32 scalar: the gradients are those of the loss
      times it (float16 loss scaling; the loss and metrics are not scaled).

  Returns:
    (loss, metrics, grads): the weighted mean loss and metrics over the
    mini-batch, and the gradient of the loss (times loss_scale) for each of
    `variables` (None for a variable the step does not read), summed over
    micro-batches and over every use of the variable (in any cell or in the
    loss).
  """
  flat, seed, specs, batch = _Inputs(cells, schedule, inputs)
  # Passes over the schedule, then lowering: a W that directly follows its
  # B runs with it as one BW; the last stage's F and its backward as one FB.
  program = ticks_lib.Lower(
      ticks_lib.FuseLast(ticks_lib.JoinBackward(schedule)), keep=keep,
      skips=interpreter.SkipPairs(cells))
  if loss_scale is not None:
    labels = (labels, tf.cast(loss_scale, tf.float32))
  label_flat = tf.nest.flatten(labels)
  head = program_lib.LossHead(
      loss_fn, labels, tuple(tl.SpecOf(x, batch) for x in label_flat),
      loss_scale is not None)
  compiled = interpreter.Compile(
      cells, schedule, inputs, specs, True, (program,), seed, jit_compile,
      execution, budget, head=head, input_grads=False)
  feeds, state = interpreter.Start(compiled, flat, label_flat, seed)
  state = interpreter.Run(compiled, feeds, program, state, trace)
  interpreter.MoveBatchNormStats(compiled, state)
  grads = interpreter.Gradients(compiled, state)
  with tf.device(cells[-1].device):
    sums = interpreter.LossSums(compiled, state)
    loss, metrics = loss_lib.Means(sums)
    scale = 1.0 / tf.maximum(sums.weight, 1e-12)
  interpreter.Done(state)
  out = []
  for v in variables:
    g = grads.get(v.ref())
    with tf.device(v.device):
      out.append(None if g is None else g * tf.cast(scale, g.dtype))
  return loss, metrics, out
