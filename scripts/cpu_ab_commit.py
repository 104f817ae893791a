# Variants for scripts/cpu_step_ab.py: the device commit's tensor form (ssv/ops/commit/naive.py, the CPU's commit)
# as a package at PREV (default .stage/prev55: `git archive <commit> ssv`) against this tree's.
import os

import ssv.ops.commit.naive as _cn

_head = _cn.kv_commit_naive
_ns: dict = {}
_src = os.path.join(os.environ.get("PREV", ".stage/prev55"), "ssv/ops/commit/naive.py")
exec(compile(open(_src).read(), _src, "exec"), _ns)


def _set(f):
    _cn.kv_commit_naive = f


VARIANTS = {"prev": (lambda: _set(_ns["kv_commit_naive"]), lambda: _set(_head)), "head": (lambda: None, lambda: None)}
