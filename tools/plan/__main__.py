"""``python -m tools.plan``: runs tools/plan/main.py."""

from absl import app

from tools.plan import main

__all__ = []

if __name__ == '__main__':
  main.DefineFlags()
  app.run(main.main)
