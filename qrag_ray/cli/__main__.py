"""`python -m qrag_ray.cli ...`: the same as the `qrag` script."""

import sys

from qrag_ray.cli.app import main

sys.exit(main())
