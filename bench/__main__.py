"""``python -m bench``: see the package docstring."""

from bench.cli import main

raise SystemExit(main())
