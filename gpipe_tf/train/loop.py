"""Training and evaluation of an experiment in a logdir: the trainer's library.

Layout of a logdir::

  logdir/params.txt   experiment Params (ToText), written on the first start
  logdir/ckpt/        checkpoints ckpt-<global step> and the state file
  logdir/train/       summaries: loss, metrics, learning_rate, grad_norm,
                      steps_per_sec, examples_per_sec; with profile_steps,
                      a profile in plugins/profile/ (TensorBoard's Profile
                      tab)
  logdir/eval/        summaries: metrics averaged over the Test() input, and
                      num_examples (how many examples that average covers)

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

Several hosts. Given a multi-worker ``strategy``
(cluster.MakeMultiWorkerStrategy, made at program start-up from TF_CONFIG)
every task runs this same function as one replica on its own K devices and
keeps its share of every global batch; the rest is as above. Only the chief
writes checkpoints, summaries and params.txt (cluster.IsChief); the
others save into a scratch directory they delete. After restoring, the tasks
check that they all resume from the same global step.

A run resumes from the newest good checkpoint (gpipe_tf.train.checkpoints): the
global step, the weights and the optimizer slots are restored and the training
input restarts at batch ``GetDataset(skip_batches=global_step)``, so a run
stopped at step S and resumed equals an uninterrupted one. A run whose logdir
holds no checkpoint starts from the task's ``init_from_checkpoint`` if set
(gpipe_tf.train.warm_start: transfer learning); a resumed one never reads it. The
training input is always repeated (its ``repeat`` is set to True) and the
evaluation input is read once (``repeat`` False), whatever Train() and Test()
say.

Progress. Every log_interval_steps a line ``Step N/MAX: <metrics> (ETA 1m39s)``
gives the time left: the mean step time of the interval (checkpoints and
evaluations included) times the steps left.

Nothing here depends on the model class: any layer under ``task.model``
(SequentialLayer, PipeliningLayer, ...) trains the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Iterator

from absl import logging
import keras
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import base_experiment
from gpipe_tf.train import checkpoints
from gpipe_tf.runtime import cluster
from gpipe_tf.runtime import distribute
from gpipe_tf import pipeline
from gpipe_tf import tasks
from gpipe_tf.train import warm_start
from gpipe_tf.layers import precision as precision_lib
from gpipe_tf.layers import random_seeds

MODES = ('train', 'eval', 'train_and_eval')
NONFINITE_POLICIES = ('skip', 'stop')
PARAMS_FILE = 'params.txt'


class NonFiniteLossError(errors.Error, FloatingPointError):
  """A training step's loss or gradients were NaN or Inf (on_nonfinite='stop')."""


class TrainConfigError(errors.Error, ValueError):
  """An argument of train_and_evaluate, or an experiment's input, cannot work."""


class NotATaskError(TrainConfigError, TypeError):
  """The task Params build something other than a gpipe_tf.tasks.BaseTask."""


@dataclasses.dataclass
class RunResult:
  """What a call of train / evaluate / train_and_evaluate did.

  Attributes:
    start_step: global step when the run started (after restoring).
    global_step: global step at the end.
    restored_checkpoint: path of the checkpoint restored at start, or None.
    train_metrics: means over the last logging interval ({} if no step ran).
    eval_metrics: the last evaluation ({} if none ran).
    skipped_steps: training steps whose update was skipped as non-finite.
  """
  start_step: int
  global_step: int
  restored_checkpoint: str | None
  train_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  skipped_steps: int = 0


class _Runner:
  """The task, optimizer, global step and checkpointer of one logdir."""

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
    if self._eval_step is None:
      def Step(batch):
        with precision_lib.Policy(self.precision):
          _, metrics = self.task.ComputeLoss(batch, training=False)
        return metrics, tasks.BatchSize(batch)
      self._eval_step = tf.function(Step, autograph=False,
                                    reduce_retracing=True)
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
            eval_steps: int, profiler: _Profiler | None = None
            ) -> tuple[dict[str, float], dict[str, float]]:
    """Trains up to global step max_steps; returns (train, eval) metrics."""
    profiler = profiler or _Profiler(self.logdir, None, False)
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


class _Profiler:
  """Profiles the training steps first..last into a TensorBoard log directory.

  tf.profiler.experimental.start before step `first`, a Trace per step (so
  the Profile tab's step view can tell them apart), stop after step `last`
  or at the latest at ``Stop``. The profile lands in
  ``logdir/plugins/profile/<run>/<host>.xplane.pb``.
  """

  def __init__(self, logdir: str, steps: tuple[int, int] | None,
               enabled: bool) -> None:
    self._logdir = logdir
    self._first, self._last = steps or (0, -1)
    self._enabled = enabled and steps is not None
    self._running = False

  @contextlib.contextmanager
  def Step(self, step: int) -> Iterator[None]:
    if not self._enabled or not self._first <= step <= self._last:
      yield
      return
    if not self._running:
      tf.profiler.experimental.start(self._logdir)
      self._running = True
      logging.info('Profiling steps %d to %d into %s.', step, self._last,
                   self._logdir)
    with tf.profiler.experimental.Trace('train', step_num=step, _r=1):
      yield
    if step == self._last:
      self.Stop()

  def Stop(self) -> None:
    if self._running:
      self._running = False
      tf.profiler.experimental.stop()
      logging.info('Wrote the profile to %s/plugins/profile.', self._logdir)


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


