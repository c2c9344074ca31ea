"""``python -m lifecycle_es``: the same as the ``lifecycle-es`` console script."""

from .cli import main

raise SystemExit(main())
