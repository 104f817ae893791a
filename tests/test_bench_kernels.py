"""The kernel benchmark's CPU-side parts: its inputs, its byte count, and resuming a run."""
import json

import pytest
import torch

from ssv.bench.kernels import cases, cases_in, claim, merge_results, ratios, resumed_rows
from ssv.bench.synthetic import eagle_tree, overlap_of, synthetic_selection, tile_bytes, unique_bytes
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


def test_tile_bytes_follows_the_kernels_work_lists():
    cfg = NSAConfig(slc_block=16, n_select=3, window=8, cmp_block=8, cmp_stride=4)
    P, n, tile = 100, 2, 16 * 4 * 2 * 2                 # a tile: 16 tokens, d = 4, K and V, 2 bytes
    pos = torch.tensor([100, 101])
    idx = torch.tensor([[[0, 3]], [[1, 3]]])
    # both windows start in block 5 (93 // 16, 94 // 16): window tiles 5 and 6, one tree tile
    assert tile_bytes(idx, pos, P, n, cfg, 4, 2, C=1) == (2 + 2 + 1) * 2 * tile   # each query alone
    assert tile_bytes(idx, pos, P, n, cfg, 4, 2, C=2) == (3 + 2 + 1) * tile       # union {0, 1, 3}
    assert tile_bytes(idx, pos, P, n, cfg, 4, 2, C=2, approx=True) == (2 + 2 + 1) * tile
    assert tile_bytes(idx, pos, P, n, cfg, 4, 2, C=2, row_splits=2) == 2 * (3 + 2 + 1) * tile
    idx[1, 0] = torch.tensor([3, 5])                     # block 5 is in the window region: no extra tile
    assert tile_bytes(idx, pos, P, n, cfg, 4, 2, C=2) == (2 + 2 + 1) * tile


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


def test_cases_cross_and_axes():
    assert cases([8, 16], [4, 64]) == [(8, 4), (8, 64), (16, 4), (16, 64)]
    assert cases([8192, 65536], [4, 64]) == [(65536, 64), (8192, 4), (8192, 64), (65536, 4)]  # the headline first
    got = cases([8192, 65536, 131072], [4, 64, 128], "axes")
    assert got[0] == (65536, 64) and len(got) == len(set(got)) == 5
    assert set(got) == {(65536, 64), (8192, 64), (131072, 64), (65536, 4), (65536, 128)}
    with pytest.raises(ValueError, match="unknown matrix"):
        cases([8], [4], "diagonal")


def test_ratios_use_the_strongest_naive_and_skip_failed_rows():
    rows = [dict(method="naive (C=1)", C=1, ms=4.0), dict(method="naive (C=1), 2 KV splits", C=1, ms=2.0),
            dict(method="ssv exact", C=4, ms=1.0), dict(method="ssv approx, lazy softmax", C=16, ms=None),
            dict(method="dense sdpa", C=0, ms=8.0), dict(method="fla parallel_nsa slc (G pad 16)", C=0, ms=3.0)]
    ratios(rows)
    assert rows[2]["x_vs_naive"] == 2.0 and rows[2]["x_vs_dense"] == 8.0 and rows[2]["x_vs_fla_slc"] == 3.0
    assert rows[0]["x_vs_naive"] == 0.5 and "x_vs_naive" not in rows[3]
    # the fastest dense row is the dense baseline (SDPA or ssv's dense kernel, whichever wins)
    rows.append(dict(method="dense verify", C=0, ms=2.0))
    ratios(rows)
    assert rows[2]["x_vs_dense"] == 2.0 and rows[-1]["x_vs_dense"] == 1.0


def _results(path, commit, rows, date):
    path.write_text(json.dumps({"env": {"commit": commit, "date": date, "copy_tbps": 4.2, "device": "H200"},
                                "nsa": {}, "overlap": 0.75, "rows": rows}))
    return str(path)


