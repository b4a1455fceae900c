"""tools/schedule_trace.py: a real traced step of any schedule, its report, PNG and Chrome trace."""

import json
import os
import subprocess
import sys

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.pipeline import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
from tools import schedule_trace  # pylint: disable=g-import-not-at-top

_TINY = dict(remat='always', num_blocks=4, dim=16, batch_size=32, steps=1)


def _ChromeTrace(timeline, directory):
  path = os.path.join(directory, 'trace.json')
  timeline.WriteChromeTrace(path)
  with open(path) as f:
    return json.load(f)['traceEvents']


class ScheduleTraceTest(tf.test.TestCase):

  def testOneTrackPerDeviceAndEveryAction(self):
    for name, k, m, v in (('1f1b', 2, 4, 1), ('zb_h1', 3, 4, 1),
                          ('interleaved_1f1b', 2, 2, 2)):
      with self.subTest(schedule=name):
        timeline, devices, busy = schedule_trace.Trace(name, k, m, v,
                                                       **_TINY)
        self.assertLen(devices, k)
        self.assertBetween(busy, 0.01, 1.1)
        events = _ChromeTrace(timeline, self.get_temp_dir())
        tracks = {e['tid']: e['args']['name'] for e in events
                  if e['ph'] == 'M'}
        self.assertEqual(tracks, {d: f'device {d}' for d in range(k)})
        expected = schedule_lib.Make(name, k, m, v)
        work = [e for e in events if e['ph'] == 'X']
        self.assertCountEqual(
            [(e['tid'], e['cat'], e['args']['stage'],
              e['args']['micro_batch']) for e in work],
            [(d, a.kind, a.stage, a.micro_batch)
             for d, row in enumerate(expected.actions) for a in row])
        report = schedule_trace.Report(timeline, 0.5)
        self.assertLen(report.splitlines(), k + 1)
        self.assertTrue(report.endswith(
            f'; cores busy 50% of {schedule_trace._Cores()}'))  # pylint: disable=protected-access
        self.assertIn(f'schedule {name}: K={k} M={m} stages={k * v}', report)
        self.assertIn('simulated (unit-time F, B, W) '
                      f'{schedule_lib.Simulate(expected).bubble_fraction:.2f}',
                      report)

  def testMainDrawsAHandWrittenSchedule(self):
    # The whole tool in a process of its own (it splits the CPU itself): a
    # CSV schedule sets K and M; the PNG and the Chrome trace are written.
    tmp = self.get_temp_dir()
    csv_path = os.path.join(tmp, 'zb.csv')
    schedule_lib.Dump(schedule_lib.Make('zb_h1', 2, 3), csv_path)
    png, trace = os.path.join(tmp, 'zb.png'), os.path.join(tmp, 'zb.json')
    out = subprocess.run(
        [sys.executable, '-m', 'tools.schedule_trace',
         f'--schedule_csv={csv_path}', '--num_blocks=2', '--dim=8',
         '--batch_size=12', f'--out={png}', f'--chrome_trace={trace}'],
        cwd=test_utils.REPO_ROOT, capture_output=True, text=True, check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')).stdout
    self.assertIn('schedule zb_h1: K=2 M=3 stages=2', out)
    self.assertRegex(out, r'cores busy \d+% of \d+')
    with open(png, 'rb') as f:
      self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
    with open(trace) as f:
      events = json.load(f)['traceEvents']
    self.assertLen([e for e in events if e['ph'] == 'M'], 2)
    self.assertLen([e for e in events if e['ph'] == 'X'], 3 * 2 * 3)  # F B W


if __name__ == '__main__':
  tf.test.main()
