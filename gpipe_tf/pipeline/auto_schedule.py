"""schedule='auto': a PipeliningLayer's balance, V and schedule chosen from its layers' costs and sizes.

The layers' costs come from the PipeliningLayer's ``cost`` estimator
(cost.LayerCosts: FLOPs, parameters, or a short profiling run of each
layer's forward and backward); a layer's F, B and W are each taken as its
cost (a backward does about twice a forward's work, half for the input
gradient and half for the weight gradients). Its sizes, per micro-batch of
ProfileBatchSize examples (memory.StageBytesOf): its input from FPropMeta;
what its backward keeps and what its B hands its W from a trace of its
training step (activations='traced', layer_bytes.KeptBytes: each distinct
layer built and traced once on a small batch; and layer_bytes.JoinedBytes,
what a stage keeps beyond that when the layer runs after the one before it,
each distinct pair traced once), or its FPropMeta outputs
(activations='outputs', or where the trace cannot build the layer: right
for an FC layer, about 15x under for a Transformer block, whose backward
also keeps its attention probabilities and its 4d-wide hidden layer); 4
bytes of weights and 4 of gradients per parameter (no optimizer slots).
schedule.layout.Choose then weighs the balances, V in (1, 2) and the
schedules on the simulated step within the memory budget, and the choice
is logged.

This module runs nothing of the pipeline: PipeliningLayer runs the schedule
it returns like any other.
"""

from __future__ import annotations

import math
from typing import Sequence

from absl import logging

from gpipe_tf import errors
from gpipe_tf.pipeline import cost as cost_lib
from gpipe_tf.pipeline import layer_bytes
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory

__all__ = ['ACTIVATIONS', 'ActivationsError', 'Choose', 'LayerCosts']

ACTIVATIONS = ('traced', 'outputs')



class ActivationsError(errors.Error, ValueError):
  """An unknown way of sizing the layers' activations."""


_PARAM_BYTES = 4  # float32 weights, and as much again for their gradients.


def _Bytes(shapes: Sequence, value_bytes: int) -> int:
  """Bytes per example of batched shapes (the batch dimension dropped)."""
  return sum(value_bytes * math.prod(int(d or 1) for d in s[1:])
             for s in shapes if len(s))


def LayerCosts(layer_params: Sequence, cost: str, input_shapes: Sequence,
               profile_batch_size: int | None, num_micro_batches: int,
               value_bytes: int = 4, activations: str = 'traced',
               policy: str = 'float32') -> list[layout.LayerCost]:
  """Every layer's layout.LayerCost (see the module docstring).

  Args:
    layer_params: the layers' Params, in order.
    cost: the cost estimator (cost.LayerCosts).
    input_shapes: the first layer's input shapes.
    profile_batch_size, num_micro_batches: as cost.ProfileBatchSize reads
      them: the examples of a micro-batch.
    value_bytes: bytes of an activation value (FPropMeta sizes).
    activations: 'traced' or 'outputs' (module docstring).
    policy: the precision policy the layers are traced in.

  Raises:
    cost.CostEstimateError: the costs cannot be estimated.
    ActivationsError: an unknown `activations`.
  """
  if activations not in ACTIVATIONS:
    raise ActivationsError(
        f"auto_activations must be one of {ACTIVATIONS}, got "
        f"{activations!r}: 'traced' for what the layers keep, 'outputs' to "
        'build nothing.')
  costs = cost_lib.LayerCosts(layer_params, cost, input_shapes,
                              profile_batch_size, num_micro_batches)
  metas = cost_lib.LayerMetas(layer_params, input_shapes)
  batch = cost_lib.ProfileBatchSize(input_shapes, profile_batch_size,
                                    num_micro_batches)
  ins = [_Bytes(input_shapes, value_bytes)] + [
      _Bytes(m.out_shapes, value_bytes) for m in metas[:-1]]
  kept = joined = [None] * len(metas)
  if activations == 'traced':
    kept = layer_bytes.KeptBytes(layer_params, input_shapes, policy=policy)
    joined = layer_bytes.JoinedBytes(layer_params, input_shapes,
                                     policy=policy, kept=kept)
  return [layout.LayerCost(c, c, c, memory.StageBytesOf(
      i, [_Bytes(m.out_shapes, value_bytes)], int(m.num_params), batch,
      _PARAM_BYTES, _PARAM_BYTES,
      kept_bytes=None if k is None else [k[0]],
      wcut_bytes=None if k is None else [k[1]]),
                            memory.StageBytes() if j is None else
                            memory.StageBytes(activations=j[0] * batch,
                                              wcut=j[1] * batch))
          for c, i, m, k, j in zip(costs, ins, metas, kept, joined)]


def Choose(layers: Sequence[layout.LayerCost], num_devices: int,
           num_micro_batches: int, remat: str,
           memory_budget: float | None, path: str) -> layout.Choice:
  """layout.Choose within memory_budget (None: 1F1B's peak), logged.

  Raises:
    schedule.MemoryBudgetError: nothing fits the budget.
  """
  if memory_budget is None:
    memory_budget = layout.OneFOneBPeak(layers, num_devices,
                                        num_micro_batches, remat=remat)
  choice = layout.Choose(layers, num_devices, num_micro_batches,
                         memory_budget, remat=remat)
  best = choice.synthesized.best
  library = choice.synthesized.best_library
  logging.info(
      "PipeliningLayer '%s' schedule='auto': %s, V=%d, balance %s; "
      'predicted step %.4g (best library schedule that fits: %s), peak '
      'bytes per device %s within the budget of %.6g (remat %r; %d layouts '
      'considered)', path, best.source, choice.num_virtual_stages,
      list(choice.balance), best.makespan,
      f'{library.source} {library.makespan:.4g}' if library else 'none',
      [f'{p:.6g}' for p in best.peaks], memory_budget, remat,
      len(choice.considered))
  return choice
