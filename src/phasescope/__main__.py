import sys

from phasescope.cli import main

sys.exit(main())
