import os
import sys
from pathlib import Path

# No hub here: without this a repo-id lookup retries for ~23 s before failing.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))
