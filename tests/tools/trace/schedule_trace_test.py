"""tools/trace/schedule.py: a real traced step of any schedule, its report, PNG and Chrome trace."""

import json
import os
import subprocess
import sys

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.pipeline import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import trace as trace_lib  # pylint: disable=g-import-not-at-top
from tools.trace import schedule as schedule_trace  # pylint: disable=g-import-not-at-top

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
        traced = schedule_trace.Trace(name, k, m, v, **_TINY)
        timeline, devices, busy = (traced.timeline, traced.devices,
                                   traced.cores_busy)
        self.assertIsNone(traced.workers_busy)
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
        device_busy = schedule_trace.DeviceBusy(timeline)
        self.assertLen(device_busy, k)
        self.assertAllClose(1 - sum(device_busy) / k,
                            timeline.BubbleFraction(), atol=1e-9)
        self.assertIn('; devices busy (trace) ' + ' / '.join(
            f'{100 * b:.0f}%' for b in device_busy) + '; cores busy', report)
        self.assertIn('simulated (unit-time F, B, W) '
                      f'{schedule_lib.Simulate(expected).bubble_fraction:.2f}',
                      report)

  def testDeviceBusyIsTheUnionOfEachDevicesActions(self):
    sched = schedule_lib.Make('1f1b', 2, 1)  # dev 0: F BW; dev 1: F BW.
    acts = [a for row in sched.actions for a in row]
    # Device 0's actions overlap (0-2, 1-3): busy 3 of the makespan 4.
    spans = {(0, 'F'): (0, 2), (0, 'BW'): (1, 3), (1, 'F'): (2, 3),
             (1, 'BW'): (3, 4)}
    timeline = trace_lib.Timeline(
        sched, acts, [spans[a.stage, a.kind][0] for a in acts],
        [spans[a.stage, a.kind][1] for a in acts])
    self.assertEqual(schedule_trace.DeviceBusy(timeline), [0.75, 0.5])
    self.assertAllClose(timeline.BubbleFraction(), 1 - 1.25 / 2)
    report = schedule_trace.Report(timeline, 0.5, [0.9, 0.4])
    self.assertTrue(report.endswith(
        '; devices busy (trace) 75% / 50%; cores busy 50% of '
        f'{schedule_trace._Cores()}; worker processes busy (CPU time / '  # pylint: disable=protected-access
        'wall time) 90% / 40%'), report)

  def testMainDrawsAHandWrittenSchedule(self):
    # The whole tool in a process of its own (it splits the CPU itself): a
    # CSV schedule sets K and M; the PNG and the Chrome trace are written.
    tmp = self.get_temp_dir()
    csv_path = os.path.join(tmp, 'zb.csv')
    schedule_lib.Dump(schedule_lib.Make('zb_h1', 2, 3), csv_path)
    png, trace = os.path.join(tmp, 'zb.png'), os.path.join(tmp, 'zb.json')
    out = subprocess.run(
        [sys.executable, '-m', 'tools.trace.schedule',
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
