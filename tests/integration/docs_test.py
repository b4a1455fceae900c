"""The README, docs/, CHANGELOG.md and benchmarks/ name only things that exist: links, paths, modules, experiments.

A move or rename that forgets the documentation fails here. Pure Python: reads
the Markdown files and the source tree, imports nothing from the project.
"""

import glob
import importlib.util
import os
import re
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

import tensorflow as tf  # pylint: disable=g-import-not-at-top

_ROOT = test_utils.REPO_ROOT
_README_MAX_BYTES = 12000
# Top-level packages of this repository; other `python -m` modules (pip,
# pytest) must be installed instead.
_REPO_PACKAGES = ('gpipe_tf', 'tools', 'params', 'tests')

_LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
_PATH = re.compile(r'(?<![\w./-])((?:gpipe_tf|tests|tools|params|docs)'
                   r'(?:/[\w.-]+)+/?)')
# Dotted names of the library and tools ('params.txt' is a file, not a module:
# experiment modules are checked through `python -m` and --model=).
_DOTTED = re.compile(r'(?<![\w./-])((?:gpipe_tf|tools)(?:\.\w+)+)')
_PYTHON_M = re.compile(r'python -m ((?:\w+\.)*\w+)')
_MODEL_FLAG = re.compile(r'--model=(\w+\.\w+\.\w+)')


# The name of the notes file outside the project that files used to cite.
_OUTSIDE_NOTES = 'TF-' + 'NOTES'
_THIS_FILE = os.path.join('tests', 'integration', 'docs_test.py')
# Files whose owners replace their citations in other branches; delete each
# entry once its file cites docs/tensorflow-notes.md.
_CITES_OUTSIDE_NOTES_FOR_NOW = frozenset([
    os.path.join('gpipe_tf', 'runtime', 'devices.py'),
])


def ProjectTextFiles(root=_ROOT):
  """The repository's source, documentation and configuration files."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = [d for d in subdirs
                  if d != '__pycache__' and not d.endswith('.egg-info') and
                  (d == '.ci' or not d.startswith('.'))]
    for name in files:
      if name.endswith(('.py', '.md', '.ini', '.cfg', '.toml', '.txt')) or (
          os.path.basename(directory) == '.ci'):
        found.append(os.path.join(directory, name))
  return sorted(found)


def DocFiles(root=_ROOT):
  return [os.path.join(root, 'README.md')] + sorted(
      glob.glob(os.path.join(root, 'docs', '*.md')))


def CheckedFiles(root=_ROOT):
  """DocFiles, the changelog and every Markdown file under benchmarks/ (READMEs, histories)."""
  changelog = os.path.join(root, 'CHANGELOG.md')
  return DocFiles(root) + ([changelog] if os.path.exists(changelog) else []) + sorted(
      glob.glob(os.path.join(root, 'benchmarks', '**', '*.md'),
                recursive=True))


def _Read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _Relative(path, root):
  return os.path.relpath(path, root)


def Anchors(text):
  """GitHub's anchors of the headings of a Markdown text (outside code blocks)."""
  anchors, seen, in_code = set(), {}, False
  for line in text.splitlines():
    if line.startswith('```'):
      in_code = not in_code
      continue
    match = re.match(r'#+\s+(.*)', line)
    if in_code or not match:
      continue
    slug = re.sub(r'[^\w\- ]', '', match.group(1).strip().lower())
    slug = slug.replace(' ', '-')
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f'{slug}-{count}')
  return anchors


def BrokenLinks(root=_ROOT):
  """['file: link (why)'] for relative links to missing files or anchors."""
  broken = []
  for doc in CheckedFiles(root):
    text = _Read(doc)
    for target in _LINK.findall(text):
      if re.match(r'[a-z]+:', target):  # http:, https:, mailto:
        continue
      path, _, anchor = target.partition('#')
      resolved = (os.path.normpath(os.path.join(os.path.dirname(doc), path))
                  if path else doc)
      where = f'{_Relative(doc, root)}: {target}'
      if not os.path.exists(resolved):
        broken.append(f'{where} (no such file)')
      elif anchor and resolved.endswith('.md') and anchor not in Anchors(
          _Read(resolved)):
        broken.append(f'{where} (no heading with that anchor)')
  return broken


