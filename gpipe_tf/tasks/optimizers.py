"""Optimizers declared by Params, each building a Keras 3 optimizer.

``optimizers.Adam.Params().Set(beta1=0.9).Instantiate()`` gives a small
wrapper; its ``Build(learning_rate)`` returns the Keras optimizer (a float, a
``keras.optimizers.schedules.LearningRateSchedule`` evaluated on the Keras
optimizer's own step counter, or a callable of no argument, which is how the
trainer ties the rate to its global step).

Keras 3 optimizers update plain ``tf.Variable``s inside a ``tf.function`` and
save and restore through ``tf.train.Checkpoint`` (tests/optimizers_test.py
checks both). Their slot variables are created by ``optimizer.build(vars)``;
call it before restoring a checkpoint so every slot exists to receive its
value.

Adafactor is deliberately NOT offered: Keras 3.15's Adafactor names its slot
variables after the model variable's name and rejects names containing '/',
which every gpipe_tf layer variable has ('task/model/fc0/w').

The wrappers deliberately do NOT clip gradients: the task's
``clip_gradient_norm_to_value`` is applied by the trainer to the whole
gradient before ``apply_gradients``.
"""

from __future__ import annotations

from typing import Any, Callable

import keras

from gpipe_tf import hyperparams

__all__ = ['Adam', 'AdamW', 'BaseOptimizer', 'LearningRate', 'RMSProp', 'SGD']

LearningRate = (float | keras.optimizers.schedules.LearningRateSchedule |
                Callable[[], Any])


class BaseOptimizer:
  """Builds one kind of Keras optimizer from frozen Params."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', cls.__name__.lower(),
             'Name of the Keras optimizer (prefix of its variable names).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    p = params.Copy()
    p.Freeze()
    self._params = p

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  def Build(self, learning_rate: LearningRate) -> keras.optimizers.Optimizer:
    """A new Keras optimizer using `learning_rate` (see the module doc)."""
    return self._Create(learning_rate)

  def _Create(self, learning_rate: LearningRate) -> keras.optimizers.Optimizer:
    raise NotImplementedError(f'{type(self).__name__}._Create')


class SGD(BaseOptimizer):
  """Stochastic gradient descent, optionally with (Nesterov) momentum.

  With momentum m: ``v = m * v - lr * g; w += v``.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('momentum', 0.0, 'Momentum in [0, 1); 0 is plain SGD.')
    p.Define('nesterov', False, 'Whether to use Nesterov momentum.')
    return p

  def _Create(self, learning_rate):
    p = self.params
    return keras.optimizers.SGD(learning_rate=learning_rate,
                                momentum=p.momentum, nesterov=p.nesterov,
                                name=p.name)


class Adam(BaseOptimizer):
  """Adam (Kingma & Ba) with bias correction, as Keras implements it."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first-moment estimate.')
    p.Define('beta2', 0.999, 'Decay of the second-moment estimate.')
    p.Define('epsilon', 1e-7, 'Added to the root of the second moment.')
    p.Define('amsgrad', False, 'Whether to use the AMSGrad variant.')
    return p

  def _Create(self, learning_rate):
    p = self.params
    return keras.optimizers.Adam(learning_rate=learning_rate, beta_1=p.beta1,
                                 beta_2=p.beta2, epsilon=p.epsilon,
                                 amsgrad=p.amsgrad, name=p.name)


class AdamW(Adam):
  """Adam with decoupled weight decay (Loshchilov & Hutter)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('weight_decay', 0.004,
             'Decoupled decay: each step w -= lr * weight_decay * w.')
    p.Define('exclude_from_weight_decay', [],
             'Regular expressions; variables whose name matches one are not '
             "decayed (e.g. ['/b:'] for biases).")
    return p

  def _Create(self, learning_rate):
    p = self.params
    opt = keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=p.weight_decay,
        beta_1=p.beta1, beta_2=p.beta2, epsilon=p.epsilon, amsgrad=p.amsgrad,
        name=p.name)
    if p.exclude_from_weight_decay:
      opt.exclude_from_weight_decay(var_names=list(p.exclude_from_weight_decay))
    return opt


class RMSProp(BaseOptimizer):
  """RMSProp: divides the gradient by a running root mean square."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('decay', 0.9, 'Decay (rho) of the mean square.')
    p.Define('momentum', 0.0, 'Momentum; 0 for none.')
    p.Define('epsilon', 1e-7, 'Added to the root mean square.')
    p.Define('centered', False, 'Whether to subtract the mean gradient.')
    return p

  def _Create(self, learning_rate):
    p = self.params
    return keras.optimizers.RMSprop(learning_rate=learning_rate, rho=p.decay,
                                    momentum=p.momentum, epsilon=p.epsilon,
                                    centered=p.centered, name=p.name)

