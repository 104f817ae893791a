"""ssv: speculative decoding whose verification runs on Native Sparse Attention."""
from ssv.config import ModelConfig, NSAConfig, RopeConfig

__version__ = "0.1.0"
__all__ = ["ModelConfig", "NSAConfig", "RopeConfig", "__version__"]
