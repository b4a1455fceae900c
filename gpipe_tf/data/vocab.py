"""Subword vocabularies: sentencepiece models trained offline from text, with fixed special ids.

A Vocabulary maps text to int ids and back through a sentencepiece model (BPE
or unigram). Every model this module trains has the same special ids::

  id 0  <pad>   padding (PAD_ID; paddings tensors mark it 1.0)
  id 1  <s>     beginning of a target sequence (BOS_ID)
  id 2  </s>    end of a sequence (EOS_ID)
  id 3  <unk>   any piece not in the vocabulary (UNK_ID)
  id 4..        target-language tokens '<2en>', '<2de>', ... (in the order
                given to Build), then the learned pieces

Language tokens are sentencepiece user-defined symbols: they are never split,
and ``LanguageId('de')`` gives the id of '<2de>'. A multilingual model is told
the language to translate into by a '<2xx>' token at the start of the source
(Johnson et al., 2017; the GPipe multilingual experiments use it too).

Training is deterministic: the same text (same files, same order) and the same
arguments give a byte-identical model file, whatever the paths. Encode does not
add BOS or EOS: the input generator decides where they go.

It deliberately does NOT download or bundle pretrained vocabularies.
"""

from __future__ import annotations

import io
import os
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm
import tensorflow as tf

from gpipe_tf import errors

__all__ = ['BOS_ID', 'EOS_ID', 'PAD_ID', 'UNK_ID', 'Vocabulary',
           'VocabularyError', 'LanguageToken']

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
MODEL_SUFFIX = '.model'
MODEL_TYPES = ('bpe', 'unigram')


class VocabularyError(errors.Error, ValueError):
  """A vocabulary that cannot be built or loaded (bad arguments, no text)."""


def LanguageToken(language: str) -> str:
  """The target-language token of `language`: 'de' -> '<2de>'."""
  if not language or any(c.isspace() or c in '<>' for c in language):
    raise VocabularyError(
        f'Language code {language!r} must be non-empty, without spaces or '
        "'<', '>' (e.g. 'en', 'de', 'pt_br').")
  return f'<2{language}>'


