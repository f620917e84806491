"""`python -m neuronabox.cli`."""

import sys

from neuronabox.cli import main

sys.exit(main())
