"""layers/prune.py: a function cut out of a traced graph, as TensorFlow's WrappedFunction.prune cuts it, without its dead copies."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

from unittest import mock  # pylint: disable=g-import-not-at-top

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import prune


def _Wrapped(variable):
  """A traced graph: h = tanh(x @ w), y = 2 h + 1, dy/dw; a control edge
  from the read of w into y, and a placeholder nothing feeds."""
  def _Fn(x, unfed):
    w = variable.read_value()
    h = tf.tanh(tf.matmul(x, w))
    with tf.control_dependencies([w.op]):
      y = h * 2.0 + 1.0
    dw = tf.gradients(y, [w])[0]
    return h, y, dw, unfed * 3.0
  return tf.compat.v1.wrap_function(
      _Fn, [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([], tf.float32)])


class PruneTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.w = tf.Variable(tf.reshape(tf.range(6, dtype=tf.float32), [3, 2]) / 10)
    self.wrapped = _Wrapped(self.w)
    self.x = tf.reshape(tf.range(6, dtype=tf.float32), [2, 3]) / 5
    self.h, self.y, self.dw, self.unfed = self.wrapped.structured_outputs

  def testTheSameFunctionAsTensorFlowsPrune(self):
    x = self.wrapped.inputs[0]
    for feeds, fetches, args in [
        ([x], [self.y, self.dw], [self.x]),
        ([self.h], [self.y], [tf.ones([2, 2])]),
        ([x, self.h], [self.h, self.dw], [self.x, tf.ones([2, 2])]),
    ]:
      mine = prune.Prune(self.wrapped, feeds, fetches)
      theirs = self.wrapped.prune(feeds=feeds, fetches=fetches)
      for a, b in zip(mine(*args), theirs(*args)):
        self.assertAllClose(a, b)
      # A fed tensor is a placeholder; a fetch that is a feed passes through.
      self.assertLen(mine.graph.inputs, len(feeds) + 1)  # w's handle.

  def testHoldsOnlyWhatTheFetchesNeed(self):
    """Fed h, y needs h * 2 + 1 and the control edge's read: TensorFlow's
    prune copies the ancestors of h too (the matmul, the tanh), dead."""
    mine = prune.Prune(self.wrapped, [self.h], [self.y])
    theirs = self.wrapped.prune(feeds=[self.h], fetches=[self.y])
    types = {op.type for op in mine.graph.get_operations()}
    self.assertNotIn('MatMul', types)
    self.assertNotIn('Tanh', types)
    self.assertIn('ReadVariableOp', types)  # The control edge's source.
    self.assertIn('MatMul', {op.type for op in theirs.graph.get_operations()})
    self.assertLess(len(mine.graph.get_operations()),
                    len(theirs.graph.get_operations()))
    self.assertAllClose(mine(tf.ones([2, 2]))[0], 3.0 * tf.ones([2, 2]))

  def testCapturesOnlyTheVariablesItReads(self):
    no_read = prune.Prune(self.wrapped, [self.h], [self.h])
    self.assertEmpty(no_read.graph.captures)
    reads = prune.Prune(self.wrapped, [self.wrapped.inputs[0]], [self.y])
    self.assertLen(reads.graph.captures, 1)
    self.assertEqual(reads.graph.captures[0][0].dtype, tf.resource)

  def testOpsKeepTheirNames(self):
    """Errors name ops (run_errors): an op of the piece is the op of the
    graph's of its name. Placeholders named after a capture (`x/resource`)
    made the import rename `x` to `x_1`."""
    fn = prune.Prune(self.wrapped, [self.wrapped.inputs[0]],
                     [self.y, self.dw])
    graph = self.wrapped.graph
    for op in fn.graph.get_operations():
      if op.type != 'Placeholder':
        self.assertEqual(graph.get_operation_by_name(op.name).type, op.type)

  def testRaisesWhatTheFeedsCannotReplace(self):
    with self.assertRaises(prune.ERRORS):  # Nothing feeds `unfed`.
      prune.Prune(self.wrapped, [self.wrapped.inputs[0]], [self.unfed])
    with self.assertRaisesRegex(Exception, 'UnliftableError|placeholder'):
      prune.Prune(self.wrapped, [self.wrapped.inputs[0]], [self.unfed])
    self.assertEqual(prune.ERRORS[0].__name__, 'UnliftableError')

  def testVariablesStayLive(self):
    """The pruned function reads the variable when it runs, not a copy."""
    fn = prune.Prune(self.wrapped, [self.wrapped.inputs[0]], [self.y])
    before = fn(self.x)[0]
    self.w.assign(self.w * 2.0)
    self.assertNotAllClose(before, fn(self.x)[0])
    self.assertAllClose(fn(self.x)[0],
                        tf.tanh(self.x @ self.w) * 2.0 + 1.0)

  def testKeptWholeIsCalledAsItIsInAStep(self):
    """KeptWhole: the same function, which a tf.function calls without
    inlining it or copying it per call site (its FunctionDef says so), and
    tf.function's allow-list as it was."""
    # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
    from tensorflow.python.eager.polymorphic_function import attributes
    # pylint: enable=g-import-not-at-top,g-direct-tensorflow-import
    allowed = attributes.MONOMORPHIC_FUNCTION_ALLOWLIST
    x = self.wrapped.inputs[0]
    cut = prune.Prune(self.wrapped, [x], [self.y, self.dw])
    whole = prune.KeptWhole(cut)
    self.assertIs(attributes.MONOMORPHIC_FUNCTION_ALLOWLIST, allowed)
    self.assertNotEqual(whole.name, cut.name)
    attrs = whole.function_def.attr
    self.assertTrue(attrs['_noinline'].b)
    self.assertTrue(attrs['_nospecialize'].b)
    self.assertNotIn('_noinline', cut.function_def.attr)

    @tf.function(autograph=False)
    def _Step(x):
      return whole(x)

    for a, b in zip(_Step(self.x), cut(self.x)):
      self.assertAllClose(a, b)

  def testKeptWholeRestoresTheAllowListWhenThreadsMakeFunctionsAtOnce(self):
    # Thread a makes its function and waits (up to a second) for thread b
    # to be making one too; b then waits for a to be done. Swapped one
    # thread at a time (b waits for a's turn to end), the allow-list ends
    # as it was. Interleaved, b saves the list a widened and restores it
    # after a restored the original: widened for good.
    # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
    import threading
    from tensorflow.python.eager import wrap_function
    from tensorflow.python.eager.polymorphic_function import attributes
    # pylint: enable=g-import-not-at-top,g-direct-tensorflow-import
    allowed = attributes.MONOMORPHIC_FUNCTION_ALLOWLIST
    cut = prune.Prune(self.wrapped, [self.wrapped.inputs[0]], [self.y])
    a_inside, b_inside, a_done = (threading.Event(), threading.Event(),
                                  threading.Event())
    make = wrap_function.WrappedFunction

    def _Held(*args, **kwargs):
      if threading.current_thread().name == 'a':
        a_inside.set()
        b_inside.wait(1.0)
      else:
        b_inside.set()
        a_done.wait(5.0)
      return make(*args, **kwargs)

    def _A():
      prune.KeptWhole(cut)
      a_done.set()

    def _B():
      a_inside.wait(5.0)
      prune.KeptWhole(cut)

    with mock.patch.object(wrap_function, 'WrappedFunction', _Held):
      threads = [threading.Thread(target=_A, name='a'),
                 threading.Thread(target=_B, name='b')]
      for t in threads:
        t.start()
      for t in threads:
        t.join(10)
    try:
      self.assertIs(attributes.MONOMORPHIC_FUNCTION_ALLOWLIST, allowed)
    finally:
      attributes.MONOMORPHIC_FUNCTION_ALLOWLIST = allowed

if __name__ == '__main__':
  tf.test.main()
