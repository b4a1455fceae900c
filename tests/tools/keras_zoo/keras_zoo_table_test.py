"""tools.keras_zoo.table: the verdict flags a gradient off by more than float32 rounding, the tables and the CSV round-trip, and docs/keras.md's support table is the zoo's results."""

import os

import numpy as np
import tensorflow as tf

from tools.keras_zoo import table as keras_zoo_table

_RESULTS = os.path.join(os.path.dirname(keras_zoo_table.DOCS), os.pardir,
                        'benchmarks', 'keras_zoo', 'results.csv')
_HUB = os.path.join(os.path.dirname(_RESULTS), 'keras_hub.csv')


class KerasZooTableTest(tf.test.TestCase):

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
      diff, keras_error, pipeline_error = keras_zoo_table.Errors(got, keras32, truth)
      row = keras_zoo_table.Row('A', 3, 2, 'gpipe', 'converted', diff, 1.0, '',
                          keras_error, pipeline_error)
      self.assertEqual(keras_zoo_table.Verdict(row), verdict, row)
    # An ill-conditioned model: Keras's own float32 step is 5% off the
    # truth; the pipeline's 6% is rounding, 50% is not.
    for pipeline_error, verdict in ((0.06, 'exact'), (0.5, 'DIFFERS')):
      row = keras_zoo_table.Row('A', 3, 2, 'gpipe', 'converted', 0.05, 1.0, '', 0.05,
                          pipeline_error)
      self.assertEqual(keras_zoo_table.Verdict(row), verdict)
    self.assertEqual(keras_zoo_table.Verdict(row._replace(keras_error=None)), '-')
    # With random draws, the pipelined step must equal the unpipelined one
    # under the same seeds within the same bound.
    row = row._replace(pipeline_error=0.06)
    self.assertEqual(keras_zoo_table.Verdict(row._replace(seeded_diff=0.01)),
                     'exact')
    self.assertEqual(keras_zoo_table.Verdict(row._replace(seeded_diff=0.5)),
                     'DIFFERS')

  def testTablesInTheDocsAreTheZoosResults(self):
    # Regenerate with: python -m tools.keras_zoo --zoo_write_docs
    #   --zoo_results=benchmarks/keras_zoo/results.csv
    with open(keras_zoo_table.DOCS) as f:
      text = f.read()
    #   python -m tools.keras_zoo --zoo_write_docs --zoo_results=\
    #   benchmarks/keras_zoo/results.csv,benchmarks/keras_zoo/keras_hub.csv
    rows = keras_zoo_table.ReadResults(_RESULTS)
    hub = keras_zoo_table.ReadResults(_HUB)
    self.assertNotEmpty(rows)
    self.assertNotEmpty(hub)
    self.assertEqual(
        keras_zoo_table.UpdateDocs(text, keras_zoo_table.Merged(rows, hub)),
        text)
    with open(keras_zoo_table.README) as f:
      text = f.read()
    self.assertEqual(keras_zoo_table.UpdateReadme(text, rows), text)
    self.assertEqual(
        keras_zoo_table.UpdateReadme(text, hub, 'keras_hub.csv'), text)

  def testTables(self):
    rows = [keras_zoo_table.Row('A', 10, 2, 'gpipe', 'converted', 1e-7, 3.0, '32x32',
                          3e-3, 2e-3),
            keras_zoo_table.Row('A', 10, 4, 'gpipe', 'converted', 2e-7, 4.0, '32x32',
                          3e-3, 4e-3),
            keras_zoo_table.Row('B', 0, 0, '-', 'KerasModelError', None, 1.0,
                          "'x' makes a | mask")]
    table = keras_zoo_table.Table(rows)
    self.assertIn('| B | 0 | 0 | - | KerasModelError: ', table)
    self.assertIn('| 2.0e-07 | 3.0e-03 | 4.0e-03 | exact | 4 |', table)
    support = keras_zoo_table.SupportTable(rows).splitlines()
    self.assertEqual(support[2], '| A | 32x32 | 10 | 2 gpipe, 4 gpipe | '
                     '2.0e-07 | 3.0e-03 | 4.0e-03 | - | exact |')
    # A model's rows come from the last results file that has it.
    newer = rows[0]._replace(k=4, schedule='zb_h1', seeded_diff=1e-7)
    self.assertEqual(keras_zoo_table.Merged(rows, [newer]),
                     [rows[2], newer])
    self.assertIn('| 1.0e-07 | exact | 3 |',
                  keras_zoo_table.Table([newer], seeded=True))
    self.assertIn("KerasModelError (0 -) | 'x' makes a / mask |", support[3])
    path = os.path.join(self.get_temp_dir(), 'rows.csv')
    keras_zoo_table.WriteResults(path, rows[:2])
    keras_zoo_table.WriteResults(path, rows[2:])
    self.assertEqual(keras_zoo_table.ReadResults(path), rows)

    def _Lines():
      with open(path) as f:
        return f.read().splitlines()[1:]

    # A re-run replaces its stale row, and a model's new row its refusal
    # before any K: no second row of one model, K and schedule in the file.
    rerun = rows[0]._replace(max_grad_diff=5e-7, seconds=2.0)
    fixed = rows[2]._replace(layers=7, k=2, schedule='zb_h1',
                             status='converted', max_grad_diff=1e-7)
    keras_zoo_table.WriteResults(path, [rerun, fixed])
    self.assertLen(_Lines(), 3)
    self.assertEqual(keras_zoo_table.ReadResults(path),
                     [rows[1], rerun, fixed])
    # A row judged against Keras's whole-batch float32 step (no float64
    # twin) says so in both tables and keeps it in the file.
    moe = rows[0]._replace(model='M', truth=keras_zoo_table.F32)
    self.assertIn('| 3.0e-03 (f32) | 2.0e-03 (f32) |',
                  keras_zoo_table.Table([moe]))
    self.assertIn('| 3.0e-03 (f32) | 2.0e-03 (f32) |',
                  keras_zoo_table.SupportTable([moe]))
    keras_zoo_table.WriteResults(path, [moe])
    self.assertEqual(keras_zoo_table.ReadResults(path)[-1], moe)



if __name__ == '__main__':
  tf.test.main()
