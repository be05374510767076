"""``python -m icegate_dagster.cli``: ``icegate-maintain`` run as a module."""

import sys

from icegate_dagster.cli.dispatch import main

sys.exit(main())
