"""Data: input generators declared by Params, on tf.data and tensorflow-datasets.

Modules: ``inputs`` (BaseInputGenerator, in-memory TFDS images, synthetic
inputs), ``streaming_inputs`` (TFDS images of any size, streamed with exact
resume), ``text_inputs`` (parallel text and translation batches),
``synthetic_text`` (synthetic token and translation batches), ``vocab``
(sentencepiece vocabularies; the only home of the special token ids),
``datasets`` (writing offline data sets as TFDS datasets).
"""

__all__ = []
