"""The recorded-canvas policy likelihoods (`mdpo`, `dtreerpo`) against numbers produced by their anchors' own code on
the tiny LLaDA (tests/fixtures/anchors/mdpo.json: MDPO's diffusion_generate + compute_loss; dtreerpo.json: DARE's
d-TreeRPO tree search + _get_local_transition_logps; docs/anchors.md). Log-probs, weights and losses agree to
ATOL = 1e-5 absolute (rtol 0); canvases, scored sets and segment boundaries exactly."""

from __future__ import annotations

import pytest
import torch
from test_anchor_fixtures import assert_within, load, model_of

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.dtreerpo import draw_dtreerpo, segment_bounds
from dllm_ais.likelihood.mask_draws import PolicyDraw, draw_logprobs, token_terms
from dllm_ais.likelihood.mdpo import draw_mdpo, mdpo_lambda, recorded_canvas
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.likelihood.replay import canvases
from dllm_ais.types import Rollout


def _mdpo_trajectory(rec):
    prompt = torch.tensor(rec["inputs"]["prompt_ids"])
    tr = rec["trajectory"]
    inp, res = torch.tensor(tr["inputs"]), torch.tensor(tr["results"])  # [B, S, L] canvases x_t, proposals x̂0_t
    conf, final = torch.tensor(tr["confidence"]), torch.tensor(tr["final"])  # [B, S, L], [B, L]
    return prompt, inp, res, conf, final


def _rollout_of(prompt, inp, final, mask_id, counted=None):
    """The anchor's path as a Rollout: each position's commit step is the last step whose canvas masks it."""
    B, S, L = inp.shape
    masked = inp == mask_id
    steps = torch.arange(S)[None, :, None].expand(B, S, L)
    commit = torch.where(masked, steps, -1).max(1).values  # [B, L]
    assert (commit >= 0).all() and not (final == mask_id).any()  # every position masked at x_0, filled at the end
    counted = torch.ones_like(final, dtype=torch.bool) if counted is None else counted
    return Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt, dtype=torch.bool), completion_ids=final,
                   completion_mask=counted, commit_step=commit, num_steps=S)


def test_mdpo_canvases_are_the_rollout_record():
    """MDPO's x_t (its sampler's intermediate inputs) are the package's recorded canvases of the same path: the
    masked sets (`recorded_canvas`) and the ids (`replay.canvases`, the tail included)."""
    rec = load("mdpo.json")
    prompt, inp, _, _, final = _mdpo_trajectory(rec)
    mask_id = rec["model"]["mask_token_id"]
    ro = _rollout_of(prompt, inp, final, mask_id)
    B, S, L = inp.shape
    assert torch.equal(recorded_canvas(ro.commit_step, torch.arange(S).expand(B, S)), inp == mask_id)
    rows, steps = torch.arange(B).repeat_interleave(S), torch.arange(S).repeat(B)
    ids, _ = canvases(ro, rows, steps, mask_id)
    assert torch.equal(ids, torch.cat([prompt[rows], inp.reshape(B * S, L)], dim=1))
    assert bool((inp == mask_id).sum(-1).diff(dim=1).lt(-1).any())  # some step commits several tokens


