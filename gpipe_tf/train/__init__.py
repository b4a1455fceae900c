"""How a model is trained: the train/eval loop, crash-safe checkpoints and warm starts.

Modules: ``loop`` (``train_and_evaluate``, the library entry point the
trainer binary calls), ``runner`` (a logdir's task, optimizer and
checkpointer, its train and eval steps and the loops that run them),
``profiler`` (TensorFlow profiles of chosen steps), ``checkpoints`` (atomic
saves, restore of the newest readable checkpoint), ``warm_start``
(initialising from another run), ``keras_model`` (``model.fit`` over a
pipeline).
"""

__all__ = []
