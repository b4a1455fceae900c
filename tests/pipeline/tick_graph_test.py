"""A built step waits for what its schedule says and nothing else (tick_graph.py)."""

from unittest import mock

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import cell_program
from gpipe_tf.pipeline import interpreter
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

_CALLS = ('StatefulPartitionedCall', 'PartitionedCall')


def _StepOf(op):
  found = introspect.FindActionScope(op.name)
  if found is None or found.micro_batch is None:
    return None
  return action_lib.Action(found.kind, found.stage, found.micro_batch)


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
        introspect.FindActionScope(op.name).end:]:
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



class _Strict(base_layer.BaseLayer):
  """Passes its input on, checking it: at trace time it raises `error` when
  its input is not 4 wide; at run time check_numerics fails on a NaN."""

  def FProp(self, x, training=False):
    if x.shape[-1] != 4:
      raise self.p.error(f'{self.p.name} takes 4 features, not {x.shape[-1]}')
    return tf.debugging.check_numerics(x, 'a NaN')

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('error', ValueError, 'Raised at trace.')
    return p

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(0, (tuple(shape),), 0)


def _StrictPipe(width=4, error=ValueError, execution='unrolled'):
  """Stage 0: one FC layer to `width`; stage 1: _Strict, then one to 3."""
  fc = core.FCLayer.Params
  return PipeliningLayer.Params().Set(
      name='net', layers=[fc().Set(name='a', input_dim=4, output_dim=width),
                          _Strict.Params().Set(name='strict', error=error),
                          fc().Set(name='b', input_dim=width, output_dim=3)],
      num_partitions=2, num_micro_batches=4, schedule='1f1b',
      balance=[1, 2], execution=execution).Instantiate()


def _Train(pipe, x=None, function=True, autograph=False):
  x = tf.ones([8, 4]) if x is None else x
  step = lambda: pipe.ComputeLossAndGradients(  # pylint: disable=g-long-lambda
      x, tf.zeros([8], tf.int32), lambda y, labels: loss_lib.LossTerms(
          losses.SoftmaxCrossEntropy(y, labels)))[0]
  return tf.function(step, autograph=autograph)() if function else step()


class StepErrorTest(tf.test.TestCase):
  """An error raised while building or running a step says where: the
  action, its tick and device, and the device's row marked (1F1B, K=2, M=4:
  'dev 1: ..   FB0  FB1  ..   FB2  ..   FB3')."""

  def testALayerErrorNamesItsStageDeviceAndRow(self):
    with self.assertRaises(ticks_lib.StepError) as raised:
      _Train(_StrictPipe(width=5))
    e = raised.exception
    self.assertIsInstance(e.__cause__, ValueError)
    self.assertEqual((e.action.stage, e.device), (1, 1))
    self.assertIn('ValueError in FB of stage 1 on micro-batch 0 at tick 1 on '
                  'device 1', str(e))
    self.assertIn('\ndev 1: ..   !FB0 FB1', str(e))
    self.assertIn('strict takes 4 features, not 5', str(e))
    # Raised through AutoGraph (as a StagingError) it keeps its message.
    with self.assertRaisesRegex(Exception, 'ValueError in FB of stage 1 on '
                                'micro-batch 0 at tick 1 on device 1'):
      _Train(_StrictPipe(width=5), autograph=True)

  def testAProjectErrorKeepsItsTypeAndGetsWhereAsANote(self):
    with self.assertRaises(base_layer.LayerInputError) as raised:
      _Train(_StrictPipe(width=5, error=base_layer.LayerInputError))
    self.assertIn('in FB of stage 1', raised.exception.__notes__[0])

  def testAPruneErrorNamesTheFirstActionOfItsPiece(self):
    prune = cell_program.CellProgram._Prune  # pylint: disable=protected-access

    def _Failing(program, reads, makes):
      if Role.DWS in makes and Role.DY in reads:  # Stage 0's BW.
        raise RuntimeError('cannot prune this one')
      return prune(program, reads, makes)

    with mock.patch.object(cell_program.CellProgram, '_Prune', _Failing):
      with self.assertRaises(ticks_lib.StepError) as raised:
        _Train(_StrictPipe())
    self.assertIsInstance(raised.exception.__cause__, RuntimeError)
    self.assertIn('RuntimeError in BW of stage 0 on micro-batch 0 at tick 2 '
                  'on device 0 (the first of 4 actions it is built for):\n'
                  'dev 0: F0   F1   !BW0', str(raised.exception))

  def testABuildErrorNamesItsStepsMicroBatchAndTick(self):
    step = interpreter._Step  # pylint: disable=protected-access

    def _Failing(c, feeds, st, m, *args):
      if (st.stage, st.kind, m) == (1, ticks_lib.FB, 2):
        raise RuntimeError('cannot build this one')
      return step(c, feeds, st, m, *args)

    for execution, want in (('unrolled', 'FB of stage 1 on micro-batch 2 at '
                             'tick 4 on device 1:\ndev 1: ..   FB0  FB1  ..   '
                             '!FB2'),
                            ('switch', 'FB of stage 1 on micro-batch 0 at '
                             'tick 1 on device 1 (the first of 4')):
      with self.subTest(execution=execution):
        with mock.patch.object(interpreter, '_Step', _Failing):
          with self.assertRaises(ticks_lib.StepError) as raised:
            _Train(_StrictPipe(execution=execution))
        self.assertIn(want, str(raised.exception))
        if execution == 'unrolled':
          self.assertIsInstance(raised.exception.__cause__, RuntimeError)

  def testAnEagerRunErrorNamesItsStepAndKeepsItsType(self):
    # Eagerly a step runs as it is built: a NaN in micro-batch 1 fails
    # stage 1's check_numerics in FB1. TensorFlow's error keeps its type
    # (ticks.Explained), the place in its message and its `where`.
    x = tf.tensor_scatter_nd_update(tf.ones([8, 4]), [[2, 0]], [float('nan')])
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      _Train(_StrictPipe(), x, function=False)
    e = raised.exception
    self.assertIsInstance(e.__cause__, tf.errors.InvalidArgumentError)
    self.assertEqual(e.where.action, action_lib.Action(ticks_lib.FB, 1, 1))
    self.assertIn('InvalidArgumentError in FB of stage 1 on micro-batch 1 at '
                  'tick 2 on device 1:\ndev 1: ..   FB0  !FB1', str(e))


if __name__ == '__main__':
  tf.test.main()
