"""Profiles chosen training steps with the TensorFlow profiler, for TensorBoard's Profile tab."""

from __future__ import annotations

import contextlib
from typing import Iterator

from absl import logging
import tensorflow as tf

__all__ = ['Profiler']


class Profiler:
  """Profiles the training steps first..last into a TensorBoard log directory.

  tf.profiler.experimental.start before step `first`, a Trace per step (so
  the Profile tab's step view can tell them apart), stop after step `last`
  or at the latest at ``Stop``. The profile lands in
  ``logdir/plugins/profile/<run>/<host>.xplane.pb``.

  Args:
    logdir: the TensorBoard log directory the profile is written under.
    steps: (first, last) global steps to profile, or None for none.
    enabled: False profiles nothing (a task that is not the chief).
  """

  def __init__(self, logdir: str, steps: tuple[int, int] | None,
               enabled: bool) -> None:
    self._logdir = logdir
    self._first, self._last = steps or (0, -1)
    self._enabled = enabled and steps is not None
    self._running = False

  @contextlib.contextmanager
  def Step(self, step: int) -> Iterator[None]:
    if not self._enabled or not self._first <= step <= self._last:
      yield
      return
    if not self._running:
      tf.profiler.experimental.start(self._logdir)
      self._running = True
      logging.info('Profiling steps %d to %d into %s.', step, self._last,
                   self._logdir)
    with tf.profiler.experimental.Trace('train', step_num=step, _r=1):
      yield
    if step == self._last:
      self.Stop()

  def Stop(self) -> None:
    if self._running:
      self._running = False
      tf.profiler.experimental.stop()
      logging.info('Wrote the profile to %s/plugins/profile.', self._logdir)
