"""``python -m txlog.cli``: the same as the ``txlog`` command."""

import sys

from txlog.cli import main

sys.exit(main())
