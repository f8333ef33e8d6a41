"""`python -m spec_engine`: the command line (spec_engine/cli.py)."""
import sys

from spec_engine.cli import main

sys.exit(main())
