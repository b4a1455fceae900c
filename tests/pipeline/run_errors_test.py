"""An op that fails as a pipelined step runs says where: its action, tick and device (run_errors.py)."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

from absl.testing import parameterized  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import run_errors
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import ticks

F = action_lib.F


def _Pipe(schedule='1f1b', execution='unrolled', m=4, **kw):
  """3 stages on 3 devices: FC, NoNaN, FC (4 -> 4 -> 3)."""
  fc = core.FCLayer.Params
  return PipeliningLayer.Params().Set(
      name='net', layers=[fc().Set(name='a', input_dim=4, output_dim=4),
                          test_utils.NoNaN.Params().Set(name='check'),
                          fc().Set(name='b', input_dim=4, output_dim=3)],
      num_partitions=3, num_micro_batches=m, schedule=schedule,
      balance=[1, 1, 1], remat='never', execution=execution,
      **kw).Instantiate()


def _Step(pipe, m=4, nan_in=None, named=True):
  """The tf.function of a training step over 2 examples a micro-batch, a
  NaN in micro-batch `nan_in`'s first example. TensorFlow's error names the
  failing op's function only when the step's is not `named` (a lambda's
  name its message parser does not read; run_errors' docstring)."""
  x = tf.ones([2 * m, 4])
  if nan_in is not None:
    x = tf.tensor_scatter_nd_update(x, [[2 * nan_in, 0]], [float('nan')])

  def train_step():
    return pipe.ComputeLossAndGradients(
        x, tf.zeros([2 * m], tf.int32), lambda y, labels: loss_lib.LossTerms(
            losses.SoftmaxCrossEntropy(y, labels)))[0]

  return tf.function(train_step if named else lambda: train_step(),
                     autograph=False)


def _Failed(op_name, function=None):
  """An InvalidArgumentError as TensorFlow reports op `op_name` failing
  (inside `function`, a function's name, or the step's own graph)."""
  where = f'{{{{function_node {function}}}}}' if function else ''
  return tf.errors.InvalidArgumentError(
      None, None, f'{{{{function_node __inference_step_9}}}} it failed\n\t '
                  f'[[{where}{{{{node {op_name}}}}}]] [Op:__inference_step_9]')


def _Ops(graph, scope):
  """The names of the ops of `graph`, and of the functions it calls, under
  an action scope named `scope` (introspect.FindActionScope; a switch
  branch's, ``stage1_F``, by ticks.FindScope), with the name of the
  function holding each (None: `graph`)."""
  found = []
  for op in graph.get_operations():
    at = introspect.FindActionScope(op.name)
    if (at is not None and at.name == scope or
        f'/{scope}/' in f'/{op.name}' and ticks.FindScope(op.name)):
      found.append((op.name, None))
  for name, function in graph._functions.items():  # pylint: disable=protected-access
    inner = getattr(function, 'graph', None)
    if inner is not None and 'pruned' not in name:
      found += [(op, op_in or name) for op, op_in in _Ops(inner, scope)]
  return found


class PieceErrorTest(tf.test.TestCase, parameterized.TestCase):
  """A layer's op fails in a piece's function, which TensorFlow names but
  not the call: the stage and kind are known, the micro-batch is one of the
  actions running that piece."""

  @parameterized.parameters(
      # F(1, m) at tick m + 1 (gpipe), in 1F1B's warm-up then steady state.
      ('gpipe', 'unrolled', 'at tick 1, 2, 3 or 4 on device 1',
       'dev 1: ..  !F0 !F1 !F2 !F3 ..  BW3 BW2 BW1 BW0 ..'),
      ('1f1b', 'unrolled', 'at tick 1, 2, 4 or 6 on device 1',
       'dev 1: ..  !F0 !F1 BW0 !F2 BW1 !F3 BW2 BW3 ..'),
      ('1f1b', 'switch', 'at tick 1, 2, 4 or 6 on device 1',
       'dev 1: ..  !F0 !F1 BW0 !F2 BW1 !F3 BW2 BW3 ..'),
      ('1f1b', 'folded', 'at tick 1, 2, 4 or 6 on device 1',
       'dev 1: ..  !F0 !F1 BW0 !F2 BW1 !F3 BW2 BW3 ..'),
      # The piece's function found by its name, not by the op's.
      ('1f1b', 'unrolled', 'at tick 1, 2, 4 or 6 on device 1',
       'dev 1: ..  !F0 !F1 BW0 !F2 BW1 !F3 BW2 BW3 ..', False))
  def testNamesTheStageKindAndEveryActionItMayBe(self, schedule, execution,
                                                 ticks_said, row, named=True):
    pipe = _Pipe(schedule, execution)
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      with run_errors.Explaining(pipe):
        _Step(pipe, nan_in=2, named=named)()
    e = raised.exception
    self.assertEqual('{{function_node __inference_pruned' in str(e),
                     not named)
    self.assertIsInstance(e.__cause__, tf.errors.InvalidArgumentError)
    self.assertIn('a NaN : Tensor had NaN values', str(e))
    self.assertEqual(sorted(e.where.actions),
                     [action_lib.Action(F, 1, m) for m in range(4)])
    self.assertIn('InvalidArgumentError in one of 4 actions, F of stage 1 on '
                  f'micro-batch 0, 1, 2 or 3 {ticks_said}', str(e))
    self.assertIn('\n' + row + '\n', str(e))

  def testACancelledPieceCalledWholeSaysHowToSeeItsError(self):
    """With pieces called whole, TensorFlow (2.21) reports an op failing
    inside one, at random, as its own error or as the cancellation of what
    waited for the call (a receipt named under the call: its error only in
    the log). Such a cancellation, explained, names the action and says to
    set whole_piece_min_flops=None; the same without pieces called whole
    says nothing of it."""
    cancelled = tf.errors.CancelledError(
        None, None, 'Graph execution error:\n\nRecvAsync is cancelled.\n\t '
        '[[{{node stage1_F_mb2/StatefulPartitionedCall/_24}}]] '
        '[Op:__inference_train_step_9]')
    said = {}
    for min_flops in (0, None):
      pipe = _Pipe(whole_piece_min_flops=min_flops)
      _Step(pipe).get_concrete_function()
      e = run_errors.Explain(cancelled, pipe, training=True)
      self.assertIsInstance(e, tf.errors.CancelledError)
      self.assertEqual(e.where.action, action_lib.Action(F, 1, 2))
      self.assertIn('CancelledError in F of stage 1 on micro-batch 2', str(e))
      said[min_flops] = 'Set whole_piece_min_flops=None' in str(e)
    self.assertEqual(said, {0: True, None: False})

  def testAnEvaluationStepsErrorIsReadAgainstItsOwnStep(self):
    # The layer's op is named without its function (a named step), and a
    # training step, built after the evaluation one, runs it too: told the
    # step was not training, Explain reads the evaluation's forward program
    # (F(1, m) at tick m + 1), not the training step's (ticks 1, 2, 4, 6).
    pipe = _Pipe()
    x = tf.tensor_scatter_nd_update(tf.ones([8, 4]), [[4, 0]],
                                    [float('nan')])

    def eval_step():
      return pipe.FProp(x, training=False)

    evaluate = tf.function(eval_step, autograph=False)
    evaluate.get_concrete_function()
    _Step(pipe).get_concrete_function()
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      with run_errors.Explaining(pipe, training=False):
        evaluate()
    self.assertIn('one of 4 actions, F of stage 1 on micro-batch 0, 1, 2 or 3 '
                  'at tick 1, 2, 3 or 4 on device 1', str(raised.exception))

  def testAnErrorOfNoStepGoesOnAsItIs(self):
    pipe = _Pipe()
    _Step(pipe).get_concrete_function()
    self.assertIsNone(run_errors.Explain(_Failed('truediv'), pipe))
    error = _Failed('truediv')
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      with run_errors.Explaining(pipe):
        raise error
    self.assertIs(raised.exception, error)


class _BadGradient(base_layer.BaseLayer):
  """Passes its input on; its gradient raises while it is traced."""

  def FProp(self, x, training=False):

    @tf.custom_gradient
    def _Identity(v):
      def _Gradient(dy):
        raise ValueError('no gradient here')
      return tf.identity(v), _Gradient

    return _Identity(x)

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(0, (tuple(shape),), 0)


class BuildErrorTest(tf.test.TestCase):

  def testABackwardTracedAfterItsForwardNamesItsStage(self):
    # A training program's backward is traced after every forward (last
    # stage first): an error there still names the stage it is built for.
    fc = core.FCLayer.Params
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=[fc().Set(name='a', input_dim=4, output_dim=4),
                            _BadGradient.Params().Set(name='bad'),
                            fc().Set(name='b', input_dim=4, output_dim=3)],
        num_partitions=3, num_micro_batches=2,
        balance=[1, 1, 1]).Instantiate()
    step = tf.function(lambda: pipe.ComputeLossAndGradients(
        tf.ones([4, 4]), tf.zeros([4], tf.int32),
        lambda y, labels: loss_lib.LossTerms(
            losses.SoftmaxCrossEntropy(y, labels)))[0])
    with self.assertRaisesRegex(Exception, 'ValueError in .* of stage 1 on '
                                '(.|\n)*no gradient here'):
      step.get_concrete_function()


