"""Small-M linear layers in one launch each: the decode step's GEMMs with their norm, SwiGLU and residual."""
