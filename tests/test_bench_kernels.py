"""The kernel benchmark's CPU-side parts: its inputs, its byte count, and resuming a run."""
import json

import pytest
import torch

from ssv.bench.kernels import eagle_tree, overlap_of, resumed_rows, synthetic_selection, unique_bytes
from ssv.config import NSAConfig


def test_eagle_tree_is_a_tree_in_bfs_order():
    for n in (1, 4, 16, 64, 128):
        depth, mask = eagle_tree(n, torch.Generator().manual_seed(n))
        assert depth.shape == (n,) and mask.shape == (n, n) and depth[0] == 0
        assert torch.equal(mask.diagonal(), torch.ones(n, dtype=mask.dtype))
        assert not mask.triu(1).any()                      # ancestors come first
        assert torch.equal(mask.sum(1), depth + 1)          # a node sees its depth + 1 path nodes
        assert bool((depth[1:] >= depth[:-1]).all())        # BFS: depth never decreases


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_synthetic_selection_forced_sorted_and_overlap(overlap):
    cfg = NSAConfig()
    pos = torch.full((8,), 4096) + torch.arange(8) // 3
    idx = synthetic_selection(pos, 2, cfg, overlap, torch.Generator().manual_seed(0))
    assert idx.shape == (8, 2, cfg.n_select)
    for i in range(8):
        for h in range(2):
            row = idx[i, h].tolist()
            assert row == sorted(row) and len(set(row)) == len(row)
            cur = int(pos[i]) // cfg.slc_block
            assert {0, cur, cur - 1} <= set(row) and max(row) <= cur
    ov = overlap_of(idx)
    assert ov == 1.0 if overlap == 1.0 else ov < 0.5


def test_unique_bytes_counts_each_needed_token_once():
    cfg = NSAConfig(slc_block=16, n_select=3, window=8, cmp_block=8, cmp_stride=4)
    P, n = 100, 2
    pos = torch.tensor([100, 101])
    idx = torch.tensor([[[0, 3]], [[3, 5]]])            # blocks 0, 3, 5 once each
    # tokens: blocks 0, 3, 5 (48), the windows [93, 100) and [94, 100) add 96..99 (93..95 are in
    # block 5), plus the n new tokens per head; K and V, d = 4, 2 bytes
    assert unique_bytes(idx, pos, P, n, cfg, d=4, elt=2) == (48 + 4 + 2) * 4 * 2 * 2


def test_resume_keeps_rows_of_the_same_commit_only(tmp_path):
    path = tmp_path / "kernels.json"
    assert resumed_rows(str(path), "abc") == ([], [])
    rows = [dict(shape="nsa-1b", context=8192, tree=64, method="naive (C=1)", ms=0.01)]
    path.write_text(json.dumps({"env": {"commit": "abc", "date": "d1", "earlier_runs": [{"date": "d0"}]},
                                "rows": rows}))
    got, earlier = resumed_rows(str(path), "abc")
    assert got == rows and [e["date"] for e in earlier] == ["d0", "d1"]
    with pytest.raises(ValueError, match="commit abc, not def"):
        resumed_rows(str(path), "def")


def test_bench_kernels_needs_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this checks the error without a GPU")
    from ssv.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "kernels", "--shapes", "nsa-1b"])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
