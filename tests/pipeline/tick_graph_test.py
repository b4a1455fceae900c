"""A built step waits for what its schedule says and nothing else (tick_graph.py)."""

import re

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

# A step's name scope, as tick_graph names a step built at its tick.
_SCOPE = re.compile(r'(?:^|/)stage(\d+)_([A-Z]+)_mb(\d+)/')
_CALLS = ('StatefulPartitionedCall', 'PartitionedCall')


def _StepOf(op):
  found = _SCOPE.search(op.name)
  return found and action_lib.Action(found.group(2), int(found.group(1)),
                                     int(found.group(3)))


def _Waits(graph):
  """({step: the other steps its piece's call waits for}, {step: per data
  input of the call made by an op, the steps that input waits for}), read
  off the graph: the steps whose ops reach the call, or the input, through
  data or control inputs."""
  reach = {}  # op name -> the steps of the op and of every op before it.

  def _Reach(op):
    stack = [op]
    while stack:
      top = stack[-1]
      before = [x.op for x in top.inputs] + list(top.control_inputs)
      pending = [b for b in before if b.name not in reach]
      if pending:
        stack.extend(pending)
        continue
      stack.pop()
      steps = set().union(*(reach[b.name] for b in before))
      mine = _StepOf(top)
      reach[top.name] = steps | ({mine} if mine else set())
    return reach[op.name]

  waits, inputs = {}, {}
  for op in graph.get_operations():
    step = _StepOf(op)
    if step is None or op.type not in _CALLS or '/' in op.name[
        _SCOPE.search(op.name).end():]:
      continue  # Only the piece: a direct child of the step's scope.
    before = [x.op for x in op.inputs] + list(op.control_inputs)
    waits.setdefault(step, set()).update(*(_Reach(x) for x in before))
    waits[step].discard(step)
    # Captured variables and constants are made by no op of the step.
    inputs.setdefault(step, []).extend(
        _Reach(x.op) for x in op.inputs
        if x.op.type not in ('Placeholder', 'Const'))
  return waits, inputs


def _Allowed(schedule):
  """{action: every action it follows in the schedule}: its data
  dependencies and its device's earlier actions, transitively."""
  before = {}
  for acts in schedule.actions:
    for i, act in enumerate(acts):
      before[act] = set(schedule.Dependencies(act)) | set(acts[:i])
  closed = {}

  def _Close(act):
    if act not in closed:
      closed[act] = set()
      for b in before[act]:
        closed[act] |= {b} | _Close(b)
    return closed[act]

  return {act: _Close(act) for act in before}


class TickGraphTest(tf.test.TestCase):

  def testAStepWaitsForItsScheduleAndNothingElse(self):
    # A slot holds every micro-batch in one TensorArray, so reading it waited
    # for every write built before the read: in interleaved 1F1B, stage 2's
    # backward of micro-batch 0 waited for stage 3's backward of micro-batch
    # 1, whose gradient arrives an earlier tick (about 100 ms a step of the
    # processes-mode Transformer, benchmarks/peers). Without remat, every
    # step's inputs come straight from their maker.
    m = 4
    for name, v in (('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2),
                    ('zb_h1', 1), ('zbv', 2)):
      with self.subTest(schedule=name):
        layers = [core.FCLayer.Params().Set(
            name=f'fc{i}', input_dim=8, output_dim=8, activation='TANH')
                  for i in range(8)]
        pipe = PipeliningLayer.Params().Set(
            name='net', layers=layers, num_partitions=2, num_micro_batches=m,
            schedule=name, num_virtual_stages=v, remat='never',
            execution='unrolled').Instantiate()
        step = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
            tf.zeros([8, 8]), tf.zeros([8], tf.int32),
            lambda y, labels: loss_lib.LossTerms(
                losses.SoftmaxCrossEntropy(y, labels)))[2])
        waits, inputs = _Waits(step.get_concrete_function().graph)
        schedule = ticks_lib.FuseLast(ticks_lib.JoinBackward(
            library.Make(name, 2, m, v)))
        allowed = _Allowed(schedule)
        self.assertEqual(set(waits), set(allowed))
        for act, got in sorted(waits.items(), key=lambda kv: str(kv[0])):
          self.assertEqual(got, allowed[act], act)
        # And every tensor the piece takes waits for the device's previous
        # step: a control dependency on the call alone holds back none of
        # its ops once TensorFlow inlines it.
        for acts in schedule.actions:
          for prev, act in zip(acts, acts[1:]):
            for i, got in enumerate(inputs[act]):
              self.assertIn(prev, got, (act, i))


if __name__ == '__main__':
  tf.test.main()
