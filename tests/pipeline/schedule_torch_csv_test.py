"""Tests for gpipe_tf.pipeline.schedule.torch_csv: PyTorch's compute-only CSV, written by hand, through Load and DumpTorch."""

import io
import os
import pathlib
import tempfile
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import Action
from gpipe_tf.pipeline.schedule import Schedule
from gpipe_tf.pipeline.schedule import ScheduleError
from gpipe_tf.pipeline.schedule import torch_csv

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'testdata')

# Hand-written in PyTorch's format; an empty cell is an idle slot, as PyTorch
# dumps them.
_GPIPE_2X3 = """\
0F0,0F1,0F2,,,,0B2,0B1,0B0
,1F0,1F1,1F2,1B2,1B1,1B0
"""
_ONE_F_ONE_B_3X4 = """\
0F0,0F1,0F2,,,,,0B0,0F3,0B1,,0B2,,0B3
,1F0,1F1,,,1B0,1F2,1B1,1F3,1B2,,1B3
,,2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3
"""
# ZB-H1 with PyTorch's I (input gradient) and W (weight gradient).
_ZB_H1_2X3 = """\
0F0,0F1,,0I0,0W0,0F2,0I1,0W1,0I2,0W2
,1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1W2
"""


def _Load(text):
  return schedule.Load(io.StringIO(text))


class LoadTest(unittest.TestCase):

  def testGPipe(self):
    # PyTorch's B is the whole backward: our BW.
    loaded = _Load(_GPIPE_2X3)
    self.assertEqual(loaded, schedule.Make('gpipe', 2, 3))
    self.assertEqual(loaded.actions[1][3], Action('BW', 1, 2))
    self.assertEqual(loaded.name, 'custom')

  def testOneFOneB(self):
    self.assertEqual(_Load(_ONE_F_ONE_B_3X4), schedule.Make('1f1b', 3, 4))

  def testZeroBubbleInputAndWeightGradients(self):
    loaded = _Load(_ZB_H1_2X3)
    self.assertEqual(loaded, schedule.Make('zb_h1', 2, 3))
    self.assertEqual(loaded.actions[0][2:4], (Action('B', 0, 0), Action('W', 0, 0)))

  def testVShapedPlacementFromTheRows(self):
    loaded = schedule.Load(os.path.join(TESTDATA, 'zbv_k2_m4.torch.csv'))
    self.assertEqual(loaded.stage_devices, (0, 1, 1, 0))
    self.assertEqual(loaded.num_micro_batches, 4)
    self.assertEqual(loaded, schedule.Make('zbv', 2, 4, 2))

  def testOverlapRunsBothActionsBackToBack(self):
    path = pathlib.Path(TESTDATA) / 'dualpipe_v_k2_m4.torch.csv'
    loaded = schedule.Load(path)
    self.assertEqual(loaded, schedule.Make('dualpipe_v', 2, 4, 2))
    # (0F3;3B1)OVERLAP_F_B, (3F2;0B0)OVERLAP_F_B after the 7 single cells.
    self.assertEqual(loaded.actions[0][7:11], (
        Action('F', 0, 3), Action('BW', 3, 1), Action('F', 3, 2),
        Action('BW', 0, 0)))
    # Spaces around cells and parts are allowed.
    self.assertEqual(_Load('0F0, ( 0F1 ; 0B0 )OVERLAP_F_B ,0B1\n'),
                     Schedule([[Action('F', 0, 0), Action('F', 0, 1),
                                Action('BW', 0, 0), Action('BW', 0, 1)]], 2))

  def testAnyPlacement(self):
    # Stage 0 on device 2, stage 1 on device 0; device 1 is an empty line (no
    # actions); '#' lines are comments and trailing empty lines are ignored.
    loaded = _Load('# my schedule\n1F0,1B0\n\n0F0,,,0B0\n\n\n')
    self.assertEqual(loaded.num_devices, 3)
    self.assertEqual(loaded.stage_devices, (2, 0))
    self.assertEqual(loaded.actions[1], ())

  def testGpipeTfFormatStillRecognised(self):
    sched = schedule.Make('1f1b', 2, 2)
    buffer = io.StringIO()
    schedule.Dump(sched, buffer)
    self.assertTrue(buffer.getvalue().startswith('# gpipe_tf schedule'))
    self.assertEqual(_Load(buffer.getvalue()), sched)
    no_comment = '\n'.join(buffer.getvalue().splitlines()[1:])
    self.assertEqual(_Load(no_comment), sched)
    self.assertFalse(torch_csv.LooksLikeTorch(no_comment.splitlines()))
    self.assertTrue(torch_csv.LooksLikeTorch(['# c', '', ',(0F0;0B0)OVERLAP_F_B']))


