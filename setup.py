"""Installs gpipe_tf: GPipe pipeline-parallel training for TensorFlow 2."""

import setuptools

setuptools.setup(
    name='gpipe_tf',
    version='0.2.0',
    description=('GPipe (micro-batch pipeline parallelism) for TensorFlow 2, '
                 'with Lingvo-style Params, layers and experiments.'),
    packages=setuptools.find_packages(include=['gpipe_tf', 'gpipe_tf.*',
                                               'params', 'params.*']),
    python_requires='>=3.10',
    install_requires=[
        'tensorflow>=2.16',
        'tensorboard>=2.16',  # tf.summary needs it since TF 2.21.
        'tensorflow-datasets>=4.9',
        'importlib_resources',  # Missing dependency of tensorflow-datasets.
        'absl-py',
        'numpy',
        'scikit-learn',  # The bundled handwritten digits (offline data).
        'sentencepiece',  # Subword vocabularies built from training text.
        'sacrebleu',  # BLEU of translation experiments.
    ],
    extras_require={
        # The tools' tests draw with matplotlib (tools.trace.schedule --out).
        # pytest-xdist: the suite runs in two processes (-n 2), one per core.
        # keras-hub: tools.keras_zoo's GPT-2 and BERT (tiny configs, no
        # downloads; 0.32 installs beside tensorflow 2.21 and keras 3.15).
        'test': ['pytest>=7', 'pytest-xdist', 'matplotlib', 'keras-hub'],
        'tools': ['matplotlib'],
    },
)