def _CurrentText(doc, root):
  """The text whose names must exist: the old-name column of a table headed
  '| Old | New |' (the changelog's moves) is not."""
  del root  # Unused.
  kept, in_moves = [], False
  for line in _Read(doc).splitlines():
    if re.match(r'\|\s*Old\s*\|\s*New\s*\|', line):
      in_moves = True
    elif not line.startswith('|'):
      in_moves = False
    cells = line.split('|')
    # '| old | new |' -> keep only the new cell.
    kept.append('|'.join(cells[2:]) if in_moves and len(cells) >= 4 else line)
  return '\n'.join(kept)


def _ModuleAndRest(dotted, root):
  """(file of the longest module prefix of `dotted`, the remaining names)."""
  parts = dotted.split('.')
  path, found, rest = root, None, parts
  for i, part in enumerate(parts):
    if os.path.isfile(os.path.join(path, part + '.py')):
      return os.path.join(path, part + '.py'), parts[i + 1:]
    if os.path.isfile(os.path.join(path, part, '__init__.py')):
      path = os.path.join(path, part)
      found, rest = os.path.join(path, '__init__.py'), parts[i + 1:]
    else:
      break
  return found, rest


def _Defines(source_file, name):
  """Whether a module's source defines, imports or lazily exports `name`."""
  text = _Read(source_file)
  return bool(re.search(
      rf'^\s*(?:class|def)\s+{name}\b|^{name}\s*[:=]|^from\s+\S+\s+import\s+'
      rf'{name}\b|^import\s+\S*\b{name}\b|[\'"]{name}[\'"]\s*:',
      text, re.M))


def MissingNames(root=_ROOT):
  """['file: name (why)'] for paths, modules and experiments that do not exist."""
  missing = []
  for doc in CheckedFiles(root):
    text = _CurrentText(doc, root)
    where = _Relative(doc, root)
    for path in sorted(set(_PATH.findall(text))):
      if not os.path.exists(os.path.join(root, path.rstrip('/'))):
        missing.append(f'{where}: {path} (no such file or directory)')
    for dotted in sorted(set(_DOTTED.findall(text))):
      module, rest = _ModuleAndRest(dotted, root)
      if module is None:
        missing.append(f'{where}: {dotted} (no such module)')
      elif rest and not _Defines(module, rest[0]):
        missing.append(f'{where}: {dotted} ({_Relative(module, root)} does not '
                       f'define {rest[0]})')
    for module in sorted(set(_PYTHON_M.findall(text))):
      top = module.split('.')[0]
      if top in _REPO_PACKAGES:
        base = os.path.join(root, *module.split('.'))
        if not (os.path.isfile(base + '.py') or
                os.path.isfile(os.path.join(base, '__main__.py'))):
          missing.append(f'{where}: python -m {module} (no such module)')
      elif importlib.util.find_spec(top) is None:
        missing.append(f'{where}: python -m {module} (not installed)')
    for name in sorted(set(_MODEL_FLAG.findall(text))):
      task, dataset, cls = name.split('.')
      source = os.path.join(root, 'params', task, dataset + '.py')
      if not (os.path.isfile(source) and re.search(
          rf'^class\s+{cls}\b', _Read(source), re.M)):
        missing.append(f'{where}: --model={name} (no class {cls} in '
                       f'params/{task}/{dataset}.py)')
  return missing


