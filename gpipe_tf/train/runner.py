"""One logdir's task, optimizer, global step and checkpointer, its training and evaluation steps, and the loops that run them.

The library entry point is loop.train_and_evaluate, which checks its
arguments, picks the tf.distribute strategy and makes a Runner.

One training step (a single tf.function)::

  seed = [task.step_seed, global_step]            (StepSeedScope: dropout masks
  loss, metrics, grads =                          depend on the step only)
      task.ComputeLossAndGradients(batch, vars)   (GradientTape, or the loss
                                                   inside the pipeline)
  grads = clip(grads, clip_gradient_norm_to_value)
  if loss and grads are finite:                   (else: 'skip' or 'stop')
    optimizer.apply_gradients(grads)              (once per step)
  global_step += 1

Non-finite steps. When the loss or any gradient is NaN or Inf the update is
not applied (a tf.cond: weights, optimizer slots and the optimizer's own
iteration counter stay as they were). With ``on_nonfinite='skip'`` (default)
the global step still advances, as in Lingvo, so the step's batch is consumed
and the learning-rate schedule moves on; the event is logged and the summary
``skipped_steps`` counts the skipped steps of this run (it is not
checkpointed). With ``'stop'`` a NonFiniteLossError is raised right after the
step, before anything is saved: the newest checkpoint stays the last good one.

Data parallelism. With ``num_replicas`` R > 1 the task is built under a
tf.distribute.MirroredStrategy (gpipe_tf.runtime.distribute; one
ReplicaLayout says where every cell of every replica runs): every global
batch (the input's batch_size) is split into R equal shares, replica r
computes the loss and gradients of its share (a PipeliningLayer pipelines it
on devices rK .. rK+K-1), the gradients and metrics are averaged across
replicas, and clipping, the finiteness check and the single optimizer update
run once on the averaged gradients. A global batch not divisible by R gives
unequal shares, whose means are then weighted equally.

Errors. An op that fails as a step runs (a layer's check_numerics, say)
raises TensorFlow's error, of its type, with the pipeline's action, tick and
device it belongs to first in its message (pipeline/run_errors.py).

Progress. Every log_interval_steps a line ``Step N/MAX: <metrics> (ETA 1m39s)``
gives the time left: the mean step time of the interval (checkpoints and
evaluations included) times the steps left.
"""

from __future__ import annotations

import os
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import errors
from gpipe_tf import tasks
from gpipe_tf.layers import precision as precision_lib
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import run_errors
from gpipe_tf.runtime import cluster
from gpipe_tf.runtime import distribute
from gpipe_tf.train import checkpoints
from gpipe_tf.train import profiler as profiler_lib
from gpipe_tf.train import warm_start

__all__ = ['NONFINITE_POLICIES', 'PARAMS_FILE', 'NonFiniteLossError',
           'NotATaskError', 'Runner', 'TrainConfigError']

NONFINITE_POLICIES = ('skip', 'stop')
PARAMS_FILE = 'params.txt'


class NonFiniteLossError(errors.Error, FloatingPointError):
  """A training step's loss or gradients were NaN or Inf (on_nonfinite='stop')."""


class TrainConfigError(errors.Error, ValueError):
  """An argument of train_and_evaluate, or an experiment's input, cannot work."""


class NotATaskError(TrainConfigError, TypeError):
  """The task Params build something other than a gpipe_tf.tasks.BaseTask."""


def _AnyBatch(x: Any) -> Any:
  """The spec of `x` with its batch (first) dimension None; a scalar or a
  composite tensor keeps its own spec."""
  if isinstance(x, tf.Tensor) and x.shape.rank:
    return tf.TensorSpec([None] + x.shape.as_list()[1:], x.dtype)
  return tf.type_spec_from_value(x)


