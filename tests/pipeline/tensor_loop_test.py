"""Tests of gpipe_tf/pipeline/tensor_loop.py: packed slots."""

import numpy as np
import tensorflow as tf

from gpipe_tf.pipeline import tensor_loop as tl


class PackedTest(tf.test.TestCase):

  def _Specs(self):
    return [tf.TensorSpec([None, 3], tf.float32), None,
            tf.TensorSpec([2], tf.int32), tf.TensorSpec([], tf.float32)]

  def testWriteReadEveryTensorOfEveryMicroBatch(self):
    packed = tl.Packed(self._Specs(), size=3)
    self.assertLen(packed.Initial(), 2)  # One list per dtype.
    lists = packed.Initial()
    values = {}
    for m in range(3):
      values[m] = [tf.fill([m + 1, 3], float(m)), None,
                   tf.constant([m, -m]), tf.constant(10.0 + m)]
      lists = packed.Write(lists, m, values[m])
    for m in (2, 0, 1):
      got = packed.Read(lists, m)
      self.assertIsNone(got[1])
      for g, v in zip(got, values[m]):
        if v is not None:
          self.assertAllEqual(g, v)

  def testSlotIndicesOfATensorMicroBatchAreOneVectorAList(self):
    # In a loop m is a tensor: a list's indices are built once (multiply,
    # add, unstack), not an add and a constant per tensor it holds.
    specs = [tf.TensorSpec([2], tf.float32)] * 12 + [
        tf.TensorSpec([], tf.int32)]
    packed = tl.Packed(specs, size=3)

    @tf.function
    def _Read(m):
      lists = packed.Write(packed.Initial(), m, [
          tf.fill([2], tf.cast(m, tf.float32) + i) for i in range(12)] +
                           [m * 7])
      return packed.Read(lists, m)

    graph = _Read.get_concrete_function(tf.TensorSpec([], tf.int32)).graph
    adds = [op for op in graph.get_operations() if op.type == 'AddV2' and
            op.inputs[0].dtype == tf.int32]
    self.assertLen(adds, 2)  # The float list's indices, once a Write/Read.
    got = _Read(tf.constant(2))
    for i in range(12):
      self.assertAllEqual(got[i], [2.0 + i] * 2)
    self.assertEqual(got[12].numpy(), 14)

  def testReadHasTheStaticShapeOfItsSpec(self):
    packed = tl.Packed(self._Specs(), size=2)

    lists = packed.Initial()
    got = packed.Read(packed.Write(lists, 1, [
        tf.zeros([4, 3]), None, tf.zeros([2], tf.int32), tf.zeros([])]), 1)
    self.assertEqual([g.shape.as_list() for g in got if g is not None],
                     [[4, 3], [2], []])

  def testTakeEmptiesTheSlotItRead(self):
    packed = tl.Packed(self._Specs(), size=2)
    lists = packed.Write(packed.Initial(), 1, [
        tf.ones([5, 3]), None, tf.constant([1, 2]), tf.constant(3.0)])
    lists = packed.Write(lists, 0, [
        tf.ones([2, 3]), None, tf.constant([7, 8]), tf.constant(9.0)])
    values, emptied = packed.Take(lists, 1)
    self.assertAllEqual(values[0], np.ones([5, 3]))

    def _Raw(m, i):  # The item as stored, whatever its shape.
      w, spec = packed.where[i], packed.specs[i]
      return tf.raw_ops.TensorListGetItem(
          input_handle=emptied[w[0]], index=m * packed.counts[w[0]] + w[1],
          element_shape=tf.constant(-1), element_dtype=spec.dtype)

    self.assertEqual(_Raw(1, 0).shape, [0, 3])  # Emptied: the tensor is freed.
    self.assertEqual(_Raw(1, 2).shape, [0])
    self.assertAllEqual(_Raw(1, 3), 3.0)        # A scalar is left as it was.
    self.assertAllEqual(packed.Read(emptied, 0)[2], [7, 8])  # Others kept.

  def testZerosWritesNothingAndReadsZeros(self):
    packed = tl.Packed([tf.TensorSpec([2, 3], tf.float32), None,
                        tf.TensorSpec([], tf.int32)])

    @tf.function
    def _Read():
      return packed.Read(packed.Zeros())

    ops = [op.type for op in _Read.get_concrete_function().graph
           .get_operations()]
    self.assertNotIn('TensorListSetItem', ops)  # Nothing written.
    a, none, b = _Read()
    self.assertAllEqual(a, np.zeros([2, 3]))
    self.assertIsNone(none)
    self.assertAllEqual(b, 0)
    with self.assertRaisesRegex(ValueError, 'fully defined'):
      tl.Packed([tf.TensorSpec([None, 3], tf.float32)]).Zeros()

  def testSumsInAWhileLoop(self):
    packed = tl.Packed([tf.TensorSpec([2], tf.float32),
                        tf.TensorSpec([], tf.float32)])

    @tf.function
    def _Run():
      def _Body(i, lists):
        a, b = packed.Read(lists)
        return i + 1, packed.Write(lists, 0, [a + 1.0, b + 2.0])
      lists = packed.Zeros()
      _, lists = tf.while_loop(lambda i, _: i < 4, _Body, (0, lists))
      return packed.Read(lists)

    a, b = _Run()
    self.assertAllEqual(a, [4.0, 4.0])
    self.assertAllEqual(b, 8.0)