def test_merge_keeps_every_row_and_each_runs_env(tmp_path):
    a = [dict(shape="nsa-1b", context=8192, tree=64, method="naive (C=1)", C=1, ms=0.01)]
    b = [dict(shape="llama3.1-8b", context=8192, tree=64, method="naive (C=1)", C=1, ms=0.02)]
    m = merge_results([_results(tmp_path / "a.json", "c1", a, "d0"), _results(tmp_path / "b.json", "c1", b, "d1")])
    assert m["rows"] == a + b and [r["date"] for r in m["env"]["runs"]] == ["d0", "d1"]
    assert m["env"]["commit"] == "c1"
    with pytest.raises(ValueError, match="different commits"):
        merge_results([str(tmp_path / "a.json"), _results(tmp_path / "c.json", "c2", b, "d2")])
    with pytest.raises(ValueError, match="same rows twice"):
        merge_results([str(tmp_path / "a.json"), _results(tmp_path / "d.json", "c1", a, "d3")])


def test_merge_from_the_cli_needs_no_gpu(tmp_path, capsys):
    from ssv.cli import main
    a = [dict(shape="nsa-1b", context=8192, tree=64, method="naive (C=1)", C=1, ms=0.01, tbps=1.0,
              x_vs_naive=1.0)]
    f = _results(tmp_path / "a.json", "c1", a, "d0")
    assert main(["bench", "kernels", "--merge", f, "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "kernels.json").read_text())["rows"] == a
    assert "nsa-1b" in capsys.readouterr().out


def test_claims_let_one_process_run_a_case(tmp_path):
    d = str(tmp_path / "claims")
    assert claim(None, "x") and claim(d, "nsa-1b-8192-64")
    assert not claim(d, "nsa-1b-8192-64") and claim(d, "nsa-1b-8192-4")
    rows = [dict(shape="nsa-1b", context=8192, tree=64, method="naive (C=1)", C=1, ms=0.01)]
    f = _results(tmp_path / "a.json", "c1", rows, "d0")
    assert cases_in([f, str(tmp_path / "missing.json")]) == {("nsa-1b", 8192, 64)}


def test_timed_reports_a_failing_opt_in_path_and_raises_otherwise(capsys, monkeypatch):
    import ssv.bench.env as K
    from ssv.bench.env import timed
    monkeypatch.setattr(K, "bench_graph", lambda fn, reps=30: (fn(), "graph"))  # no GPU here: run fn untimed
    assert timed(lambda: 0.5, False, "ok") == (0.5, "graph")

    def boom():
        raise RuntimeError("no kernel")
    ms, how = timed(boom, True, "case x")
    assert ms is None and how == "failed: RuntimeError: no kernel"
    assert "case x failed: RuntimeError: no kernel" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="no kernel"):
        timed(boom, False, "case x")


def test_commit_label_marks_a_tree_that_differs_from_its_head(tmp_path, monkeypatch):
    """A copied tree with a stale .git must not pass for its HEAD: the label says -dirty."""
    import subprocess

    from ssv.bench.env import commit
    monkeypatch.delenv("SSV_COMMIT", raising=False)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "one"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert commit(tmp_path) == head + "-dirty"
    monkeypatch.setenv("SSV_COMMIT", "abc1234")
    assert commit(tmp_path) == "abc1234"


def test_timed_takes_the_commands_reps(monkeypatch):
    # `ssv bench kernels --reps` reached no timing until session 34 (bench_graph kept its default 30)
    import ssv.bench.env as be
    import ssv.bench.kernels as kb
    seen = []
    monkeypatch.setattr(be, "bench_graph", lambda fn, reps=30: seen.append(reps) or (1.0, "graph"))
    assert be.timed(lambda: None, False, "case", 7) == (1.0, "graph") and seen == [7]
    import inspect
    for f in (kb.run_case, kb.run_traces):   # the launchers hand it on
        assert "reps" in inspect.signature(f).parameters


def test_rotation_reads_past_the_l2():
    from ssv.bench.env import rotation
    small = 2 * 3 * 5120 * 64 * 2   # the default model's K/V of one layer at 5K: ~3.9 MB
    assert rotation(small) * small >= 200e6
    assert rotation(300e6) == 1 and rotation(40e6) * 40e6 >= 200e6
