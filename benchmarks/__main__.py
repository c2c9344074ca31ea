"""``python -m benchmarks``: run every benchmark module and print the table of figures."""

from .suite import main

raise SystemExit(main())
