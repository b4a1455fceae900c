"""Parameters, parameter memory, forward FLOPs and per-cell totals of a registered model, without building it.

Everything comes from the layers' FPropMeta (shapes only, no variables), so
the 83.9B-parameter Transformer-L of Table 1 is counted in seconds on a
laptop::

  python -m tools.plan.model_stats --model=lm.synthetic.TransformerL_1663
  python -m tools.plan.model_stats --model=mt.multilingual.T_64_16384_32 \\
      --num_partitions=8 --json
  python -m tools.plan.model_stats --model=lm.synthetic.TransformerL_103 \\
      --model_params_override='model.num_partitions : 16'

The layer list is ``task.model.layers`` (a PipeliningLayer or SequentialLayer)
and the input shapes ``task.model.input_shapes`` (else inferred from the first
layer's input_dim). Overrides are applied by base_experiment.ApplyOverrides,
as the trainer applies them. Cells are the K contiguous groups the pipeline's
partitioner picks from the layers' FLOPs (PipeliningLayer.CellMetas); an
explicit ``balance`` of the model is kept unless --num_partitions is given.

Parameter memory = parameters x bytes per parameter, where bytes per
parameter = bytes of one value of the model's dtype x (1 + optimizer slots
per weight): the weight plus what the optimizer keeps between steps.
Gradients and activations are not counted (they are transient). Slots:
SGD 0 (1 with momentum), Adam/AdamW 2 (3 with amsgrad), RMSProp 1 (+1 with
momentum, +1 centered). The paper's 12 bytes per parameter is RMSProp with
momentum in float32 (weight, mean square, momentum). Table 1 prints GiB.

FLOPs are forward FLOPs per example (a multiply-add counts 2) at the input
shapes, i.e. for full-length sequences; the loss is not counted.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

__all__ = ['BytesPerParam', 'DefineFlags', 'DtypeBytes', 'FormatText',
           'LayersAndShapes', 'ModelStats', 'ModelStatsError', 'OptimizerSlots',
           'PrintOrExit', 'Run', 'main']



def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines this tool's flags on `flag_values` (done only when run as a script)."""
  flags.DEFINE_string('model', None, 'Registered experiment, e.g. '
                      'lm.synthetic.TransformerL_1663.', flag_values=flag_values)
  flags.DEFINE_string(
      'model_params_override', '',
      "Overrides in ToText format ('path : value', separated by newlines or "
      "';'), as for the trainer.", flag_values=flag_values)
  flags.DEFINE_integer(
      'num_partitions', 0, "K cells to report; 0: the model's own K (1 for a "
      'SequentialLayer).', flag_values=flag_values)
  flags.DEFINE_integer(
      'bytes_per_param', 0, "Bytes per parameter; 0: from the task's "
      'optimizer and the model dtype.', flag_values=flag_values)
  flags.DEFINE_bool('json', False, 'Print one JSON object.',
                    flag_values=flag_values)


class ModelStatsError(ValueError):
  """The experiment's model cannot be counted; the message says why."""


_DTYPE_BYTES = {'float32': 4, 'float16': 2, 'bfloat16': 2, 'float64': 8}


def OptimizerSlots(optimizer_params: Any) -> int:
  """Slot variables per weight that the optimizer Params will create.

  Raises:
    ModelStatsError: an optimizer this function does not know.
  """
  from gpipe_tf.tasks import optimizers  # pylint: disable=g-import-not-at-top
  cls = optimizer_params.cls
  if issubclass(cls, optimizers.Adam):
    return 3 if optimizer_params.amsgrad else 2
  if issubclass(cls, optimizers.RMSProp):
    return (1 + int(optimizer_params.momentum > 0) +
            int(bool(optimizer_params.centered)))
  if issubclass(cls, optimizers.SGD):
    return int(optimizer_params.momentum > 0)
  raise ModelStatsError(f'Unknown optimizer {cls.__name__}: pass '
                        '--bytes_per_param.')


def DtypeBytes(dtype: str) -> int:
  """Bytes of one value of `dtype` (e.g. 'float32': 4)."""
  if dtype not in _DTYPE_BYTES:
    raise ModelStatsError(f'Unknown dtype {dtype!r}: pass --bytes_per_param.')
  return _DTYPE_BYTES[dtype]


def BytesPerParam(task_params: Any, dtype: str) -> int:
  """Bytes of a weight plus its optimizer slots, in `dtype`."""
  return DtypeBytes(dtype) * (1 + OptimizerSlots(task_params.optimizer))


def LayersAndShapes(experiment_params: Any) -> tuple[list, Any]:
  """The model's layer Params and the input shapes of its first layer.

  ``task.model.layers`` and ``task.model.input_shapes`` (else inferred from
  the first layer's input_dim).

  Raises:
    ModelStatsError: no layer list, or shapes that cannot be inferred.
  """
  from gpipe_tf.pipeline import cost as cost_lib  # pylint: disable=g-import-not-at-top
  model = experiment_params.task.model
  if model is None or 'layers' not in model or not model.layers:
    raise ModelStatsError(
        'task.model has no `layers`; model_stats counts a PipeliningLayer or '
        'SequentialLayer Params.')
  layers = list(model.layers)
  shapes = model.input_shapes if 'input_shapes' in model else None
  try:
    return layers, shapes or cost_lib.InferInputShapes(layers)
  except cost_lib.CostEstimateError as e:
    raise ModelStatsError(str(e)) from e


