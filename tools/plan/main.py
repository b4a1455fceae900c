"""Recommends K, R, M, schedule, V and remat for a registered model on D devices within a memory budget.

Reads the experiment's layer Params and input shapes as tools/plan/model_stats.py
does (FPropMeta), traces each distinct layer's step once for what its
backward keeps (gpipe_tf.pipeline.layer_bytes; --activations=outputs builds
nothing and takes each layer's outputs instead), estimates every layout with the
schedule simulator (tools/plan/lib.py says how), drops those over the
budget and prints the fastest as a table, with the reason for the winner::

  python -m tools.plan --model=lm.synthetic.TransformerL_103 --devices=8 \\
      --memory_budget_mib=16384
  python -m tools.plan --model=synthetic.mlp.Tiny --devices=2 --json
  python -m tools.plan --model=synthetic.mlp.Tiny --devices=2 \\
      --synthesize=tiny.csv     # a schedule made for the model, and tiny.png
  python -m tools.plan --synthesize_table   # synthesized vs library, on paper
  python -m tools.plan --synthesize_table --table_width=1024 \\
      --table_heads=16 --table_tokens=512   # ... for a larger block

Bytes per parameter: weight + optimizer slots in the model's dtype (Adam 4 +
8 in float32; tools.plan.model_stats.BytesPerParam) + the gradient (4). The batch
is the experiment's training batch unless --batch_size says otherwise.

--compare=ROWS.json (a ``python -m tools.benchmark --json`` output) plans
the model the benchmark timed instead (on its devices and batch unless
--devices and --batch_size say otherwise), and prints the planner's
estimates beside the measured rows (docs/planning.md). Rows timed with
``tools.benchmark --devices=processes`` (one worker process per device)
are compared device by device: the fullest device's measured peak beside
its estimate, and the planner is first calibrated on their workers' CPU
time (a device's speed and a cost per layer per pass:
plan_check.Calibrate); shared-mode rows by the one allocator's total.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from absl import app
from absl import flags

from tools.plan import block as plan_block
from tools.plan import check as plan_check
from tools.plan import lib as plan_lib
from tools.plan import synthesize as plan_synthesize

__all__ = ['BenchmarkModel', 'DefineFlags', 'ExperimentModel', 'Run', 'main']

def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the flags on `flag_values` (only when run as a script)."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string('model', None, 'Registered experiment, e.g. '
                      'lm.synthetic.TransformerL_103.', **fv)
  flags.DEFINE_string(
      'model_params_override', '', "Overrides in ToText format ('path : "
      "value', separated by newlines or ';'), as for the trainer.", **fv)
  flags.DEFINE_integer(
      'devices', 0, "D devices to plan for; 0: the model's own K (with "
      "--compare: the benchmark's devices).", **fv)
  flags.DEFINE_float('memory_budget_mib', 0,
                     'Memory per device, MiB; 0: no limit.', **fv)
  flags.DEFINE_integer(
      'batch_size', 0, "Global batch N; 0: the experiment's training batch.",
      **fv)
  flags.DEFINE_list('schedules', [], 'Schedules to consider; empty: every '
                    'registered one.', **fv)
  flags.DEFINE_integer('max_micro_batches', 64, 'Largest M.', **fv)
  flags.DEFINE_float('flops_per_second', 1e12, "A device's speed; scales the "
                     'estimated examples/sec, not the ranking.', **fv)
  flags.DEFINE_integer('top', 10, 'Plans to print; 0: all.', **fv)
  flags.DEFINE_bool('json', False, 'Print one JSON object.', **fv)
  flags.DEFINE_string(
      'compare', None, "A tools.benchmark --json file: plan the benchmark's "
      'model instead of --model and print the estimates beside its rows.',
      **fv)
  flags.DEFINE_enum(
      'activations', 'traced', ['outputs', 'traced'],
      "A layer's activations in the memory estimate. 'traced': what its "
      "backward keeps, from a trace of each distinct layer's training step "
      'on a small batch (gpipe_tf.pipeline.layer_bytes; builds one of '
      "each, seconds per kind of layer). 'outputs': its FPropMeta outputs (nothing is "
      'built; far under for a Transformer block).', **fv)
  flags.DEFINE_string(
      'synthesize', None, 'Write the schedule synthesized for --model on '
      '--devices (one pipeline, K = D) with --micro_batches within '
      "--memory_budget_mib (0: 1F1B's modelled peak) to this CSV, in "
      "PyTorch's format (schedule.DumpTorch), and draw it to the same path "
      'with .png; print the choice and its unit-time grid.', **fv)
  flags.DEFINE_integer('micro_batches', 0, 'M for --synthesize; 0: 4 x D.',
                       **fv)
  flags.DEFINE_enum('remat', 'never', ['never', 'always', 'except_last'],
                    'The remat policy --synthesize plans for.', **fv)
  flags.DEFINE_bool(
      'synthesize_table', False, 'Print synthesized against library '
      'schedules for 32 Transformer blocks of --table_width ... '
      '--table_micro_batch (bytes traced; times measured on the benchmark '
      'block, scaled by FLOPs at other sizes: tools/plan/block.py) at '
      '--table_devices x --table_micro_batches x --table_budgets; no '
      '--model needed.', **fv)
  default = plan_block.BlockSize()
  flags.DEFINE_integer('table_width', default.width, "The table block's "
                       'model width d (default: the benchmark block).', **fv)
  flags.DEFINE_integer('table_tokens', default.tokens,
                       "The table block's sequence length T.", **fv)
  flags.DEFINE_integer('table_heads', default.heads,
                       "The table block's attention heads h.", **fv)
  flags.DEFINE_integer('table_hidden', 0, "The table block's feed-forward "
                       'hidden width H; 0: 4 x --table_width.', **fv)
  flags.DEFINE_integer('table_micro_batch', default.micro_batch,
                       "Sequences per micro-batch of the table.", **fv)
  flags.DEFINE_list('table_devices', ['4', '8', '16'], 'K of the table.',
                    **fv)
  flags.DEFINE_list('table_micro_batches', ['8', '16', '32', '64'],
                    'M of the table.', **fv)
  flags.DEFINE_list('table_budgets', ['0.5', '1', '1.5'],
                    "Budgets of the table, as fractions of 1F1B's peak.", **fv)
  flags.DEFINE_enum(
      'precision', None, list(_POLICIES),
      "The trainer's --precision: activations in its compute dtype (2 bytes "
      'under the mixed policies), variables and gradients in float32. '
      "Default: float32; with --compare, the rows' dtype (tools.benchmark "
      '--dtype), only rows of it compared.', **fv)


# The trainer's --precision values (layers/precision.POLICIES; a test keeps
# the two the same without importing TensorFlow here).
_POLICIES = ('float32', 'mixed_bfloat16', 'mixed_float16')


def _Kept(model: plan_lib.Model, layers, shapes, activations: str,
          policy: str) -> plan_lib.Model:
  if activations != 'traced':
    return model
  from gpipe_tf.pipeline import layer_bytes  # pylint: disable=g-import-not-at-top
  return plan_lib.WithKeptBytes(
      model, layer_bytes.KeptBytes(layers, shapes, policy=policy))


def _ActivationBytes(policy: str, value_bytes: int) -> int:
  """Bytes of an activation value under `policy`: 2 under a 16-bit one."""
  return value_bytes if policy == 'float32' else 2


def ExperimentModel(experiment_params, activations: str = 'traced',
                    policy: str = 'float32'
                    ) -> tuple[plan_lib.Model, int, int]:
  """An experiment's model costs, its own K and its training batch.

  Bytes per parameter: weight and optimizer slots in the model's dtype
  (model_stats.BytesPerParam), and one more value for the gradient;
  `activations` as --activations, `policy` as --precision.
  """
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from tools.plan import model_stats  # pylint: disable=g-import-not-at-top
  layers, shapes = model_stats.LayersAndShapes(experiment_params)
  dtype = layers[0].dtype
  value = model_stats.DtypeBytes(dtype)
  model = _Kept(plan_lib.ModelOf(
      layers, shapes, model_stats.BytesPerParam(experiment_params.task, dtype),
      value, _ActivationBytes(policy, value)), layers, shapes, activations,
                policy)
  return (model, PipeliningLayer.NumDevicesOf(experiment_params.task.model),
          int(experiment_params.train.batch_size))


def _RowsPolicy(measured: dict, policy: str | None) -> str:
  """The precision policy --compare plans for: --precision, else the one
  dtype of the benchmark's rows.

  Raises:
    plan_lib.PlanError: rows of several dtypes and no --precision.
  """
  if policy:
    return policy
  dtypes = sorted({r.get('dtype', 'float32') for r in measured['rows']})
  if len(dtypes) > 1:
    raise plan_lib.PlanError(
        f'the rows were timed under several precision policies {dtypes}: '
        'pass --precision=<one of them> to compare its rows.')
  return dtypes[0] if dtypes else 'float32'


def BenchmarkModel(measured: dict, activations: str = 'traced',
                   policy: str | None = None
                   ) -> tuple[plan_lib.Model, int, int]:
  """The model a tools.benchmark --json file timed, its D and its batch
  (`activations` as --activations, `policy` as --precision: default, the
  rows' dtype).

  Raises:
    plan_lib.PlanError: rows of several dtypes and no `policy`.
  """
  from tools.benchmark import lib as benchmark_lib  # pylint: disable=g-import-not-at-top
  fields = {f.name for f in dataclasses.fields(benchmark_lib.ModelSpec)}
  spec = benchmark_lib.ModelSpec(**{k: v for k, v in measured.items()
                                    if k in fields})
  policy = _RowsPolicy(measured, policy)
  layers, shapes = benchmark_lib.LayersOf(spec)
  # The benchmark's SGD keeps no slots: 4 bytes of weight, 4 of gradient.
  model = plan_lib.ModelOf(layers, shapes, bytes_per_param=4,
                           activation_bytes=_ActivationBytes(policy, 4))
  return (_Kept(model, layers, shapes, activations, policy),
          measured['num_devices'], spec.batch_size)


def Run(fv: flags.FlagValues) -> str:
  """The tool's output for parsed flags (see DefineFlags).

  Raises:
    model_registry.ModelNotFoundError, AttributeError,
    hyperparams.ParamsParseError (bad override), partition.PartitionError,
    model_stats.ModelStatsError, plan_lib.PlanError; with --compare,
    OSError and json.JSONDecodeError.
  """
  if fv.synthesize_table:
    block = plan_block.TransformerBlock(plan_block.BlockSize(
        fv.table_width, fv.table_tokens, fv.table_heads,
        fv.table_hidden or 4 * fv.table_width, fv.table_micro_batch))
    rows = plan_synthesize.Table(
        block.cost, 32, block.comm_time, [int(k) for k in fv.table_devices],
        [int(m) for m in fv.table_micro_batches],
        [float(b) for b in fv.table_budgets])
    return '\n'.join([block.Describe(), '', plan_synthesize.FormatTable(rows),
                      ''] + plan_synthesize.Targets(rows))
  measured = None
  if fv.compare:
    with open(fv.compare) as f:
      measured = json.load(f)
    policy = _RowsPolicy(measured, fv.precision)
    model, own_k, own_n = BenchmarkModel(measured, fv.activations, policy)
    name = (f"tools.benchmark's {measured['num_blocks']} x "
            f"{measured['block']} blocks of width {measured['dim']}")
  elif fv.model:
    from gpipe_tf import base_experiment  # pylint: disable=g-import-not-at-top
    from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
    params = model_registry.GetParams(fv.model)
    if fv.model_params_override:
      base_experiment.ApplyOverrides(params, fv.model_params_override)
    policy = fv.precision or 'float32'
    model, own_k, own_n = ExperimentModel(params, fv.activations, policy)
    name = fv.model
  else:
    raise plan_lib.PlanError('--model (or --compare) is required.')
  d, n = fv.devices or own_k, fv.batch_size or own_n
  budget = fv.memory_budget_mib * plan_lib.MIB or None
  if fv.synthesize:
    return _Synthesize(fv, model, d, n, budget, name)
  plans = plan_lib.Rank(model, d, n, budget, fv.flops_per_second,
                        schedules=fv.schedules or None,
                        max_micro_batches=fv.max_micro_batches)
  reason = plan_lib.Reason(plans, budget)
  untraced = ([i for i, c in enumerate(model.layers) if c.kept_bytes is None]
              if fv.activations == 'traced' else [])
  if fv.json:
    return json.dumps(dict(
        model=name, devices=d, batch_size=n,
        memory_budget_mib=fv.memory_budget_mib or None, reason=reason,
        activations=fv.activations, precision=policy,
        untraced_layers=untraced,
        plans=[p.AsDict() for p in plans if p.fits][:fv.top or None]))
  limit = f'{fv.memory_budget_mib:g} MiB' if budget else 'none'
  text = (f'{name}: D={d} devices, batch {n}, memory budget {limit} per '
          f'device, precision {policy}; {len(plans)} layouts estimated\n\n'
          f'{plan_lib.FormatTable(plans, fv.top)}\n\n{reason}')
  if untraced:
    shown = ', '.join(map(str, untraced[:10])) + (
        ', ...' if len(untraced) > 10 else '')
    text += (f'\n\n--activations=traced: layers {shown} ({len(untraced)} of '
             f'{len(model.layers)}) keep the estimate from their outputs: the '
             'trace could not build them on float inputs of their shapes '
             '(gpipe_tf.pipeline.layer_bytes).')
  if measured is not None:
    rows = [r for r in measured['rows']
            if r.get('dtype', 'float32') == policy]
    if not rows:
      raise plan_lib.PlanError(f'no row of {fv.compare} was timed under '
                               f'--precision={policy}.')
    table = plan_check.Compare(model, rows, measured['batch_size'])
    mode = measured.get('devices', 'shared')
    what = ('one worker process per device' if mode == 'processes' else
            'one process, logical devices sharing one thread pool')
    text += (f'\n\nThe estimates beside the measured rows of '
             f'{fv.compare} (--devices={mode}: {what}):\n\n{table}')
  return text


def _Synthesize(fv: flags.FlagValues, model: plan_lib.Model, d: int, n: int,
                budget: float | None, name: str) -> str:
  """--synthesize: choose, write the CSV and the PNG, report."""
  from gpipe_tf.pipeline import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline.schedule import layout  # pylint: disable=g-import-not-at-top
  m = fv.micro_batches or 4 * d
  layers = plan_synthesize.LayerCosts(model, -(-n // m), fv.flops_per_second)
  if budget is None:
    budget = layout.OneFOneBPeak(layers, d, m, remat=fv.remat)
  try:
    choice = layout.Choose(layers, d, m, budget, remat=fv.remat)
  except schedule_lib.MemoryBudgetError as e:
    raise plan_lib.PlanError(str(e)) from e
  schedule_lib.DumpTorch(choice.schedule, fv.synthesize)
  png = fv.synthesize.removesuffix('.csv') + '.png'
  plan_synthesize.Draw(choice, png)
  return (f'{name}: K={d} devices, M={m} micro-batches of {-(-n // m)}, '
          f'remat {fv.remat}; wrote {fv.synthesize} (PyTorch schedule CSV) '
          f'and {png}.\n\n{plan_synthesize.Report(choice, budget)}')


def main(argv: Sequence[str],
         flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Prints the plan; exits with status 1 and one line on bad input."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  from tools.plan import model_stats  # pylint: disable=g-import-not-at-top
  model_stats.PrintOrExit('plan', lambda: Run(flag_values), (
      plan_lib.PlanError, OSError, json.JSONDecodeError))

