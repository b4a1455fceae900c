"""The GPipe engine: partitioning, schedules, micro-batching and the PipeliningLayer."""

from gpipe_tf.pipeline.microbatch import MicroBatchError
from gpipe_tf.pipeline.partition import PartitionError
from gpipe_tf.pipeline.pipelining_layer import PipeliningLayer
from gpipe_tf.pipeline.pipelining_layer import REMAT_POLICIES
