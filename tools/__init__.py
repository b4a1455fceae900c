"""Command-line tools over the library, grouped by job (run as ``python -m tools.X``).

* ``tools.benchmark``: training and inference steps timed over grids of K,
  M, remat and R, shared-CPU or one process per device, with the memory
  model's and the replayed schedule's predictions (``python -m
  tools.benchmark``; ``tools.benchmark.skips``: stash/pop against carried
  skips);
* ``tools.plan``: K, R, M, schedule, V and remat for D devices within a
  budget (``python -m tools.plan``; ``tools.plan.model_stats``: a model's
  parameters and FLOPs);
* ``tools.trace``: real steps traced and timed (``tools.trace.schedule``,
  ``.waits``, ``.worker_profile``, ``.cost``, ``.first_step``,
  ``.step_ops``);
* ``tools.keras_zoo``: Keras models converted, pipelined and checked against
  Keras's gradients (``python -m tools.keras_zoo``);
* ``tools.export``: a SavedModel for serving (``python -m tools.export``)
  and Keras's model.fit over a pipeline (``tools.export.fit_digits``);
* ``tools.code_lines`` and ``tools.support_doc``: the repository's own
  measures and generated pages.

A package's command is its ``main.py`` (flags and output; run by the
package's ``__main__.py``) over the package's library modules. What the
tools read from the engine goes through its public API,
gpipe_tf.pipeline.introspect (docs/pipeline.md, "What tools read from a
step"), not its internals.
"""

__all__ = []
