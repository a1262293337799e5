"""`python -m nativelab.check script.py [args...]`: the same as `nativelab check script.py [args...]`."""

import sys

from .cli import main

sys.exit(main())
