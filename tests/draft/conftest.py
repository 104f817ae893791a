import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The draft tests run tiny models: one thread avoids OpenMP hand-off costs that dominate (and
    explode on a loaded 2-core machine). Restored afterwards for other test directories."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
