"""Benchmarks of pipelined training and inference steps, and what they are measured against.

* ``python -m tools.benchmark`` (``main``): the flags and the output, over
  ``lib``;
* ``lib``: builds the grid's steps and times them, round by round
  (``TimedRows``, the one measuring loop of both modes);
* ``processes``: ``--devices=processes``, every cell in a worker process of
  its own, and every worker's figures;
* ``baseline``: the single-core baseline in a child process;
* ``predict``: a processes-mode row's step replayed on its measured piece
  costs (``--predict``);
* ``tables``: the result rows as Markdown tables and target checks;
* ``skips`` (``python -m tools.benchmark.skips``): what stash/pop saves
  over tuple carrying, on a Keras U-Net.

The memory model's sizes of a traced step come from the engine's public API
(gpipe_tf.pipeline.introspect.TracedStageBytes).
"""

__all__ = []
