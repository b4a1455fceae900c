"""PipelineModel: a keras.Model whose fit trains a pipeline with the loss inside, one update per batch.

``model.fit`` drives the training, ``evaluate`` and ``predict`` run the
pipeline's forward (``FProp(training=False)``), and Keras's callbacks
(TensorBoard, ModelCheckpoint, EarlyStopping, ...) and progress bar work as
for any Keras model::

  model = PipelineModel(PipeliningLayer.Params().Set(
      name='net', layers=[...], num_partitions=2, num_micro_batches=4,
      schedule='1f1b'))
  model.compile(keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=['accuracy'])
  model.fit(train_ds, validation_data=test_ds, epochs=3, callbacks=[...])

One training step (Keras's ``train_step``, traced once by ``fit``)::

  loss, metrics, grads = net.ComputeLossAndGradients(x, y, loss_fn)
      loss_fn(outputs, labels) of one micro-batch -> LossTerms of
      per-example values of the compiled loss and metrics
  optimizer.apply_gradients(grads)              (once per batch)

so any schedule trains (GPipe, 1F1B, interleaved, zero-bubble), and the
update equals the one of the unpipelined model on the whole batch. Losses
the layers add with ``add_loss`` in training (a MoE router's) are in the
loss and its gradients, as Keras adds ``model.losses`` (aux_losses;
weighed per micro-batch, docs/keras.md). A layer
without ``ComputeLossAndGradients`` (e.g. a SequentialLayer) trains with a
GradientTape around ``FProp``.

What compile accepts. The pipeline needs per-example losses (its micro-batch
losses are weighted into the batch mean), so:

* ``loss``: a ``keras.losses.Loss`` with reduction ``'sum_over_batch_size'``
  (the default), ``'mean'`` or ``'mean_with_sample_weight'`` (all the mean
  over the loss's elements; it is called with reduction ``'none'``), the name
  of a Keras loss function (``'sparse_categorical_crossentropy'``), or any
  function (y_true, y_pred) -> per-example values [batch, ...].
* ``metrics``: ``'accuracy'``/``'acc'`` (resolved from the shapes as Keras
  does), names of Keras metric functions (``'mae'``), functions like the loss,
  and ``keras.metrics.MeanMetricWrapper`` instances (e.g.
  ``SparseCategoricalAccuracy()``). Each is averaged over the batch's
  examples like the loss.

Refused with KerasLossError: no loss, reductions ``'sum'`` and ``'none'``
(Keras would train on the batch sum), several losses (dicts, lists,
``loss_weights``), ``weighted_metrics``, stateful metrics that are not a
per-example mean (AUC, Precision, ...), sample weights in the data, and
``jit_compile=True`` (XLA compiles for one device; the cells run on several).

The pipeline's variables are tf.Variables owned by the layer, not Keras
variables: the optimizer is built on them in ``compile``, ``save_weights``,
``load_weights`` and ``ModelCheckpoint(save_weights_only=True)`` store them
by their path (``net/fc0/w``), and ``tf.train.Checkpoint(model=...)`` tracks
them. ``model.weights`` and ``get_weights`` deliberately do NOT list them.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import run_errors
from gpipe_tf.train import checkpoints

__all__ = ['KerasLossError', 'PerExampleFn', 'PipelineModel']

PerExampleFn = Callable[[Any, Any], tf.Tensor]

_MEAN_REDUCTIONS = ('sum_over_batch_size', 'mean', 'mean_with_sample_weight')
_ACCURACY_NAMES = ('accuracy', 'acc')


class KerasLossError(errors.Error, ValueError):
  """A Keras loss, metric, argument or batch the pipeline cannot split."""


def _PerExampleLoss(loss: Any) -> PerExampleFn:
  """fn(y_true, y_pred) giving the loss of every example."""
  if loss is None:
    raise KerasLossError(
        'PipelineModel.compile needs a loss, e.g. loss=keras.losses.'
        'SparseCategoricalCrossentropy(from_logits=True).')
  if isinstance(loss, (dict, list, tuple)):
    raise KerasLossError(
        f'PipelineModel trains one output with one loss; got a '
        f'{type(loss).__name__} of losses. Pass a single loss.')
  if isinstance(loss, str):
    loss = keras.losses.get(loss)
  if isinstance(loss, keras.losses.Loss):
    if loss.reduction not in _MEAN_REDUCTIONS:
      raise KerasLossError(
          f'Loss {loss.name!r} has reduction={loss.reduction!r}; the pipeline '
          'averages per-example losses over the batch. Give it '
          "reduction='sum_over_batch_size' (the default).")
    try:
      unreduced = type(loss).from_config(
          dict(loss.get_config(), reduction='none'))
    except Exception as e:  # pylint: disable=broad-except
      raise KerasLossError(
          f'Cannot rebuild loss {type(loss).__name__} with reduction=\'none\' '
          f'from its get_config() ({type(e).__name__}: {e}); pass its '
          'per-example function instead (y_true, y_pred) -> [batch, ...].'
      ) from e
    return unreduced
  if callable(loss):
    return loss
  raise KerasLossError(f'Unknown loss {loss!r}; pass a keras.losses.Loss, the '
                       'name of a Keras loss or a function.')


def _Accuracy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
  """Keras's 'accuracy', chosen from the shapes as compile chooses it."""
  true_rank, pred_rank = y_true.shape.rank, y_pred.shape.rank
  if pred_rank is not None and y_pred.shape[-1] == 1:
    return keras.metrics.binary_accuracy(y_true, y_pred)
  if true_rank is not None and pred_rank is not None and (
      true_rank == pred_rank - 1 or y_true.shape[-1] == 1):
    return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)
  return keras.metrics.categorical_accuracy(y_true, y_pred)


