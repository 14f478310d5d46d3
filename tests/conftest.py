import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(FIXTURES))


@pytest.fixture(scope="session")
def small_net_path() -> Path:
    return FIXTURES / "small_net.py"