def ModelStats(experiment_params: Any, num_partitions: int = 0,
               bytes_per_param: int = 0) -> dict[str, Any]:
  """Counts the model of experiment Params (fields train, test, task).

  Args:
    experiment_params: e.g. model_registry.GetParams(name), overrides applied.
    num_partitions: K cells to report; 0 keeps the model's own.
    bytes_per_param: 0 derives it from the optimizer and dtype.

  Returns:
    {'num_params', 'param_bytes', 'bytes_per_param', 'flops_per_example',
     'num_layers', 'input_shapes', 'num_partitions',
     'cells': [{'num_layers', 'num_params', 'flops', 'param_bytes'}]}.

  Raises:
    ModelStatsError: no layer list, or shapes that cannot be inferred.
  """
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  task = experiment_params.task
  model = task.model
  layers, shapes = LayersAndShapes(experiment_params)
  pipe = PipeliningLayer.Params().Set(name=model.name, layers=layers,
                                      input_shapes=shapes)
  if 'balance' in model and model.balance is not None and not num_partitions:
    pipe.balance = list(model.balance)
  own = model.num_partitions if 'num_partitions' in model else 1
  k = num_partitions or own
  cells = PipeliningLayer.CellMetas(pipe, num_partitions=(
      None if pipe.balance is not None else k))
  if not bytes_per_param:
    bytes_per_param = BytesPerParam(task, layers[0].dtype)
  for cell in cells:
    cell['param_bytes'] = cell['num_params'] * bytes_per_param
  num_params = sum(c['num_params'] for c in cells)
  return {
      'num_params': num_params,
      'param_bytes': num_params * bytes_per_param,
      'bytes_per_param': bytes_per_param,
      'flops_per_example': sum(c['flops'] for c in cells),
      'num_layers': len(layers),
      'input_shapes': [list(s) for s in shapes],
      'num_partitions': len(cells),
      'cells': cells,
  }


def _Human(n: float, unit: str = '') -> str:
  for scale, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
    if abs(n) >= scale:
      return f'{n / scale:.2f}{suffix}{unit}'
  return f'{n:.0f}{unit}'


def FormatText(name: str, stats: dict[str, Any]) -> str:
  """A human-readable report of ModelStats."""
  lines = [
      f'model              {name}',
      f'layers             {stats["num_layers"]}',
      f'parameters         {stats["num_params"]:,} ({_Human(stats["num_params"])})',
      f'parameter memory   {stats["param_bytes"] / 2**30:.1f} GiB '
      f'({stats["bytes_per_param"]} bytes per parameter)',
      f'forward FLOPs      {_Human(stats["flops_per_example"])} per example '
      f'at input shapes {stats["input_shapes"]}',
      f'cells (K={stats["num_partitions"]})',
      '  cell  layers      params    GiB      FLOPs',
  ]
  for i, c in enumerate(stats['cells']):
    lines.append(f'  {i:4d}  {c["num_layers"]:6d}  {_Human(c["num_params"]):>10}'
                 f'  {c["param_bytes"] / 2**30:7.2f}  {_Human(c["flops"]):>9}')
  return '\n'.join(lines)


def Run(flag_values: flags.FlagValues) -> str:
  """The tool's output for parsed flags (see DefineFlags).

  Raises:
    model_registry.ModelNotFoundError, AttributeError,
    hyperparams.ParamsParseError (bad override), partition.PartitionError
    (K larger than the layers), ModelStatsError.
  """
  from gpipe_tf import base_experiment  # pylint: disable=g-import-not-at-top
  from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
  if not flag_values.model:
    raise ModelStatsError('--model is required.')
  params = model_registry.GetParams(flag_values.model)
  if flag_values.model_params_override:
    base_experiment.ApplyOverrides(params, flag_values.model_params_override)
  stats = ModelStats(params, flag_values.num_partitions,
                     flag_values.bytes_per_param)
  if flag_values.json:
    return json.dumps(dict(stats, model=flag_values.model))
  return FormatText(flag_values.model, stats)


def PrintOrExit(tool: str, run: Callable[[], str],
                errors: tuple[type[Exception], ...] = ()) -> None:
  """Prints run()'s output; on bad input exits with status 1 and one line.

  Bad input: an unregistered model, a bad override, K larger than the
  layers, a ModelStatsError, or one of ``errors``.
  """
  from gpipe_tf import hyperparams  # pylint: disable=g-import-not-at-top
  from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import partition  # pylint: disable=g-import-not-at-top
  try:
    print(run())
  except (model_registry.ModelNotFoundError, AttributeError,
          hyperparams.ParamsParseError, partition.PartitionError,
          ModelStatsError) + tuple(errors) as e:
    sys.exit(f'{tool}: error: ' + ' '.join(str(e).split()))


def main(argv: Sequence[str],
         flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Prints Run's output; exits with status 1 and one line on bad input."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  PrintOrExit('model_stats', lambda: Run(flag_values))


if __name__ == '__main__':
  DefineFlags()
  app.run(main)
