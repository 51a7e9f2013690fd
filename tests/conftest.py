import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The tools/ scripts are not a package: make them importable for their unit tests.
sys.path.insert(0, str(REPO / "tools"))
