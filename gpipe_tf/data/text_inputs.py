"""Parallel text for translation: tokenised sentence pairs in length buckets, seeded and resumable.

``ParallelTextInput`` reads sentence pairs from a folder of text files or from
a TFDS translation dataset, tokenises them once with a subword vocabulary
(gpipe_tf.data.vocab) and serves batches for ``TranslationTask``::

  src_ids       int32 [B, L]  <2xx> source pieces </s>  (<2xx>: target language)
  src_paddings  float32 [B, L]  1.0 at padded positions
  tgt_ids       int32 [B, L]  <s> target pieces         (decoder input)
  tgt_labels    int32 [B, L]  target pieces </s>        (what to predict)
  tgt_paddings  float32 [B, L]

Padded positions hold id 0 (<pad>). L is max_length without bucketing; with
bucketing it is the padded length of the batch's bucket (below).

Folder layout: one sentence per line, line i of the two files of a pair are
translations of each other::

  folder/train.en-de.en   folder/train.en-de.de    split 'train', pair en-de
  folder/test.en-de.en    folder/test.en-de.de
  folder/train.en-fr.en   folder/train.en-fr.fr    a second pair: multilingual
  folder/vocab.model      the vocabulary (default place; built if missing)

The language pair 'de-en' reads the en-de files the other way round when no
de-en files exist.

Order and resume. Examples live in host memory and are visited epoch by epoch
in the order drawn statelessly from (seed, epoch) (BaseInputGenerator). Without
bucketing the stream is exactly the base class's (batches may straddle
epochs). With bucketing, each epoch's order is grouped by
``tf.data.Dataset.bucket_by_sequence_length``: an example joins the bucket of
its length (max of source and target length), a bucket is emitted as a batch
the moment it holds its batch size, and at the end of the epoch the partial
buckets are emitted in bucket order (or dropped with drop_remainder); no batch
straddles two epochs. Guarantee: the stream is a pure function of the Params,
the text and the vocabulary, and ``GetDataset(skip_batches=k)`` equals
``GetDataset()`` with its first k batches dropped, element for element. The
number of batches in an epoch does not depend on the order (per bucket it is
ceil or floor of count / batch size), so resuming jumps straight to the right
epoch and replays only that epoch's grouping of (index, length) pairs; no
skipped batch is gathered or padded.

Shapes. Without bucketing every batch is [batch_size, max_length]. With it,
a batch's shape is [bucket batch size, bucket padded length] (the dataset's
element_spec says [None, None]); a tf.function fed eager batches traces once
per new shape unless it relaxes shapes (the trainer's reduce_retracing does so
from the second shape on). A pipelined model needs every batch to hold at least
num_micro_batches examples: keep drop_remainder on when training with buckets.

It deliberately does NOT stream corpora larger than memory, and does NOT
download: TFDS datasets must already be prepared in data_dir.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from gpipe_tf import errors
from gpipe_tf import hyperparams
from gpipe_tf.data import inputs
from gpipe_tf.data import vocab as vocab_lib

__all__ = ['ParallelTextInput', 'WriteReversalCorpus', 'ReversalTarget',
           'CorpusExistsError']

DatasetNotFoundError = inputs.DatasetNotFoundError
InputConfigError = inputs.InputConfigError
DEFAULT_VOCAB_FILE = 'vocab.model'
_PAIR_FILE = re.compile(r'^(?P<split>[^.]+)\.(?P<src>[^.-]+)-(?P<tgt>[^.-]+)'
                        r'\.(?P<lang>[^.-]+)$')


class ParallelTextInput(inputs.BaseInputGenerator):
  """Translation batches from a folder of parallel text or a TFDS dataset.

  See the module docstring for the output features, the folder layout and the
  order / resume guarantee. Set exactly one of ``folder`` and ``tfds_name``.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('folder', None,
             'Folder of parallel text files {split}.{src}-{tgt}.{lang}.')
    p.Define('tfds_name', None,
             "TFDS translation dataset, e.g. 'wmt14_translate/de-en'; its "
             'features are keyed by language code. Read with download=False.')
    p.Define('data_dir', None,
             'TFDS data directory (with tfds_name); None: the TFDS default.')
    p.Define('split', 'train', "Split: 'train', 'test', ... (folder: the file "
             "prefix; TFDS: any split string such as 'train[:1%]').")
    p.Define('language_pairs', None,
             "Translation directions 'src-tgt', e.g. ['en-de', 'en-fr']. "
             'None: every pair of the split found in the folder (folder), or '
             "the dataset's supervised direction (TFDS).")
    p.Define('vocab_path', None,
             'sentencepiece model file. None: folder/vocab.model (folder '
             'only).')
    p.Define('build_vocab', False,
             'If vocab_path is missing, build it from the vocab_split text '
             '(every language of every pair found in it, files in name '
             'order) with '
             "'<2xx>' tokens for all those languages. False: missing -> error.")
    p.Define('vocab_split', 'train', 'Split whose text the vocabulary learns.')
    p.Define('vocab_size', 8000, 'Largest vocabulary to build (building only).')
    p.Define('vocab_model_type', 'bpe', "'bpe' or 'unigram' (building only).")
    p.Define('max_length', 64,
             'Longest src_ids and tgt_ids, in tokens (source: <2xx> and </s> '
             'included; target: <s> included).')
    p.Define('truncate', False,
             'Longer pairs: True truncates them, False drops them.')
    p.Define('target_language_token', True,
             "Start src_ids with the target language's '<2xx>' token.")
    p.Define('bucket_boundaries', [],
             'Increasing length bounds: bucket i holds lengths in '
             '[b[i-1], b[i]) and is padded to b[i] - 1; the last bucket '
             '(>= b[-1]) to max_length. Empty: no bucketing, pad to '
             'max_length.')
    p.Define('bucket_batch_sizes', None,
             'Batch size of each bucket (len(bucket_boundaries) + 1 values). '
             'None: tokens_per_batch if set, else batch_size for all.')
    p.Define('tokens_per_batch', 0,
             'If > 0 (and bucket_batch_sizes None): bucket batch size = '
             'max(1, tokens_per_batch // padded length).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self._params
    if (p.folder is None) == (p.tfds_name is None):
      raise InputConfigError(f'{p.name}: set exactly one of folder and '
                             f'tfds_name (got {p.folder!r}, {p.tfds_name!r}).')
    if p.vocab_path is None and p.folder is None:
      raise InputConfigError(f'{p.name}: set vocab_path (no folder to keep '
                             'the vocabulary in).')
    if p.vocab_path is not None and not p.vocab_path.endswith(
        vocab_lib.MODEL_SUFFIX):
      raise InputConfigError(f'{p.name}: vocab_path must end in '
                             f'{vocab_lib.MODEL_SUFFIX}, got {p.vocab_path!r}.')
    if not isinstance(p.max_length, int) or p.max_length < 3:
      raise InputConfigError(
          f'{p.name}: max_length must be an int >= 3, got {p.max_length!r}.')
    self._pairs = None if p.language_pairs is None else [
        _ParsePair(pair, p.name) for pair in p.language_pairs]
    self._boundaries = list(p.bucket_boundaries or [])
    b = self._boundaries
    if b and (any(not isinstance(x, int) for x in b) or b[0] < 2 or
              any(x >= y for x, y in zip(b, b[1:])) or
              b[-1] > p.max_length + 1):
      raise InputConfigError(
          f'{p.name}: bucket_boundaries must be increasing ints in [2, '
          f'max_length + 1 = {p.max_length + 1}], got {b}.')
    self._padded_lengths = [x - 1 for x in b] + [p.max_length]
    self._bucket_sizes = self._BucketBatchSizes()
    self._vocab: vocab_lib.Vocabulary | None = None

  # ---- Public ---------------------------------------------------------------
  @property
  def vocab(self) -> vocab_lib.Vocabulary:
    """The vocabulary (built first if missing and build_vocab allows)."""
    if self._vocab is None:
      self._vocab = self._LoadVocab()
    return self._vocab

  @property
  def bucket_batch_sizes(self) -> list[int]:
    """Batch size of each bucket (one value without bucketing)."""
    return list(self._bucket_sizes)

  def BatchesPerEpoch(self) -> int:
    """Batches per epoch: bucketed, exact and the same every epoch; otherwise
    N / batch_size rounded as drop_remainder says (batches straddle epochs)."""
    self._EnsureLoaded()
    p = self._params
    if not self._boundaries:
      rounding = np.floor if p.drop_remainder else np.ceil
      return int(rounding(self._num_examples / p.batch_size))
    lengths = self._examples['length'].numpy()
    counts = np.bincount(np.searchsorted(self._boundaries, lengths,
                                         side='right'),
                         minlength=len(self._bucket_sizes))
    sizes = np.array(self._bucket_sizes)
    if p.drop_remainder:
      return int(np.sum(counts // sizes))
    return int(np.sum(-(-counts // sizes)))

  def GetDataset(self, skip_batches: int = 0) -> tf.data.Dataset:
    """The stream of batches from batch `skip_batches` on (module docstring)."""
    if not self._boundaries:
      return super().GetDataset(skip_batches)
    if not isinstance(skip_batches, int) or skip_batches < 0:
      raise ValueError(
          f'skip_batches must be a non-negative int, got {skip_batches!r}.')
    self._EnsureLoaded()
    p = self._params
    per_epoch = self.BatchesPerEpoch()
    if per_epoch == 0:
      raise InputConfigError(
          f'{p.name}: no bucket fills a batch of {self._bucket_sizes} from '
          f'{self._num_examples} examples with drop_remainder; lower the '
          'bucket batch sizes or set drop_remainder False.')
    first_epoch, skip_in_first = divmod(skip_batches, per_epoch)
    if p.repeat:
      epochs = tf.data.Dataset.counter(first_epoch)
    else:
      epochs = tf.data.Dataset.range(first_epoch, 1)
    lengths = self._examples['length']
    boundaries = self._boundaries
    sizes = self._bucket_sizes

    @tf.autograph.experimental.do_not_convert
    def _EpochBatches(epoch):
      order = self._EpochOrder(epoch)
      ds = tf.data.Dataset.from_tensor_slices(
          {'index': order, 'length': tf.gather(lengths, order)})
      ds = ds.bucket_by_sequence_length(
          lambda x: x['length'], boundaries, sizes,
          drop_remainder=p.drop_remainder)
      return ds.skip(tf.where(epoch == first_epoch,
                              tf.constant(skip_in_first, tf.int64), 0))

    padded = tf.constant(self._padded_lengths, tf.int32)
    examples = self._examples

    @tf.autograph.experimental.do_not_convert
    def _Batch(batch):
      bucket = tf.searchsorted(tf.constant(boundaries, tf.int32),
                               tf.reduce_max(batch['length'])[None],
                               side='right')[0]
      gathered = {k: tf.gather(v, batch['index']) for k, v in examples.items()}
      return self._Features(gathered, padded[bucket])

    ds = epochs.flat_map(_EpochBatches)
    ds = ds.map(_Batch, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)

  # ---- BaseInputGenerator hooks ---------------------------------------------
  def _LoadExamples(self) -> dict[str, Any]:
    p = self._params
    vocab = self.vocab
    src_rows, tgt_rows = [], []
    for (src_lang, tgt_lang), (sources, targets) in self._ReadPairs(
        p.split, self._pairs).items():
      prefix = [vocab.LanguageId(tgt_lang)] if p.target_language_token else []
      for source, target in zip(sources, targets):
        src = prefix + vocab.Encode(source)
        tgt = vocab.Encode(target)
        if len(src) + 1 > p.max_length or len(tgt) + 1 > p.max_length:
          if not p.truncate:
            continue
          src = src[:p.max_length - 1]
          tgt = tgt[:p.max_length - 1]
        src_rows.append(src + [vocab.eos_id])
        tgt_rows.append(tgt)
    if not src_rows:
      raise InputConfigError(
          f'{p.name}: no sentence pair of split {p.split!r} fits max_length '
          f'{p.max_length}; raise max_length or set truncate.')
    src_length = np.array([len(r) for r in src_rows], np.int32)
    tgt_length = np.array([len(r) + 1 for r in tgt_rows], np.int32)
    return {'src': _PadRows(src_rows, p.max_length),
            'src_length': src_length,
            'tgt': _PadRows(tgt_rows, p.max_length),
            'tgt_length': tgt_length,
            'length': np.maximum(src_length, tgt_length)}

  def _PreprocessBatch(self, batch: dict[str, tf.Tensor],
                       seed: tf.Tensor) -> dict[str, tf.Tensor]:
    del seed
    return self._Features(batch, self._params.max_length)

  # ---- Internals ------------------------------------------------------------
  def _Features(self, batch: dict[str, tf.Tensor], length) -> dict[str,
                                                                   tf.Tensor]:
    """Gathered rows to the output features, padded to `length`."""
    positions = tf.range(length)[tf.newaxis, :]
    tgt = batch['tgt'][:, :length]
    num_pieces = batch['tgt_length'][:, tf.newaxis] - 1
    bos = tf.fill([tf.shape(tgt)[0], 1], vocab_lib.BOS_ID)
    return {
        'src_ids': batch['src'][:, :length],
        'src_paddings': tf.cast(
            positions >= batch['src_length'][:, tf.newaxis], tf.float32),
        'tgt_ids': tf.concat([bos, tgt], axis=1)[:, :length],
        'tgt_labels': tf.where(positions == num_pieces, vocab_lib.EOS_ID, tgt),
        'tgt_paddings': tf.cast(
            positions >= batch['tgt_length'][:, tf.newaxis], tf.float32),
    }

  def _BucketBatchSizes(self) -> list[int]:
    p = self._params
    num = len(self._boundaries) + 1
    if p.bucket_batch_sizes is not None:
      sizes = list(p.bucket_batch_sizes)
      if len(sizes) != num or any(
          not isinstance(s, int) or s < 1 for s in sizes):
        raise InputConfigError(
            f'{p.name}: bucket_batch_sizes needs {num} positive ints '
            f'(len(bucket_boundaries) + 1), got {sizes}.')
      return sizes
    if p.tokens_per_batch:
      if not isinstance(p.tokens_per_batch, int) or p.tokens_per_batch < 1:
        raise InputConfigError(f'{p.name}: tokens_per_batch must be a '
                               f'positive int, got {p.tokens_per_batch!r}.')
      return [max(1, p.tokens_per_batch // n) for n in self._padded_lengths]
    return [p.batch_size] * num

  def _LoadVocab(self) -> vocab_lib.Vocabulary:
    p = self._params
    path = p.vocab_path or os.path.join(p.folder, DEFAULT_VOCAB_FILE)
    if os.path.isfile(path):
      return vocab_lib.Vocabulary(path)
    if not p.build_vocab:
      raise vocab_lib.VocabularyError(
          f'{p.name}: no vocabulary at {path}. Set build_vocab True to build '
          f'it from the {p.vocab_split!r} text, or point vocab_path at a model.')
    if p.folder is not None:
      texts = _ReadFolder(p, p.vocab_split, None)
      languages = sorted({lang for pair in texts for lang in pair})
    else:
      texts = _ReadTfdsLanguages(p, p.vocab_split)
      languages = sorted(texts)
    prefix = path[:-len(vocab_lib.MODEL_SUFFIX)]
    if p.folder is not None:
      files = sorted(glob.glob(os.path.join(p.folder, f'{p.vocab_split}.*')))
      files = [f for f in files if _PAIR_FILE.match(os.path.basename(f))]
      built = vocab_lib.Vocabulary.Build(
          files, p.vocab_size, prefix, languages, p.vocab_model_type)
    else:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      scratch = f'{path}.text{os.getpid()}'
      with open(scratch, 'w', encoding='utf-8') as f:
        for language in languages:
          f.writelines(line + '\n' for line in texts[language])
      try:
        built = vocab_lib.Vocabulary.Build(
            [scratch], p.vocab_size, prefix, languages, p.vocab_model_type)
      finally:
        os.remove(scratch)
    return built

  def _ReadPairs(self, split: str, pairs: list[tuple[str, str]] | None
                 ) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
    """{(src, tgt): (source lines, target lines)} of `split`, in pair order."""
    if self._params.folder is not None:
      return _ReadFolder(self._params, split, pairs)
    return _ReadTfds(self._params, split, pairs)


def _ParsePair(pair: str, name: str) -> tuple[str, str]:
  parts = pair.split('-') if isinstance(pair, str) else []
  if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
    raise InputConfigError(
        f"{name}: language pair {pair!r} must look like 'en-de'.")
  return parts[0], parts[1]


def _ReadLines(path: str) -> list[str]:
  with open(path, encoding='utf-8') as f:
    return [line.rstrip('\r\n') for line in f]


def _ReadFolder(p, split, pairs):
  """Pairs of `split` from files {split}.{a}-{b}.{lang} in p.folder."""
  if not os.path.isdir(p.folder):
    raise DatasetNotFoundError(f'{p.name}: no folder {p.folder}.')
  if pairs is None:
    found = set()
    for path in glob.glob(os.path.join(p.folder, f'{split}.*')):
      m = _PAIR_FILE.match(os.path.basename(path))
      if m and m['split'] == split and m['lang'] == m['src']:
        found.add((m['src'], m['tgt']))
    pairs = sorted(found)
    if not pairs:
      raise DatasetNotFoundError(
          f'{p.name}: no files {split}.<src>-<tgt>.<src> in {p.folder}; '
          'write the corpus first (e.g. WriteReversalCorpus).')
  out = {}
  for src, tgt in pairs:
    for a, b in ((src, tgt), (tgt, src)):
      paths = [os.path.join(p.folder, f'{split}.{a}-{b}.{lang}')
               for lang in (src, tgt)]
      if all(os.path.isfile(x) for x in paths):
        break
    else:
      raise DatasetNotFoundError(
          f'{p.name}: no files {split}.{src}-{tgt}.{{{src},{tgt}}} (nor '
          f'{tgt}-{src}) in {p.folder}.')
    sources, targets = _ReadLines(paths[0]), _ReadLines(paths[1])
    if len(sources) != len(targets):
      raise InputConfigError(
          f'{p.name}: {paths[0]} has {len(sources)} lines but {paths[1]} has '
          f'{len(targets)}; parallel files must align line by line.')
    out[(src, tgt)] = (sources, targets)
  return out


def _TfdsBuilder(p) -> tfds.core.DatasetBuilder:
  """The prepared builder of p.tfds_name (never downloads)."""
  where = p.data_dir or tfds.core.constants.DATA_DIR
  try:
    builder = tfds.builder(p.tfds_name, data_dir=p.data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise DatasetNotFoundError(
        f'{p.name}: {p.tfds_name!r} is neither a TFDS dataset nor one '
        f'prepared in data_dir {where}.') from e
  if not builder.is_prepared():
    raise DatasetNotFoundError(
        f'{p.name}: TFDS dataset {p.tfds_name!r} is not prepared in data_dir '
        f'{where} (looked for {builder.data_dir}); downloading is off. '
        'Prepare it on a machine with network access (tfds.builder(...)'
        '.download_and_prepare()) and copy its folder there.')
  return builder


def _ReadTfdsLanguages(p, split, builder=None) -> dict[str, list[str]]:
  """{language: sentences of `split`} of every language of p.tfds_name."""
  builder = builder or _TfdsBuilder(p)
  languages = sorted(builder.info.features.keys())
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(
                              interleave_cycle_length=1))
  texts = {lang: [] for lang in languages}
  for chunk in ds.batch(4096).as_numpy_iterator():
    for lang in languages:
      texts[lang].extend(t.decode('utf-8') for t in chunk[lang])
  return texts


def _ReadTfds(p, split, pairs):
  """Pairs of `split` of TFDS dataset p.tfds_name (never downloads)."""
  builder = _TfdsBuilder(p)
  languages = sorted(builder.info.features.keys())
  if pairs is None:
    keys = builder.info.supervised_keys
    if not keys or len(keys) != 2:
      raise InputConfigError(f'{p.name}: {p.tfds_name!r} has no supervised '
                             'direction; set language_pairs.')
    pairs = [tuple(keys)]
  for pair in pairs:
    if not set(pair) <= set(languages):
      raise InputConfigError(
          f'{p.name}: {p.tfds_name!r} has languages {languages}, not '
          f'{"-".join(pair)}.')
  texts = _ReadTfdsLanguages(p, split, builder)
  return {(src, tgt): (texts[src], texts[tgt]) for src, tgt in pairs}


def _PadRows(rows: list[list[int]], width: int) -> np.ndarray:
  out = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


# ---- A synthetic corpus that can be learned offline ---------------------------
class CorpusExistsError(errors.Error, FileExistsError):
  """The folder holds a corpus written with other arguments."""


_LEXICON = ('apple', 'river', 'stone', 'cloud', 'tiger', 'maple', 'candle',
            'silver', 'garden', 'window', 'pepper', 'harbor', 'lemon',
            'falcon', 'meadow', 'rocket', 'violet', 'copper', 'island',
            'thunder', 'marble', 'basket', 'forest', 'pilot')
_CORPUS_STAMP = '.corpus.json'


def ReversalTarget(sentence: str, language: str) -> str:
  """The translation of `sentence` into pseudo-language `language`.

  'rev': the words in reverse order. 'mir': reversed order and every word
  spelled backwards. Example: 'apple river' -> 'river apple' / 'revir elppa'.
  """
  words = sentence.split()[::-1]
  if language == 'rev':
    return ' '.join(words)
  if language == 'mir':
    return ' '.join(w[::-1] for w in words)
  raise InputConfigError(
      f"Unknown reversal language {language!r}: 'rev' or 'mir'.")


def WriteReversalCorpus(folder: str, num_train: int, num_test: int,
                        seed: int = 0, min_words: int = 3, max_words: int = 8,
                        languages: tuple[str, ...] = ('rev',)) -> list[str]:
  """Writes a parallel corpus of word-reversal tasks; idempotent.

  Source language 'en': min_words..max_words words drawn uniformly from a
  24-word lexicon. Each target language of `languages` ('rev', 'mir'; see
  ReversalTarget) gets the pair files {split}.en-{lang}.{en,lang} for splits
  'train' and 'test' over the same source sentences. Test sentences never
  occur in train. A model that learns the task reaches BLEU 100.

  Idempotent: a folder already holding a corpus written with the same
  arguments is left untouched (files, vocabulary and all). Files are written
  under temporary names and renamed, the stamp file last.

  Returns:
    The paths of the text files.

  Raises:
    CorpusExistsError: the folder holds a corpus written with other arguments.
    InputConfigError: bad arguments (e.g. more test sentences than
      can be unique).
  """
  args = dict(num_train=num_train, num_test=num_test, seed=seed,
              min_words=min_words, max_words=max_words,
              languages=list(languages))
  for lang in languages:
    ReversalTarget('a', lang)  # Validates the language.
  if not 1 <= min_words <= max_words or num_train < 1 or num_test < 0:
    raise InputConfigError(f'Bad corpus arguments: {args}.')
  paths = [os.path.join(folder, f'{split}.en-{lang}.{side}')
           for split in ('train', 'test') for lang in languages
           for side in ('en', lang)]
  stamp = os.path.join(folder, _CORPUS_STAMP)
  if os.path.isfile(stamp):
    with open(stamp, encoding='utf-8') as f:
      existing = json.load(f)
    if existing != args:
      raise CorpusExistsError(
          f'{folder} holds a corpus written with {existing}, not {args}; '
          'use another folder or delete this one.')
    if all(os.path.isfile(x) for x in paths):
      return paths
  rng = np.random.default_rng(seed)
  seen: set[str] = set()
  splits = {}
  for split, count in (('train', num_train), ('test', num_test)):
    sentences = []
    for _ in range(100 * count + 1000):
      if len(sentences) == count:
        break
      n = int(rng.integers(min_words, max_words + 1))
      sentence = ' '.join(_LEXICON[i] for i in rng.integers(0, len(_LEXICON),
                                                             n))
      if split == 'test' and sentence in seen:
        continue
      if split == 'train':
        seen.add(sentence)
      sentences.append(sentence)
    if len(sentences) < count:
      raise InputConfigError(
          f'Cannot draw {count} new {split} sentences of '
          f'{min_words}..{max_words} words; lower the counts.')
    splits[split] = sentences
  os.makedirs(folder, exist_ok=True)
  for split, sentences in splits.items():
    for lang in languages:
      base = os.path.join(folder, f'{split}.en-{lang}.')
      _WriteAtomic(base + 'en', sentences)
      _WriteAtomic(base + lang, [ReversalTarget(s, lang) for s in sentences])
  _WriteAtomic(stamp, [json.dumps(args, sort_keys=True)])
  return paths


def _WriteAtomic(path: str, lines: list[str]) -> None:
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.writelines(line + '\n' for line in lines)
  os.replace(tmp, path)
