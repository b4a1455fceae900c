"""Pipeline schedules as data: which pass each device runs when, checked and simulated.

Pure Python; importing it does not import TensorFlow.

    from gpipe_tf.pipeline import schedule
    s = schedule.Make('1f1b', num_devices=4, num_micro_batches=8)
    print(s.ToAscii())
    schedule.Simulate(s).bubble_fraction
"""

from gpipe_tf.pipeline.schedule.action import Action
from gpipe_tf.pipeline.schedule.action import B
from gpipe_tf.pipeline.schedule.action import BW
from gpipe_tf.pipeline.schedule.action import F
from gpipe_tf.pipeline.schedule.action import FB
from gpipe_tf.pipeline.schedule.action import ScheduleError
from gpipe_tf.pipeline.schedule.action import W
from gpipe_tf.pipeline.schedule.csv_io import Dump
from gpipe_tf.pipeline.schedule.csv_io import DumpTorch
from gpipe_tf.pipeline.schedule.csv_io import Load
from gpipe_tf.pipeline.schedule.library import Make
from gpipe_tf.pipeline.schedule.library import Names
from gpipe_tf.pipeline.schedule.library import Register
from gpipe_tf.pipeline.schedule.simulate import SimResult
from gpipe_tf.pipeline.schedule.simulate import Simulate
from gpipe_tf.pipeline.schedule.synthesize import MemoryBudgetError
from gpipe_tf.pipeline.schedule.synthesize import Synthesize
from gpipe_tf.pipeline.schedule.table import Schedule
from gpipe_tf.pipeline.schedule.vshape import V_SHAPED
from gpipe_tf.pipeline.schedule.vshape import VStageDevices  # Registers zbv, dualpipe_v.

__all__ = ['Action', 'B', 'BW', 'Dump', 'DumpTorch', 'F', 'FB', 'Load', 'Make',
           'MemoryBudgetError', 'Names', 'Register', 'Schedule',
           'ScheduleError', 'SimResult', 'Simulate', 'Synthesize', 'V_SHAPED',
           'VStageDevices', 'W']
