"""Names one unit of pipeline work: a pass of one stage over one micro-batch.

Four kinds of pass exist. A forward F(s, m) runs stage s on micro-batch m. The
backward of (s, m) runs either as one combined pass BW(s, m), or split in two:
B(s, m) computes the gradient with respect to the stage's input (what stage s-1
waits for) and W(s, m) the gradient with respect to the stage's weights (which
nobody waits for, so a schedule may defer it to fill idle time):

    F(s, m) --> F(s+1, m)          forwards flow to later stages
    B(s, m) <-- B(s+1, m)          input gradients flow back
    W(s, m) after B(s, m)          weight gradients hang off the side
    BW(s, m) = B(s, m) then W(s, m), as one pass
    FB(s, m) = F(s, m) then its backward (B, or BW when no W follows), as
               one pass: what ticks.FuseLast makes of the last stage's
               forward and the backward that directly follows it

This module deliberately knows nothing of devices or time.
"""

import dataclasses
import numbers

from gpipe_tf import errors

__all__ = ['Action', 'B', 'BW', 'CheckIndex', 'F', 'FB', 'KINDS',
           'ScheduleError', 'W']

F = 'F'
B = 'B'
W = 'W'
BW = 'BW'
FB = 'FB'
KINDS = (F, B, W, BW)  # What schedules are written in (library, CSV).
_PASS_KINDS = (FB,)  # Made only by passes over a schedule (ticks.FuseLast).


class ScheduleError(errors.Error, ValueError):
  """A pipeline schedule is malformed, incomplete or deadlocks; the message says where."""

  def __init__(self, message: str, device: int | None = None,
               position: int | None = None):
    """Creates the error.

    Args:
      message: what is wrong and what to change.
      device: the device whose action list holds the bad step, if there is one.
      position: the bad step's 0-based index in that device's list.
    """
    super().__init__(message)
    self.device = device
    self.position = position


def CheckIndex(value: int, name: str, minimum: int = 0) -> None:
  """Raises ScheduleError unless value is an int (not a bool) >= minimum."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or
      value < minimum):
    raise ScheduleError(f'{name} must be an int >= {minimum}, got {value!r}')


@dataclasses.dataclass(frozen=True, order=True)
class Action:
  """One pass of one stage over one micro-batch.

  Actions are immutable, hashable and ordered (by kind, then stage, then
  micro-batch), so they serve as dict keys and sort deterministically.

  Attributes:
    kind: F, B, W, BW or FB (see the module docstring).
    stage: s, the 0-based pipeline stage.
    micro_batch: m, the 0-based micro-batch.
  """
  kind: str
  stage: int
  micro_batch: int

  def __post_init__(self):
    if self.kind not in KINDS + _PASS_KINDS:
      raise ScheduleError(f'Action kind must be one of {", ".join(KINDS)}; '
                          f'got {self.kind!r}')
    CheckIndex(self.stage, 'Action stage')
    CheckIndex(self.micro_batch, 'Action micro_batch')

  @property
  def label(self) -> str:
    """Kind and micro-batch, e.g. 'F3' or 'BW3': the cell text of a grid row.

    A grid row is one device, so when every device holds a single stage the
    stage is implied by the row; otherwise use stage_label.
    """
    return f'{self.kind}{self.micro_batch}'

  @property
  def stage_label(self) -> str:
    """Kind, micro-batch and stage, e.g. 'F3s1' for F(stage=1, micro_batch=3)."""
    return f'{self.label}s{self.stage}'

  def __str__(self) -> str:
    return f'{self.kind}(stage={self.stage}, micro_batch={self.micro_batch})'