class DocsTest(tf.test.TestCase):

  def testRelativeLinksPointToExistingFilesAndHeadings(self):
    self.assertEqual(BrokenLinks(), [])

  def testNamedPathsModulesAndExperimentsExist(self):
    self.assertEqual(MissingNames(), [])

  def testReadmeStaysShort(self):
    size = os.path.getsize(os.path.join(_ROOT, 'README.md'))
    self.assertLess(size, _README_MAX_BYTES,
                    'README.md grew: move details into docs/ and link them.')

  def testEveryDocsPageLinksBackToTheReadmeAndIsLinkedFromIt(self):
    readme = _Read(os.path.join(_ROOT, 'README.md'))
    for page in DocFiles()[1:]:
      name = os.path.basename(page)
      self.assertIn(f'](docs/{name})', readme, name)
      self.assertIn('](../README.md)', _Read(page), name)

  def testBenchmarksAndChangelogAreLinkedFromTheReadme(self):
    readme = _Read(os.path.join(_ROOT, 'README.md'))
    self.assertIn('](CHANGELOG.md)', readme)
    self.assertIn('](benchmarks/README.md', readme)
    index = _Read(os.path.join(_ROOT, 'benchmarks', 'README.md'))
    for page in glob.glob(os.path.join(_ROOT, 'benchmarks', '*', 'README.md')):
      tool = os.path.basename(os.path.dirname(page))
      self.assertIn(f']({tool}/README.md)', index, tool)
      self.assertIn('](../README.md)', _Read(page), tool)

  def testNoProjectFileCitesNotesOutsideTheProject(self):
    """TensorFlow facts live in docs/tensorflow-notes.md, not in a file outside."""
    cited = []
    for path in ProjectTextFiles():
      name = _Relative(path, _ROOT)
      if name in _CITES_OUTSIDE_NOTES_FOR_NOW or name == _THIS_FILE:
        continue
      if _OUTSIDE_NOTES in _Read(path):
        cited.append(name)
    self.assertEqual(cited, [], 'cite docs/tensorflow-notes.md instead')

  def testTheCheckerFindsBreakage(self):
    """The checks above can fail: a copy of the docs with one of each break."""
    root = tempfile.mkdtemp(dir=self.get_temp_dir())
    os.makedirs(os.path.join(root, 'docs'))
    os.makedirs(os.path.join(root, 'gpipe_tf', 'train'))
    for init in ('gpipe_tf/__init__.py', 'gpipe_tf/train/__init__.py'):
      with open(os.path.join(root, init), 'w') as f:
        f.write('')
    with open(os.path.join(root, 'gpipe_tf', 'train', 'loop.py'), 'w') as f:
      f.write('def train_and_evaluate():\n  pass\n')
    with open(os.path.join(root, 'README.md'), 'w') as f:
      f.write('# R\n\n[ok](docs/a.md) [ok](docs/a.md#one) [gone](docs/b.md) '
              '[bad anchor](docs/a.md#two)\n\n'
              '`gpipe_tf/train/loop.py` `gpipe_tf/train_lib.py` '
              '`gpipe_tf.train.loop.train_and_evaluate` `gpipe_tf.train.loop.'
              'Evaluate` `python -m tools.gone`\n')
    with open(os.path.join(root, 'CHANGELOG.md'), 'w') as f:
      f.write('# Changelog\n\n## 0.2\n\n| Old | New |\n|---|---|\n'
              '| `gpipe_tf.train_lib` | `gpipe_tf.train.loop` |\n\n'
              '`gpipe_tf.gone` [gone](docs/c.md)\n')
    with open(os.path.join(root, 'docs', 'a.md'), 'w') as f:
      f.write('# A\n\n## One\n\n[back](../README.md)\n')
    self.assertEqual(BrokenLinks(root), [
        'README.md: docs/b.md (no such file)',
        'README.md: docs/a.md#two (no heading with that anchor)',
        'CHANGELOG.md: docs/c.md (no such file)'])
    self.assertEqual(MissingNames(root), [
        'README.md: docs/b.md (no such file or directory)',
        'README.md: gpipe_tf/train_lib.py (no such file or directory)',
        'README.md: gpipe_tf.train.loop.Evaluate (gpipe_tf/train/loop.py does '
        'not define Evaluate)',
        'README.md: tools.gone (no such module)',
        'README.md: python -m tools.gone (no such module)',
        'CHANGELOG.md: docs/c.md (no such file or directory)',
        'CHANGELOG.md: gpipe_tf.gone (gpipe_tf/__init__.py does not define '
        'gone)'])


if __name__ == '__main__':
  tf.test.main()
