import os

import torch

# Kernels run compiled on a GPU and in Triton's interpreter (CPU tensors) elsewhere. The variable must
# be set before the kernel modules are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
