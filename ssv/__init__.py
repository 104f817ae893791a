"""ssv: speculative decoding whose verification runs on Native Sparse Attention."""
from ssv.api import LLM, Generation
from ssv.config import ModelConfig, NSAConfig, RopeConfig

__version__ = "0.1.0"
__all__ = ["LLM", "Generation", "ModelConfig", "NSAConfig", "RopeConfig", "__version__"]
