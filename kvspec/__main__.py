import sys

from kvspec.cli import main

sys.exit(main())