class Vocabulary:
  """A sentencepiece model with the module's special ids.

  ``Vocabulary(model_path)`` loads a model file; ``Vocabulary.Build(...)``
  trains one from text files and returns it loaded. A Vocabulary is immutable.
  """

  @classmethod
  def Build(cls, text_files: Sequence[str], vocab_size: int,
            model_prefix: str, language_tokens: Sequence[str] = (),
            model_type: str = 'bpe', character_coverage: float = 1.0,
            max_sentences: int = 0) -> 'Vocabulary':
    """Trains a model on the lines of `text_files`; writes model_prefix.model.

    The file is written atomically (a temporary file renamed into place), so a
    reader never sees half a model and two concurrent builders of the same
    text leave one valid, identical file.

    Args:
      text_files: text files, one sentence per line (UTF-8), read in the order
        given; blank lines are skipped.
      vocab_size: the largest vocabulary wanted, specials and language tokens
        included. A small corpus may give fewer pieces (`vocab_size` of the
        result tells); it never gives more.
      model_prefix: path without suffix; its directory is created.
      language_tokens: language codes ('en', 'de') whose '<2xx>' tokens get
        the ids right after the specials, in this order.
      model_type: 'bpe' or 'unigram'.
      character_coverage: fraction of characters the model must cover; the
        rest map to <unk>. 1.0 suits small alphabets; ~0.9995 for CJK.
      max_sentences: train on the first this many lines only; 0 = all lines.

    Returns:
      The trained Vocabulary, loaded from model_prefix.model.

    Raises:
      VocabularyError: bad arguments, a missing file, or no text at all.
    """
    if model_type not in MODEL_TYPES:
      raise VocabularyError(
          f'model_type must be one of {MODEL_TYPES}, got {model_type!r}.')
    symbols = [LanguageToken(lang) for lang in language_tokens]
    if len(set(symbols)) != len(symbols):
      raise VocabularyError(f'Duplicate language_tokens: {language_tokens}.')
    minimum = UNK_ID + 1 + len(symbols) + 1
    if not isinstance(vocab_size, int) or vocab_size < minimum:
      raise VocabularyError(
          f'vocab_size must be an int >= {minimum} (4 specials, '
          f'{len(symbols)} language tokens, one piece), got {vocab_size!r}.')
    if isinstance(text_files, str):
      text_files = [text_files]
    missing = [f for f in text_files if not os.path.isfile(f)]
    if missing or not text_files:
      raise VocabularyError(
          f'Cannot build a vocabulary: text files {missing or "(none)"} do '
          'not exist.')
    lines = list(_Lines(text_files, max_sentences))
    if not lines:
      raise VocabularyError(f'The files {list(text_files)} hold no text.')
    model = io.BytesIO()
    try:
      # Deterministic: one thread, every sentence, in file order; the model
      # bytes carry no path (no input / model_prefix fields are set).
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(lines), model_writer=model,
          vocab_size=vocab_size, model_type=model_type,
          character_coverage=character_coverage,
          pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
          user_defined_symbols=symbols, hard_vocab_limit=False,
          num_threads=1, input_sentence_size=0,
          shuffle_input_sentence=False, minloglevel=2)
    except RuntimeError as e:
      raise VocabularyError(f'sentencepiece training failed: {e}') from e
    path = model_prefix + MODEL_SUFFIX
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.vocab-', dir=directory)
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(model.getvalue())
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise
    return cls(path)

  def __init__(self, model_path: str) -> None:
    """Loads a sentencepiece model file.

    Raises:
      VocabularyError: no such file, or its special ids are not the module's
        (a model trained elsewhere with other ids).
    """
    if not os.path.isfile(model_path):
      raise VocabularyError(
          f'No vocabulary model at {model_path}; build one with '
          'Vocabulary.Build(text_files, vocab_size, model_prefix).')
    self._model_path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)
    ids = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(),
           self._sp.unk_id())
    if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
      raise VocabularyError(
          f'{model_path} has special ids (pad, bos, eos, unk) = {ids}; this '
          f'project needs {(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}. Rebuild it with '
          'Vocabulary.Build.')
    self._languages = {}
    for i in range(self._sp.get_piece_size()):
      piece = self._sp.id_to_piece(i)
      if (self._sp.is_control(i) or self._sp.is_unknown(i) or
          not (piece.startswith('<2') and piece.endswith('>'))):
        continue
      self._languages[piece[2:-1]] = i
    self._skip_on_decode = {PAD_ID, BOS_ID, *self._languages.values()}

  @property
  def model_path(self) -> str:
    return self._model_path

  @property
  def vocab_size(self) -> int:
    """Number of ids: every id is in [0, vocab_size)."""
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def bos_id(self) -> int:
    return BOS_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  @property
  def languages(self) -> list[str]:
    """Language codes that have a '<2xx>' token, in id order."""
    return sorted(self._languages, key=self._languages.get)

  def LanguageId(self, language: str) -> int:
    """Id of the '<2xx>' token of `language`.

    Raises:
      VocabularyError: the model has no token for `language`.
    """
    if language not in self._languages:
      raise VocabularyError(
          f'{self._model_path} has no token {LanguageToken(language)}; its '
          f'languages are {self.languages}. Rebuild the vocabulary with '
          f'language_tokens including {language!r}.')
    return self._languages[language]

  def Encode(self, text: str) -> list[int]:
    """Ids of the pieces of `text` (no BOS/EOS added)."""
    return self._sp.encode(text)

  def Decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; pad, BOS and '<2xx>' tokens dropped.

    Accepts a list, a numpy array or a 1-D tensor of ids.
    """
    if isinstance(ids, tf.Tensor):
      ids = ids.numpy()
    kept = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in self._skip_on_decode:
        kept.append(i)
    return self._sp.decode(kept)

  def EncodeTf(self, texts: tf.Tensor) -> tf.RaggedTensor:
    """Graph-compatible Encode of a [N] string tensor: a [N, None] int32 ragged.

    Runs the sentencepiece encoder in Python through ``tf.py_function``: it
    works inside tf.data.Dataset.map and tf.function, holds the GIL while it
    runs, and cannot be serialised into a SavedModel. Input generators of this
    project tokenise at load time instead (gpipe_tf.data.text_inputs).
    """
    texts = tf.convert_to_tensor(texts, tf.string)

    def _Encode(batch):
      pieces = self._sp.encode([t.decode('utf-8') for t in batch.numpy()])
      lengths = [len(p) for p in pieces]
      flat = [i for p in pieces for i in p]
      return (tf.constant(flat, tf.int32, shape=[len(flat)]),
              tf.constant(lengths, tf.int64, shape=[len(lengths)]))

    flat, lengths = tf.py_function(_Encode, [texts], (tf.int32, tf.int64))
    flat.set_shape([None])
    lengths.set_shape(texts.shape)
    return tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False)


def _Lines(text_files: Sequence[str], limit: int) -> Iterable[str]:
  """Non-blank lines of the files in order, at most `limit` (0: no limit)."""
  count = 0
  for path in text_files:
    with open(path, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if not line:
          continue
        yield line
        count += 1
        if limit and count >= limit:
          return
