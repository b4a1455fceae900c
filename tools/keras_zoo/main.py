"""Keras model zoo: keras.applications and keras_hub models converted with FromKeras, pipelined, and checked against Keras's own gradients.

Every keras.applications architecture is built with random weights
(weights=None) at the smallest of 32, 64, 75 and 96 pixels it accepts, and
every keras_hub backbone class and four task models from tiny configs
(tools/keras_zoo/hub.py; no presets, no downloads). Each is converted with
``pipeline.FromKeras``, run at each K and schedule for one training step
(``ComputeLossAndGradients``, M = 4 micro-batches of 4 examples), and
compared with Keras's own ``tf.GradientTape`` step over the same
micro-batches (BatchNormalization normalises each micro-batch in both).
Dropout rates are set to 0 first: a micro-batch's masks cannot equal a
full-batch Keras step's. A keras_hub model that draws random numbers at its
default settings is also stepped so, remat 'always', under the step seed
SEED, and compared with UnpipelinedStep under the same seed (the row's
seeded_diff). The loss is a squared error against random targets over
every output, so each output's gradient counts.

What "within float32 rounding" means: the same model is built a second
time under Keras's ``float64`` policy with the same weights, and its tape
step over the same micro-batches is the truth. Keras's own float32 step is
``keras_error`` off it (the rounding floor: large for a deep BatchNorm net
normalising 4 examples on 1 x 1 maps), the pipeline's float32 step
``pipeline_error``; the verdict (tools/keras_zoo/table.py's Verdict) is 'exact' when
the pipeline's error is at most 4 times Keras's own (or below 1e-6), else
'DIFFERS'. Errors are the largest element difference over
every gradient, relative to the largest truth gradient. The two Keras steps
are taken once per model and shared by every K and schedule.

    python -m tools.keras_zoo                        # everything
    python -m tools.keras_zoo --zoo_models=MobileNetV3Small,GPT2CausalLM \\
        --zoo_partitions=2 --zoo_schedules=gpipe
    python -m tools.keras_zoo --zoo_runs=4:zb_h1,2:gpipe # these pairs only
    python -m tools.keras_zoo --zoo_list                 # the model names
    python -m tools.keras_zoo --zoo_write_docs --zoo_results=\\
        benchmarks/keras_zoo/results.csv,benchmarks/keras_zoo/keras_hub.csv
                                                     # refresh the tables

The table: model, layers (Params), K, schedule, status (converted, or the
named error), max grad diff (the pipeline's float32 gradients against
Keras's float32 ones, relative to the largest Keras gradient), Keras's and
the pipeline's error against the float64 truth, the verdict, and the
seconds the row took (pipeline build, trace and step). The rows, the CSV
file and the tables (docs/keras.md's support table too) are
tools/keras_zoo/table.py's; tests/tools/keras_zoo/keras_zoo_table_test.py fails when
the page is stale.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

# Imports TensorFlow but runs no op: main splits the CPU before the first one.
from gpipe_tf.runtime import devices as devices_lib
from tools.keras_zoo import table as table_lib

Row = table_lib.Row

__all__ = ['APPLICATIONS', 'Build', 'KerasStep', 'Names', 'PipelineStep',
           'Run', 'SquaredError', 'UnpipelinedStep', 'main']

_MODELS = flags.DEFINE_list('zoo_models', None, 'Models to run (default: all).')
_PARTITIONS = flags.DEFINE_list('zoo_partitions', ['2', '4'], 'Values of K.')
_SCHEDULES = flags.DEFINE_list('zoo_schedules', ['gpipe', '1f1b', 'zb_h1'],
                               'Schedules.')
_RUNS = flags.DEFINE_list(
    'zoo_runs', None, 'K:schedule pairs to run (e.g. 4:zb_h1,2:gpipe) '
    'instead of every --zoo_partitions x --zoo_schedules.')
_LIST = flags.DEFINE_bool('zoo_list', False, 'Print the model names and exit.')
_RESULTS = flags.DEFINE_list(
    'zoo_results', None, 'Merge the rows into this CSV file (a row replaces '
    'the one of its model, K and schedule). With --zoo_write_docs: the '
    'files whose rows make the tables, e.g. benchmarks/keras_zoo/'
    'results.csv,benchmarks/keras_zoo/keras_hub.csv (a model\'s rows from '
    'the last file that has it).')
_MICRO_BATCHES = flags.DEFINE_integer(
    'zoo_micro_batches', 4, 'M, the same at every K (so one Keras step per '
    'model serves every row).')
_WRITE_DOCS = flags.DEFINE_bool(
    'zoo_write_docs', False, "Rewrite docs/keras.md's support table and "
    "benchmarks/keras_zoo/README.md's table from --zoo_results.")

_SIZES = (32, 64, 75, 96)
# The step seed of the runs with random draws (pipelined and unpipelined).
SEED = (11, 5)
_PER_MICRO_BATCH = 4
_SEQ = 8
APPLICATIONS = ('ConvNeXtBase', 'ConvNeXtLarge', 'ConvNeXtSmall', 'ConvNeXtTiny',
                'ConvNeXtXLarge', 'DenseNet121', 'DenseNet169', 'DenseNet201',
                'EfficientNetB0', 'EfficientNetB1', 'EfficientNetB2',
                'EfficientNetB3', 'EfficientNetB4', 'EfficientNetB5',
                'EfficientNetB6', 'EfficientNetB7', 'EfficientNetV2B0',
                'EfficientNetV2B1', 'EfficientNetV2B2', 'EfficientNetV2B3',
                'EfficientNetV2L', 'EfficientNetV2M', 'EfficientNetV2S',
                'InceptionResNetV2', 'InceptionV3', 'MobileNet', 'MobileNetV2',
                'MobileNetV3Large', 'MobileNetV3Small', 'NASNetLarge',
                'NASNetMobile', 'ResNet101', 'ResNet101V2', 'ResNet152',
                'ResNet152V2', 'ResNet50', 'ResNet50V2', 'VGG16', 'VGG19',
                'Xception')


def _HubNames() -> list[str]:
  from tools.keras_zoo import hub as keras_zoo_hub  # pylint: disable=g-import-not-at-top
  return keras_zoo_hub.Names()


def _IsHub(name: str) -> bool:
  return name not in APPLICATIONS


def Names() -> list[str]:
  """keras.applications' models, then keras_hub's (keras_zoo_hub)."""
  return list(APPLICATIONS) + _HubNames()


def Build(name: str, size: int | None = None, randomness: bool = False
          ) -> tuple[Any, str]:
  """(model, what it was built as), under the Keras dtype policy in force.

  Args:
    name: one of Names().
    size: the image size of a keras.applications model; None: the smallest
      of 32, 64, 75 and 96 pixels it accepts.
    randomness: a keras_hub model at its default dropout; False: dropout 0.

  Raises:
    ValueError: when no small input fits, or a keras_hub class has no tiny
      config (keras_zoo_hub.NotBuiltError).
  """
  import keras  # pylint: disable=g-import-not-at-top
  if _IsHub(name):
    from tools.keras_zoo import hub as keras_zoo_hub  # pylint: disable=g-import-not-at-top
    model = keras_zoo_hub.Build(name, randomness=randomness)
    ints = [t for t in model.inputs if 'int' in str(t.dtype)]
    return model, (f'tiny config, {_SEQ} tokens' if ints else
                   'tiny config, ' + 'x'.join(
                       str(d) for d in model.inputs[0].shape[1:3]))
  fn = getattr(keras.applications, name)
  errors = []
  for size in _SIZES if size is None else (size,):
    try:
      model = fn(weights=None, input_shape=(size, size, 3), classes=10,
                 classifier_activation=None)
      return model, f'{size}x{size}'
    except ValueError as e:
      errors.append(str(e).split('\n')[0])
  raise ValueError(f'no input of {list(_SIZES)} px fits: {errors[-1]}')


def _Float64Twin(name: str, model: Any, built: str) -> Any:
  """`name` built again under Keras's float64 policy, with `model`'s weights."""
  import keras  # pylint: disable=g-import-not-at-top
  before = keras.config.dtype_policy()
  keras.config.set_dtype_policy('float64')
  try:
    twin, _ = Build(name, None if _IsHub(name) else int(built.split('x')[0]))
  finally:
    keras.config.set_dtype_policy(before)
  _NoDropout(twin)
  twin.set_weights(model.get_weights())
  return twin


def _NoDropout(model: Any) -> None:
  import keras  # pylint: disable=g-import-not-at-top
  for layer in model._flatten_layers(include_self=True):  # pylint: disable=protected-access
    if isinstance(layer, keras.layers.Dropout):
      layer.rate = 0.0


def _Inputs(model: Any, n: int) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top

  from tools.keras_zoo import hub as keras_zoo_hub  # pylint: disable=g-import-not-at-top
  lengths = keras_zoo_hub.LENGTHS.get(type(model).__name__, {})
  made = keras_zoo_hub.INPUTS.get(type(model).__name__, {})

  def _One(t, i):
    key = t.name.split(':')[0]
    shape = [n] + [lengths.get(key, _SEQ) if d is None else d
                   for d in t.shape[1:]]
    if key in made:  # Values a random draw would make invalid (SAM3's boxes).
      return tf.cast(made[key](shape, _PER_MICRO_BATCH, i), t.dtype)
    if 'int' in keras.backend.standardize_dtype(t.dtype) or (
        keras.backend.standardize_dtype(t.dtype) == 'bool'):
      if 'mask' in t.name:  # Padding: example j keeps its first L_j tokens.
        length = tf.maximum(1, shape[1] - tf.range(n) % 4)[:, None]
        keep = tf.range(shape[1])[None, :] < length
        return tf.cast(tf.broadcast_to(
            tf.reshape(keep, [n, shape[1]] + [1] * (len(shape) - 2)), shape),
                       t.dtype)
      high = 2 if 'segment' in t.name else 50
      return tf.random.stateless_uniform(shape, [i, 1], 0, high, t.dtype)
    return tf.random.stateless_normal(shape, [i, 2], dtype=t.dtype)

  struct = model._inputs_struct  # pylint: disable=protected-access
  if isinstance(struct, dict):
    return {k: _One(t, i) for i, (k, t) in enumerate(sorted(struct.items()))}
  xs = [_One(t, i) for i, t in enumerate(model.inputs)]
  return xs[0] if len(xs) == 1 else tuple(xs)


def SquaredError(outputs: Any, targets: Any) -> Any:
  """The zoo's loss per example: the mean squared error of every output,
  summed over the outputs; in float64 for a float64 model's outputs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  terms = []
  for o, t in zip(tf.nest.flatten(outputs), tf.nest.flatten(targets)):
    dtype = tf.float64 if o.dtype == tf.float64 else tf.float32
    d = tf.square(tf.cast(o, dtype) - tf.cast(t, dtype))
    terms.append(tf.reduce_mean(tf.reshape(d, [tf.shape(d)[0], -1]), 1))
  return tf.add_n(terms)


