"""``python -m lifecycle_es.cli``: the same as the ``lifecycle-es`` console script."""

from . import main

raise SystemExit(main())
