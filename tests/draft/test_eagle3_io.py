import json

import pytest
import torch
from safetensors.torch import save_file

import ssv.draft as draft
from ssv.config import ModelConfig
from ssv.draft import (Eagle3Config, Eagle3Head, check_compatible, default_layer_ids, head_size_bytes,
                       load_eagle3, save_eagle3)
from ssv.draft.vocab import check_mapping, count_tokens, coverage, mapping_from_ids, top_tokens

from .helpers import tiny_head, tiny_target

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9,
                      n_kv_heads=3, head_dim=64, tie_embeddings=True)


def test_config_roundtrip_and_defaults():
    cfg = Eagle3Config.for_target(SMOLLM2, 8192, window=300)
    assert cfg.aux_layer_ids == (1, 14, 26) == default_layer_ids(30)
    d = cfg.to_json_dict()
    assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["num_hidden_layers"] == 1
    assert d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert d["ssv_draft_window"] == 300 and d["target_hidden_size"] == 576 and d["draft_vocab_size"] == 8192
    back = Eagle3Config.from_json_dict(json.loads(json.dumps(d)))
    assert back == cfg and back.to_json_dict() == d
    # transformers-5 rope layout and top-level ids (vLLM speculators) are understood too
    d2 = dict(d, rope_parameters={"rope_type": "default", "rope_theta": 5e5}, eagle_config={},
              eagle_aux_hidden_state_layer_ids=[2, 3, 4])
    c2 = Eagle3Config.from_json_dict(d2)
    assert c2.rope_theta == 5e5 and c2.aux_layer_ids == (2, 3, 4)


@pytest.mark.parametrize("bad", [dict(num_attention_heads=5), dict(head_dim=7), dict(draft_vocab_size=10 ** 6),
                                 dict(window=0), dict(aux_layer_ids=(1, 1, 2)), dict(hidden_size=-1),
                                 dict(rope_scaling={"rope_type": "yarn", "factor": 2.0})])
def test_config_validation(bad):
    kw = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=100, draft_vocab_size=50, target_hidden_size=64)
    kw.update(bad)
    with pytest.raises(ValueError):
        Eagle3Config(**kw)


def test_head_under_25mb():
    cfg = Eagle3Config.for_target(SMOLLM2, 8192)
    assert head_size_bytes(cfg, torch.bfloat16) < 25_000_000 < head_size_bytes(Eagle3Config.for_target(SMOLLM2, 16384))
    shipped = draft.default_head_path() / "model.safetensors"   # tracked: the shipped head, its vocabulary grown
    cfg = draft.read_config(draft.default_head_path())
    assert shipped.stat().st_size <= 25_000_000
    assert shipped.stat().st_size == pytest.approx(head_size_bytes(cfg, torch.bfloat16), rel=1e-3)


def _specforge_head(folder, V=80, Vd=40, H=32, Ht=32, heads=4, kv=2, hd=8, inter=48, with_embed=True, drop=None):
    """A head written the way SpecForge/EAGLE save one: names listed by hand, random weights."""
    g = torch.Generator().manual_seed(0)
    shapes = {
        "fc.weight": (H, 3 * Ht),
        "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, heads * hd),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (inter, H), "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
        "norm.weight": (H,), "lm_head.weight": (Vd, H),
    }
    sd = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    used = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
    sd["d2t"] = used - torch.arange(Vd)
    sd["t2d"] = torch.zeros(V, dtype=torch.bool)
    sd["t2d"][used] = True
    if with_embed:
        sd["embed_tokens.weight"] = torch.randn(V, H, generator=g).to(torch.bfloat16)
    for k in drop or ():
        sd.pop(k)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": H, "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": hd, "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 1000.0,
           "max_position_embeddings": 2048, "vocab_size": V, "draft_vocab_size": Vd, "target_hidden_size": Ht,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "pad_token_id": 0,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return sd


