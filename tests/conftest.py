import sys
from pathlib import Path

# The helpers in tests/ (launcher.py) are imported as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