def KerasStep(model: Any, x: Any, targets: Any, m: int,
              per_example: Callable[[Any, Any], Any] = SquaredError,
              reverse: bool = False) -> tuple[Any, list]:
  """Keras's own tape step over the m micro-batches a pipeline takes.

  Each micro-batch is a separate training call (BatchNormalization
  normalises each on its own, as in the pipeline); the loss is the mean of
  `per_example` over all examples, plus each micro-batch's
  ``model.losses`` (add_loss: a MoE router's loss) weighed by its share of
  the examples, as a pipeline weighs them (docs/keras.md).

  Args:
    model: the Keras model.
    x: its input (a tensor, a tuple or a dict of them), the whole batch.
    targets: what `per_example` compares the outputs with, the whole batch.
    m: the number of micro-batches.
    per_example: (outputs, targets) -> the loss of each example.
    reverse: take the micro-batches in reverse order (the same step,
      summed in another order).

  Returns:
    (loss, its gradients in the order of model.trainable_variables).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import microbatch  # pylint: disable=g-import-not-at-top
  flat_x, flat_t = tf.nest.flatten(x), tf.nest.flatten(targets)
  pairs = list(zip(microbatch.Split(flat_x, m), microbatch.Split(flat_t, m)))
  with tf.GradientTape() as tape:
    terms = []
    for xm, tm in pairs[::-1] if reverse else pairs:
      y = model(tf.nest.pack_sequence_as(x, xm), training=True)
      term = tf.reduce_sum(per_example(y, tf.nest.pack_sequence_as(targets,
                                                                   tm)))
      if model.losses:
        term += tf.cast(tf.shape(xm[0])[0], term.dtype) * tf.add_n(
            [tf.cast(l, term.dtype) for l in model.losses])
      terms.append(term)
    total = tf.add_n(terms)
    loss = total / tf.cast(tf.shape(flat_x[0])[0], total.dtype)
  grads = tape.gradient(loss, model.trainable_variables)
  # A variable the loss does not read (an untied output embedding of a
  # backbone) has no gradient; the pipeline gives it zeros.
  return loss, [tf.zeros(v.shape, v.dtype) if g is None else
                tf.convert_to_tensor(g)
                for v, g in zip(model.trainable_variables, grads)]


def PipelineStep(model: Any, params: list, x: Any, targets: Any, m: int,
                 per_example: Callable[[Any, Any], Any] = SquaredError,
                 step_seed: Sequence[int] | None = None,
                 no_dropout: bool = False,
                 **settings: Any) -> tuple[Any, Any, list]:
  """One pipelined step over `model` converted, from the model's weights.

  Builds a PipeliningLayer over `params` (``FromKeras(model)``) with
  `settings` (num_partitions, schedule, balance, ...), copies the model's
  weights in (LoadKerasWeights), takes one ``ComputeLossAndGradients`` step
  of `per_example` over m micro-batches and gives each gradient back to the
  Keras variable it belongs to: what KerasStep computes, pipelined.

  Args:
    model: the Keras model `params` was converted from.
    params: the layer Params, ``FromKeras(model)``.
    x: the model's input, the whole batch.
    targets: what `per_example` compares the outputs with.
    m: the number of micro-batches.
    per_example: (outputs, targets) -> the loss of each example.
    step_seed: the step seed (two ints) the random draws derive from
      (random_seeds.StepSeedScope); None: a fresh one.
    no_dropout: set the rate of every keras.layers.Dropout inside the built
      Keras layers to 0, as _NoDropout does to `model` (a Dropout nested in
      a custom layer is rebuilt from that layer's config, at its rate).
    **settings: other PipeliningLayer Params fields.

  Returns:
    (the PipeliningLayer, the loss, its gradients in the order of
    model.trainable_variables).

  Raises:
    KeyError: a trainable Keras variable has no gradient in the pipeline.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top
  pipe = pipeline.PipeliningLayer.Params().Set(
      name='net', layers=params, num_micro_batches=m, **settings).Instantiate()
  pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(pipe, model)}
  if no_dropout:
    for m in pipe.submodules:
      if getattr(m, 'keras_layer', None) is not None:
        _NoDropout(m.keras_layer)
  with _SeedScope(step_seed):
    loss, _, grads = pipe.ComputeLossAndGradients(
        x if isinstance(x, tuple) else (x,), targets,
        lambda o, t: loss_lib.LossTerms(per_example(o, t)))
  by_var = dict(zip(map(id, pipe.trainable_variables), grads))
  return pipe, loss, [
      tf.zeros(v.shape, v.dtype) if by_var[id(pairs[id(v)])] is None
      else by_var[id(pairs[id(v)])] for v in model.trainable_variables]


