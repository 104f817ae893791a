from ssv.model.llama import Transformer

__all__ = ["Transformer"]
