"""Fused layer glue for the CUDA decode step (RMSNorm, RoPE + cache write, SwiGLU): fewer launches
per layer; `naive.py` holds the plain-PyTorch twins they are tested against."""
