"""Training and evaluation of an experiment in a logdir: the trainer's library.

Layout of a logdir::

  logdir/params.txt   experiment Params (ToText), written on the first start
  logdir/ckpt/        checkpoints ckpt-<global step> and the state file
  logdir/train/       summaries: loss, metrics, learning_rate, grad_norm,
                      steps_per_sec, examples_per_sec
  logdir/eval/        summaries: metrics averaged over the Test() input, and
                      num_examples (how many examples that average covers)

One training step (a single tf.function)::

  seed = [task.step_seed, global_step]            (StepSeedScope: dropout masks
  loss, metrics = task.ComputeLoss(batch, True)    depend on the step only)
  grads = d loss / d task.trainable_variables     (GradientTape)
  grads = clip(grads, clip_gradient_norm_to_value)
  optimizer.apply_gradients(grads)                (once per step)
  global_step += 1

A run resumes from the newest good checkpoint (gpipe_tf.checkpoints): the
global step, the weights and the optimizer slots are restored and the training
input restarts at batch ``GetDataset(skip_batches=global_step)``, so a run
stopped at step S and resumed equals an uninterrupted one. The training input
is always repeated (its ``repeat`` is set to True) and the evaluation input is
read once (``repeat`` False), whatever Train() and Test() say.

Nothing here depends on the model class: any layer under ``task.model``
(SequentialLayer, PipeliningLayer, ...) trains the same way.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from absl import logging
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import checkpoints
from gpipe_tf import tasks
from gpipe_tf.layers import random_seeds

MODES = ('train', 'eval', 'train_and_eval')
PARAMS_FILE = 'params.txt'


@dataclasses.dataclass
class RunResult:
  """What a call of train / evaluate / train_and_evaluate did.

  Attributes:
    start_step: global step when the run started (after restoring).
    global_step: global step at the end.
    restored_checkpoint: path of the checkpoint restored at start, or None.
    train_metrics: means over the last logging interval ({} if no step ran).
    eval_metrics: the last evaluation ({} if none ran).
  """
  start_step: int
  global_step: int
  restored_checkpoint: str | None
  train_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class _Runner:
  """The task, optimizer, global step and checkpointer of one logdir."""

  def __init__(self, experiment: base_experiment.ExperimentLike, logdir: str,
               max_checkpoints_to_keep: int) -> None:
    self.params = base_experiment.AsExperimentParams(experiment)
    self.logdir = logdir
    self.task = self.params.task.Instantiate()
    if not isinstance(self.task, tasks.BaseTask):
      raise TypeError(f'Task Params build a {type(self.task).__name__}, not a '
                      'gpipe_tf.tasks.BaseTask.')
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name='global_step')
    schedule = self.task.learning_rate_schedule
    self.learning_rate = lambda: schedule(self.global_step)
    self.optimizer = self.task.CreateOptimizer(self.learning_rate)
    self.variables = tuple(self.task.trainable_variables)
    self.optimizer.build(list(self.variables))  # Slots exist before restore.
    checkpoint = tf.train.Checkpoint(task=self.task, optimizer=self.optimizer,
                                     global_step=self.global_step)
    self.checkpointer = checkpoints.Checkpointer(
        os.path.join(logdir, 'ckpt'), checkpoint,
        max_to_keep=max_checkpoints_to_keep)
    self._train_step = None
    self._eval_step = None
    self._eval_writer = None

  def Restore(self) -> str | None:
    path = self.checkpointer.Restore()
    if path:
      logging.info('Resuming from %s at global step %d.', path, self.Step())
    return path

  def Step(self) -> int:
    return int(self.global_step.numpy())

  def WriteParamsText(self) -> None:
    """Writes logdir/params.txt unless present (then warns if it differs)."""
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
  def TrainStep(self, batch: dict[str, tf.Tensor]) -> tuple[dict, tf.Tensor]:
    if self._train_step is None:
      self._train_step = tf.function(self._TrainStep, autograph=False,
                                     reduce_retracing=True)
    return self._train_step(batch)

  def _TrainStep(self, batch):
    task = self.task
    seed = tf.stack([tf.constant(task.step_seed, tf.int64),
                     self.global_step.read_value()])
    with random_seeds.StepSeedScope(seed):
      with tf.GradientTape() as tape:
        loss, metrics = task.ComputeLoss(batch, training=True)
      grads = tape.gradient(loss, self.variables)
    pairs = [(g, v) for g, v in zip(grads, self.variables) if g is not None]
    unused = [v.name for g, v in zip(grads, self.variables) if g is None]
    if unused:
      logging.warning('No gradient reaches %s; they are not trained.', unused)
    grads, norm = task.ClipGradients([g for g, _ in pairs])
    learning_rate = self.learning_rate()
    self.optimizer.apply_gradients(zip(grads, [v for _, v in pairs]))
    self.global_step.assign_add(1)
    metrics = dict(metrics, learning_rate=learning_rate, grad_norm=norm)
    return metrics, tasks.BatchSize(batch)

  def EvalStep(self, batch: dict[str, tf.Tensor]) -> tuple[dict, tf.Tensor]:
    if self._eval_step is None:
      def Step(batch):
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
      raise ValueError('The evaluation input produced no example; check '
                       'Test() (batch_size larger than the data with '
                       'drop_remainder?).')
    step = self.Step()
    results = {name: value / total for name, value in sums.items()}
    if self._eval_writer is None:
      self._eval_writer = tf.summary.create_file_writer(
          os.path.join(self.logdir, 'eval'))
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
            eval_steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Trains up to global step max_steps; returns (train, eval) metrics."""
    start = self.Step()
    if start >= max_steps:
      logging.info('Global step %d already reaches max_steps=%d; not training.',
                   start, max_steps)
      return {}, {}
    p = self.params.train.Copy()
    if 'repeat' in p:
      p.repeat = True
    batches = iter(p.Instantiate().GetDataset(skip_batches=start))
    writer = tf.summary.create_file_writer(os.path.join(self.logdir, 'train'))
    sums: dict[str, Any] = {}
    steps = examples = 0
    last_time = time.time()
    train_metrics, eval_metrics = {}, {}
    for done in range(start + 1, max_steps + 1):
      batch = next(batches, None)
      if batch is None:
        raise ValueError('The training input produced no batch; check Train() '
                         '(batch_size larger than the data with '
                         'drop_remainder?).')
      metrics, size = self.TrainStep(batch)
      for name, value in metrics.items():
        sums[name] = sums[name] + value if name in sums else value
      steps += 1
      examples += size
      if done % log_interval_steps == 0 or done == max_steps:
        elapsed = max(time.time() - last_time, 1e-9)
        train_metrics = {k: float(v) / steps for k, v in sums.items()}
        train_metrics['steps_per_sec'] = steps / elapsed
        train_metrics['examples_per_sec'] = float(examples) / elapsed
        with writer.as_default(step=done):
          for name, value in train_metrics.items():
            tf.summary.scalar(name, value)
        writer.flush()
        logging.info('Step %d/%d: %s', done, max_steps, _Format(train_metrics))
        sums, steps, examples, last_time = {}, 0, 0, time.time()
      if done % save_interval_steps == 0 or done == max_steps:
        path = self.checkpointer.Save(done)
        logging.info('Saved %s.', path)
      if eval_interval_steps > 0 and done % eval_interval_steps == 0 and (
          done != max_steps):
        eval_metrics = self.Evaluate(eval_steps)
    writer.close()
    return train_metrics, eval_metrics


