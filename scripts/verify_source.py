"""The verify kernel (`nsa_verify_fwd_kernel`) with code inserted into its source and one argument added
after NSPLIT, loaded as a module of its own, and a stand-in that launches it in the launcher's place with
that argument: what `verify_timeline.py` (clock stamps) and `verify_redo_count.py` (the lazy softmax's redo
count) probe with. Not part of the library: the shipped kernel never carries these."""
from __future__ import annotations

import importlib.util
import inspect
import os
import tempfile

ARG_AT = 23   # the launcher's positional arguments up to and including NSPLIT (verify.py's `args`)


def patched_module(name: str, arg: str, edits: list, prelude: str = ""):
    """verify_kernels.py with `arg` after NSPLIT, each (old, new) of `edits` replaced (each old must occur
    once) and `prelude` (more jit functions) before the kernel, loaded as module `name`."""
    import ssv.ops.nsa.verify_kernels as VK
    src = inspect.getsource(VK)
    head = "\n@triton.jit\ndef nsa_verify_fwd_kernel("
    edits = [(head, prelude + head), ("    plen, N, W, scale, NSPLIT,\n", f"    plen, N, W, scale, NSPLIT, {arg},\n")]\
        + list(edits)
    for old, new in edits:
        assert src.count(old) == 1, f"{name}: the kernel's source no longer has one {old!r}"
        src = src.replace(old, new, 1)
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class WithArg:
    """A patched kernel in the launcher's place: its launches and warmups get `value` as the added argument;
    `grids` records each launch's grid."""

    def __init__(self, kernel, value):
        self.kernel, self.value, self.grids = kernel, value, []

    def _args(self, args):
        return args[:ARG_AT] + (self.value,) + args[ARG_AT:]

    def __getitem__(self, grid):
        self.grids.append(grid)
        launch = self.kernel[grid]
        return lambda *args, **kw: launch(*self._args(args), **kw)

    def warmup(self, *args, **kw):
        return self.kernel.warmup(*self._args(args), **kw)