class EngineOpErrorTest(tf.test.TestCase):
  """An op the engine builds (a slot's read or write, a receipt) names its
  step by its name scope, inside a loop's body too. TensorFlow's message is
  made here, as it reports such an op, from the op names of a built step."""

  def testAnOpBuiltAtItsTickNamesItsMicroBatch(self):
    pipe = _Pipe()
    graph = _Step(pipe).get_concrete_function().graph
    name, _ = _Ops(graph, 'stage1_F_mb2')[0]
    where = run_errors.Explain(_Failed(name), pipe).where
    self.assertEqual(where.actions, (action_lib.Action(F, 1, 2),))
    self.assertIn('F of stage 1 on micro-batch 2 at tick 4 on device 1:\n'
                  'dev 1: ..  F0  F1  BW0 !F2 BW1', str(where))

  def testAReceiptNamesTheActionsThatMadeWhatItTakesIn(self):
    # dev 0: F0  F1  F2  ..  BW0 F3  BW1 ..  BW2 BW3
    # dev 1: ..  F0  F1  BW0 F2  BW1 F3  BW2 BW3 ..
    # dev 2: ..  ..  FB0 FB1 ..  FB2 ..  FB3 ..  ..
    pipe = _Pipe()
    graph = _Step(pipe).get_concrete_function().graph

    def _Explained(t):
      name = next(op.name for op in graph.get_operations()
                  if op.name.startswith(f'stage1_RECV_t{t}/'))
      return str(run_errors.Explain(_Failed(name), pipe))

    # At tick 4 stage 1 takes in the gradient FB(2, 1) made at tick 3.
    self.assertIn('InvalidArgumentError in stage 1 taking in what was made by '
                  'FB of stage 2 on micro-batch 1 at tick 3 on device 2:\n'
                  'dev 2: ..   ..   FB0  !FB1 ..', _Explained(4))
    # At tick 3, F(0, 2)'s output and FB(2, 0)'s gradient: which of the
    # two the op took in, its name does not say.
    self.assertIn('InvalidArgumentError in stage 1 taking in what was made by '
                  'one of 2 actions, F of stage 0 on micro-batch 2 at tick 2 '
                  'on device 0; or FB of stage 2 on micro-batch 0 at tick 2 '
                  'on device 2', _Explained(3))

  def testAnOpInALoopsBodyNamesTheActionsOfItsIterations(self):
    m = 8
    pipe = _Pipe('1f1b', 'folded', m)
    graph = _Step(pipe, m).get_concrete_function().graph
    program = pipe.cells[0].compiled[0].ticks[0]
    plan = pipe.cells[0].compiled[0].plans[0]
    loop, = [s for s in plan if s.kind == periods.REPEAT]
    # Stage 1's F in the loop's body: the column of its first iteration.
    column = next(t for t in range(loop.start, loop.start + loop.period)
                  if program.grid[1][t].kind == F)
    name, function = _Ops(graph, f'stage1_F_t{column}')[0]
    self.assertIsNotNone(function)  # The loop's body.
    where = run_errors.Explain(_Failed(name, function), pipe).where
    self.assertEqual(
        where.actions, tuple(program.grid[1][column + i * loop.period]
                             for i in range(loop.repeats)))
    self.assertGreater(len(where.actions), 1)
    self.assertIn(f'one of {loop.repeats} actions, F of stage 1', str(where))

  def testAnOpInASwitchBranchNamesEveryActionOfItsStageAndKind(self):
    pipe = _Pipe('1f1b', 'switch')
    graph = _Step(pipe).get_concrete_function().graph
    name, function = _Ops(graph, 'stage1_F')[0]
    self.assertIsNotNone(function)  # A branch of the loop's switch.
    where = run_errors.Explain(_Failed(name, function), pipe).where
    self.assertEqual(sorted(where.actions),
                     [action_lib.Action(F, 1, m) for m in range(4)])


if __name__ == '__main__':
  tf.test.main()