def test_load_specforge_named_head(tmp_path):
    sd = _specforge_head(tmp_path / "h")
    target = tiny_target()
    head, cfg = load_eagle3(tmp_path / "h", target=target.cfg)
    assert cfg.window == 512 and cfg.aux_layer_ids == (0, 2, 4) and cfg.extra["pad_token_id"] == 0
    mine = head.state_dict()
    for k, t in sd.items():
        if k != "embed_tokens.weight":
            assert torch.equal(mine[k].to(t.dtype), t), k
    # our own save writes the same names (plus nothing else), and loads back identically
    save_eagle3(tmp_path / "again", head)
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(sd) - {"embed_tokens.weight"}
    head2, cfg2 = load_eagle3(tmp_path / "again")
    assert cfg2 == cfg
    for k, t in head2.state_dict().items():
        assert torch.equal(t, mine[k]), k
    # it drafts
    d = draft.Eagle3Drafter(head, target)
    lp = d.commit([torch.randn(3, 32) for _ in range(3)], torch.tensor([5, 6, 7]))
    assert torch.isfinite(lp).sum() == 40


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_eagle3(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_eagle3(tmp_path / "empty")
    _specforge_head(tmp_path / "noweights")
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_eagle3(tmp_path / "noweights")
    _specforge_head(tmp_path / "missing", drop=["midlayer.hidden_norm.weight"])
    with pytest.raises(ValueError, match="missing tensor.*hidden_norm"):
        load_eagle3(tmp_path / "missing")
    _specforge_head(tmp_path / "shape", Ht=16)
    cfg = json.loads((tmp_path / "shape" / "config.json").read_text())
    (tmp_path / "shape" / "config.json").write_text(json.dumps(dict(cfg, target_hidden_size=32)))
    with pytest.raises(ValueError, match="fc.weight has shape"):
        load_eagle3(tmp_path / "shape")
    _specforge_head(tmp_path / "bad")
    (tmp_path / "bad" / "config.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_eagle3(tmp_path / "bad")


def test_check_compatible_errors(tmp_path):
    target = tiny_target()                      # vocab 80, hidden 32, 6 layers
    _specforge_head(tmp_path / "v", V=100)
    with pytest.raises(ValueError, match="vocab_size 100 != target vocab 80"):
        load_eagle3(tmp_path / "v", target=target.cfg)
    cfg = Eagle3Config.for_target(target.cfg)
    check_compatible(cfg, target.cfg)
    from dataclasses import replace
    with pytest.raises(ValueError, match="target_hidden_size"):
        check_compatible(replace(cfg, target_hidden_size=64), target.cfg)
    with pytest.raises(ValueError, match="only 6 layers"):
        check_compatible(replace(cfg, aux_layer_ids=(1, 2, 6)), target.cfg)
    with pytest.raises(ValueError, match="does not match"):
        draft.Eagle3Drafter(Eagle3Head(replace(cfg, vocab_size=81)), target)


def test_vocab_mapping():
    d2t, t2d = mapping_from_ids(torch.tensor([7, 2, 9]), 12, 3)
    assert d2t.tolist() == [2, 6, 7] and (torch.arange(3) + d2t).tolist() == [2, 7, 9]
    assert t2d.nonzero().flatten().tolist() == [2, 7, 9]
    check_mapping(d2t, t2d, 12)
    with pytest.raises(ValueError):
        mapping_from_ids(torch.tensor([7, 7, 9]), 12, 3)
    with pytest.raises(ValueError):
        check_mapping(d2t, torch.zeros(12, dtype=torch.bool), 12)
    counts = count_tokens([[1, 1, 5], torch.tensor([5, 5, 3])], 8)
    assert counts.tolist() == [0, 2, 0, 1, 0, 3, 0, 0]
    assert top_tokens(counts, 2).tolist() == [1, 5]
    assert top_tokens(counts, 5).tolist() == [0, 1, 2, 3, 5]     # zero counts: lowest ids first
    assert coverage(counts, top_tokens(counts, 2)) == pytest.approx(5 / 6)
    # the head maps draft log-probs onto target ids, -inf elsewhere
    target = tiny_target()
    head = tiny_head(target, draft_vocab=10)
    lp = head.target_logp(torch.randn(2, 32))
    ids = head.target_ids()
    assert torch.isfinite(lp[:, ids]).all() and torch.isinf(lp).sum() == 2 * 70
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2))
    assert torch.equal(head.t2d.nonzero().flatten(), torch.sort(ids).values)


def test_default_head_path_and_missing(monkeypatch, tmp_path):
    assert draft.default_head_path().parts[-2:] == ("data", "eagle3-smollm2")
    monkeypatch.setattr(draft, "default_head_path", lambda: tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="train-draft"):
        draft.load_default_head()


def test_grow_ids_keeps_old_and_takes_most_frequent():
    from ssv.draft.vocab import grow_ids
    counts = torch.tensor([0, 9, 3, 3, 7, 1, 0, 5])
    old = torch.tensor([7, 1])
    assert grow_ids(old, counts, 2).tolist() == [1, 7]
    # 4 (7) then the tie 2/3 (3): the lower id first
    assert grow_ids(old, counts, 4).tolist() == [1, 2, 4, 7]
    assert grow_ids(old, counts, 8).tolist() == list(range(8))
    with pytest.raises(ValueError, match="grown draft vocabulary"):
        grow_ids(old, counts, 1)
    with pytest.raises(ValueError, match="grown draft vocabulary"):
        grow_ids(old, counts, 9)


