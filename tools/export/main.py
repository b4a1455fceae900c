"""Exports a trained experiment's newest checkpoint as a TensorFlow SavedModel for serving.

::

  python -m tools.export --model=image.digits.AmoebaNetTiny \\
      --logdir=/tmp/gpipe_digits --export_dir=/tmp/gpipe_digits_export

Serving does not depend on how the model was trained: a PipeliningLayer's
layers are exported as a SequentialLayer over the same layer Params (same
variable paths, so the trainer's checkpoint restores into it; see
docs/pipeline.md), with no device placement, so the SavedModel runs on one
device of whatever machine loads it. Loading it needs TensorFlow only, not
gpipe_tf.

Signatures, by task (inputs have the Test() input's dtypes and shapes, with
any batch size)::

  ClassificationTask   serving_default(inputs) -> {logits, probabilities}
  LanguageModelTask    serving_default(ids, paddings)
                           -> {logits [B, T, V], next_ids [B, T] (argmax)}
  TranslationTask      serving_default(src_ids, src_paddings)
                           -> {ids [B, max_decode_len]} (greedy decoding,
                              TranslationTask.Decode: EOS then padding)
                       logits(src_ids, src_paddings, tgt_ids, tgt_paddings)
                           -> {logits [B, T, V]} (teacher forcing)
  any other task with INPUT_KEYS
                       serving_default(<INPUT_KEYS>) -> {outputs}

Only the model's variables are read (not the optimizer's). Nothing in the
logdir is ever written; a bad argument raises a named error before anything
is written anywhere.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from absl import app
from absl import flags
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import errors
from gpipe_tf import model_registry
from gpipe_tf import pipeline
from gpipe_tf import tasks
from gpipe_tf.layers import core
from gpipe_tf.train import checkpoints

__all__ = ['ExportError', 'Export', 'ExportLayer', 'DefineFlags', 'Run']


class ExportError(errors.Error, ValueError):
  """An export that cannot be made (a non-empty export_dir, ...)."""


def Unpipelined(model: Any) -> Any:
  """A SequentialLayer's Params over a PipeliningLayer's layers; others as is.

  The layer name, and with it every variable path, stays the same.
  """
  if not (isinstance(model.cls, type) and
          issubclass(model.cls, pipeline.PipeliningLayer)):
    return model.Copy()
  p = core.SequentialLayer.Params()
  for name, value in model.IterParams():
    if name in p and name != 'cls':
      p.Set(**{name: value})
  return p.Copy()


def _NewestCheckpoint(logdir: str) -> str:
  """The newest readable checkpoint of a trainer logdir (read only)."""
  directory = os.path.join(logdir, checkpoints.CHECKPOINT_NAME)
  for path in checkpoints.CandidateCheckpoints(directory):
    try:
      checkpoints.VerifyReadable(path)
    except Exception:  # pylint: disable=broad-except
      continue
    return path
  raise checkpoints.NoCheckpointError(
      f'No readable checkpoint in {directory}: pass the --logdir the trainer '
      'wrote (python -m gpipe_tf.trainer --logdir=...), after at least one '
      'checkpoint was saved.')


def _InputSpecs(params: Any, keys: Sequence[str]) -> list[tf.TensorSpec]:
  """TensorSpecs of the Test() input's entries `keys`, any batch size."""
  spec = params.test.Instantiate().GetDataset().element_spec
  missing = [k for k in keys if k not in spec]
  if missing:
    raise ExportError(f'The Test() input yields {sorted(spec)}, not the '
                      f'model inputs {missing}; export needs them.')
  return [tf.TensorSpec([None] + spec[k].shape.as_list()[1:], spec[k].dtype,
                        name=k) for k in keys]


def _Signatures(task: tasks.BaseTask, specs: list[tf.TensorSpec],
                max_decode_len: int | None) -> dict[str, Any]:
  """The concrete functions to serve, by signature name."""
  model = task.model

  def _Forward(*xs):
    return core.AsTuple(model.FProp(*xs, training=False))[0]

  if isinstance(task, tasks.ClassificationTask):
    def _Classify(inputs):
      logits = _Forward(inputs)
      return {'logits': logits, 'probabilities': tf.nn.softmax(logits)}
    return {'serving_default': tf.function(_Classify).get_concrete_function(
        *specs)}
  if isinstance(task, tasks.TranslationTask):
    length = max_decode_len or specs[2].shape[1]
    if not length:
      raise ExportError('The Test() targets have no fixed length; pass '
                        '--max_decode_len=N for the decode signature.')

    def _Decode(src_ids, src_paddings):
      return {'ids': task.Decode({'src_ids': src_ids,
                                  'src_paddings': src_paddings}, int(length))}

    def _Logits(src_ids, src_paddings, tgt_ids, tgt_paddings):
      return {'logits': _Forward(src_ids, src_paddings, tgt_ids, tgt_paddings)}
    return {
        'serving_default': tf.function(_Decode).get_concrete_function(
            *specs[:2]),
        'logits': tf.function(_Logits).get_concrete_function(*specs)}
  if isinstance(task, tasks.LanguageModelTask):
    def _NextTokens(ids, paddings):
      logits = _Forward(ids, paddings)
      return {'logits': logits,
              'next_ids': tf.argmax(logits, axis=-1, output_type=tf.int32)}
    return {'serving_default': tf.function(_NextTokens).get_concrete_function(
        *specs)}

  def _Outputs(*xs):
    return {'outputs': _Forward(*xs)}
  return {'serving_default': tf.function(_Outputs).get_concrete_function(
      *specs)}


