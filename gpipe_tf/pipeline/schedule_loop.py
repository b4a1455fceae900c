"""Any schedule as one tf.while_loop over clock ticks (``micro_batch_loop``).

loop.FillDrainLoop runs GPipe as two loops, all forwards then all backwards.
1F1B, interleaved 1F1B and zero-bubble schedules mix forwards and backwards
on a device, so they run as one loop, with the loss inside the pipeline:

  * Ticks (schedule/ticks.py, pure Python) give every action a tick after
    the action before it on its device and after the actions it reads from.
    A table per device says what it runs at tick t: nothing, or F or the
    backward of one of its stages on micro-batch m, picked by a
    ``tf.switch_case`` on the device.
  * Stage s's last forward output and last input gradient are loop variables
    on its device. In the tick after it made one, the neighbour takes it in
    (a ``tf.cond`` from a table) and keeps it in a TensorArray on its own
    device, one slot per micro-batch: the forward input there is what F
    reads and what the backward recomputes from; the output gradient is
    what the backward reads. Only boundary tensors cross devices.
  * The last stage computes the loss of micro-batch m and d(loss)/d(outputs)
    right after its F. Where its backward directly follows that F on the
    device (every micro-batch of 1F1B's last stage; ticks.Fusable), F, loss
    and backward run as one action, from the activations just made (remat
    'always' keeps those too). Every other backward recomputes its forward
    and adds the weight gradients to running sums the loop carries. A B runs
    the whole backward and W nothing (as with ``trace_once``): the order is
    the schedule's, but zero-bubble's W do not fill its bubble.

BatchNorm statistics and loss sums add up in the loop, and dropout seeds are
FoldIn(step seed, m) as in the unrolled engine, so the results equal it
(tests/pipeline/schedule_loop_test.py). The step's graph does not grow with
M: the loop body holds one F and one backward per stage.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import loop as loop_lib
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import ticks as ticks_lib


class ScheduleLoop(loop_lib.FillDrainLoop):
  """One training step of any schedule as one loop; see the module.

  Args:
    cells: the S cells, cell s on the device of stage s.
    schedule: a valid schedule of S stages.
    seed: the step seed.
  """

  def __init__(self, cells: Sequence[cell_lib.Cell],
               schedule: schedule_lib.Schedule, seed: tf.Tensor) -> None:
    super().__init__(cells, schedule.num_micro_batches, True, seed)
    self.schedule = schedule
    self.table = ticks_lib.Ticks(schedule, ticks_lib.Fusable(schedule))
    self.ticks = self.table.num_ticks
    self.overlap = schedule.num_devices

  def LossAndGradients(self, structure: Any, flat: Sequence[Any], labels: Any,
                       loss_fn: loss_lib.LossFn, bn_stats: Any) -> tuple:
    """Runs the step.

    Returns:
      (total, grads): the loss.Sums of the mini-batch and
      {variable.ref(): (variable, gradient)} summed over micro-batches.
    """
    inputs = self._SplitInputs(flat)
    self._Trace(structure, flat)
    num_stages = len(self.cells)
    last = num_stages - 1
    with tf.device(self.cells[-1].device):
      label_flat = self.label_flat = tf.nest.flatten(labels)
      label_tas = [loop_lib.TensorArrayOf(
          loop_lib.SpecOf(x, self.batch), self.m).split(x, self.sizes)
                   if loop_lib.HasBatch(x) else x for x in label_flat]
      loss_step, dys0, sums0 = self._LossFunction(labels, label_flat,
                                                  loss_fn)
    functions, accs, dx_present = self._BackwardFunctions(
        [g is not None for g in dys0], False)
    fused = self._ForwardBackwardFunction(loss_step)

    # Per stage: forward inputs by micro-batch (stage 0 reads the split
    # inputs), output gradients by micro-batch, and the carries.
    inbox_x, inbox_dy, carry_y, carry_dx = [], [], [], []
    for s, cell in enumerate(self.cells):
      out_specs = (self.out_specs if s == last else self.in_specs[s + 1])
      present = ([g is not None for g in dys0] if s == last
                 else dx_present[s + 1])
      with tf.device(cell.device):
        inbox_x.append(None if s == 0 else [
            None if spec is None else loop_lib.TensorArrayOf(spec, self.m)
            for spec in self.in_specs[s]])
        slots = [loop_lib.TensorArrayOf(spec, self.m) if p else None
                 for spec, p in zip(out_specs, present)]
        if s == last:   # written by the loss step, not taken in
          dys, slots = slots, None
        inbox_dy.append(slots)
        carry_y.append(None if s == last else [
            None if spec is None else loop_lib.Filler(spec)
            for spec in self.in_specs[s + 1]])
        carry_dx.append(None if s == 0 else [
            loop_lib.Filler(spec) if p else None
            for spec, p in zip(self.in_specs[s], dx_present[s])])

    stages = [self.schedule.StagesOn(d)
              for d in range(self.schedule.num_devices)]
    branch, micro = self.table.Branches(stages)
    got_y, got_dx = self.table.Receipts(num_stages)

    def _Receive(s, t, inbox_x, inbox_dy, carry_y, carry_dx):
      """Stage s takes in what its neighbours made at tick t-1."""
      new_x, new_dy = inbox_x[s], inbox_dy[s]
      if s > 0:
        m = tf.gather(got_y[s], t)
        new_x = loop_lib.Select(
            m >= 0, lambda: [None if ta is None else ta.write(m, y)
                             for ta, y in zip(inbox_x[s], carry_y[s - 1])],
            inbox_x[s])
      if s < last:
        m = tf.gather(got_dx[s], t)
        new_dy = loop_lib.Select(
            m >= 0, lambda: [None if ta is None else ta.write(m, g)
                             for ta, g in zip(inbox_dy[s], carry_dx[s + 1])],
            inbox_dy[s])
      return new_x, new_dy

    def _Inputs(s, m, inbox_x):
      source = inputs if s == 0 else inbox_x[s]
      return [ta.read(m) if isinstance(ta, tf.TensorArray) else ta
              for ta in source]

    def _Forward(s, m, inbox_x, state):
      """F(s, m): state is this stage's (carry_y, carry_dx, acc, bn,
      dy slots of the last stage, loss sums of the last stage)."""
      y_s, dx_s, acc, bn, dys, total = state
      function, _ = self.cells[s].ForwardFunction(
          self.in_structs[s], True, inline=True)
      flat_y, sums = function(random_seeds.FoldIn(self.seeds[s], m),
                              *_Inputs(s, m, inbox_x))
      bn = [[a + b for a, b in zip(acc_s, new)]
            for acc_s, new in zip(bn, sums)]
      if s < last:
        return list(flat_y), dx_s, acc, bn, dys, total
      label_m = [ta.read(m) if isinstance(ta, tf.TensorArray) else ta
                 for ta in label_tas]
      dys_m, sums_m = loss_step(list(flat_y), label_m)
      dys = [None if ta is None else ta.write(m, g)
             for ta, g in zip(dys, dys_m)]
      total = tf.nest.map_structure(tf.add, total, sums_m)
      return y_s, dx_s, acc, bn, dys, total

    def _Backward(s, m, inbox_x, inbox_dy, state):
      """The backward of (s, m), recomputing F(s, m)."""
      y_s, dx_s, acc, bn, dys, total = state
      function, _ = functions[s]
      source = dys if s == last else inbox_dy[s]
      dy = [None if ta is None else ta.read(m) for ta in source]
      dx, acc = self.RunBackward(s, function, m, _Inputs(s, m, inbox_x), dy,
                                 acc)
      if s > 0:
        dx_s = dx
      return y_s, dx_s, acc, bn, dys, total

    def _ForwardBackward(s, m, inbox_x, state):
      """F(s, m), its loss and its backward as one action (s is last)."""
      y_s, dx_s, acc, bn, dys, total = state
      label_m = [ta.read(m) if isinstance(ta, tf.TensorArray) else ta
                 for ta in label_tas]
      dx, dws, sums, sums_m = fused(
          random_seeds.FoldIn(self.seeds[s], m), _Inputs(s, m, inbox_x),
          [label_m], self.running[s].Read(acc))
      acc = self.running[s].Write(acc, dws)
      bn = [[a + b for a, b in zip(acc_s, new)]
            for acc_s, new in zip(bn, sums)]
      total = tf.nest.map_structure(tf.add, total, sums_m)
      if s > 0:
        dx_s = list(dx)
      return y_s, dx_s, acc, bn, dys, total

    def _Body(t, inbox_x, inbox_dy, carry_y, carry_dx, accs, bns, dys,
              total):
      inbox_x, inbox_dy = list(inbox_x), list(inbox_dy)
      for s, cell in enumerate(self.cells):
        with tf.device(cell.device):
          inbox_x[s], inbox_dy[s] = _Receive(s, t, inbox_x, inbox_dy,
                                             carry_y, carry_dx)
      carry_y, carry_dx = list(carry_y), list(carry_dx)
      accs, bns = list(accs), list(bns)
      for d, on_d in enumerate(stages):
        with tf.device(self.cells[on_d[0]].device):
          m = tf.gather(micro[d], t)
          state = [(carry_y[s], carry_dx[s], accs[s], bns[s],
                    dys if s == last else None,
                    total if s == last else None) for s in on_d]
          compact = loop_lib.Compact(state)

          def _Run(j, kind, state=state, compact=compact, on_d=on_d,
                   m=m):
            s = on_d[j]
            new = list(state)
            if kind == 'B':
              new[j] = _Backward(s, m, inbox_x, inbox_dy, state[j])
            elif kind == 'F':
              new[j] = _Forward(s, m, inbox_x, state[j])
            else:
              new[j] = _ForwardBackward(s, m, inbox_x, state[j])
            return compact.Values(new)

          # Branch ids as ticks.TickTable.Branches numbers them.
          branches = [compact.Values]
          for j in range(len(on_d)):
            branches.append(lambda j=j, run=_Run: run(j, 'F'))
            branches.append(lambda j=j, run=_Run: run(j, 'B'))
          if last in on_d and self.table.fused:
            branches.append(
                lambda j=on_d.index(last), run=_Run: run(j, 'FB'))
          new = compact.Pack(tf.switch_case(tf.gather(branch[d], t),
                                            branches))
          for s, (y_s, dx_s, acc, bn, dys_s, total_s) in zip(on_d, new):
            carry_y[s], carry_dx[s], accs[s], bns[s] = y_s, dx_s, acc, bn
            if s == last:
              dys, total = dys_s, total_s
      return inbox_x, inbox_dy, carry_y, carry_dx, accs, bns, dys, total

    state = (inbox_x, inbox_dy, carry_y, carry_dx, accs, self.bn_zeros,
             dys, sums0)
    *_, accs, bns, _, total = loop_lib.RunTicks(self.ticks, _Body, state,
                                                self.overlap)
    for s, cell in enumerate(self.cells):
      _, holder = cell.ForwardFunction(self.in_structs[s], True, inline=True)
      for layer, stats in zip(holder.get('bn', []), bns[s]):
        bn_stats.Add(layer, *stats)
    return total, self._Gradients(functions, accs)

  def _ForwardBackwardFunction(self, loss_step: Any) -> Any:
    """The last stage's forward, loss and backward as one function
    (Cell.ForwardBackwardFunction), for the ticks that fuse them; None when
    none do. Its weight gradients are summed in the backward's order."""
    if not self.table.fused:
      return None
    last = len(self.cells) - 1
    cell = self.cells[last]
    wanted, variables = self.backward_args[last]
    zeros = self.running[last].zeros
    function, holder = cell.ForwardBackwardFunction(
        self.in_structs[last], True, wanted, [z is not None for z in zeros],
        loss_step, inline=True)
    seed_spec = tf.TensorSpec(self.seed.shape, self.seed.dtype)
    with tf.device(cell.device):
      function.get_concrete_function(
          seed_spec, list(self.in_specs[last]),
          [[loop_lib.SpecOf(x, self.batch) for x in self.label_flat]],
          [None if z is None else tf.TensorSpec(z.shape, z.dtype)
           for z in zeros])
    if [v.ref() for v in holder['variables']] != [v.ref() for v in variables]:
      raise ValueError(
          f'cell {last} reads other variables in its forward '
          f'({[v.name for v in holder["variables"]]}) than in its '
          f'rematerialised backward ({[v.name for v in variables]}); '
          'please report this with the model.')
    return function
