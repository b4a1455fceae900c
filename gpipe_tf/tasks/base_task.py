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
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import precision
from gpipe_tf.pipeline import loss as loss_lib

__all__ = ['BaseTask', 'BatchSize', 'Metrics']

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

  # A task that splits its loss per example declares which batch entries are
  # the model's positional inputs and which the loss reads, and implements
  # LossTerms; ComputeLoss and ComputeLossAndGradients then work for every
  # model and pipeline schedule. A task may instead override ComputeLoss
  # alone, which trains any model except pipelines whose schedule needs the
  # loss inside (1F1B, interleaved, zero-bubble).
  INPUT_KEYS: tuple[str, ...] = ()
  LABEL_KEYS: tuple[str, ...] = ()

  def ModelInputs(self, batch: dict[str, tf.Tensor]) -> tuple:
    """The model's positional inputs: ``batch[k]`` for k in INPUT_KEYS."""
    return tuple(batch[k] for k in self.INPUT_KEYS)

  def Labels(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """What LossTerms reads besides the outputs: LABEL_KEYS of `batch`."""
    return {k: batch[k] for k in self.LABEL_KEYS}

  def LossTerms(self, outputs: Any, labels: dict[str, tf.Tensor]
                ) -> loss_lib.LossTerms:
    """Per-example (or per-token) losses, weights and metrics of a batch.

    Called on the whole batch, or inside a pipeline on each micro-batch.
    """
    raise loss_lib.LossNotSplittableError(
        f'{type(self).__name__} computes its loss in ComputeLoss only; a '
        'pipeline schedule that runs backward passes between forwards needs '
        'the loss per micro-batch: implement INPUT_KEYS, LABEL_KEYS and '
        "LossTerms (see ClassificationTask), or use schedule='gpipe'.")

  def BatchMetrics(self, batch: dict[str, tf.Tensor]) -> Metrics:
    """Metrics of the batch alone (no model outputs), added to the others."""
    del batch
    return {}

  def ComputeLoss(self, batch: dict[str, tf.Tensor], training: bool = False
                  ) -> tuple[tf.Tensor, Metrics]:
    """Returns (scalar float32 loss, {metric name: scalar}).

    Metrics are means over the batch; the evaluator averages them over the
    evaluation set weighted by batch size. The default runs the model on
    ModelInputs and reduces LossTerms to weighted means, plus the auxiliary
    losses its layers add in training (aux_losses).
    """
    if type(self).LossTerms is BaseTask.LossTerms:
      raise NotImplementedError(
          f'{type(self).__name__}: implement LossTerms (with INPUT_KEYS and '
          'LABEL_KEYS), or override ComputeLoss.')
    with aux_losses.Collect() as aux:  # Layers' terms (add_loss, AddAuxLoss).
      outputs = self.model.FProp(*self.ModelInputs(batch), training=training)
    outputs = precision.ToFloat32(outputs)  # The loss in float32.
    loss, metrics = loss_lib.ReduceTerms(
        self.LossTerms(outputs, self.Labels(batch)))
    if aux.terms:
      loss = loss + aux.Total()
      metrics['loss'] = loss
    metrics.update(self.BatchMetrics(batch))
    return loss, metrics

  def ComputeLossAndGradients(self, batch: dict[str, tf.Tensor],
                              variables: list[tf.Variable],
                              loss_scale: tf.Tensor | None = None
                              ) -> tuple[tf.Tensor, Metrics, list]:
    """(loss, metrics, gradients of `variables`) of one training batch.

    With `loss_scale` the gradients are those of the loss times it (float16
    training); the loss and metrics are not scaled.

    A pipelined model whose schedule starts backwards before the last forward
    computes the loss inside the pipeline
    (PipeliningLayer.ComputeLossAndGradients); anything else runs
    ComputeLoss under a GradientTape.
    """
    if getattr(self.model, 'needs_loss_inside', False):
      if type(self).LossTerms is BaseTask.LossTerms:
        self.LossTerms(None, {})  # Raises LossNotSplittableError.
      loss, metrics, grads = self.model.ComputeLossAndGradients(
          self.ModelInputs(batch), self.Labels(batch), self.LossTerms,
          variables, loss_scale=loss_scale)
      metrics = dict(metrics)
      metrics.update(self.BatchMetrics(batch))
      return loss, metrics, grads
    with tf.GradientTape() as tape:
      loss, metrics = self.ComputeLoss(batch, training=True)
      scaled = loss if loss_scale is None else loss * loss_scale
    return loss, metrics, tape.gradient(scaled, variables)

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

