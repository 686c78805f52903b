"""``python -m selfattn``: the same as the ``selfattn`` command."""

import sys

from selfattn.cli import main

sys.exit(main())
