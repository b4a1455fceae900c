"""Where a model runs: devices (logical CPU devices, defaults) and tf.distribute strategies.

Modules: ``devices`` (splitting a CPU into logical devices, default device
lists), ``distribute`` (replica layout, MirroredStrategy and
MultiWorkerMirroredStrategy, cross-replica reductions).
"""