def test_grow_rows_keeps_old_rows_and_maps_new_ones():
    from ssv.draft.vocab import grow_rows
    g = torch.Generator().manual_seed(0)
    vocab, ht, h = 300, 12, 10
    target = torch.randn(vocab, ht, generator=g)
    m = torch.randn(ht, h, generator=g)
    old = torch.sort(torch.randperm(vocab, generator=g)[:100]).values
    new = torch.sort(torch.cat([old, torch.tensor([i for i in range(vocab) if i not in set(old.tolist())][:37])])).values
    w_old = target[old] @ m
    w_old[5] = 0.0                              # an old row is copied as it is, never refitted
    out = grow_rows(w_old, old, new, target)
    keep = torch.searchsorted(new, old)
    assert torch.equal(out[keep], w_old)
    added = torch.ones(new.numel(), dtype=torch.bool)
    added[keep] = False
    # rows that are an exact linear image of the target's: the added ones are that image
    exact = grow_rows(target[old] @ m, old, new, target)
    torch.testing.assert_close(exact[added], target[new[added]] @ m, rtol=1e-3, atol=1e-3)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="every old id"):
        grow_rows(target[old] @ m, old, new[new != old[50]], target)


def test_grow_head_keeps_old_logits(tmp_path):
    from ssv.draft.eagle3 import grow_head
    from ssv.draft.vocab import grow_ids
    target = tiny_target()
    head = tiny_head(target, draft_vocab=30)
    counts = torch.arange(target.cfg.vocab_size)            # the highest ids most frequent
    new = grow_ids(head.target_ids(), counts, 45)
    rows = target.state_dict()["embed_tokens.weight"]
    big = grow_head(head, new, rows)
    assert big.cfg.draft_vocab_size == 45 and torch.equal(big.target_ids(), new)
    x = torch.randn(3, head.cfg.hidden_size)
    lp_old, lp_new = head.draft_logits(x), big.draft_logits(x)
    keep = torch.searchsorted(new, head.target_ids())
    torch.testing.assert_close(lp_new[:, keep], lp_old)
    assert torch.isfinite(lp_new).all()
    save_eagle3(tmp_path / "h", big)
    again, cfg = load_eagle3(tmp_path / "h")
    assert cfg.draft_vocab_size == 45 and torch.equal(again.target_ids(), new)
    with pytest.raises(ValueError, match="every old id"):
        grow_head(head, new[new != head.target_ids()[7]], rows)


def test_balanced_scores_weigh_groups_equally():
    from ssv.draft.vocab import balanced_scores, top_tokens
    big = torch.tensor([1000, 900, 800, 0, 0, 0])       # a large group's frequent tokens
    small = torch.tensor([0, 0, 0, 5, 0, 1])              # a small group's
    assert top_tokens(big + small, 3).tolist() == [0, 1, 2]          # raw counts: the small group loses
    s = balanced_scores([big, small, torch.zeros(6, dtype=torch.long)])   # an empty group adds nothing
    torch.testing.assert_close(s.sum(), torch.tensor(2.0, dtype=torch.float64))
    assert top_tokens(s, 3).tolist() == [0, 1, 3]      # the small group's most frequent token enters
    with pytest.raises(ValueError, match="at least one group"):
        balanced_scores([])


def test_remap_rows_keeps_shared_rows_and_maps_the_rest():
    from ssv.draft.vocab import remap_rows
    g = torch.Generator().manual_seed(1)
    vocab, ht, h = 200, 12, 10
    target = torch.randn(vocab, ht, generator=g)
    m = torch.randn(ht, h, generator=g)
    perm = torch.randperm(vocab, generator=g)
    old = torch.sort(perm[:80]).values
    new = torch.sort(torch.cat([perm[20:80], perm[80:110]])).values     # drops 20 old ids, adds 30
    w_old = target[old] @ m
    w_old[3] += 1.0                                   # a kept row is copied as it is, never refitted
    out = remap_rows(w_old, old, new, target)
    shared = torch.isin(new, old)
    assert int(shared.sum()) == 60
    torch.testing.assert_close(out[shared], w_old[torch.searchsorted(old, new[shared])])
    exact = remap_rows(target[old] @ m, old, new, target)
    torch.testing.assert_close(exact[~shared], target[new[~shared]] @ m, rtol=1e-3, atol=1e-3)
