"""pytest's set-up for the package's tests (the shared helpers are in ``helpers.py``)."""

import os

# Device waits of the CPU backend give up after this long instead of their spin limit
# (minutes), so a lost signal fails a test in seconds. Set before any communicator exists.
os.environ.setdefault("MSCCLPP_SPIN_TIMEOUT_MS", "20000")
