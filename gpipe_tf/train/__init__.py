"""How a model is trained: the train/eval loop, crash-safe checkpoints and warm starts.

Modules: ``loop`` (``train_and_evaluate``, the library entry point the
trainer binary calls), ``checkpoints`` (atomic saves, restore of the newest
readable checkpoint), ``warm_start`` (initialising from another run).
"""