def _PerExampleMetric(metric: Any) -> tuple[str, PerExampleFn]:
  """(name, fn) of one compiled metric; fn gives per-example values."""
  if isinstance(metric, str) and metric in _ACCURACY_NAMES:
    return metric, _Accuracy
  name = metric if isinstance(metric, str) else None
  if isinstance(metric, str):
    metric = keras.metrics.get(metric)
  if isinstance(metric, keras.metrics.MeanMetricWrapper):
    fn, kwargs = metric._fn, dict(metric._fn_kwargs)  # pylint: disable=protected-access
    return name or metric.name, lambda y, p: fn(y, p, **kwargs)
  if isinstance(metric, keras.metrics.Metric):
    raise KerasLossError(
        f'Metric {metric.name!r} ({type(metric).__name__}) is not a mean of '
        'per-example values, so it cannot be summed over micro-batches; use '
        'a per-example metric (a function or a MeanMetricWrapper), or '
        'compute it from model.predict.')
  if callable(metric):
    return name or getattr(metric, '__name__', 'metric'), metric
  raise KerasLossError(f'Unknown metric {metric!r}; pass a name, a function '
                       'or a keras.metrics.MeanMetricWrapper.')


def _Inputs(x: Any) -> tuple:
  """The layer's positional inputs: a tuple/list of tensors, or one tensor."""
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _PerExample(name: str, values: Any) -> tf.Tensor:
  """`values` as a tensor; a scalar (a loss reduced over the batch) raises."""
  values = tf.convert_to_tensor(values)
  if values.shape.rank == 0:
    raise KerasLossError(
        f'{name!r} returned a scalar; the pipeline needs one value per example '
        '(shape [batch, ...]): pass a keras.losses.Loss, or a function such '
        'as keras.losses.sparse_categorical_crossentropy that does not '
        'reduce over the batch.')
  return values


