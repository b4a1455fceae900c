"""Keras model zoo: keras.applications and keras_hub models converted with FromKeras, pipelined, and checked against Keras's own gradients.

Every keras.applications architecture is built with random weights
(weights=None) at the smallest of 32, 64, 75 and 96 pixels it accepts, and
keras_hub's GPT-2 and BERT backbones and task models from tiny configs (no
presets, no downloads). Each is converted with ``pipeline.FromKeras``, run
at each K and schedule for one training step (``ComputeLossAndGradients``,
M = K micro-batches of 4 examples), and compared with Keras's own
``tf.GradientTape`` step over the same micro-batches (BatchNormalization
normalises each micro-batch in both). Dropout rates are set to 0 first: a
pipeline draws other masks than Keras. The loss is a squared error against
random targets over every output, so each output's gradient counts.

    python -m tools.keras_zoo                        # everything
    python -m tools.keras_zoo --zoo_models=MobileNetV3Small,GPT2CausalLM \\
        --zoo_partitions=2 --zoo_schedules=gpipe
    python -m tools.keras_zoo --zoo_list                 # the model names
    python -m tools.keras_zoo --zoo_results=benchmarks/keras_zoo/results.csv \\
        --zoo_write_docs                                 # refresh docs/keras.md

The table: model, layers (Params), K, schedule, status (converted, or the
named error), the largest gradient difference over every variable relative
to the largest Keras gradient, and the seconds the row took (build, trace
and step). ``SupportTable`` renders the results as docs/keras.md's support
table; tests/tools/keras_zoo_test.py fails when the page is stale.
"""

from __future__ import annotations

import csv
import os
import re
import time
from typing import Any, Callable, NamedTuple, Sequence

from absl import app
from absl import flags

# Imports TensorFlow but runs no op: main splits the CPU before the first one.
from gpipe_tf.runtime import devices as devices_lib

__all__ = ['APPLICATIONS', 'HUB', 'Row', 'Build', 'Names', 'ReadResults',
           'Run', 'SupportTable', 'Table', 'UpdateDocs', 'WriteResults']

_MODELS = flags.DEFINE_list('zoo_models', None, 'Models to run (default: all).')
_PARTITIONS = flags.DEFINE_list('zoo_partitions', ['2', '4'], 'Values of K.')
_SCHEDULES = flags.DEFINE_list('zoo_schedules', ['gpipe', '1f1b', 'zb_h1'],
                               'Schedules.')
_LIST = flags.DEFINE_bool('zoo_list', False, 'Print the model names and exit.')
_RESULTS = flags.DEFINE_string('zoo_results', None,
                               'Append the rows to this CSV file.')
_WRITE_DOCS = flags.DEFINE_bool(
    'zoo_write_docs', False, "Rewrite docs/keras.md's support table from "
    '--zoo_results.')

DOCS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'docs',
                    'keras.md')
_BEGIN = '<!-- keras_zoo support table: python -m tools.keras_zoo --zoo_write_docs -->'
_END = '<!-- end of keras_zoo support table -->'
_SIZES = (32, 64, 75, 96)
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
HUB = ('GPT2Backbone', 'GPT2CausalLM', 'BertBackbone', 'BertTextClassifier')


class Row(NamedTuple):
  """One zoo result: status is 'converted' or the named error's class."""
  model: str
  layers: int
  k: int
  schedule: str
  status: str
  max_grad_diff: float | None
  seconds: float
  detail: str = ''


def Names() -> list[str]:
  return list(APPLICATIONS) + list(HUB)


def _Hub(name: str) -> Any:
  import keras_hub  # pylint: disable=g-import-not-at-top
  tiny = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
              intermediate_dim=32, max_sequence_length=_SEQ, dropout=0.0)
  if name.startswith('GPT2'):
    backbone = keras_hub.models.GPT2Backbone(**tiny)
    if name == 'GPT2Backbone':
      return backbone
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  backbone = keras_hub.models.BertBackbone(**tiny)
  if name == 'BertBackbone':
    return backbone
  return keras_hub.models.BertTextClassifier(
      backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0)


