"""Compile a Triton kernel for sm_90 on a machine without a GPU (triton's own ptxas) and read its
resource use (cuobjdump): what `compile_accept_sm90.py` and `compile_route_sm90.py` report."""
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_sm90(fn, sig: dict, const: dict, warps: int = 4, stages=None):
    """(the compiled kernel, its REG / STACK / SHARED strings): sig names the pointer / int arguments'
    types (every other argument is a constexpr, given in const)."""
    order = list(fn.arg_names)
    src = ASTSource(fn=fn, signature={n: sig.get(n, "constexpr") for n in order},
                    constexprs={(order.index(k),): v for k, v in const.items()})
    opts = dict(num_warps=warps) if stages is None else dict(num_warps=warps, num_stages=stages)
    cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cc.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    use = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return cc, re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", use).groups()


def sass_lines(cc) -> list:
    """The compiled kernel's SASS instruction lines (cuobjdump over its cubin), each "/*addr*/ op ...;"
    with branch targets as addresses."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cc.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/", ln)]