class PipelineModel(keras.Model):
  """A keras.Model over a gpipe_tf layer (a PipeliningLayer, or any layer).

  Attributes:
    layer: the gpipe_tf layer built from the Params given (its variables have
      the paths of a SequentialLayer over the same layers, so checkpoints
      move between them).
  """

  def __init__(self, layer_params: hyperparams.InstantiableParams,
               seed: int = 0, **kwargs: Any) -> None:
    """Builds the layer and its variables.

    Args:
      layer_params: Params of a PipeliningLayer (or any gpipe_tf layer with
        ``FProp(*inputs, training)``).
      seed: mixed with the optimizer's step into the step seed of dropout
        masks (random_seeds.StepSeedScope), as the trainer mixes the task's
        random_seed.
      **kwargs: keras.Model arguments (``name``; default: the layer's name).
    """
    kwargs.setdefault('name', layer_params.name)
    super().__init__(**kwargs)
    self.layer = layer_params.Instantiate()
    self._seed = int(seed)
    self._loss_fn: PerExampleFn | None = None
    self._metric_fns: dict[str, PerExampleFn] = {}
    self._trackers: dict[str, keras.metrics.Mean] = {}
    self.built = True  # The layer made its variables; nothing to infer.

  # ---- Keras: compile and the steps ----------------------------------------
  def compile(self, optimizer: Any = 'rmsprop', loss: Any = None,
              metrics: list | None = None, **kwargs: Any) -> None:
    """keras.Model.compile with a per-example loss (see the module docstring).

    Raises:
      KerasLossError: a loss, metric or argument the pipeline cannot use.
    """
    for name in ('loss_weights', 'weighted_metrics'):
      if kwargs.get(name) is not None:
        raise KerasLossError(
            f'PipelineModel.compile does not take {name}: it trains one '
            'output with one loss; drop it.')
    if kwargs.pop('jit_compile', False) not in (False, 'auto'):
      raise KerasLossError(
          'PipelineModel runs its cells on several devices, which XLA cannot '
          'compile as one program; leave jit_compile unset (or False).')
    self._loss_fn = _PerExampleLoss(loss)
    self._metric_fns = dict(_PerExampleMetric(m) for m in (metrics or []))
    super().compile(optimizer=optimizer, jit_compile=False, **kwargs)
    self._trackers = {name: keras.metrics.Mean(name=name)
                      for name in ['loss'] + list(self._metric_fns)}
    # Keras builds the optimizer on model.trainable_variables, which holds no
    # tf.Variable of the layer: build it on the layer's variables first.
    self.optimizer.build(self.layer.trainable_variables)

  def fit(self, *args: Any, **kwargs: Any) -> Any:
    """keras.Model.fit; an op that fails as a step runs raises its error
    with the pipeline's action, tick and device first in its message
    (run_errors.Explaining)."""
    with run_errors.Explaining(self.layer, training=True):
      return super().fit(*args, **kwargs)

  def evaluate(self, *args: Any, **kwargs: Any) -> Any:
    """keras.Model.evaluate, its errors explained as fit's."""
    with run_errors.Explaining(self.layer, training=False):
      return super().evaluate(*args, **kwargs)

  @property
  def metrics(self) -> list[keras.metrics.Metric]:
    """The means fit and evaluate report: loss, then the compiled metrics."""
    return list(self._trackers.values())

  def call(self, inputs: Any, training: bool | None = False) -> Any:
    """The layer's forward: ``FProp(*inputs, training)``."""
    return self.layer.FProp(*_Inputs(inputs), training=bool(training))

  def train_step(self, data: Any) -> dict[str, tf.Tensor]:
    """One synchronous update with the loss inside the pipeline."""
    x, y = self._Unpack(data)
    inputs = _Inputs(x)
    variables = list(self.layer.trainable_variables)
    seed = tf.stack([tf.constant(self._seed, tf.int64),
                     tf.cast(self.optimizer.iterations, tf.int64)])
    with random_seeds.StepSeedScope(seed):
      if hasattr(self.layer, 'ComputeLossAndGradients'):
        loss, metrics, grads = self.layer.ComputeLossAndGradients(
            inputs, y, self.LossTerms, variables)
      else:
        with tf.GradientTape() as tape:
          with aux_losses.Collect() as aux:  # As Keras adds model.losses.
            outputs = self.layer.FProp(*inputs, training=True)
          loss, metrics = loss_lib.ReduceTerms(self.LossTerms(outputs, y))
          if aux.terms:
            loss = metrics['loss'] = loss + aux.Total()
        grads = tape.gradient(loss, variables)
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    self.optimizer.apply_gradients(pairs)
    return self._Track(metrics, inputs)

  def test_step(self, data: Any) -> dict[str, tf.Tensor]:
    """The loss and metrics of the pipelined forward (training=False)."""
    x, y = self._Unpack(data)
    inputs = _Inputs(x)
    outputs = self.layer.FProp(*inputs, training=False)
    _, metrics = loss_lib.ReduceTerms(self.LossTerms(outputs, y))
    return self._Track(metrics, inputs)

  def predict_step(self, data: Any) -> Any:
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    return self.layer.FProp(*_Inputs(x), training=False)

  # ---- The per-example loss ------------------------------------------------
  def LossTerms(self, outputs: Any, labels: Any) -> loss_lib.LossTerms:
    """The compiled loss and metrics of a (micro-)batch, per example."""
    if self._loss_fn is None:
      raise KerasLossError('PipelineModel: call compile(optimizer, loss) '
                           'before fit or evaluate.')
    loss = _PerExample('loss', self._loss_fn(labels, outputs))
    metrics = {}
    for name, fn in self._metric_fns.items():
      value = tf.cast(_PerExample(name, fn(labels, outputs)), loss.dtype)
      while value.shape.rank < loss.shape.rank:  # Per example, per token.
        value = value[..., tf.newaxis]
      metrics[name] = tf.broadcast_to(value, tf.shape(loss))
    return loss_lib.LossTerms(loss, None, metrics)

  def _Unpack(self, data: Any) -> tuple[Any, Any]:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
      raise KerasLossError(
          'PipelineModel does not take sample weights (the data yields '
          '(x, y, sample_weight)); yield (x, y), or fold the weights into '
          'a loss function of (y_true, y_pred).')
    if y is None:
      raise KerasLossError('PipelineModel.fit and evaluate need (x, y) '
                           'batches; the data yields x only.')
    return x, y

  def _Track(self, metrics: dict[str, tf.Tensor],
             inputs: tuple) -> dict[str, tf.Tensor]:
    """Adds the batch's means, weighted by its size; returns running means."""
    size = tf.shape(tf.nest.flatten(inputs)[0])[0]
    for name, tracker in self._trackers.items():
      tracker.update_state(metrics[name], sample_weight=size)
    return {name: tracker.result() for name, tracker in self._trackers.items()}

  # ---- Saving: the layer's tf.Variables by path ----------------------------
  def save_own_variables(self, store: Any) -> None:
    """Stores every variable of the layer under its path (weights files)."""
    for variable in self.layer.variables:
      store[_Key(variable)] = variable.numpy()

  def load_own_variables(self, store: Any) -> None:
    """Loads what save_own_variables stored.

    Raises:
      checkpoints.IncompatibleCheckpointError: the file holds other variables.
    """
    expected = {_Key(v): v for v in self.layer.variables}
    found = set(store.keys())
    if found != set(expected):
      raise checkpoints.IncompatibleCheckpointError(
          'The weights file holds another model: missing '
          f'{sorted(set(expected) - found)[:5]}, unexpected '
          f'{sorted(found - set(expected))[:5]}. Load it into a '
          'PipelineModel built from the same layer Params.')
    for key, variable in expected.items():
      variable.assign(store[key])


def _Key(variable: tf.Variable) -> str:
  """A variable's path as a weights-file key ('net/fc0/w:0' -> 'net.fc0.w')."""
  return variable.name.split(':')[0].replace('/', '.')
