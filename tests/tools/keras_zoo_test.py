"""tools.keras_zoo: keras_hub models pipelined equal Keras's own step, and docs/keras.md's support table is the zoo's results.

GPT2CausalLM (a backbone called with a dict of two inputs, a tied
embedding read again by the output head) under 1f1b, and BertBackbone (two
outputs in a dict, an operation node ``x[:, 0, :]``, three inputs) under
zb_h1, both at K=2, equal Keras's tf.GradientTape step within float32
rounding. BatchNorm, operation nodes and custom-gradient activations of the
keras.applications models are covered at a smaller size by
tests/pipeline/keras_import_test.py.
"""

import os

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools import keras_zoo  # pylint: disable=g-import-not-at-top

_RESULTS = os.path.join(os.path.dirname(keras_zoo.DOCS), os.pardir,
                        'benchmarks', 'keras_zoo', 'results.csv')


class KerasZooTest(tf.test.TestCase):

  def testHubModelEqualsKeras(self):
    # A keras_hub task model (a nested backbone called with a dict, tied
    # embeddings) through the zoo's own path; several outputs and the rest
    # are keras_import_test's, BertBackbone the zoo table's.
    [row] = keras_zoo.Run('GPT2CausalLM', [2], ['1f1b'])
    self.assertEqual(row.status, 'converted', row.detail)
    self.assertLess(row.max_grad_diff, 1e-5)

  def testDocsSupportTableIsTheZoosResults(self):
    # Regenerate with: python -m tools.keras_zoo --zoo_write_docs
    #   --zoo_results=benchmarks/keras_zoo/results.csv
    with open(keras_zoo.DOCS) as f:
      text = f.read()
    rows = keras_zoo.ReadResults(_RESULTS)
    self.assertNotEmpty(rows)
    self.assertEqual(keras_zoo.UpdateDocs(text, rows), text)

  def testTables(self):
    rows = [keras_zoo.Row('A', 10, 2, 'gpipe', 'converted', 1e-7, 3.0, '32x32'),
            keras_zoo.Row('A', 10, 4, 'gpipe', 'converted', 2e-7, 4.0, '32x32'),
            keras_zoo.Row('B', 0, 0, '-', 'KerasModelError', None, 1.0,
                          "'x' makes a | mask")]
    self.assertIn('| B | 0 | 0 | - | KerasModelError: ', keras_zoo.Table(rows))
    support = keras_zoo.SupportTable(rows).splitlines()
    self.assertEqual(support[2], '| A | 32x32 | 10 | 2 gpipe, 4 gpipe | '
                     '2.0e-07 |')
    self.assertIn("KerasModelError (0 -) | 'x' makes a / mask |", support[3])
    path = os.path.join(self.get_temp_dir(), 'rows.csv')
    keras_zoo.WriteResults(path, rows[:2])
    keras_zoo.WriteResults(path, rows[2:])
    self.assertEqual(keras_zoo.ReadResults(path), rows)


if __name__ == '__main__':
  tf.test.main()
