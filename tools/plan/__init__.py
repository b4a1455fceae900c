"""Tools that size and plan a pipeline before it runs: K, R, M, schedule, V and remat for D devices within a memory budget.

* ``python -m tools.plan`` (``main``): the planner's command, a thin absl
  main over ``lib``;
* ``lib``: the estimates (throughput and per-device memory of layouts, from
  FPropMeta and the schedule simulator) and their ranking, pure Python;
* ``trace``: what each layer's backward keeps, read from a traced step
  (``--activations=traced``, through gpipe_tf.pipeline.introspect);
* ``synthesize``: ``--synthesize`` and ``--synthesize_table``;
* ``block``: the Transformer block of ``--synthesize_table`` at a chosen
  size (bytes traced, times scaled by FLOPs from the measured benchmark
  block);
* ``check``: the estimates beside measured tools.benchmark rows
  (``--compare``);
* ``model_stats`` (``python -m tools.plan.model_stats``): a registered
  model's parameters, memory and FLOPs, without building it.
"""

__all__ = []