def _SeedScope(step_seed: Sequence[int] | None) -> Any:
  import contextlib  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top
  if step_seed is None:
    return contextlib.nullcontext()
  return random_seeds.StepSeedScope(tf.constant(list(step_seed), tf.int64))


def UnpipelinedStep(model: Any, params: list, x: Any, targets: Any, m: int,
                    step_seed: Sequence[int],
                    per_example: Callable[[Any, Any], Any] = SquaredError
                    ) -> tuple[Any, list]:
  """PipelineStep's step without a pipeline: what a pipeline with random
  draws (dropout, noise) must equal.

  A SequentialLayer over the same `params`, with `model`'s weights, runs
  micro-batch i in turn under the step seed a pipeline gives it,
  ``FoldIn(step_seed, i)``, so every layer draws the masks it draws in the
  pipeline at any K, schedule and recompute; the loss is the mean of
  `per_example` over all examples plus each micro-batch's auxiliary losses
  weighed by its share of the examples, as KerasStep's.

  Returns:
    (loss, its gradients in the order of model.trainable_variables).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import aux_losses  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import microbatch  # pylint: disable=g-import-not-at-top
  seq = layers.SequentialLayer.Params().Set(name='net',
                                            layers=params).Instantiate()
  pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(seq, model)}
  flat_x, flat_t = tf.nest.flatten(x), tf.nest.flatten(targets)
  xs, ts = microbatch.Split(flat_x, m), microbatch.Split(flat_t, m)
  step = tf.constant(list(step_seed), tf.int64)
  with tf.GradientTape() as tape:
    total = 0.0
    for i, (xm, tm) in enumerate(zip(xs, ts)):
      xm = tf.nest.pack_sequence_as(x, xm)
      with random_seeds.StepSeedScope(random_seeds.FoldIn(step, i)), (
          aux_losses.Collect()) as aux:
        y = seq.FProp(*(xm if isinstance(xm, tuple) else (xm,)),
                      training=True)
      term = tf.reduce_sum(per_example(
          y, tf.nest.pack_sequence_as(targets, tm)))
      total += term + tf.cast(tf.cast(tf.shape(tf.nest.flatten(xm)[0])[0],
                                      tf.float32) * aux.Total(), term.dtype)
    loss = total / tf.cast(tf.shape(flat_x[0])[0], total.dtype)
  by_var = dict(zip(map(id, seq.trainable_variables),
                    tape.gradient(loss, seq.trainable_variables)))
  return loss, [tf.zeros(v.shape, v.dtype) if by_var[id(pairs[id(v)])] is None
                else tf.convert_to_tensor(by_var[id(pairs[id(v)])])
                for v in model.trainable_variables]


def _AsFloat64(x: Any) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float64) if t.dtype.is_floating else t, x)


def Run(name: str, runs: Sequence[tuple[int, str]],
        log: Callable[[Row], None] = lambda row: None,
        micro_batches: int = 4) -> list[Row]:
  """The zoo rows of model `name`, one per (K, schedule) of `runs`.

  Keras's float32 and float64 steps over the same `micro_batches`
  micro-batches (every dropout 0) are taken once and shared by every row.
  A keras_hub model that draws random numbers at its default settings
  (GPT-2's dropout 0.1) is also built so, and each row steps it pipelined
  (remat always) under the step seed SEED and compares it with
  UnpipelinedStep under the same seed, taken once (Row.seeded_diff).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  start = time.time()

  def _Refused(status, error, layers=0):
    row = Row(name, layers, 0, '-', status, None, time.time() - start,
              f'{type(error).__name__}: {error}' if status == 'skipped'
              else str(error))
    log(row)
    return [row]

  try:
    model, built = Build(name)
  except ValueError as e:
    return _Refused('skipped', e)
  _NoDropout(model)
  try:
    params = pipeline.FromKeras(model)
  except Exception as e:  # pylint: disable=broad-except
    return _Refused(_Status(e), e)
  m = micro_batches
  x = _Inputs(model, m * _PER_MICRO_BATCH)
  try:
    # A micro-batch's outputs: CLIP's logits are micro-batch x micro-batch.
    first = tf.nest.map_structure(lambda t: t[:_PER_MICRO_BATCH], x)
    targets = tf.nest.map_structure(
        lambda o: tf.random.stateless_normal([m * o.shape[0]] + o.shape[1:],
                                             [7, 7]),
        model(first, training=False))
    _, keras32 = KerasStep(model, x, targets, m)
  except Exception as e:  # pylint: disable=broad-except
    return _Refused('skipped', ValueError(
        f"Keras's own training step fails: {type(e).__name__}: "
        f'{str(e).splitlines()[0][:200]}'), len(params))
  truth_kind = table_lib.F64
  try:
    _, truth = KerasStep(_Float64Twin(name, model, built), _AsFloat64(x),
                         _AsFloat64(targets), m)
  except Exception:  # pylint: disable=broad-except
    truth, truth_kind = _Float32Truth(model, x, targets, m)
  try:
    noisy = _Noisy(name, model)
    if noisy is not None:
      noisy_params = pipeline.FromKeras(noisy)
      _, seeded_want = UnpipelinedStep(noisy, noisy_params, x, targets, m,
                                       SEED)
  except Exception as e:  # pylint: disable=broad-except
    return _Refused(_Status(e), e, len(params))
  rows = []
  for k, sched in runs:
    start = time.time()
    try:
      _, _, got = PipelineStep(model, params, x, targets, m,
                               num_partitions=k, schedule=sched,
                               no_dropout=True)
      diff, keras_error, pipeline_error = table_lib.Errors(
          got, keras32, keras32 if truth is None else truth)
      if truth is None:
        keras_error = pipeline_error = None
      seeded = None
      if noisy is not None:
        _, _, got = PipelineStep(noisy, noisy_params, x, targets, m,
                                 step_seed=SEED, num_partitions=k,
                                 schedule=sched, remat='always')
        seeded = table_lib.Errors(got, seeded_want, seeded_want)[0]
      row = Row(name, len(params), k, sched, 'converted', diff,
                time.time() - start, built, keras_error, pipeline_error,
                seeded, truth_kind)
    except Exception as e:  # pylint: disable=broad-except
      row = Row(name, len(params), k, sched, _Status(e), None,
                time.time() - start, str(e))
    rows.append(row)
    log(row)
  return rows


def _Float32Truth(model: Any, x: Any, targets: Any, m: int
                  ) -> tuple[Any, str]:
  """(gradients, Row.truth) for a model Keras cannot step in float64.

  keras_hub's MoE blocks cast to float32 inside (their load-balancing
  loss), so their float64 twin fails. Keras's float32 step over the whole
  batch in one call is then the reference: for a model with no batch
  statistics it is the micro-batched step computed in another order, so
  Keras's micro-batched step is off it by rounding only (keras_error) and
  the pipeline must be as close (Verdict). Measured on six keras_hub models
  with a float64 twin, this spread is 0.16 to 1.5 times Keras's error
  against float64, so the bound max(FACTOR x spread, FLOOR) is the f64
  verdict's within a factor of 6 (docs/keras.md). A model with
  BatchNormalization (its statistics depend on the micro-batch) gets
  (None, F64): no verdict. A model that adds losses in training (a MoE
  router's, at its real coefficient) adds them per micro-batch, a function
  of the micro-batch, so its truth is Keras's float32 step over the same
  micro-batches taken in reverse order (F32_REVERSED): the same step summed
  in another order.
  """
  import keras  # pylint: disable=g-import-not-at-top
  if any(isinstance(layer, keras.layers.BatchNormalization)
         for layer in model._flatten_layers()):  # pylint: disable=protected-access
    return None, table_lib.F64
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model(tf.nest.map_structure(lambda t: t[:t.shape[0] // m], x),
        training=True)
  if model.losses:
    return (KerasStep(model, x, targets, m, reverse=True)[1],
            table_lib.F32_REVERSED)
  return KerasStep(model, x, targets, 1)[1], table_lib.F32


def _Noisy(name: str, quiet: Any) -> Any:
  """keras_hub model `name` at its default settings with `quiet`'s weights,
  when it draws random numbers there; else None."""
  if not _IsHub(name):
    return None
  from tools.keras_zoo import hub as keras_zoo_hub  # pylint: disable=g-import-not-at-top
  noisy, _ = Build(name, randomness=True)
  if not keras_zoo_hub.HasRandomness(noisy):
    return None
  noisy.set_weights(quiet.get_weights())
  return noisy


def _Status(error: Exception) -> str:
  """A named error's class; 'crash: <class>' for any other exception."""
  from gpipe_tf import errors  # pylint: disable=g-import-not-at-top
  name = type(error).__name__
  return name if isinstance(error, errors.Error) else f'crash: {name}'


def main(argv: Sequence[str]) -> None:
  del argv
  if _LIST.value:
    print('\n'.join(Names()))
    return
  if _WRITE_DOCS.value:
    results = {path: table_lib.ReadResults(path) for path in _RESULTS.value}
    with open(table_lib.DOCS) as f:
      text = f.read()
    with open(table_lib.DOCS, 'w') as f:
      f.write(table_lib.UpdateDocs(text, table_lib.Merged(*results.values())))
    with open(table_lib.README) as f:
      text = f.read()
    for path, rows in results.items():
      text = table_lib.UpdateReadme(text, rows, os.path.basename(path))
    with open(table_lib.README, 'w') as f:
      f.write(text)
    return
  if _RUNS.value:
    runs = [(int(k), s) for k, s in (r.split(':') for r in _RUNS.value)]
  else:
    runs = [(int(k), s) for k in _PARTITIONS.value for s in _SCHEDULES.value]
  devices_lib.SplitCpu(max(k for k, _ in runs))
  names = _MODELS.value or Names()
  unknown = sorted(set(names) - set(Names()))
  if unknown:
    raise app.UsageError(f'unknown models {unknown}; see --zoo_list.')
  rows = []

  def _Log(row):
    print(table_lib.Table([row], True).splitlines()[-1], flush=True)
    if _RESULTS.value:
      table_lib.WriteResults(_RESULTS.value[0], [row])

  for name in names:
    rows += Run(name, runs, _Log, _MICRO_BATCHES.value)
  print(table_lib.Table(rows, True))

