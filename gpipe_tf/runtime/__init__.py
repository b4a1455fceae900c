"""Where a model runs: devices (logical CPU devices, defaults) and tf.distribute strategies.

Modules: ``devices`` (splitting a CPU into logical devices, default device
lists), ``distribute`` (the replica layout, MirroredStrategy, splitting
batches, cross-replica reductions), ``cluster`` (TF_CONFIG clusters,
MultiWorkerMirroredStrategy, the chief and the other tasks).
"""

__all__ = []
