"""Eagle3Drafter: the EAGLE-3 head at inference, with its own windowed KV cache and tree scratch.

Alignment (EAGLE): draft row r holds the pair (target feature at position r, token at r + 1), sits at
RoPE position r and predicts the token at r + 2. `commit` appends rows; the last committed row is the
tree ROOT (node 0 of DraftTree, whose token is the root token); a tree node at depth d >= 1 is a
row at position P + d (P = last committed row) holding (feature of its parent's row, its own token),
where the parent's feature is the midlayer output (before `norm`) -- for depth 1 the output of the
last committed row. Each node row attends to the committed rows inside the window plus the rows of
its own ancestors (and itself) in the scratch area: never to a sibling branch. This is the attention
pattern of training-time test, where unrolled step k of row t sees the real rows <= t plus its own
chain t+1..t+k.

Committed keys live in a ring buffer of `window` slots (slot = position % window), which is all a
windowed query can see; the KV cache is O(window) whatever the context length.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ssv.draft.eagle3 import Eagle3Head, check_compatible, masked_attention, masked_attention_fused
from ssv.engine.modes import decoding
from ssv.ops.draft_attn.naive import draft_attn_naive
from ssv.ops.ring_commit.naive import ring_commit_naive
from ssv.spec.tree import DraftTree, TreeSpec, build_tree


class Eagle3Drafter:
    def __init__(self, head: Eagle3Head, target, chunk: int = 512, fused: Optional[bool] = None):
        """head: an Eagle3Head (moved to the target's device and dtype); target: ssv Transformer.
        fused: the device round's layer through the glue kernels and one SDPA call (default: on CUDA)."""
        cfg = head.cfg
        check_compatible(cfg, target.cfg)
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.head = head.to(device=self.device, dtype=self.dtype).eval()
        self.embed = target.embed_tokens
        self.cfg = cfg
        ids = cfg.layer_ids(target.cfg.n_layers)
        self.taps = tuple(sorted(ids))            # what to ask Transformer.forward for (ascending)
        self._order = [self.taps.index(i) for i in ids]  # tapped (ascending) -> fc column order
        self.fc_taps = tuple(ids)                 # the layers in fc column order (`wide_taps`)
        self.window = cfg.window
        self.fused = self.device.type == "cuda" if fused is None else bool(fused)
        self.chunk = max(1, min(chunk, self.window))
        # ring slots [0, window) and one spare slot: the device commit's padded rows land there
        shape = (self.window + 1, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros_like(self.k)
        self.slot_pos = torch.full((self.window + 1,), -1, dtype=torch.long, device=self.device)
        # the device round's state in fixed buffers: committed rows, the last row's feature and its
        # draft-vocabulary log-probs (ascending target ids `vocab_ids`, so a stable sort over them
        # ranks ties as one over the target vocabulary does)
        self.dlen = torch.zeros(1, dtype=torch.long, device=self.device)
        self.hid_buf = torch.zeros(cfg.hidden_size, dtype=self.dtype, device=self.device)
        self.dlogp_buf = torch.zeros(cfg.draft_vocab_size, dtype=torch.float32, device=self.device)
        self.vocab_ids = self.head.target_ids()
        self._scratch = None        # the last expansion's (keys, values, features, features) scratch
        self._scratches: dict = {}
        self._row_ids: dict = {}    # n -> arange(n) on the device (`_arange`)
        self._rope_tab = None       # cos, sin [P, D] by position (`use_rope_table`), or computed per call
        self.reset()

    def use_rope_table(self, n: int) -> None:
        """Keep cos / sin of positions 0..n-1 (the device round's: its RoPE kernels read rows by position,
        so a round computes none; the same elementwise ops on the same values as `head.rope`, the same
        bits). The caller keeps every drafted position below n (the runner's capacity)."""
        if self._rope_tab is None or self._rope_tab[0].shape[0] < n:
            self._rope_tab = self.head.rope(torch.arange(n, device=self.device))

    def _rope_rows(self, pos: torch.Tensor):
        """(cos, sin, pos for the kernel): the table and the positions to read, or (without a table)
        the positions' own cos / sin."""
        if self._rope_tab is None:
            return (*self.head.rope(pos), None)
        return (*self._rope_tab, pos)

    def reset(self) -> None:
        self.length = 0
        self.dlen.zero_()
        self.slot_pos.fill_(-1)
        self.last_hidden: Optional[torch.Tensor] = None
        self.agreement: Optional[tuple] = None   # the last `commit(agree=...)`'s (top-1, top-k, pairs)
        self.last_logp: Optional[torch.Tensor] = None

    def _keep_last(self, out: torch.Tensor) -> torch.Tensor:
        """Remember the last row's feature and log-probs [1, H]; returns the target-vocab log-probs."""
        self.last_hidden = out[-1]
        dlogp = self.head.draft_logp(out[-1:])[0]
        self.hid_buf.copy_(out[-1])
        self.dlogp_buf.copy_(dlogp)
        self.last_logp = self.head.to_target(dlogp)
        return self.last_logp

    # ------------------------------------------------------------------ committed rows
    def _features(self, taps: Sequence[torch.Tensor], n: int) -> torch.Tensor:
        if len(taps) != 3:
            raise ValueError(f"commit: expected 3 tapped hidden states (layers {list(self.taps)}), got {len(taps)}")
        for t in taps:
            if t.dim() != 2 or t.shape != (n, self.cfg.target_hidden_size):
                raise ValueError(f"commit: each tapped hidden state must be [{n}, {self.cfg.target_hidden_size}], "
                                 f"got {tuple(t.shape)}")
        feats = torch.cat([taps[o] for o in self._order], -1)
        return self.head.project(feats.to(device=self.device, dtype=self.dtype))

    @decoding
    def commit(self, taps: Sequence[torch.Tensor], next_tokens, start: Optional[int] = None,
               agree: tuple = (0, 0)) -> torch.Tensor:
        """Append n rows (features at positions p0..p0+n-1 with the tokens at p0+1..p0+n).

        taps: 3 tensors [n, target_hidden] in ascending layer order (as Transformer.forward returns
        them for `taps=drafter.taps`). start: optional check that p0 equals the committed length.
        agree = (k, m): also count, over the last m rows, how often the head's first choice (top-1)
        and its k first choices (top-k) name the next row's token; kept as `agreement` (top-1 hits,
        top-k hits, pairs), e.g. a prompt's evidence for `ArFallback.prime`.
        Returns the draft log-probs [vocab] (target vocabulary, -inf off the draft vocabulary) of
        the token after the last one, i.e. of the children of the next tree root.
        """
        toks = torch.as_tensor(next_tokens, dtype=torch.long, device=self.device).flatten()
        n = toks.numel()
        if n == 0:
            raise ValueError("commit: no tokens")
        if start is not None and start != self.length:
            raise ValueError(f"commit: rows start at position {start} but the drafter holds {self.length}")
        hidden = self._features(taps, n)
        emb = self.embed(toks).to(self.dtype)
        mid, W = self.head.midlayer, self.window
        k_agree, tail = int(agree[0]), n - int(agree[1])
        hits = torch.zeros(2, dtype=torch.long, device=self.device) if k_agree > 0 else None
        out = None
        for c0 in range(0, n, self.chunk):
            c1 = min(n, c0 + self.chunk)
            pos = torch.arange(self.length + c0, self.length + c1, device=self.device)
            cos, sin = self.head.rope(pos)
            q, k, v = mid.qkv(emb[c0:c1], hidden[c0:c1], cos, sin)
            u = min(self.length + c0, W)  # ring slots in use (slot = position % W)
            kpos = torch.cat([self.slot_pos[:u], pos])
            vis = (kpos[None] >= 0) & (kpos[None] <= pos[:, None]) & (kpos[None] > pos[:, None] - W)
            a = masked_attention(q, torch.cat([self.k[:u], k]), torch.cat([self.v[:u], v]), vis)
            out = mid.finish(a, hidden[c0:c1])
            slots = pos % W
            self.k[slots], self.v[slots], self.slot_pos[slots] = k, v, pos
            if k_agree > 0 and c1 > tail:
                # row i predicts toks[i + 1]: the last row has no pair yet
                lo, hi = max(c0, tail, 0), min(c1, n - 1)
                if hi > lo:
                    hit = self._drafts(out[lo - c0:hi - c0], k_agree) == toks[lo + 1:hi + 1, None]   # [m, k]
                    hits += torch.stack([hit[:, 0].sum(), hit.any(-1).sum()])
        if k_agree > 0:
            h1, hk = hits.tolist()
            self.agreement = (h1, hk, max(0, n - 1 - max(tail, 0)))
        self.length += n
        self.dlen.fill_(self.length)
        return self._keep_last(out)

    # ------------------------------------------------------------------ the device round
    @decoding
    def expand_rows(self, level: int, tokens: torch.Tensor, parent_rows: torch.Tensor,
                    path_rows: torch.Tensor):
        """`ssv.spec.device.grow_tree`'s expand: the frontier of `level` (depth level - 1) through the
        head, in fixed shapes; returns draft-vocabulary log-probs [F, draft_vocab] (ids `vocab_ids`),
        or on the fused path their `Logits`."""
        c, mid, W = self.cfg, self.head.midlayer, self.window
        f, depth = tokens.numel(), path_rows.shape[1]
        rows = max(1, depth * f)
        # one scratch per size, never freed: a captured draft graph keeps the addresses it was
        # captured with, so a larger bucket must not release the buffers of a smaller one
        if rows not in self._scratches:
            self._scratches[rows] = (
                torch.zeros(rows, c.num_key_value_heads, c.head_dim, dtype=self.dtype, device=self.device),
                torch.zeros(rows, c.num_key_value_heads, c.head_dim, dtype=self.dtype, device=self.device),
                torch.zeros(rows, c.hidden_size, dtype=self.dtype, device=self.device),
                torch.zeros(rows, c.hidden_size, dtype=self.dtype, device=self.device))
        self._scratch = self._scratches[rows]
        if self.fused:
            return self._expand_fused(level, tokens, parent_rows, path_rows)
        sk, sv, hid, _ = self._scratch
        own = path_rows[:, level - 2]                                # this level's rows
        feat = torch.where((parent_rows < 0)[:, None], self.hid_buf[None], hid[parent_rows.clamp_min(0)])
        pos = (self.dlen - 1) + (level - 1)                          # [1]: every frontier node's position
        cos, sin = self.head.rope(pos.expand(f))
        emb = self.embed(tokens).to(self.dtype)
        q, k, v = mid.qkv(emb, feat, cos, sin)
        sk[own], sv[own] = k, v
        # the ring's window and each node's ancestors within it, as in `propose`
        a = draft_attn_naive(q, self.k, self.v, self.slot_pos, sk, sv, path_rows, self.dlen, level, W)
        out = mid.finish(a, feat)
        hid[own] = out
        return self.head.draft_logp(out)

    def _expand_fused(self, level: int, tokens, parent_rows, path_rows):
        """`expand_rows` in ~15 launches where the tensor form takes ~50 (the CUDA round): the
        level's rows are the contiguous range (level - 2) * F.. (grow_tree's layout), the children of
        the root (level 2) all take the last committed feature and the others their parent's row,
        the level positions' RoPE is made once a round (at level 2), and the attention is one
        kernel (ssv/ops/draft_attn) over the ring and each node's path rows. The input norms' launch
        reads each node's parent feature (the root's children: the last committed one) and also
        copies it into the level's own rows, where the layer adds into it (no gather or copy launch;
        levels alternate between two feature buffers, so a level never writes the rows it reads),
        and the rows come back as `Logits` with the final norm folded: their norm scale and
        log_softmax are the top-k's launch."""
        from ssv.ops.draft_attn.ops import draft_attn
        mid, W = self.head.midlayer, self.window
        f, depth = tokens.numel(), path_rows.shape[1]
        sk, sv, h_even, h_odd = self._scratch
        lo = (level - 2) * f
        rows = self._arange(sk.shape[0])
        own = (h_even if level % 2 == 0 else h_odd)[lo:lo + f]
        if level == 2:
            src, parents = self.hid_buf[None].expand(f, -1), None     # a broadcast row
            # levels 2.. at P + 1.. (P = dlen - 1)
            p = self.dlen + self._arange(depth)
            tab = self._rope_tab
            self._level_rope = self.head.rope(p) if tab is None else (tab[0][p], tab[1][p])
        else:
            src, parents = h_odd if level % 2 == 0 else h_even, parent_rows
        cos, sin = (t[level - 2:level - 1] for t in self._level_rope)
        q = mid.qkv_write(self.embed.weight, tokens, src, cos, sin, sk, sv, rows[lo:lo + f], hidden_rows=parents,
                          raw=own)
        a = draft_attn(q, self.k, self.v, self.slot_pos, sk, sv, path_rows, self.dlen, level, W)
        out = mid.finish_fused(a, own, out=own)
        return self.head.draft_logits_folded(out)

    def _attend(self, q, k, v, vis, residual) -> torch.Tensor:
        mid = self.head.midlayer
        if self.fused:
            return mid.finish_fused(masked_attention_fused(q, k, v, vis), residual)
        return mid.finish(masked_attention(q, k, v, vis), residual)

    @decoding
    def commit_rows(self, taps: Sequence[torch.Tensor], tokens: torch.Tensor, n: torch.Tensor,
                    predict: int = 0) -> Optional[torch.Tensor]:
        """`commit` in fixed shapes: R rows of which the first n [1] are real (the accepted path and
        its next tokens); the padded rows are computed, never stored. taps: as `commit`'s, or one
        tensor [R, 3 * H] in fc column order (`Transformer.forward(wide_taps=True)` of `fc_taps`).
        predict = k > 0: also return each row's top-k drafts of the token after it [R, k] (target
        ids, best first): the children a tree would propose there."""
        R, W = tokens.numel(), self.window
        feats = taps if isinstance(taps, torch.Tensor) else torch.cat([taps[o] for o in self._order], -1)
        hidden = self.head.project(feats.to(self.dtype))
        ar = self._arange(R)
        pos = self.dlen + ar
        mid = self.head.midlayer
        if self.fused and R <= W:
            from ssv.ops.draft_attn.ops import draft_attn_rows
            from ssv.ops.ring_commit.ops import ring_commit
            k = torch.empty(R, *self.k.shape[1:], dtype=self.dtype, device=self.device)
            v = torch.empty_like(k)
            cos, sin, rpos = self._rope_rows(pos)
            q = mid.qkv_write(self.embed.weight, tokens, hidden, cos, sin, k, v, ar, pos=rpos)
            # the ring's window and the real rows before each row, in one launch
            a = draft_attn_rows(q, self.k, self.v, self.slot_pos, k, v, self.dlen, n, W)
            out = mid.finish_fused(a, hidden, out=hidden)   # hidden is read by nothing after: no copy
            ring_commit(k, v, self.k, self.v, self.slot_pos, out, self.hid_buf, n, self.dlen, W)
        else:
            q, k, v = mid.qkv(self.embed(tokens).to(self.dtype), hidden, *self.head.rope(pos))
            real = ar < n
            ring = self.slot_pos[:W]
            vis_ring = (ring[None] >= 0) & (ring[None] > pos[:, None] - W)
            vis_new = (pos[None] <= pos[:, None]) & real[None]
            vis_new = vis_new | torch.eye(R, dtype=torch.bool, device=self.device)  # padded rows see themselves
            out = self._attend(q, torch.cat([self.k[:W], k]), torch.cat([self.v[:W], v]),
                               torch.cat([vis_ring, vis_new], 1), hidden)
            ring_commit_naive(k, v, self.k, self.v, self.slot_pos, out, self.hid_buf, n, self.dlen, W)
        torch.log_softmax(self.head.draft_logits(self.hid_buf[None]), -1, out=self.dlogp_buf[None])   # draft_logp
        if predict:
            return self._drafts(out, int(predict))
        return None

    def _arange(self, n: int) -> torch.Tensor:
        """arange(n) on the device, made once: the first call of a shape runs eagerly, before any
        capture, so a replayed round launches none."""
        if n not in self._row_ids:
            self._row_ids[n] = torch.arange(n, device=self.device)
        return self._row_ids[n]

    def _drafts(self, out: torch.Tensor, k: int) -> torch.Tensor:
        """Each row's k first draft choices of the token after it [R, k] (target ids, best first)."""
        k = min(k, self.vocab_ids.numel())
        return self.vocab_ids[self.head.draft_logits(out).topk(k, -1).indices]

    def advance_host(self, n: int) -> None:
        """Device rounds committed n rows: the host's count follows (no copy)."""
        self.length += n

    # ------------------------------------------------------------------ draft tree
    @decoding
    def propose(self, root_token: int, root_logp: Optional[torch.Tensor], spec: TreeSpec,
                record: Optional[dict] = None) -> DraftTree:
        """Grow a draft tree (build_tree) rooted at `root_token`, the token of the last committed row.

        root_logp: log-probs of the root's children (commit's return value; None = the last one).
        record: optional dict filled with {tuple of node tokens from depth 1: log-probs [vocab] (CPU)}
        for every expanded node (tests, debugging). Nothing committed is modified.
        """
        if self.length == 0 or self.last_hidden is None:
            raise ValueError("propose: commit the context first")
        root_logp = self.last_logp if root_logp is None else root_logp
        P, W, mid, c = self.length - 1, self.window, self.head.midlayer, self.cfg
        cap = max(1, (spec.depth - 1) * spec.top_k)
        sk = torch.zeros(cap, c.num_key_value_heads, c.head_dim, dtype=self.dtype, device=self.device)
        sv = torch.zeros_like(sk)
        slot_of: dict = {}      # pool node -> scratch slot
        hid = []                # scratch slot -> output feature
        paths: dict = {0: []}   # pool node -> scratch slots of its depth>=1 path (itself last)
        n_ring = min(self.length, W)  # ring slots in use
        ring_k, ring_v, ring_pos = self.k[:n_ring], self.v[:n_ring], self.slot_pos[:n_ring]

        def expand(frontier, tree: DraftTree) -> torch.Tensor:
            if list(frontier) == [0]:
                return root_logp.view(1, -1)
            parents, tokens, depth = tree.parents.tolist(), tree.tokens.tolist(), tree.depth.tolist()
            used = len(hid)
            rows = list(range(used, used + len(frontier)))
            for u, s in zip(frontier, rows):
                slot_of[u] = s
                paths[u] = paths[parents[u]] + [s]
            feat = torch.stack([self.last_hidden if parents[u] == 0 else hid[slot_of[parents[u]]]
                                for u in frontier])
            dep = torch.tensor([depth[u] for u in frontier], device=self.device)
            pos = P + dep
            cos, sin = self.head.rope(pos)
            tok = torch.tensor([tokens[u] for u in frontier], dtype=torch.long, device=self.device)
            q, k, v = mid.qkv(self.embed(tok).to(self.dtype), feat, cos, sin)
            sk[rows[0]:rows[-1] + 1], sv[rows[0]:rows[-1] + 1] = k, v
            n_scr = rows[-1] + 1
            scr = torch.zeros(len(frontier), n_scr, dtype=torch.bool)
            for r, u in enumerate(frontier):
                for j, s in enumerate(paths[u]):   # ancestor at depth j+1 (position P+j+1)
                    scr[r, s] = depth[u] - (j + 1) < W
            vis = torch.cat([(ring_pos[None] >= 0) & (ring_pos[None] > pos[:, None] - W), scr.to(self.device)], 1)
            a = masked_attention(q, torch.cat([ring_k, sk[:n_scr]]), torch.cat([ring_v, sv[:n_scr]]), vis)
            out = mid.finish(a, feat)
            hid.extend(out.unbind(0))
            lp = self.head.target_logp(out)
            if record is not None:
                for r, u in enumerate(frontier):
                    key = tuple(tokens[a_] for a_ in _path_nodes(parents, u))
                    record[key] = lp[r].float().cpu()
            return lp

        if record is not None:
            record[()] = root_logp.float().cpu()
        return build_tree(expand, int(root_token), spec.depth, spec.top_k, spec.total_tokens)


def _path_nodes(parents: list, u: int) -> list:
    out = []
    while u > 0:
        out.append(u)
        u = parents[u]
    return out[::-1]


def join_prefill_taps(chunks: Sequence[Sequence[torch.Tensor]]) -> list:
    """Runner.prefill returns taps per chunk ([[t0, t1, t2], ...]); concatenate them per layer."""
    if not chunks:
        raise ValueError("no tapped chunks")
    return [torch.cat([c[i] for c in chunks], 0) for i in range(len(chunks[0]))]
