"""``python -m analyzer`` runs the herdscope command."""
import sys

from .cli import main

sys.exit(main())
