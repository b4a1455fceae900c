"""``python -m tools.export``: runs tools/export/main.py."""

from absl import app

from tools.export import main

__all__ = []

if __name__ == '__main__':
  main.DefineFlags()
  app.run(main.main)
