"""What is trained: tasks (network + loss + metrics), optimizers and learning-rate schedules.

Modules: ``base_task`` (BaseTask), ``classification`` (ClassificationTask),
``sequence`` (LanguageModelTask, TranslationTask; their synthetic
inputs are in gpipe_tf.data.synthetic_text), ``metrics`` (BLEU and
accuracies), ``optimizers`` (Keras optimizers declared by Params),
``lr_schedules`` (learning-rate schedules declared by Params).
"""

from gpipe_tf.tasks.base_task import BaseTask
from gpipe_tf.tasks.base_task import BatchSize
from gpipe_tf.tasks.base_task import Metrics
from gpipe_tf.tasks.classification import ClassificationTask
from gpipe_tf.tasks.sequence import LanguageModelTask
from gpipe_tf.tasks.sequence import TranslationTask

__all__ = ['BaseTask', 'BatchSize', 'ClassificationTask', 'LanguageModelTask',
           'Metrics', 'TranslationTask']
