"""`python -m qrag_ray.cli ...`: the same as the `qrag` script."""

from qrag_ray.cli.app import main

raise SystemExit(main())
