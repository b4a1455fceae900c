"""tools.keras_zoo: keras_hub models pipelined equal Keras's own step, and docs/keras.md's support table is the zoo's results.

GPT2CausalLM (a backbone called with a dict of two inputs, a tied
embedding read again by the output head) under 1f1b at K=2 equals Keras's
tf.GradientTape step within float32 rounding: its verdict against Keras's
float64 step is 'exact', and the verdict flags a gradient that is off by
more than rounding. BatchNorm, operation nodes and custom-gradient activations of the
keras.applications models are covered at a smaller size by
tests/pipeline/keras_import_test.py.
"""

import os

import numpy as np

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
    [row] = keras_zoo.Run('GPT2CausalLM', [(2, '1f1b')], micro_batches=2)
    self.assertEqual(row.status, 'converted', row.detail)
    self.assertLess(row.max_grad_diff, 1e-5)
    self.assertEqual(keras_zoo.Verdict(row), 'exact')
    # The truth is float64: Keras's own float32 step is off it, a little.
    self.assertBetween(row.keras_error, 1e-9, 1e-5)

  def testVerdictFlagsAWrongGradient(self):
    rng = np.random.default_rng(0)
    truth = [rng.normal(size=(8, 3)), rng.normal(size=(5,))]

    def _Rounded(seed, rel=1e-7):  # float32-like noise on every element.
      r = np.random.default_rng(seed)
      return [g * (1 + rel * r.normal(size=g.shape)) for g in truth]

    keras32, good = _Rounded(1), _Rounded(2)
    wrong = [g.copy() for g in good]
    wrong[1][3] *= 1.001  # One element of one gradient off by 0.1%.
    for got, verdict in ((good, 'exact'), (wrong, 'DIFFERS')):
      diff, keras_error, pipeline_error = keras_zoo.Errors(got, keras32, truth)
      row = keras_zoo.Row('A', 3, 2, 'gpipe', 'converted', diff, 1.0, '',
                          keras_error, pipeline_error)
      self.assertEqual(keras_zoo.Verdict(row), verdict, row)
    # An ill-conditioned model: Keras's own float32 step is 5% off the
    # truth; the pipeline's 6% is rounding, 50% is not.
    for pipeline_error, verdict in ((0.06, 'exact'), (0.5, 'DIFFERS')):
      row = keras_zoo.Row('A', 3, 2, 'gpipe', 'converted', 0.05, 1.0, '', 0.05,
                          pipeline_error)
      self.assertEqual(keras_zoo.Verdict(row), verdict)
    self.assertEqual(keras_zoo.Verdict(row._replace(keras_error=None)), '-')

  def testDocsSupportTableIsTheZoosResults(self):
    # Regenerate with: python -m tools.keras_zoo --zoo_write_docs
    #   --zoo_results=benchmarks/keras_zoo/results.csv
    with open(keras_zoo.DOCS) as f:
      text = f.read()
    rows = keras_zoo.ReadResults(_RESULTS)
    self.assertNotEmpty(rows)
    self.assertEqual(keras_zoo.UpdateDocs(text, rows), text)

  def testTables(self):
    rows = [keras_zoo.Row('A', 10, 2, 'gpipe', 'converted', 1e-7, 3.0, '32x32',
                          3e-3, 2e-3),
            keras_zoo.Row('A', 10, 4, 'gpipe', 'converted', 2e-7, 4.0, '32x32',
                          3e-3, 4e-3),
            keras_zoo.Row('B', 0, 0, '-', 'KerasModelError', None, 1.0,
                          "'x' makes a | mask")]
    table = keras_zoo.Table(rows)
    self.assertIn('| B | 0 | 0 | - | KerasModelError: ', table)
    self.assertIn('| 2.0e-07 | 3.0e-03 | 4.0e-03 | exact | 4 |', table)
    support = keras_zoo.SupportTable(rows).splitlines()
    self.assertEqual(support[2], '| A | 32x32 | 10 | 2 gpipe, 4 gpipe | '
                     '2.0e-07 | 3.0e-03 | 4.0e-03 | exact |')
    self.assertIn("KerasModelError (0 -) | 'x' makes a / mask |", support[3])
    path = os.path.join(self.get_temp_dir(), 'rows.csv')
    keras_zoo.WriteResults(path, rows[:2])
    keras_zoo.WriteResults(path, rows[2:])
    self.assertEqual(keras_zoo.ReadResults(path), rows)


if __name__ == '__main__':
  tf.test.main()
