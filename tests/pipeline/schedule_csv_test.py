"""Tests for gpipe_tf.pipeline.schedule's CSV Dump and Load: round trips, hand-written, errors."""

import io
import pathlib
import tempfile
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import Action
from gpipe_tf.pipeline.schedule import Schedule
from gpipe_tf.pipeline.schedule import ScheduleError

_ONE_F_ONE_B_2X2 = """\
# gpipe_tf schedule num_devices=2 num_micro_batches=2 stage_devices=0;1 name=1f1b
device,step,action,stage,micro_batch
0,0,F,0,0
0,1,F,0,1
0,2,BW,0,0
0,3,BW,0,1
1,0,F,1,0
1,1,BW,1,0
1,2,F,1,1
1,3,BW,1,1
"""


def _Load(text):
  return schedule.Load(io.StringIO(text))


def _RoundTrip(sched):
  buffer = io.StringIO()
  schedule.Dump(sched, buffer)
  buffer.seek(0)
  return schedule.Load(buffer)


class CsvTest(unittest.TestCase):

  def testDumpFormat(self):
    buffer = io.StringIO()
    schedule.Dump(schedule.Make('1f1b', 2, 2), buffer)
    self.assertEqual(buffer.getvalue(), _ONE_F_ONE_B_2X2)

  def testRoundTrip(self):
    for name, k, m, v in (('gpipe', 3, 4, 2), ('1f1b', 4, 7, 1),
                          ('interleaved_1f1b', 3, 5, 3), ('zb_h1', 5, 9, 1),
                          ('gpipe', 1, 1, 1)):
      sched = schedule.Make(name, k, m, v)
      loaded = _RoundTrip(sched)
      self.assertEqual(loaded, sched, msg=name)
      self.assertEqual(loaded.name, name)
      self.assertEqual(loaded.actions, sched.actions)

  def testRoundTripKeepsPlacementAndIdleDevices(self):
    sched = Schedule([[Action('F', 1, 0), Action('BW', 1, 0)],
                      [Action('F', 0, 0), Action('BW', 0, 0)], []], 1,
                     stage_devices=[1, 0], name='two words')
    loaded = _RoundTrip(sched)
    self.assertEqual(loaded, sched)
    self.assertEqual((loaded.num_devices, loaded.stage_devices, loaded.name),
                     (3, (1, 0), 'two words'))

  def testRoundTripThroughPaths(self):
    sched = schedule.Make('zb_h1', 3, 4)
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'zb.csv'
      schedule.Dump(sched, path)
      self.assertEqual(schedule.Load(path), sched)
      self.assertEqual(schedule.Load(str(path)), sched)
      self.assertTrue(path.read_text().startswith('# gpipe_tf schedule'))

  def testHandWritten(self):
    # No metadata comment, rows out of order, spaces, a blank line, a comment.
    loaded = _Load('# my 1F1B\n'
                   'device, step, action, stage, micro_batch\n'
                   '1,3,BW,1,1\n0,0,F,0,0\n0,1,F,0,1\n\n'
                   '0, 2, BW, 0, 0\n0,3,BW,0,1\n1,0,F,1,0\n1,1,BW,1,0\n1,2,F,1,1\n')
    self.assertEqual(loaded, schedule.Make('1f1b', 2, 2))
    self.assertEqual(loaded.name, 'custom')

  def testHandWrittenInfersPlacement(self):
    loaded = _Load('device,step,action,stage,micro_batch\n'
                   '1,0,F,0,0\n0,0,F,1,0\n0,1,BW,1,0\n1,1,BW,0,0\n')
    self.assertEqual(loaded.stage_devices, (1, 0))
    self.assertEqual(loaded.num_micro_batches, 1)

  def testMalformed(self):
    header = 'device,step,action,stage,micro_batch\n'
    cases = (
        ('dev,step,kind\n0,0,F,0,0\n', 'line 1: expected the header'),
        (header + '0,0,F,0,0\n0,1,BW,0\n', 'line 3: expected 5 fields'),
        (header + 'x,0,F,0,0\n', 'line 2: device, step, stage and micro_batch '
         'must be ints >= 0'),
        (header + '0,0,F,-1,0\n', 'line 2: .* must be ints >= 0'),
        (header + '0,0,Q,0,0\n', "line 2: action must be one of F, B, W, BW, got 'Q'"),
        (header + '0,0,F,0,0\n0,0,BW,0,0\n',
         'line 3: device 0 step 0 is already given at line 2'),
        (header + '0,0,F,0,0\n0,2,BW,0,0\n', 'line 3: device 0 step 2 follows step 0'),
        (header + '0,0,F,0,0\n1,1,BW,0,0\n', 'line 3: stage 0 is on device 1 here '
         'but on device 0 at line 2'),
        ('# gpipe_tf schedule num_devices=x\n' + header, 'line 1: bad'),
        ('# gpipe_tf schedule colour=red\n' + header, "unknown key 'colour'"),
        (header, 'no action rows'),
        (header + '0,0,F,1,0\n0,1,BW,1,0\n', 'stage 0 has no rows'),
    )
    for text, pattern in cases:
      with self.assertRaisesRegex(ScheduleError, pattern, msg=text):
        _Load(text)

  def testInvalidScheduleNamesTheLine(self):
    # Device 1 runs BW(1,0) before F(1,0); its step 0 is on line 8.
    text = _ONE_F_ONE_B_2X2.replace('1,0,F,1,0\n1,1,BW,1,0',
                                    '1,1,F,1,0\n1,0,BW,1,0')
    with self.assertRaisesRegex(ScheduleError,
                                r"^line 8: schedule '1f1b': device 1, position 0: "
                                r'BW\(stage=1, micro_batch=0\) deadlocks'):
      _Load(text)
    wrong_device = _ONE_F_ONE_B_2X2.replace('1,3,BW,1,1', '0,4,BW,1,1')
    with self.assertRaisesRegex(ScheduleError, '^line 10: .* is on the wrong device'):
      _Load(wrong_device)


if __name__ == '__main__':
  unittest.main()