def test_mdpo_log_probs_lambda_loss_and_gradient_match_mdpo():
    """On MDPO's own canvases, targets (its proposals x̂0_t) and confidences: per-token log-probs, λ_t = L /
    (#masked + 1e-4), and MDPO's first-iteration loss −Σ Â λ c ratio / (#masked + 1e-4) (value and gradient, each
    step as MDPO's micro-batch): the gradient is that of −Σ Â · (our per-token terms Σ weight · log p) / n."""
    rec = load("mdpo.json")
    m = model_of(rec)
    prompt, inp, res, conf, _ = _mdpo_trajectory(rec)
    mask_id, out = m.config.mask_token_id, rec["outputs"]
    B, S, L = inp.shape
    adv = torch.tensor(rec["inputs"]["advantages"])  # [B, S]
    param = dict(m.named_parameters())[rec["inputs"]["grad_param"]]
    ones_p, ones_c = torch.ones_like(prompt, dtype=torch.bool), torch.ones(B, L, dtype=torch.bool)
    for s in range(S):
        hidden = (inp[:, s] == mask_id)[:, None]  # [B, 1, L] x_t's masked positions (MDPO scores all of them)
        lam = mdpo_lambda(hidden, L)  # [B, 1]
        assert_within(lam[:, 0], torch.tensor(out["lambda_t"][s]))
        weight = torch.where(hidden, lam[..., None] * conf[:, s, None].double(), 0.0)
        draw = PolicyDraw(hidden, weight, None, None, hidden)
        with torch.no_grad():
            lp = draw_logprobs(m, prompt, ones_p, res[:, s], ones_c, draw, mask_token_id=mask_id)[:, 0]
        want = torch.tensor(out["per_token_logps"][s])
        assert_within(lp[hidden[:, 0]], want[hidden[:, 0]])
        m.zero_grad()
        terms = token_terms(draw, draw_logprobs(m, prompt, ones_p, res[:, s], ones_c, draw, mask_token_id=mask_id))
        n = hidden.sum() + 1e-4  # MDPO's normaliser: the micro-batch's masked count
        (-(adv[:, s].double() * terms.sum(-1).double()).sum() / n).backward()  # its gradient at ratio 1
        assert_within(param.grad, torch.tensor(out["grad"][s]))
        value = -(adv[:, s].double() * weight[:, 0].sum(-1)).sum() / n  # its value at ratio 1: −Σ Â λ c / n
        assert_within(value, torch.tensor(out["loss"][s]))
        assert float(param.grad.abs().max()) > 1e-3  # a real gradient


def test_mdpo_draw_scores_the_recorded_canvases_with_lambda_and_the_commit_confidence():
    """`draw_mdpo` on MDPO's path (every canvas: K ≥ steps): each canvas is one of MDPO's x_t, every counted position
    it masks is scored, and on the tokens committed at that step (where MDPO's target is the final token too) the
    weight · K is MDPO's λ_t · confidence exactly. Post-EOS positions (a tail declared on row 0) stay masked on the
    canvas and count in λ_t, but are never scored."""
    rec = load("mdpo.json")
    prompt, inp, _, conf, final = _mdpo_trajectory(rec)
    mask_id = rec["model"]["mask_token_id"]
    B, S, L = inp.shape
    counted = torch.ones(B, L, dtype=torch.bool)
    counted[0, 5:] = False  # as if row 0 had stopped at position 4
    ro = _rollout_of(prompt, inp, final, mask_id, counted)
    commit_conf = conf.gather(1, ro.commit_step[:, None, :])[:, 0]  # [B, L] the probability each token was committed
    draw = draw_mdpo(ro.commit_step, counted, S, 0, commit_conf)
    for b in range(B):
        used = draw.hidden[b].any(-1)  # canvases drawn for row b
        steps = [int(ro.commit_step[b][draw.hidden[b, k]].min()) for k in range(draw.hidden.shape[1]) if used[k]]
        K_b = len(steps)
        last = int(ro.commit_step[b][counted[b]].max())
        assert steps == list(range(last + 1))  # every canvas that still masks a counted token, in order
        for k, s in enumerate(steps):
            assert torch.equal(draw.hidden[b, k], inp[b, s] == mask_id)
            assert torch.equal(draw.mask[b, k], (inp[b, s] == mask_id) & counted[b])
            lam = torch.tensor(rec["outputs"]["lambda_t"][s][b], dtype=torch.float64)
            now = draw.mask[b, k] & (ro.commit_step[b] == s)
            assert_within(draw.weight[b, k][now] * K_b, lam * conf[b, s][now].double())
    assert bool((draw.hidden & ~counted[:, None, :]).any()) and not bool((draw.weight[0, :, 5:] != 0).any())


def _tree(rec):
    tr = rec["tree"]
    gen = torch.tensor(tr["node_generations"])  # [B, nodes, P + L]
    return tr, gen, torch.tensor(rec["inputs"]["prompt_ids"])