def Export(experiment: base_experiment.ExperimentLike, logdir: str,
           export_dir: str, max_decode_len: int | None = None) -> str:
  """Writes the SavedModel of `experiment`'s newest checkpoint in `logdir`.

  Args:
    experiment: what was trained (a registered experiment class, instance or
      experiment Params, with the overrides the trainer ran with).
    logdir: the trainer's logdir; only read.
    export_dir: where the SavedModel goes; must not exist or be empty.
    max_decode_len: TranslationTask: length of the decoded ids; default: the
      Test() input's target length.

  Returns:
    The checkpoint exported.

  Raises:
    ExportError: export_dir is not empty, or the task has no INPUT_KEYS.
    checkpoints.NoCheckpointError: no readable checkpoint in logdir/ckpt.
    checkpoints.IncompatibleCheckpointError: it holds another model.
  """
  if tf.io.gfile.exists(export_dir) and tf.io.gfile.listdir(export_dir):
    raise ExportError(f'--export_dir={export_dir} is not empty; pass a new '
                      'directory (export never overwrites one).')
  params = base_experiment.AsExperimentParams(experiment)
  path = _NewestCheckpoint(logdir)
  task_params = params.task.Copy()
  task_params.model = Unpipelined(task_params.model)
  task = task_params.Instantiate()
  if not task.INPUT_KEYS:
    raise ExportError(f'{type(task).__name__} declares no INPUT_KEYS, so '
                      'export cannot tell the model inputs; set INPUT_KEYS.')
  keys = task.INPUT_KEYS
  root = tf.train.Checkpoint(task=task)
  checkpoints.CheckCompatible(path, root, strict=('task',))
  root.read(path).expect_partial()  # The optimizer and step are not served.
  signatures = _Signatures(task, _InputSpecs(params, keys), max_decode_len)
  module = tf.Module()
  module.task = task  # The variables the signatures read.
  tf.saved_model.save(module, export_dir, signatures=signatures)
  return path


def ExportLayer(trained: Any, input_specs: dict[str, tf.TensorSpec],
                export_dir: str) -> None:
  """Writes a SavedModel serving a trained layer's forward, unpipelined.

  For a layer trained outside the trainer: a ``PipelineModel``'s layer after
  ``model.fit``, e.g. over ``pipeline.FromKeras`` Params of a keras_hub
  model (docs/keras.md, "Pretrained weights"). A SequentialLayer over the
  same Params (Unpipelined) takes `trained`'s variables by path and serves::

    serving_default(<input_specs' names>) -> {'outputs': y}, or y itself
                                            when the layer returns a dict

  Args:
    trained: the built layer (a PipeliningLayer or any gpipe_tf layer)
      holding the trained variables; its own Params are rebuilt.
    input_specs: the inputs by name (any batch size: None). A chain that
      starts with KerasInputs takes them as a dict; another layer takes
      them positionally, in this order.
    export_dir: where the SavedModel goes; must not exist or be empty.

  Raises:
    ExportError: export_dir is not empty, or `trained` lacks a variable of
      the layer (other Params).
  """
  if tf.io.gfile.exists(export_dir) and tf.io.gfile.listdir(export_dir):
    raise ExportError(f'export_dir={export_dir} is not empty; pass a new '
                      'directory (export never overwrites one).')
  layer_params = trained.p
  layer = Unpipelined(layer_params).Instantiate()
  have = {v.name: v for v in trained.variables}
  missing = [v.name for v in layer.variables if v.name not in have]
  if missing or len(have) != len(trained.variables):
    raise ExportError(
        f'the trained layer has no variables {missing[:5]} (or two of one '
        'name).')
  for v in layer.variables:
    v.assign(have[v.name])
  first = (layer_params.layers[0] if 'layers' in layer_params
           else layer_params)
  by_name = getattr(first, 'cls', None) is not None and (
      first.cls.__name__ == 'KerasInputs')

  def _Serve(**xs):
    y = (layer.FProp(dict(xs), training=False) if by_name else
         layer.FProp(*[xs[k] for k in input_specs], training=False))
    return y if isinstance(y, dict) else {'outputs': y}

  specs = {k: tf.TensorSpec(s.shape, s.dtype, name=k)
           for k, s in input_specs.items()}
  module = tf.Module()
  module.layer = layer  # The variables the signature reads.
  tf.saved_model.save(module, export_dir, signatures={
      'serving_default': tf.function(_Serve).get_concrete_function(**specs)})


def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines this tool's flags on `flag_values` (only when run as a script)."""
  flags.DEFINE_string('model', None, 'Registered experiment, e.g. '
                      'image.digits.AmoebaNetTiny.', flag_values=flag_values)
  flags.DEFINE_string('logdir', None, "The trainer's --logdir (read only).",
                      flag_values=flag_values)
  flags.DEFINE_string('export_dir', None,
                      'Where to write the SavedModel (new or empty).',
                      flag_values=flag_values)
  flags.DEFINE_string(
      'model_params_override', '',
      'The overrides the model was trained with (as for the trainer).',
      flag_values=flag_values)
  flags.DEFINE_integer('max_decode_len', 0,
                       'Translation: decoded length; 0: the Test() target '
                       'length.', flag_values=flag_values)


def Run(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Exports as the flags say; returns the line to print."""
  for name in ('model', 'logdir', 'export_dir'):
    if not flag_values[name].value:
      raise ExportError(f'--{name} is required.')
  params = model_registry.GetParams(flag_values.model)
  if flag_values.model_params_override:
    base_experiment.ApplyOverrides(params, flag_values.model_params_override)
  path = Export(params, flag_values.logdir, flag_values.export_dir,
                flag_values.max_decode_len or None)
  return f'Exported {path} to {flag_values.export_dir}'


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  try:
    print(Run())
  except errors.Error as e:
    raise SystemExit(f'export: error: {type(e).__name__}: {e}') from None