class DumpTorchTest(unittest.TestCase):

  def testFormat(self):
    buffer = io.StringIO()
    schedule.DumpTorch(schedule.Make('zb_h1', 2, 2), buffer)
    self.assertEqual(buffer.getvalue(), '0F0,0F1,0I0,0W0,0I1,0W1\n'
                                        '1F0,1I0,1F1,1I1,1W0,1W1\n')

  def testRoundTrip(self):
    for name, k, m, v in (('gpipe', 3, 4, 2), ('1f1b', 4, 7, 1),
                          ('interleaved_1f1b', 3, 5, 3), ('zb_h1', 5, 9, 1),
                          ('zbv', 4, 6, 2), ('dualpipe_v', 3, 7, 2),
                          ('gpipe', 1, 1, 1)):
      sched = schedule.Make(name, k, m, v)
      buffer = io.StringIO()
      schedule.DumpTorch(sched, buffer)
      buffer.seek(0)
      self.assertEqual(schedule.Load(buffer), sched, msg=name)

  def testRoundTripThroughPathKeepsAnIdleDevice(self):
    sched = Schedule([[Action('F', 1, 0), Action('BW', 1, 0)], [],
                      [Action('F', 0, 0), Action('BW', 0, 0)]], 1,
                     stage_devices=[2, 0])
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'mine.csv'
      schedule.DumpTorch(sched, path)
      self.assertEqual(path.read_text(), '1F0,1B0\n\n0F0,0B0\n')
      self.assertEqual(schedule.Load(str(path)), sched)


class MalformedTest(unittest.TestCase):

  def testBadCells(self):
    cases = (
        ('0F0,0X1\n', r"^line 1, column 2: '0X1' is not an action; write "
         r'\{stage\}\{kind\}\{micro_batch\} with kind F'),
        ('0F0,0B0\n1F0,F1\n', "line 2, column 2: 'F1' is not an action"),
        ('0F0,0B\n', "^line 1, column 2: '0B' has no micro-batch; write e.g. 0B0"),
        ('0F0,0SEND_F0,0B0\n', "^line 1, column 2: '0SEND_F0' is a communication "
         'or FSDP action; this reader takes the compute-only format'),
        ('0F0,0UNSHARD\n', "column 2: '0UNSHARD' is a communication"),
        ('0F0,,(0B0)OVERLAP_F_B\n', r"^line 1, column 3: '\(0B0\)OVERLAP_F_B' must "
         'hold two or more actions separated by ";"'),
        ('0F0,(0F1;)OVERLAP_F_B\n', 'line 1, column 2: .* must hold two or more'),
        ('(0F0;0B0)\n', r"^line 1, column 1: '\(0F0;0B0\)' is not an action "
         r'group; the only group is \(a;b\)OVERLAP_F_B'),
        ('0F0,(0F1;(0B0;0B1)OVERLAP_F_B)OVERLAP_F_B\n',
         r"column 2: '\(0B0' is not an action"),
        ('0F0,0F1\n1F0,0B0\n', '^line 2, column 2: stage 0 is on this row '
         r'\(device 1\) but also on line 1 \(device 0\), column 1; a stage runs '
         'on one device'),
        ('2F0,2B0\n0F0,0B0\n', '^stage 1 appears in no cell, so its device is '
         'unknown; stages must be numbered 0 to 2 without gaps'),
        (',,\n\n', 'has no actions; write one row per device'),
    )
    for text, pattern in cases:
      with self.assertRaisesRegex(ScheduleError, pattern, msg=text):
        _Load(text)

  def testInvalidScheduleNamesLineAndColumn(self):
    # Device 1 runs its backward of micro-batch 1 before the forward (swapped);
    # the idle first cell makes the column (3) differ from the position (1).
    text = _ONE_F_ONE_B_3X4.replace(',1F0,1F1,,,1B0,1F2,1B1,',
                                    ',1F0,1B1,,,1B0,1F2,1F1,')
    with self.assertRaisesRegex(
        ScheduleError, r"^line 2, column 3: schedule 'custom': device 1, "
        r'position 1: BW\(stage=1, micro_batch=1\) deadlocks: it waits for '
        r'F\(stage=1, micro_batch=1\), which runs later on the same device'):
      _Load(text)
    # A forward without its backward names the forward's cell.
    with self.assertRaisesRegex(ScheduleError, r'^line 1, column 3: .* '
                                r'F\(stage=0, micro_batch=1\) has no backward'):
      _Load('0F0,,0F1,0B0\n')

  def testMalformedGpipeTfFileKeepsItsMessage(self):
    with self.assertRaisesRegex(ScheduleError, "^line 1: expected the header .*"
                                "or, for PyTorch's format, rows of cells like"):
      _Load('dev,step,kind\n0,0,F,0,0\n')


if __name__ == '__main__':
  unittest.main()
