# Variants for scripts/cpu_step_ab.py as it was at cf66a0a (phases captured and replayed under no_grad): the phases
# under torch.inference_mode() against torch.no_grad(), the same kernels (inference mode skips autograd's version
# counters and view tracking, a dispatcher cost each small op pays). Since a CPU generation runs in inference mode
# (session 55), the harness replays in it: this file's comparison is that commit's (step-ab-inference-mode-*.json).
import torch

_ctx = []


def _enter():
    _ctx.append(torch.inference_mode())
    _ctx[-1].__enter__()


def _leave():
    _ctx.pop().__exit__(None, None, None)


VARIANTS = {"no_grad": (lambda: None, lambda: None), "inference_mode": (_enter, _leave)}