def Build(name: str) -> tuple[Any, str]:
  """(model, what it was built as); raises ValueError when no small input
  fits."""
  import keras  # pylint: disable=g-import-not-at-top
  if name in HUB:
    return _Hub(name), f'tiny config, {_SEQ} tokens'
  fn = getattr(keras.applications, name)
  errors = []
  for size in _SIZES:
    try:
      model = fn(weights=None, input_shape=(size, size, 3), classes=10,
                 classifier_activation=None)
      return model, f'{size}x{size}'
    except ValueError as e:
      errors.append(str(e).split('\n')[0])
  raise ValueError(f'no input of {list(_SIZES)} px fits: {errors[-1]}')


def _Inputs(model: Any, n: int) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top

  def _One(t, i):
    shape = [n] + [_SEQ if d is None else d for d in t.shape[1:]]
    if 'int' in keras.backend.standardize_dtype(t.dtype):
      if 'mask' in t.name:
        return tf.ones(shape, t.dtype)
      high = 2 if 'segment' in t.name else 50
      return tf.random.stateless_uniform(shape, [i, 1], 0, high, t.dtype)
    return tf.random.stateless_normal(shape, [i, 2], dtype=t.dtype)

  struct = model._inputs_struct  # pylint: disable=protected-access
  if isinstance(struct, dict):
    return {k: _One(t, i) for i, (k, t) in enumerate(sorted(struct.items()))}
  xs = [_One(t, i) for i, t in enumerate(model.inputs)]
  return xs[0] if len(xs) == 1 else tuple(xs)


def _PerExample(outputs: Any, targets: Any) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  terms = []
  for o, t in zip(tf.nest.flatten(outputs), tf.nest.flatten(targets)):
    d = tf.square(tf.cast(o, tf.float32) - t)
    terms.append(tf.reduce_mean(tf.reshape(d, [tf.shape(d)[0], -1]), 1))
  return tf.add_n(terms)


def _KerasGradients(model: Any, x: Any, targets: Any, m: int) -> list:
  """Keras's tape step over the m micro-batches the pipeline takes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import microbatch  # pylint: disable=g-import-not-at-top
  flat_x, flat_t = tf.nest.flatten(x), tf.nest.flatten(targets)
  xs, ts = microbatch.Split(flat_x, m), microbatch.Split(flat_t, m)
  n = tf.cast(tf.shape(flat_x[0])[0], tf.float32)
  with tf.GradientTape() as tape:
    total = tf.add_n([tf.reduce_sum(_PerExample(
        model(tf.nest.pack_sequence_as(x, xm), training=True),
        tf.nest.pack_sequence_as(targets, tm))) for xm, tm in zip(xs, ts)])
    loss = total / n
  return tape.gradient(loss, model.trainable_variables)


def Run(name: str, ks: Sequence[int], schedules: Sequence[str],
        log: Callable[[Row], None] = lambda row: None) -> list[Row]:
  """The zoo rows of model `name` at each K and schedule."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import errors  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top
  start = time.time()
  try:
    model, built = Build(name)
  except ValueError as e:
    row = Row(name, 0, 0, '-', 'skipped', None, time.time() - start, str(e))
    log(row)
    return [row]
  for layer in model._flatten_layers():  # pylint: disable=protected-access
    if isinstance(layer, keras.layers.Dropout):
      layer.rate = 0.0
  try:
    params = pipeline.FromKeras(model)
  except errors.Error as e:
    row = Row(name, 0, 0, '-', type(e).__name__, None, time.time() - start,
              str(e))
    log(row)
    return [row]
  rows = []
  for k in ks:
    m = k
    x = _Inputs(model, m * _PER_MICRO_BATCH)
    outs = model(x, training=False)
    targets = tf.nest.map_structure(
        lambda o: tf.random.stateless_normal(o.shape, [7, 7]), outs)
    want = _KerasGradients(model, x, targets, m)
    for sched in schedules:
      start = time.time()
      try:
        pipe = pipeline.PipeliningLayer.Params().Set(
            name='net', layers=params, num_partitions=k, num_micro_batches=m,
            schedule=sched).Instantiate()
        pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(pipe, model)}
        _, _, grads = pipe.ComputeLossAndGradients(
            x if isinstance(x, tuple) else (x,), targets,
            lambda o, t: loss_lib.LossTerms(_PerExample(o, t)))
        got = dict(zip(map(id, pipe.trainable_variables), grads))
        diff, scale = 0.0, 1e-12
        for var, g in zip(model.trainable_variables, want):
          g = np.asarray(tf.convert_to_tensor(g))
          diff = max(diff, float(np.max(np.abs(
              np.asarray(got[id(pairs[id(var)])]) - g))))
          scale = max(scale, float(np.max(np.abs(g))))
        diff /= scale
        row = Row(name, len(params), k, sched, 'converted', diff,
                  time.time() - start, built)
      except errors.Error as e:
        row = Row(name, len(params), k, sched, type(e).__name__, None,
                  time.time() - start, str(e))
      rows.append(row)
      log(row)
  return rows