def _CheckPositive(**values: int) -> None:
  for name, value in values.items():
    if not isinstance(value, int) or value < 1:
      raise TrainConfigError(
          f'{name} must be a positive int, got {value!r}.')


def train_and_evaluate(experiment: base_experiment.ExperimentLike,
                       logdir: str, mode: str = 'train_and_eval',
                       max_steps: int = 1000, *,
                       save_interval_steps: int = 100,
                       log_interval_steps: int = 10,
                       eval_interval_steps: int = 0,
                       eval_steps: int = 0,
                       max_checkpoints_to_keep: int = 5,
                       on_nonfinite: str = 'skip',
                       deterministic: bool = False,
                       num_replicas: int = 1,
                       strategy: tf.distribute.Strategy | None = None,
                       checkpoint_io_device: str | None = None,
                       profile_steps: tuple[int, int] | None = None,
                       precision: str = 'float32') -> RunResult:
  """Trains and/or evaluates `experiment` in `logdir`, resuming if possible.

  Args:
    experiment: a SingleTaskModelParams class or instance, or experiment Params
      (fields train, test, task; see base_experiment).
    logdir: directory of checkpoints, summaries and params.txt.
    mode: 'train' (train to max_steps), 'eval' (evaluate the newest
      checkpoint once) or 'train_and_eval' (train, then evaluate).
    max_steps: global step to train to; a run already there does not train.
    save_interval_steps: checkpoint every this many steps (and at the end).
    log_interval_steps: log and write train summaries every this many steps.
    eval_interval_steps: with 'train_and_eval', also evaluate every this many
      steps; 0 evaluates at the end only.
    eval_steps: evaluate on at most this many batches; 0 reads the whole
      Test() input.
    max_checkpoints_to_keep: older checkpoints are deleted.
    on_nonfinite: what a step with a NaN/Inf loss or gradient does; its
      update is never applied. 'skip': go on (the global step advances);
      'stop': raise NonFiniteLossError before anything is saved.
    deterministic: enable TensorFlow op determinism (process-wide, for good)
      and seed the global generators with the task's random_seed, so two runs
      give bit-identical results.
    num_replicas: R; > 1 trains data-parallel on R replicas of the model
      (MirroredStrategy, gpipe_tf.runtime.distribute), each pipeline on its own K
      devices. Needs R x K default devices. 0: as many replicas as fit,
      every device used (distribute.ReplicaLayout.Plan).
    strategy: a strategy made by the caller instead, e.g. a multi-worker one
      (cluster.MakeMultiWorkerStrategy: it must be made at program
      start-up); num_replicas must then be 0 or 1.
    checkpoint_io_device: the device whose host reads and writes checkpoint
      files, e.g. the trainer's CPU when the pipeline's cells live on other
      hosts (gpipe_tf.runtime.pipeline_cluster); default: each variable's host.
    profile_steps: (first, last) global steps, 1-based: profile the training
      steps first..last (tf.profiler) into logdir/train/plugins/profile,
      which TensorBoard's Profile tab shows (tensorboard-plugin-profile).
      None: no profile. Only the chief profiles.
    precision: the mixed-precision policy of training and evaluation
      ('float32', 'mixed_bfloat16', 'mixed_float16'; layers/precision.py).
      'mixed_float16' wraps the optimizer in Keras's LossScaleOptimizer: an
      overflowing step's update is skipped and the step counts as a
      non-finite one (on_nonfinite decides whether training goes on).

  Returns:
    A RunResult.

  Raises:
    checkpoints.IncompatibleCheckpointError: logdir holds another model's
      checkpoint (nothing in logdir is written).
    checkpoints.NoCheckpointError: mode 'eval' and no checkpoint.
    NonFiniteLossError: on_nonfinite 'stop' and a non-finite step.
    distribute.ReplicaLayoutError: fewer than R x K devices.
    cluster.WorkerMismatchError: multi-worker tasks restored different
      global steps (a task cannot read the chief's checkpoints).
    checkpoints.CheckpointWriteError: a checkpoint could not be written.
    TrainConfigError: a bad argument, or an input that yields nothing.
  """
  if mode not in MODES:
    raise TrainConfigError(f'mode must be one of {MODES}, got {mode!r}.')
  if on_nonfinite not in NONFINITE_POLICIES:
    raise TrainConfigError(
        f'on_nonfinite must be one of {NONFINITE_POLICIES}, got '
        f'{on_nonfinite!r}.')
  _CheckPositive(max_steps=max_steps, save_interval_steps=save_interval_steps,
                 log_interval_steps=log_interval_steps,
                 max_checkpoints_to_keep=max_checkpoints_to_keep)
  if profile_steps is not None and not (
      len(profile_steps) == 2 and all(isinstance(s, int) for s in profile_steps)
      and 1 <= profile_steps[0] <= profile_steps[1]):
    raise TrainConfigError(
        f'profile_steps must be (first, last) global steps with 1 <= first <= '
        f'last, got {profile_steps!r}.')
  if not isinstance(num_replicas, int) or num_replicas < 0:
    raise TrainConfigError('num_replicas must be an int >= 0 (0: every '
                           f'device), got {num_replicas!r}.')
  params = base_experiment.AsExperimentParams(experiment)
  if deterministic:
    EnableDeterminism(params.task.random_seed or 0)
  num_cells = pipeline.PipeliningLayer.NumDevicesOf(params.task.model)
  if strategy is None:
    layout = distribute.ReplicaLayout.Plan(num_replicas, num_cells)
    strategy = layout.MakeStrategy()
  elif num_replicas not in (0, 1):
    raise TrainConfigError(f'num_replicas={num_replicas} and a strategy were '
                           'both given; the strategy fixes the replicas: pass '
                           'one.')
  else:  # ReplicaLayoutError if too few devices.
    layout = distribute.ReplicaLayout.FromStrategy(strategy, num_cells)
  runner = _Runner(params, logdir, max_checkpoints_to_keep, on_nonfinite,
                   strategy, layout.is_chief, checkpoint_io_device,
                   precision)
  if strategy is not None:
    _LogLayout(strategy, layout)
  # An evaluation without a checkpoint fails below; no warm start for it.
  restored = runner.Restore(warm_start_if_new=mode != 'eval')
  start = runner.Step()
  cluster.CheckTasksAgree(
      strategy, start, 'global step they resume from',
      f'every task must read the chief\'s checkpoints in '
      f'{runner.checkpointer.directory}: put the logdir on a filesystem all '
      'hosts share (e.g. NFS or GCS), with the same path on every host.')
  if mode == 'eval':
    if restored is None:
      raise checkpoints.NoCheckpointError(
          f'No checkpoint in {runner.checkpointer.directory} to evaluate; '
          'train first (--mode=train or train_and_eval).')
    runner.WriteParamsText()
    return RunResult(start, start, restored,
                     eval_metrics=runner.Evaluate(eval_steps))
  runner.WriteParamsText()
  profiler = _Profiler(os.path.join(logdir, 'train'), profile_steps,
                       layout.is_chief)
  try:
    train_metrics, eval_metrics = runner.Train(
        max_steps, save_interval_steps, log_interval_steps,
        eval_interval_steps if mode == 'train_and_eval' else 0, eval_steps,
        profiler)
  finally:
    profiler.Stop()  # Training ended (or failed) before the last step.
  if mode == 'train_and_eval':
    eval_metrics = runner.Evaluate(eval_steps)
  return RunResult(start, runner.Step(), restored, train_metrics, eval_metrics,
                   runner.skipped_steps)


