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
import tensorflow as tf

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


class _FusedAdamUpdate:
  """Keras's Adam update of a variable as one ResourceApplyAdam op.

  Keras 3 builds Adam's update of each variable from small ops (casts, the
  step's bias corrections again for every variable, three assignments: a
  step of 10 variables traced 418 ops, 79 fused); TensorFlow's fused kernel
  computes the same update, in the same order of operations
  (``m += (g - m) * (1 - beta1)``, likewise ``v``,
  ``var -= m * alpha / (sqrt(v) + epsilon)``), in one op, and the step's
  constants are built once per dtype. Its variables and slots are Keras's
  own, so checkpoints are unchanged.

  Keras's update runs instead with AMSGrad, under a tf.distribute strategy
  (whose update of a mirrored variable Keras drives per device), or for a
  variable that is not a tf.Variable.
  """

  def _backend_update_step(self, grads, trainable_variables, learning_rate):
    self._fused_constants = {}
    try:
      return super()._backend_update_step(grads, trainable_variables,
                                          learning_rate)
    finally:
      self._fused_constants = None

  def update_step(self, gradient, variable, learning_rate):
    constants = getattr(self, '_fused_constants', None)
    if (constants is None or self.amsgrad or tf.distribute.has_strategy() or
        not isinstance(variable, tf.Variable)):
      return super().update_step(gradient, variable, learning_rate)
    dtype = variable.dtype
    if dtype not in constants:
      step = tf.cast(self.iterations + 1, dtype)
      beta1 = tf.cast(self.beta_1, dtype)
      beta2 = tf.cast(self.beta_2, dtype)
      constants[dtype] = dict(
          beta1_power=tf.pow(beta1, step), beta2_power=tf.pow(beta2, step),
          lr=tf.cast(learning_rate, dtype), beta1=beta1, beta2=beta2,
          epsilon=tf.cast(self.epsilon, dtype))
    index = self._get_variable_index(variable)
    tf.raw_ops.ResourceApplyAdam(
        var=variable.handle, m=self._momentums[index].value.handle,
        v=self._velocities[index].value.handle,
        grad=tf.cast(gradient, dtype), use_locking=False, **constants[dtype])


class _FusedKerasAdam(_FusedAdamUpdate, keras.optimizers.Adam):
  """keras.optimizers.Adam, each variable's update one op."""


class _FusedKerasAdamW(_FusedAdamUpdate, keras.optimizers.AdamW):
  """keras.optimizers.AdamW, each variable's Adam update one op (its decay
  is Keras's, applied before)."""


class Adam(BaseOptimizer):
  """Adam (Kingma & Ba) with bias correction, as Keras implements it."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first-moment estimate.')
    p.Define('beta2', 0.999, 'Decay of the second-moment estimate.')
    p.Define('epsilon', 1e-7, 'Added to the root of the second moment.')
    p.Define('amsgrad', False, 'Whether to use the AMSGrad variant.')
    p.Define('fused', True,
             "Update each variable with TensorFlow's fused Adam kernel (one "
             "op, the same arithmetic) instead of Keras's ops; Keras's run "
             'with amsgrad and under a tf.distribute strategy.')
    return p

  def _Create(self, learning_rate):
    p = self.params
    cls = _FusedKerasAdam if p.fused else keras.optimizers.Adam
    return cls(learning_rate=learning_rate, beta_1=p.beta1, beta_2=p.beta2,
               epsilon=p.epsilon, amsgrad=p.amsgrad, name=p.name)


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
    cls = _FusedKerasAdamW if p.fused else keras.optimizers.AdamW
    opt = cls(
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