def _leaf_paths(tr) -> list[list[int]]:
    parent = tr["node_parent_idx"]
    out = []
    for leaf, is_leaf in enumerate(tr["node_is_leaf"]):
        if is_leaf:
            path = [leaf]
            while parent[path[-1]] >= 0:
                path.append(parent[path[-1]])
            out.append(path[::-1])
    return out


def test_dtreerpo_segments_canvases_and_log_probs_match_dare():
    """Each root-to-leaf path of DARE's d-TreeRPO tree as a rollout: our segment bounds are its branch points, each
    segment's canvas is the parent node's generation, its scored tokens those that went MASK -> token, and the
    per-token terms are DARE's local transition log-probs (one forward at the parent canvas)."""
    rec = load("dtreerpo.json")
    m = model_of(rec)
    tr, gen, prompt = _tree(rec)
    mask_id, P = m.config.mask_token_id, prompt.shape[1]
    T, s = rec["anchor"]["settings"]["num_diffusion_steps"], rec["anchor"]["settings"]["tree_contraction_factor"]
    bounds = segment_bounds(T, s)
    assert bounds == sorted(T - bp for bp in tr["branch_points"]) and len(bounds) == s + 1
    local = {seg["node"]: torch.tensor(seg["local_logps"]) for seg in rec["outputs"]["segments"]}
    paths = _leaf_paths(tr)
    B = prompt.shape[0]
    rows = [(path, b) for path in paths for b in range(B)]
    L = gen.shape[-1] - P
    commit = torch.full((len(rows), L), -1, dtype=torch.long)
    want = torch.zeros(len(rows), L, dtype=torch.float64)
    for r, (path, b) in enumerate(rows):
        for k, (par, child) in enumerate(zip(path[:-1], path[1:], strict=True)):
            changed = (gen[b, par, P:] == mask_id) & (gen[b, child, P:] != mask_id)
            commit[r][changed] = bounds[k]  # any step of segment k: the draw only reads the segment
            want[r][changed] = local[child][b][changed].double()
    final = torch.stack([gen[b, path[-1], P:] for path, b in rows])
    ro = Rollout(prompt_ids=prompt[[b for _, b in rows]], prompt_mask=torch.ones(len(rows), P, dtype=torch.bool),
                 completion_ids=final, completion_mask=torch.ones_like(final, dtype=torch.bool), commit_step=commit,
                 num_steps=T)
    draw = draw_dtreerpo(ro.commit_step, ro.completion_mask, T, s)
    for r, (path, b) in enumerate(rows):
        for k, (par, child) in enumerate(zip(path[:-1], path[1:], strict=True)):
            assert torch.equal(draw.hidden[r, k], gen[b, par, P:] == mask_id)
            assert torch.equal(draw.mask[r, k], (gen[b, par, P:] == mask_id) & (gen[b, child, P:] != mask_id))
    ids, _ = canvases(ro, torch.arange(len(rows)), torch.full((len(rows),), bounds[1]), mask_id)
    assert torch.equal(ids, torch.stack([gen[b, path[1]] for path, b in rows]))  # x_{b_1} = the first child node
    like = policy_likelihood("dtreerpo", PolicyLikelihoodConfig(dtreerpo_segments=s))
    with torch.no_grad():
        got = like.token_logp(m, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                              like.draw_rollout(ro, 0), mask_token_id=mask_id)
    assert bool((want != 0).all())  # every token scored once, at its segment's parent canvas
    assert_within(got, want)


@pytest.mark.parametrize("T,s,want", [(6, 3, [0, 2, 4, 6]), (128, 2, [0, 64, 128]), (128, 3, [0, 42, 85, 128]),
                                      (2, 4, [0, 1, 2])])
def test_segment_bounds_are_dares_branch_points(T, s, want):
    """DARE's branch_points = [T] + [T − int(k·T/s)], deduplicated, counted here in forward steps."""
    branch = sorted({T} | {T - int(k * T / s) for k in range(1, s + 1)}, reverse=True)
    assert segment_bounds(T, s) == want == sorted(T - bp for bp in branch)
