"""BaseTask: a network plus the loss, metrics and optimiser settings that train it.

A task is the layer at the root of the variable tree (``task/model/...``). It
turns a batch (a dict of tensors from an input generator) into a scalar loss
and a dict of scalar metrics; the trainer differentiates the loss over
``task.trainable_variables``.

The network is any layer built from ``Params.model``: a SequentialLayer, a
PipeliningLayer or anything else with ``FProp(inputs, training=...)``. A task
deliberately does NOT own the optimizer or the global step (the trainer
does), so ``tf.train.Checkpoint(task=task)`` holds model variables only.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.layers import base_layer

Metrics = dict[str, tf.Tensor]


class BaseTask(base_layer.BaseLayer):
  """Base class of tasks; subclasses implement ``ComputeLoss``."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.name = 'task'
    p.Define('model', None,
             'Params of the network (any layer); built as child `model`.')
    p.Define('optimizer', optimizers.Adam.Params(),
             'Optimizer Params (gpipe_tf.tasks.optimizers).')
    p.Define('learning_rate_schedule', lr_schedules.Constant.Params(),
             'Learning-rate schedule Params (gpipe_tf.tasks.lr_schedules); it also '
             'holds the base learning rate.')
    p.Define('clip_gradient_norm_to_value', 0.0,
             'If > 0, gradients are scaled so their global norm is at most '
             'this; 0 disables clipping.')
    p.Define('init_from_checkpoint', None,
             'Warm start (transfer learning): a checkpoint prefix, or a '
             'directory (another run\'s logdir or its ckpt/) whose newest '
             'readable checkpoint initialises the model variables when the '
             'logdir holds no checkpoint of its own (gpipe_tf.train.warm_start). '
             'None: start from the initialisers.')
    p.Define('init_from_checkpoint_skip', [],
             'With init_from_checkpoint: regular expressions (re.search on '
             'variable names like task/model/head/logits/w); matching '
             'variables keep their initial values, e.g. a softmax layer '
             'whose class count changed. Each must match some variable.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    if p.model is None:
      raise base_layer.LayerConfigError(
          f"Task '{p.name}' has no model: set Params.model to the "
          'Params of a layer.')
    if not p.clip_gradient_norm_to_value >= 0:
      raise base_layer.LayerConfigError(
          'clip_gradient_norm_to_value must be >= 0, got '
          f'{p.clip_gradient_norm_to_value}.')
    self.CreateChild('model', p.model)
    self._schedule = p.learning_rate_schedule.Instantiate()

  @property
  def learning_rate_schedule(self) -> lr_schedules.BaseSchedule:
    """The schedule built from ``Params.learning_rate_schedule``."""
    return self._schedule

  @property
  def step_seed(self) -> int:
    """Seed the trainer mixes with the step for per-step randomness.

    ``Params.random_seed`` of the task, 0 when unset.
    """
    return int(self.p.random_seed or 0)

  def CreateOptimizer(self, learning_rate: optimizers.LearningRate | None = None
                      ) -> keras.optimizers.Optimizer:
    """A new Keras optimizer from ``Params.optimizer``.

    Args:
      learning_rate: what the optimizer reads its rate from; by default the
        task's schedule evaluated on the Keras optimizer's step counter. The
        trainer passes a callable reading its global step instead.
    """
    opt = self.p.optimizer.Instantiate()
    return opt.Build(self._schedule if learning_rate is None else learning_rate)

  def ClipGradients(self, grads: list[tf.Tensor]
                    ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Applies ``clip_gradient_norm_to_value``; returns (grads, norm before)."""
    norm = tf.linalg.global_norm(grads)
    clip = self.p.clip_gradient_norm_to_value
    if clip > 0:
      grads, _ = tf.clip_by_global_norm(grads, clip, use_norm=norm)
    return list(grads), norm

  def ComputeLoss(self, batch: dict[str, tf.Tensor], training: bool = False
                  ) -> tuple[tf.Tensor, Metrics]:
    """Returns (scalar float32 loss, {metric name: scalar}).

    Metrics are means over the batch; the evaluator averages them over the
    evaluation set weighted by batch size.
    """
    raise NotImplementedError(f'{type(self).__name__}.ComputeLoss')

  def FProp(self, batch: dict[str, tf.Tensor], training: bool = False
            ) -> tuple[tf.Tensor, Metrics]:
    return self.ComputeLoss(batch, training=training)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes
                ) -> base_layer.LayerMeta:
    """The cost of the model on `input_shapes` (the loss is not counted)."""
    return params.model.cls.FPropMeta(params.model, *input_shapes)


def BatchSize(batch: Any) -> tf.Tensor:
  """Leading dimension of the first tensor of `batch` (int32 scalar)."""
  first = tf.nest.flatten(batch)[0]
  return tf.shape(first)[0]

