"""``python -m workers.cli``: the ``hookbus`` command."""

import sys

from workers.cli import main

sys.exit(main())
