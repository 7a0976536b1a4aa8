import sys

from aiworker.cli import main

sys.exit(main())