def _Format(metrics: dict[str, float]) -> str:
  return ', '.join(f'{k}={v:.4g}' for k, v in sorted(metrics.items()))


def _CheckPositive(**values: int) -> None:
  for name, value in values.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive int, got {value!r}.')


def train_and_evaluate(experiment: base_experiment.ExperimentLike,
                       logdir: str, mode: str = 'train_and_eval',
                       max_steps: int = 1000, *,
                       save_interval_steps: int = 100,
                       log_interval_steps: int = 10,
                       eval_interval_steps: int = 0,
                       eval_steps: int = 0,
                       max_checkpoints_to_keep: int = 5) -> RunResult:
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

  Returns:
    A RunResult.

  Raises:
    checkpoints.IncompatibleCheckpointError: logdir holds another model's
      checkpoint (nothing in logdir is written).
    checkpoints.NoCheckpointError: mode 'eval' and no checkpoint.
    ValueError: a bad argument.
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
  _CheckPositive(max_steps=max_steps, save_interval_steps=save_interval_steps,
                 log_interval_steps=log_interval_steps,
                 max_checkpoints_to_keep=max_checkpoints_to_keep)
  runner = _Runner(experiment, logdir, max_checkpoints_to_keep)
  restored = runner.Restore()
  start = runner.Step()
  if mode == 'eval':
    if restored is None:
      raise checkpoints.NoCheckpointError(
          f'No checkpoint in {runner.checkpointer.directory} to evaluate; '
          'train first (--mode=train or train_and_eval).')
    runner.WriteParamsText()
    return RunResult(start, start, restored,
                     eval_metrics=runner.Evaluate(eval_steps))
  runner.WriteParamsText()
  train_metrics, eval_metrics = runner.Train(
      max_steps, save_interval_steps, log_interval_steps,
      eval_interval_steps if mode == 'train_and_eval' else 0, eval_steps)
  if mode == 'train_and_eval':
    eval_metrics = runner.Evaluate(eval_steps)
  return RunResult(start, runner.Step(), restored, train_metrics, eval_metrics)


def train(experiment: base_experiment.ExperimentLike, logdir: str,
          max_steps: int, **kwargs: Any) -> RunResult:
  """train_and_evaluate with mode 'train' (same keyword arguments)."""
  return train_and_evaluate(experiment, logdir, 'train', max_steps, **kwargs)


def evaluate(experiment: base_experiment.ExperimentLike, logdir: str, *,
             eval_steps: int = 0) -> RunResult:
  """Evaluates the newest checkpoint in `logdir` once (into logdir/eval)."""
  return train_and_evaluate(experiment, logdir, 'eval', eval_steps=eval_steps)