def _Diff(row: Row) -> str:
  return '-' if row.max_grad_diff is None else f'{row.max_grad_diff:.1e}'


def Table(rows: Sequence[Row]) -> str:
  """The rows as a Markdown table."""
  lines = ['| model | layers | K | schedule | status | max grad diff | s |',
           '|---|---|---|---|---|---|---|']
  for r in rows:
    status = r.status if r.status == 'converted' else (
        f'{r.status}: {r.detail}')
    lines.append(f'| {r.model} | {r.layers} | {r.k} | {r.schedule} | '
                 f'{status} | {_Diff(r)} | {r.seconds:.0f} |')
  return '\n'.join(lines) + '\n'


def WriteResults(path: str, rows: Sequence[Row]) -> None:
  """Appends `rows` to the CSV file `path`."""
  new = not os.path.exists(path)
  with open(path, 'a', newline='') as f:
    w = csv.writer(f)
    if new:
      w.writerow(Row._fields)
    for r in rows:
      w.writerow(['' if v is None else v for v in r])


def ReadResults(path: str) -> list[Row]:
  """The rows of a results CSV (a model's last rows win)."""
  with open(path, newline='') as f:
    rows = [Row(d['model'], int(d['layers']), int(d['k']), d['schedule'],
                d['status'], float(d['max_grad_diff']) if d['max_grad_diff']
                else None, float(d['seconds']), d['detail'])
            for d in csv.DictReader(f)]
  last = {}
  for r in rows:
    last[(r.model, r.k, r.schedule)] = r
  return list(last.values())


def SupportTable(rows: Sequence[Row]) -> str:
  """docs/keras.md's support table: one line per model."""
  by_model: dict[str, list[Row]] = {}
  for r in rows:
    by_model.setdefault(r.model, []).append(r)
  lines = ['| model | built as | layers | runs (K x schedule) | '
           'max grad diff |', '|---|---|---|---|---|']
  for name in sorted(by_model):
    rs = by_model[name]
    ok = [r for r in rs if r.status == 'converted']
    if ok:
      runs = ', '.join(f'{r.k} {r.schedule}' for r in ok)
      worst = max(r.max_grad_diff for r in ok)
      lines.append(f'| {name} | {ok[0].detail} | {ok[0].layers} | {runs} | '
                   f'{worst:.1e} |')
    for r in rs:
      if r.status != 'converted':
        detail = re.sub(r'\s+', ' ', r.detail)[:160].replace('|', '/')
        lines.append(f'| {name} | - | {r.layers or "-"} | {r.status} '
                     f'({r.k} {r.schedule}) | {detail} |')
  return '\n'.join(lines) + '\n'


def UpdateDocs(text: str, rows: Sequence[Row]) -> str:
  """`text` (docs/keras.md) with its support table made from `rows`."""
  begin, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
  return text[:begin] + '\n' + SupportTable(rows) + text[end:]


def main(argv: Sequence[str]) -> None:
  del argv
  if _LIST.value:
    print('\n'.join(Names()))
    return
  if _WRITE_DOCS.value:
    with open(DOCS) as f:
      text = f.read()
    with open(DOCS, 'w') as f:
      f.write(UpdateDocs(text, ReadResults(_RESULTS.value)))
    return
  ks = [int(k) for k in _PARTITIONS.value]
  devices_lib.SplitCpu(max(ks))
  names = _MODELS.value or Names()
  unknown = sorted(set(names) - set(Names()))
  if unknown:
    raise app.UsageError(f'unknown models {unknown}; see --zoo_list.')
  rows = []

  def _Log(row):
    print(Table([row]).splitlines()[-1], flush=True)
    if _RESULTS.value:
      WriteResults(_RESULTS.value, [row])

  for name in names:
    rows += Run(name, ks, _SCHEDULES.value, _Log)
  print(Table(rows))


if __name__ == '__main__':
  app.run(main)
