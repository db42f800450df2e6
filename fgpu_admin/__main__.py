"""``python -m fgpu_admin``: the same as the ``fgpu-hub`` console script."""

import sys

from .cli import main

sys.exit(main())