class Runner:
  """The task, optimizer, global step and checkpointer of one logdir, its
  train and eval steps, and the loops that run them.

  Args:
    experiment: experiment Params or a class/instance (base_experiment).
    logdir: where checkpoints (logdir/ckpt), summaries (logdir/train,
      logdir/eval) and params.txt go.
    max_checkpoints_to_keep: older checkpoints are deleted.
    on_nonfinite: 'skip' or 'stop' (module docstring).
    strategy: the tf.distribute strategy the task is built under, or None.
    is_chief: whether this task writes checkpoints, summaries and params.txt.
    checkpoint_io_device: the device whose host reads and writes checkpoints.
    precision_policy: the mixed-precision policy of its steps.
  """

  def __init__(self, experiment: base_experiment.ExperimentLike, logdir: str,
               max_checkpoints_to_keep: int, on_nonfinite: str = 'skip',
               strategy: tf.distribute.Strategy | None = None,
               is_chief: bool = True,
               checkpoint_io_device: str | None = None,
               precision_policy: str = 'float32') -> None:
    self.params = base_experiment.AsExperimentParams(experiment)
    precision_lib.ComputeDtype(precision_policy)  # PolicyError if unknown.
    self.precision = precision_policy
    self.checkpoint_io_device = checkpoint_io_device
    self.logdir = logdir
    self.on_nonfinite = on_nonfinite
    self.strategy = strategy
    self.is_chief = is_chief
    self.skipped_steps = 0
    self._trained = []  # Variables that receive a gradient (set when traced).
    if strategy is None:
      self._Build(max_checkpoints_to_keep)
    else:
      with strategy.scope():
        self._Build(max_checkpoints_to_keep)

  def _Build(self, max_checkpoints_to_keep: int) -> None:
    logdir = self.logdir
    self.task = self.params.task.Instantiate()
    if not isinstance(self.task, tasks.BaseTask):
      raise NotATaskError(f'Task Params build a {type(self.task).__name__}, '
                          'not a gpipe_tf.tasks.BaseTask.')
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name='global_step')
    schedule = self.task.learning_rate_schedule
    self.learning_rate = lambda: schedule(self.global_step)
    self.optimizer = self.task.CreateOptimizer(self.learning_rate)
    if self.precision == 'mixed_float16':
      # Dynamic loss scaling: the scale halves on an overflowing step (whose
      # update is skipped) and grows after a run of good ones.
      self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
    self.variables = tuple(self.task.trainable_variables)
    self.optimizer.build(list(self.variables))  # Slots exist before restore.
    checkpoint = tf.train.Checkpoint(task=self.task, optimizer=self.optimizer,
                                     global_step=self.global_step)
    self.checkpointer = checkpoints.Checkpointer(
        os.path.join(logdir, 'ckpt'), checkpoint,
        max_to_keep=max_checkpoints_to_keep,
        scratch_directory=cluster.ScratchDirectory(self.strategy, logdir),
        io_device=self.checkpoint_io_device)
    self._train_step = None
    self._eval_step = None
    self._eval_writer = None

  def Restore(self, warm_start_if_new: bool = True) -> str | None:
    """Restores the newest good checkpoint; else warm-starts (if asked)."""
    path = self.checkpointer.Restore()
    if path:
      logging.info('Resuming from %s at global step %d.', path, self.Step())
    elif warm_start_if_new and self.task.p.init_from_checkpoint:
      # Only a training run's first start.
      warm_start.InitFromCheckpoint(self.task, self.task.p.init_from_checkpoint,
                                    self.task.p.init_from_checkpoint_skip)
    return path

  def Step(self) -> int:
    return int(self.global_step.numpy())

  def WriteParamsText(self) -> None:
    """Writes logdir/params.txt unless present (then warns if it differs)."""
    if not self.is_chief:
      return
    text = self.params.ToText() + '\n'
    path = os.path.join(self.logdir, PARAMS_FILE)
    if tf.io.gfile.exists(path):
      with tf.io.gfile.GFile(path) as f:
        if f.read() != text:
          logging.warning('%s differs from the Params of this run (overrides '
                          'changed?); keeping the original file.', path)
      return
    tf.io.gfile.makedirs(self.logdir)
    tmp = path + '.tmp'
    with tf.io.gfile.GFile(tmp, 'w') as f:
      f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)

  # ---- Steps ----------------------------------------------------------------
  def TrainStep(self, batch: dict[str, tf.Tensor]
                ) -> tuple[dict, tf.Tensor, tf.Tensor]:
    """One step; returns (metrics, global batch size, whether it applied)."""
    if self._train_step is None:
      self._train_step = tf.function(self._TrainStep, autograph=False,
                                     reduce_retracing=True)
    with run_errors.Explaining(self.task, training=True):  # Its action.
      return self._train_step(batch)

  def _LossAndGrads(self, batch):
    """(loss, metrics, non-None grads, batch size) of one (replica's) batch."""
    task = self.task
    seed = tf.stack([tf.constant(task.step_seed, tf.int64),
                     self.global_step.read_value()])
    with random_seeds.StepSeedScope(seed), precision_lib.Policy(self.precision):
      # The loss inside the pipeline when the model's schedule needs it.
      loss, metrics, grads = task.ComputeLossAndGradients(
          batch, self.variables, loss_scale=self._LossScale())
    self._trained = [v for g, v in zip(grads, self.variables) if g is not None]
    unused = [v.name for g, v in zip(grads, self.variables) if g is None]
    if unused:
      logging.warning('No gradient reaches %s; they are not trained.', unused)
    grads = [tf.convert_to_tensor(g) for g in grads if g is not None]
    return loss, dict(metrics), grads, tasks.BatchSize(batch)

  def _ReplicaLossAndGrads(self, batch):
    """_LossAndGrads averaged over replicas (sizes summed), on every replica."""
    batch = distribute.ReplicaInput(batch)  # A global batch on a cluster.
    loss, metrics, grads, size = self._LossAndGrads(batch)
    loss, metrics, grads = distribute.BatchedAllReduce(
        tf.distribute.ReduceOp.MEAN, (loss, metrics, grads))
    return loss, metrics, grads, distribute.BatchedAllReduce(
        tf.distribute.ReduceOp.SUM, size)

  def _TrainStep(self, batch):
    if self.strategy is None:
      loss, metrics, grads, size = self._LossAndGrads(batch)
    else:
      reduced = self.strategy.run(self._ReplicaLossAndGrads, (batch,))
      first = lambda x: self.strategy.experimental_local_results(x)[0]
      loss, metrics, grads, size = tf.nest.map_structure(first, reduced)
    scale = self._LossScale()
    if scale is not None:  # Clip and check the true gradients.
      grads = [g / scale for g in grads]
    grads, norm = self.task.ClipGradients(grads)
    finite = tf.reduce_all(tf.stack(
        [tf.reduce_all(tf.math.is_finite(loss))] +
        [tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    learning_rate = self.learning_rate()
    variables = self._trained

    def _Apply():
      self.optimizer.apply_gradients(zip(grads, variables))
      return tf.constant(True)

    if scale is not None:
      # The LossScaleOptimizer sees every step, overflowing ones included
      # (it skips their update and lowers the scale); it unscales itself.
      self.optimizer.apply_gradients(zip([g * scale for g in grads],
                                         variables))
      applied = finite
    else:
      applied = tf.cond(finite, _Apply, lambda: tf.constant(False))
    self.global_step.assign_add(1)
    metrics = dict(metrics, learning_rate=learning_rate, grad_norm=norm)
    return metrics, size, applied

  def _LossScale(self) -> tf.Tensor | None:
    """The dynamic loss scale of mixed_float16 training (else None)."""
    if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      return None
    return tf.convert_to_tensor(self.optimizer.dynamic_scale)

  def EvalStep(self, batch: dict[str, tf.Tensor]) -> tuple[dict, tf.Tensor]:
    """Metrics and batch size of one evaluation batch.

    The step is traced once, on the first call, for that batch with its
    batch dimension relaxed to None: a smaller last batch runs the same
    trace, where tracing for the first batch's shape traced the step again
    for the last one. Other dimensions keep the first batch's sizes; a
    batch that differs in them is traced again (reduce_retracing).
    """
    first = self._eval_step is None
    if first:
      def Step(batch):
        with precision_lib.Policy(self.precision):
          _, metrics = self.task.ComputeLoss(batch, training=False)
        return metrics, tasks.BatchSize(batch)
      self._eval_step = tf.function(Step, autograph=False,
                                    reduce_retracing=True)
    with run_errors.Explaining(self.task, training=False):
      if first:  # Traced where the call would have traced it.
        self._eval_step.get_concrete_function(
            tf.nest.map_structure(_AnyBatch, batch))
      return self._eval_step(batch)

  # ---- Loops ----------------------------------------------------------------
  def Evaluate(self, eval_steps: int) -> dict[str, float]:
    """Averages metrics over the Test() input (all of it if eval_steps <= 0)."""
    p = self.params.test.Copy()
    if 'repeat' in p:
      p.repeat = False
    sums: dict[str, float] = {}
    total = 0
    for i, batch in enumerate(p.Instantiate().GetDataset()):
      if 0 < eval_steps <= i:
        break
      metrics, size = self.EvalStep(batch)
      size = int(size)
      for name, value in metrics.items():
        sums[name] = sums.get(name, 0.0) + float(value) * size
      total += size
    if not total:
      raise TrainConfigError('The evaluation input produced no example; '
                             'check Test() (batch_size larger than the data '
                             'with drop_remainder?).')
    step = self.Step()
    results = {name: value / total for name, value in sums.items()}
    if self._eval_writer is None:
      self._eval_writer = self._SummaryWriter('eval')
    with self._eval_writer.as_default(step=step):
      for name, value in results.items():
        tf.summary.scalar(name, value)
      tf.summary.scalar('num_examples', total)
    self._eval_writer.flush()
    logging.info('Eval at step %d over %d examples: %s', step, total,
                 _Format(results))
    return results

  def Train(self, max_steps: int, save_interval_steps: int,
            log_interval_steps: int, eval_interval_steps: int,
            eval_steps: int, profiler: profiler_lib.Profiler | None = None
            ) -> tuple[dict[str, float], dict[str, float]]:
    """Trains up to global step max_steps; returns (train, eval) metrics."""
    profiler = profiler or profiler_lib.Profiler(self.logdir, None, False)
    start = self.Step()
    if start >= max_steps:
      logging.info('Global step %d already reaches max_steps=%d; not training.',
                   start, max_steps)
      return {}, {}
    p = self.params.train.Copy()
    if 'repeat' in p:
      p.repeat = True
    dataset = p.Instantiate().GetDataset(skip_batches=start)
    if self.strategy is not None:
      dataset = distribute.DistributeDataset(self.strategy, dataset)
    batches = iter(dataset)
    writer = self._SummaryWriter('train')
    sums: dict[str, Any] = {}
    steps = counted = examples = 0
    last_time = time.time()
    train_metrics, eval_metrics = {}, {}
    for done in range(start + 1, max_steps + 1):
      batch = next(batches, None)
      if batch is None:
        raise TrainConfigError('The training input produced no batch; check '
                               'Train() (batch_size larger than the data '
                               'with drop_remainder?).')
      with profiler.Step(done):
        metrics, size, applied = self.TrainStep(batch)
      if bool(applied):  # Skipped steps stay out of the metric means.
        for name, value in metrics.items():
          sums[name] = sums[name] + value if name in sums else value
        counted += 1
      else:
        self._OnNonFinite(done, metrics)
      steps += 1
      examples += size
      if done % log_interval_steps == 0 or done == max_steps:
        elapsed = max(time.time() - last_time, 1e-9)
        train_metrics = {k: float(v) / counted for k, v in sums.items()}
        train_metrics['steps_per_sec'] = steps / elapsed
        train_metrics['examples_per_sec'] = float(examples) / elapsed
        train_metrics['skipped_steps'] = float(self.skipped_steps)
        with writer.as_default(step=done):
          for name, value in train_metrics.items():
            tf.summary.scalar(name, value)
        writer.flush()
        eta = (max_steps - done) * elapsed / steps
        logging.info('Step %d/%d: %s (ETA %s)', done, max_steps,
                     _Format(train_metrics), _Duration(eta))
        sums, steps, counted, examples = {}, 0, 0, 0
        last_time = time.time()
      if done % save_interval_steps == 0 or done == max_steps:
        path = self.checkpointer.Save(done)
        logging.info('Saved %s.', path)
      if eval_interval_steps > 0 and done % eval_interval_steps == 0 and (
          done != max_steps):
        eval_metrics = self.Evaluate(eval_steps)
    writer.close()
    return train_metrics, eval_metrics

  def _SummaryWriter(self, name: str) -> tf.summary.SummaryWriter:
    """A writer into logdir/<name>; one that writes nothing off the chief."""
    if not self.is_chief:
      return tf.summary.create_noop_writer()
    return tf.summary.create_file_writer(os.path.join(self.logdir, name))

  def _OnNonFinite(self, step: int, metrics: dict[str, tf.Tensor]) -> None:
    loss = float(metrics.get('loss', float('nan')))
    norm = float(metrics['grad_norm'])
    if self.on_nonfinite == 'stop':
      raise NonFiniteLossError(
          f'Step {step}: non-finite loss ({loss}) or gradients (norm {norm}); '
          'stopped before saving (the newest checkpoint is the last good '
          "one). Lower the learning rate, clip gradients, or pass "
          "on_nonfinite='skip' (--on_nonfinite=skip) to skip such steps.")
    self.skipped_steps += 1
    logging.warning('Step %d: non-finite loss (%s) or gradients (norm %s); '
                    'update skipped (%d skipped so far in this run).', step,
                    loss, norm, self.skipped_steps)


def _Duration(seconds: float) -> str:
  """'45s', '1m39s', '2h05m': a duration for a progress line."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


def _Format(metrics: dict[str, float]) -> str:
  return ', '.join(f'{k}={v:.4g}' for k, v in sorted(metrics.items()))