def EnableDeterminism(seed: int) -> None:
  """Makes every TensorFlow op deterministic and seeds the global generators.

  Process-wide and irreversible; call it before building the model.
  """
  tf.config.experimental.enable_op_determinism()
  tf.random.set_seed(seed)
  logging.info('Op determinism enabled; global seed %d.', seed)


def _LogLayout(strategy: tf.distribute.Strategy,
               layout: distribute.ReplicaLayout) -> None:
  """Logs the strategy and, for each replica, the device of every cell."""
  name = ('MultiWorkerMirroredStrategy' if layout.task
          else type(strategy).__name__)
  first, *rest = layout.Describe()
  logging.info('Strategy %s: %s', name, first)
  for line in rest:
    logging.info('%s', line)
  logging.info('Variables are mirrored on %s.',
               list(strategy.extended.worker_devices))


def train(experiment: base_experiment.ExperimentLike, logdir: str,
          max_steps: int, **kwargs: Any) -> RunResult:
  """train_and_evaluate with mode 'train' (same keyword arguments)."""
  return train_and_evaluate(experiment, logdir, 'train', max_steps, **kwargs)


def evaluate(experiment: base_experiment.ExperimentLike, logdir: str, *,
             eval_steps: int = 0) -> RunResult:
  """Evaluates the newest checkpoint in `logdir` once (into logdir/eval)."""
  return train_and_evaluate(experiment, logdir, 'eval', eval_steps=eval_steps)