class FlatTest(tf.test.TestCase):

  def testPackIsOneVectorPerDtypeAndUnpackGivesEachTensorBack(self):
    values = [tf.constant([1.0, 2.0]), tf.constant(3.0, tf.float64),
              tf.constant([[4.0], [5.0]]), tf.constant(6.0),
              tf.constant([7.0], tf.float64)]
    flat = tl.Flat([tf.TensorSpec.from_tensor(v) for v in values])
    vectors = flat.Pack(values)
    self.assertLen(vectors, 2)
    self.assertAllEqual(vectors[0], [1.0, 2.0, 4.0, 5.0, 6.0])
    self.assertAllEqual(vectors[1], [3.0, 7.0])
    for got, want in zip(flat.Unpack(vectors), values):
      self.assertEqual(got.dtype, want.dtype)
      self.assertAllEqual(got, want)

  def testVectorsAreNotReshaped(self):
    # Biases and scales are vectors already: packing and unpacking them
    # builds no Reshape (one a tensor, both ways, in a deep cell's pieces).
    specs = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([3], tf.float32),
             tf.TensorSpec([2, 2], tf.float32), tf.TensorSpec([], tf.float32)]
    flat = tl.Flat(specs)

    @tf.function
    def _RoundTrip(a, b, c, d):
      return flat.Unpack(flat.Pack([a, b, c, d]))

    graph = _RoundTrip.get_concrete_function(*specs).graph
    reshapes = [op for op in graph.get_operations() if op.type == 'Reshape']
    # The matrix and the scalar, each packed and unpacked: four.
    self.assertLen(reshapes, 4)
    values = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0, 5.0]),
              tf.constant([[6.0, 7.0], [8.0, 9.0]]), tf.constant(10.0)]
    for got, want in zip(_RoundTrip(*values), values):
      self.assertAllEqual(got, want)

  def testTensorsOfUnknownShapeStayAsTheyAre(self):
    flat = tl.Flat([tf.TensorSpec([2], tf.float32),
                    tf.TensorSpec([None], tf.float32)])
    values = [tf.constant([1.0, 2.0]), tf.constant([3.0])]
    self.assertIs(flat.Pack(values)[1], values[1])
    self.assertIs(flat.Unpack(values)[0], values[0])

  def testLargeTensorsAndNoneFollowTheVectorAsTheyAre(self):
    values = [tf.ones([3, 3]), None, tf.constant([1.0, 2.0]),
              tf.zeros([4]), tf.constant(5.0)]
    flat = tl.Flat([None if v is None else tf.TensorSpec.from_tensor(v)
                    for v in values], max_elements=4)
    packed = flat.Pack(values)
    self.assertLen(packed, 3)
    self.assertAllEqual(packed[0], [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 5.0])
    self.assertIs(packed[1], values[0])
    self.assertIsNone(packed[2])
    got = flat.Unpack(packed)
    self.assertIsNone(got[1])
    for g, w in zip(got, values):
      if w is not None:
        self.assertAllEqual(g, w)


if __name__ == '__main__':
  tf.test.main()
