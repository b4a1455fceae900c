"""Replays per-device action lists in list order, each as early as its inputs allow, and draws it.

The one timing engine behind Schedule.Validate (does it deadlock?),
Schedule.Clocks and Order (the unit-time grid) and Simulate (real durations).
Each device runs its own list front to back, one action at a time; an action
starts when the device is free and every data dependency has ended (plus a
communication delay when the dependency ran on another device). When no
device can start its next action the replay stops and reports how far each
device got, which is how a deadlock is found.

This module deliberately does not check the lists: it replays whatever it is
given, so that error messages can draw how far a bad schedule gets.
"""

from collections.abc import Callable, Iterable, Sequence
import dataclasses

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import ascii as ascii_lib

__all__ = ['Replay', 'Replayed']

Action = action_lib.Action


@dataclasses.dataclass
class Replayed:
  """When each replayed action started and ended, and how far each device got.

  Attributes:
    start: start time of every action that ran.
    end: end time of every action that ran.
    device: the device (list index) each action ran on.
    reached: per device, how many of its actions ran; a device with actions
      left over is stuck on actions[d][reached[d]].
  """
  start: dict[Action, float]
  end: dict[Action, float]
  device: dict[Action, int]
  reached: list[int]

  def Stuck(self, actions: Sequence[Sequence[Action]]) -> list[int]:
    """Returns the devices that did not run their whole list."""
    return [d for d, acts in enumerate(actions) if self.reached[d] < len(acts)]

  @property
  def makespan(self) -> float:
    """End time of the last action to end (0 if nothing ran)."""
    return max(self.end.values(), default=0.0)

  def Draw(self, num_devices: int, stage_labels: bool,
           mark: tuple[int, Action] | None = None) -> str:
    """Draws a unit-time replay: 'dev d: F0 F1 .. BW0 BW0', one column per tick.

    Args:
      num_devices: K, the number of rows.
      stage_labels: label cells 'F3s1' (Action.stage_label), else 'F3'.
      mark: (device, action) to draw as '!label' where that device stopped:
        the bad step of an error message.

    Returns:
      K lines (ascii_lib.Grid); '..' is an idle tick.
    """
    label = (lambda a: a.stage_label) if stage_labels else (lambda a: a.label)
    rows = [['..'] * int(self.makespan) for _ in range(num_devices)]
    for act, start in self.start.items():
      for t in range(int(start), int(self.end[act])):
        rows[self.device[act]][t] = label(act)
    if mark:
      d, act = mark
      tick = int(max((self.end[a] for a in self.end if self.device[a] == d),
                     default=0))
      for row in rows:
        row.extend(['..'] * (tick + 1 - len(row)))
      rows[d][tick] = '!' + label(act)
    return ascii_lib.Grid(rows)


def Replay(actions: Sequence[Sequence[Action]],
           dependencies: Callable[[Action], Iterable[Action]],
           duration: Callable[[Action], float],
           comm_time: float = 0.0) -> Replayed:
  """Replays device lists, each action as soon as its device and inputs are ready.

  Args:
    actions: actions[d] is device d's ordered list.
    dependencies: the data dependencies of an action.
    duration: how long an action takes.
    comm_time: added to a dependency's end time when it ran on another device.

  Returns:
    The Replayed times. It is partial (Stuck() is not empty) when some device
    waits for a dependency that never ends.
  """
  result = Replayed(start={}, end={}, device={}, reached=[0] * len(actions))
  free = [0.0] * len(actions)
  progressed = True
  while progressed:
    progressed = False
    for d, acts in enumerate(actions):
      while result.reached[d] < len(acts):
        act = acts[result.reached[d]]
        deps = list(dependencies(act))
        if any(dep not in result.end for dep in deps):
          break
        ready = [result.end[dep] + (comm_time if result.device[dep] != d else 0.0)
                 for dep in deps]
        begin = max([free[d]] + ready)
        result.start[act] = begin
        result.end[act] = free[d] = begin + duration(act)
        result.device[act] = d
        result.reached[d] += 1
        progressed = True
  return result
