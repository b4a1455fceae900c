"""Learning-rate schedules declared by Params: functions of the global step.

Each schedule is a ``keras.optimizers.schedules.LearningRateSchedule`` built
from its Params (``schedules.Cosine.Params().Set(...).Instantiate()``) and
called with the number of training steps already taken (0 on the first step).
The trainer evaluates it on its own global step, so a resumed run continues
the schedule exactly where it stopped.

Shapes of the schedules (lr = Params.learning_rate, W = warmup_steps,
T = total_steps, s = step + 1)::

  Constant               LinearWarmupRsqrtDecay    Cosine
  lr |----------         lr |   /\                lr |   /--.
     |                      |  /  `--.__             |  /    `.
     |                      | /         ``---        | /       `.___ final
     +----------> step      +--W--------> step       +--W--------T---> step
                       lr*min(s/W, sqrt(W/s))    warm-up, then half a cosine
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams

__all__ = ['BaseSchedule', 'Constant', 'Cosine', 'LinearWarmupRsqrtDecay',
           'ScheduleConfigError']


class ScheduleConfigError(errors.Error, ValueError):
  """A schedule's Params hold values it cannot run with."""


class BaseSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """A learning rate as a function of the step, configured by Params.

  Subclasses implement ``Value(step)`` on a float32 step tensor and may check
  their Params in ``_Validate``. The schedule is a pure function of the step:
  it holds no variables and no state.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('learning_rate', 1e-3,
             'Base (peak) learning rate; the schedule scales it.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__()
    p = params.Copy()
    p.Freeze()
    self._params = p
    if not p.learning_rate >= 0:
      raise ScheduleConfigError(
          f'{type(self).__name__}: learning_rate must be >= 0, '
          f'got {p.learning_rate}.')
    self._Validate()

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  def _Validate(self) -> None:
    """Raises ValueError on inconsistent Params."""

  def Value(self, step: tf.Tensor) -> tf.Tensor:
    """The learning rate at `step` (float32 scalar tensor)."""
    raise NotImplementedError(f'{type(self).__name__}.Value')

  def __call__(self, step: Any) -> tf.Tensor:
    return self.Value(tf.cast(step, tf.float32))

  def get_config(self) -> dict[str, Any]:
    return {'params': self._params.ToText()}


class Constant(BaseSchedule):
  """The same learning rate at every step."""

  def Value(self, step):
    return tf.fill(tf.shape(step), tf.cast(self.params.learning_rate,
                                           tf.float32))


class LinearWarmupRsqrtDecay(BaseSchedule):
  """Transformer schedule: linear warm-up, then decay with 1/sqrt(step).

  ``lr * min(s / W, sqrt(W / s))`` with ``s = step + 1`` and W = warmup_steps:
  the first step already has a non-zero rate, the peak ``lr`` is reached on
  step W - 1, and at s = 4W the rate is lr / 2.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('warmup_steps', 4000, 'Steps of linear warm-up (>= 1).')
    return p

  def _Validate(self):
    if self.params.warmup_steps < 1:
      raise ScheduleConfigError(
          'LinearWarmupRsqrtDecay: warmup_steps must be >= 1, '
          f'got {self.params.warmup_steps}.')

  def Value(self, step):
    p = self.params
    s = step + 1.0
    warmup = float(p.warmup_steps)
    return p.learning_rate * tf.minimum(s / warmup, tf.sqrt(warmup / s))


class Cosine(BaseSchedule):
  """Optional linear warm-up, then half a cosine down to a floor.

  For step < W: ``lr * (step + 1) / W``. Then, with
  ``t = min((step - W) / (T - W), 1)``:
  ``final + (lr - final) * (1 + cos(pi * t)) / 2``; from step T on the rate
  stays at ``final_learning_rate``.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('total_steps', 10000, 'Step at which the floor is reached.')
    p.Define('warmup_steps', 0, 'Steps of linear warm-up (0: none).')
    p.Define('final_learning_rate', 0.0,
             'Floor the rate decays to, in [0, learning_rate].')
    return p

  def _Validate(self):
    p = self.params
    if not 0 <= p.warmup_steps < p.total_steps:
      raise ScheduleConfigError(
          'Cosine: need 0 <= warmup_steps < total_steps, got '
          f'warmup_steps={p.warmup_steps}, '
          f'total_steps={p.total_steps}.')
    if not 0 <= p.final_learning_rate <= p.learning_rate:
      raise ScheduleConfigError(
          'Cosine: final_learning_rate must be in [0, '
          f'learning_rate={p.learning_rate}], got {p.final_learning_rate}.')

  def Value(self, step):
    p = self.params
    warmup = float(p.warmup_steps)
    t = tf.clip_by_value((step - warmup) / (p.total_steps - warmup), 0.0, 1.0)
    decayed = p.final_learning_rate + (
        p.learning_rate - p.final_learning_rate) * 0.5 * (
            1.0 + tf.cos(math.pi * t))
    if not p.warmup_steps:
      return decayed
    return tf.where(step < warmup, p.learning_rate * (step + 1.0) / warmup,
                    decayed)
