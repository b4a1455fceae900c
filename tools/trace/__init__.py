"""Tools that trace and time real pipelined steps: what each device ran and when, what building a step costs, where its devices wait.

Each command is ``python -m tools.trace.<module>``:

* ``schedule``: a real step's per-device timeline, its measured bubble
  beside the simulated one, a PNG and a Chrome trace;
* ``waits``: where a traced step's devices wait (``schedule --waits``);
* ``worker_profile``: what each local worker ran, op by op
  (``schedule --profile``);
* ``cost``: what building a pipelined step costs as M grows, per execution;
* ``first_step``: where a deep model's first training step goes;
* ``step_ops``: the op counts of built training steps, to compare the
  engine's graphs before and after a refactor;
* ``transformer``: the Transformer stack and training step ``cost`` and
  ``first_step`` build.

They read the engine through its public API (gpipe_tf.pipeline.introspect,
gpipe_tf.pipeline.trace), not its internals.
"""

__all__ = []
