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

What one training step does (the loss, the gradients averaged over
data-parallel replicas, clipping, the finiteness check and the one update),
how non-finite steps are handled and what the progress lines say is in
runner.py, whose Runner holds the task, optimizer, global step and
checkpointer of the logdir and runs the steps; this module checks the
arguments, picks the tf.distribute strategy and drives a Runner.

Several hosts. Given a multi-worker ``strategy``
(cluster.MakeMultiWorkerStrategy, made at program start-up from TF_CONFIG)
every task runs this same function as one replica on its own K devices and
keeps its share of every global batch; the rest is as with one host. Only the chief
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

Nothing here depends on the model class: any layer under ``task.model``
(SequentialLayer, PipeliningLayer, ...) trains the same way.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import pipeline
from gpipe_tf.runtime import cluster
from gpipe_tf.runtime import distribute
from gpipe_tf.train import checkpoints
from gpipe_tf.train import profiler as profiler_lib
from gpipe_tf.train import runner as runner_lib

__all__ = ['MODES', 'NONFINITE_POLICIES', 'PARAMS_FILE', 'NonFiniteLossError',
           'NotATaskError', 'RunResult', 'TrainConfigError',
           'EnableDeterminism', 'evaluate', 'train', 'train_and_evaluate']

# The runner's errors and constants, where the entry points' callers look.
NonFiniteLossError = runner_lib.NonFiniteLossError
NotATaskError = runner_lib.NotATaskError
TrainConfigError = runner_lib.TrainConfigError
NONFINITE_POLICIES = runner_lib.NONFINITE_POLICIES
PARAMS_FILE = runner_lib.PARAMS_FILE

MODES = ('train', 'eval', 'train_and_eval')


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
  runner = runner_lib.Runner(params, logdir, max_checkpoints_to_keep, on_nonfinite,
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
  profiler = profiler_lib.Profiler(os.path.join(logdir, 'train'),
                                   profile_steps, layout.is_chief)
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

