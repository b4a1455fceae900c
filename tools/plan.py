"""Recommends K, R, M, schedule, V and remat for a registered model on D devices within a memory budget.

Reads the experiment's layer Params and input shapes as tools/model_stats.py
does (FPropMeta: nothing is built), estimates every layout with the schedule
simulator (tools/plan_lib.py says how), drops those over the budget and
prints the fastest as a table, with the reason for the winner::

  python -m tools.plan --model=lm.synthetic.TransformerL_103 --devices=8 \\
      --memory_budget_mib=16384
  python -m tools.plan --model=synthetic.mlp.Tiny --devices=2 --json

Bytes per parameter: weight + optimizer slots in the model's dtype (Adam 4 +
8 in float32; tools.model_stats.BytesPerParam) + the gradient (4). The batch
is the experiment's training batch unless --batch_size says otherwise.

--compare=ROWS.json (a ``python -m tools.benchmark --json`` output) instead
prints the planner's estimates beside those measured rows, for the model the
benchmark timed (docs/planning.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Sequence

from absl import app
from absl import flags

from tools import plan_lib

_MODEL = flags.DEFINE_string('model', None, 'Registered experiment, e.g. '
                             'lm.synthetic.TransformerL_103.')
_OVERRIDE = flags.DEFINE_string(
    'model_params_override', '', "Overrides in ToText format ('path : value', "
    "separated by newlines or ';'), as for the trainer.")
_DEVICES = flags.DEFINE_integer(
    'devices', 0, "D devices to plan for; 0: the model's own K.")
_BUDGET = flags.DEFINE_float(
    'memory_budget_mib', 0, 'Memory per device, MiB; 0: no limit.')
_BATCH = flags.DEFINE_integer(
    'batch_size', 0, "Global batch N; 0: the experiment's training batch.")
_SCHEDULES = flags.DEFINE_list(
    'schedules', [], 'Schedules to consider; empty: every registered one.')
_MAX_MICRO = flags.DEFINE_integer('max_micro_batches', 64, 'Largest M.')
_FLOPS = flags.DEFINE_float(
    'flops_per_second', 1e12, "A device's speed; scales the estimated "
    'examples/sec, not the ranking.')
_TOP = flags.DEFINE_integer('top', 10, 'Plans to print; 0: all.')
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON object.')
_COMPARE = flags.DEFINE_string(
    'compare', None, 'A tools.benchmark --json file: print the estimates '
    'beside its measured rows instead of planning.')


def Plan(experiment_params, num_devices: int, batch_size: int,
         budget_mib: float, schedules: Sequence[str] = (),
         max_micro_batches: int = 64, flops_per_second: float = 1e12
         ) -> tuple[list[plan_lib.Plan], int, int]:
  """Every layout of an experiment's model, ranked (plan_lib.Rank).

  ``num_devices`` and ``batch_size`` of 0 take the model's own K and the
  experiment's training batch. Returns (plans, D, N).
  """
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from tools import model_stats  # pylint: disable=g-import-not-at-top
  layers, shapes = model_stats.LayersAndShapes(experiment_params)
  dtype = layers[0].dtype
  model = plan_lib.ModelOf(
      layers, shapes, model_stats.BytesPerParam(experiment_params.task, dtype),
      model_stats.DtypeBytes(dtype))
  d = num_devices or PipeliningLayer.NumDevicesOf(
      experiment_params.task.model)
  n = batch_size or int(experiment_params.train.batch_size)
  plans = plan_lib.Rank(model, d, n, budget_mib * plan_lib.MIB or None,
                        flops_per_second, schedules=list(schedules) or None,
                        max_micro_batches=max_micro_batches)
  return plans, d, n


def _Run() -> str:
  if _COMPARE.value:
    return _Compare(_COMPARE.value)
  from gpipe_tf import base_experiment  # pylint: disable=g-import-not-at-top
  from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
  if not _MODEL.value:
    raise plan_lib.PlanError('--model (or --compare) is required.')
  params = model_registry.GetParams(_MODEL.value)
  if _OVERRIDE.value:
    base_experiment.ApplyOverrides(params, _OVERRIDE.value)
  plans, d, n = Plan(params, _DEVICES.value, _BATCH.value, _BUDGET.value,
                     _SCHEDULES.value, _MAX_MICRO.value, _FLOPS.value)
  budget = _BUDGET.value * plan_lib.MIB or None
  reason = plan_lib.Reason(plans, budget)
  if _JSON.value:
    return json.dumps(dict(
        model=_MODEL.value, devices=d, batch_size=n,
        memory_budget_mib=_BUDGET.value or None, reason=reason,
        plans=[p.AsDict() for p in plans if p.fits][:_TOP.value or None]))
  return (f'{_MODEL.value}: D={d} devices, batch {n}, memory budget '
          f"{f'{_BUDGET.value:.0f} MiB' if budget else 'none'} per device; "
          f'{len(plans)} layouts estimated\n\n'
          f'{plan_lib.FormatTable(plans, _TOP.value)}\n\n{reason}')


def _Compare(path: str) -> str:
  """The estimates beside the measured rows of a benchmark JSON file."""
  from tools import benchmark_lib  # pylint: disable=g-import-not-at-top
  with open(path) as f:
    measured = json.load(f)
  fields = {f.name for f in dataclasses.fields(benchmark_lib.ModelSpec)}
  spec = benchmark_lib.ModelSpec(**{k: v for k, v in measured.items()
                                    if k in fields})
  layers, shapes = benchmark_lib.LayersOf(spec)
  # The benchmark's SGD keeps no slots: 4 bytes of weight, 4 of gradient.
  model = plan_lib.ModelOf(layers, shapes, bytes_per_param=4)
  return (f'{spec.num_blocks} x {spec.block} blocks, dim {spec.dim}, batch '
          f'{spec.batch_size}: planner estimates beside {path}\n\n'
          f'{plan_lib.Compare(model, measured["rows"], spec.batch_size)}')


def main(argv: Sequence[str]) -> None:
  """Prints the plan; exits with status 1 and one line on bad input."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  from gpipe_tf import hyperparams  # pylint: disable=g-import-not-at-top
  from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import partition  # pylint: disable=g-import-not-at-top
  from tools import model_stats  # pylint: disable=g-import-not-at-top
  try:
    print(_Run())
  except (model_registry.ModelNotFoundError, AttributeError,
          hyperparams.ParamsParseError, partition.PartitionError,
          model_stats.ModelStatsError, plan_lib.PlanError) as e:
    sys.exit('plan: error: ' + ' '.join(str(e).split()))


if __name__ == '__main__':
  app.run(main)
