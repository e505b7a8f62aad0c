"""Record tests/fixtures/dream_threshold.json from Fast-dLLM's uncached Dream threshold decoding (run OUTSIDE this
repository's environment).

Setup: the scratch folder of scripts/record_dream_fixture.py (SCRATCH/venv with torch 2.13.0, transformers 4.46.3,
safetensors; SCRATCH/dream_official = NVlabs/Fast-dLLM `dream/model/` as it is). Every call here is one row without
padding, where Fast-dLLM's positions (arange) are the hub's.
Run: OMP_NUM_THREADS=1 SCRATCH/venv/bin/python scripts/record_dream_threshold.py SCRATCH CKPT_DIR OUT_JSON
(`--draws N`, default 20000 one-row calls per T > 0 setting; `--t0-only`: no draws; `--defaults-only`: add the
official defaults to an existing OUT_JSON).

- `generation_utils.DreamGenerationMixin.diffusion_generate` with alg="confidence_threshold" (the uncached `_sample`:
  quota L / steps per step plus what earlier steps left, a shortfall at the last step adds a step), bound to the
  official model as scripts/record_dream_generate.py binds it; NFE = forward calls (a pre-hook).
- The mask token's logit is set to -inf by a forward hook on lm_head (our sampler never proposes the mask id).
- `top_k` and `top_p` are always passed (transformers 4.46 reads an omitted top_k as 50 from the model config).
- The T > 0 draws of a setting are n calls on one global RNG stream, seeded once.
- `decisive_ties` counts the selection torch.topk calls (over the canvas) whose result depends on torch.topk's
  arbitrary tie order: a tie at the quota boundary among values >= τ (which of them commits), or a tie at the top
  below τ (which one is forced). Fixtures must have none.
"""

import contextlib
import hashlib
import io
import json
import sys
import types

import torch

sys.path.insert(0, sys.argv[1])
from dream_official import generation_utils as gu  # noqa: E402
from dream_official.configuration_dream import DreamConfig  # noqa: E402
from dream_official.modeling_dream import DreamModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

torch.set_num_threads(1)
CKPT, OUT = sys.argv[2], sys.argv[3]
DRAWS = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 20000

config = DreamConfig.from_pretrained(CKPT)
config._attn_implementation = "sdpa"
model = DreamModel(config)
missing, unexpected = model.load_state_dict(load_file(f"{CKPT}/model.safetensors"), strict=False)
assert not unexpected and not missing, (missing, unexpected)
model = model.float().eval()
MASK, V, PAD = config.mask_token_id, config.vocab_size, config.pad_token_id
model.generation_config = gu.DreamGenerationConfig(mask_token_id=MASK, pad_token_id=PAD,
                                                   eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id)
model.diffusion_generate = types.MethodType(gu.DreamGenerationMixin.diffusion_generate, model)
model._sample = types.MethodType(gu.DreamGenerationMixin._sample, model)


def no_mask(_module, _inputs, out):
    out = out.clone()
    out[..., MASK] = -torch.inf
    return out


model.lm_head.register_forward_hook(no_mask)
NFE, TIES, TAU = [0], [0], [None]
model.register_forward_pre_hook(lambda *_: NFE.__setitem__(0, NFE[0] + 1))
_topk = torch.topk


def checked_topk(x, k, *args, **kwargs):
    out = _topk(x, k, *args, **kwargs)
    if x.shape[-1] != V and k >= 1:  # the selection over canvas positions, not a top_k filter over the vocabulary
        srt = torch.sort(x, dim=-1, descending=True).values[0]
        finite = int(torch.isfinite(srt).sum())
        if k < finite and srt[k - 1] == srt[k] and float(srt[k - 1]) >= TAU[0]:
            TIES[0] += 1
        if finite > 1 and srt[0] == srt[1] and float(srt[0]) < TAU[0]:
            TIES[0] += 1
    return out


torch.topk = checked_topk


def prompt(seed, P):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(V) if t not in (MASK, PAD, config.eos_token_id)])
    return allowed[torch.randint(len(allowed), (1, P), generator=g)]


def run(ids, seed=0, **kw):
    """One official call; seed None: go on with the global RNG stream as it is."""
    NFE[0] = 0
    TIES[0] = 0
    TAU[0] = kw["threshold"]
    if seed is not None:
        torch.manual_seed(seed)
    kw.setdefault("top_k", None)
    kw.setdefault("top_p", None)
    with contextlib.redirect_stdout(io.StringIO()):  # _sample prints "used steps" and "used time"
        out = model.diffusion_generate(ids, attention_mask=None, max_new_tokens=kw.pop("gen_length"),
                                       output_history=False, return_dict_in_generate=True,
                                       alg="confidence_threshold", **kw)
    return out.sequences[:, ids.shape[1]:], NFE[0], TIES[0]


def fixture(name, seed, P, **kw):
    ids = prompt(seed, P)
    comp, nfe, ties = run(ids, **dict(kw))
    assert not bool((comp == MASK).any()), name
    print(f"{name}: nfe={nfe} decisive_ties={ties} {comp.tolist()}", flush=True)
    return dict(name=name, prompt_ids=ids.tolist(), settings=kw, completion=comp.tolist(), nfe=nfe,
                decisive_ties=ties)


def draws(name, seed, P, n, **kw):
    ids = prompt(seed, P)
    counts, nfes = {}, {}
    # one stream for all n calls, as our sampler draws (tests/fixtures/dream_generate.md: the first recording
    # reseeded every call with 1000 + i and its NFE counts sat 3.1 standard errors off the exact law)
    torch.manual_seed(3000 + seed)
    for _ in range(n):
        comp, nfe, _ = run(ids, seed=None, **dict(kw))
        key = " ".join(map(str, comp[0].tolist()))
        counts[key] = counts.get(key, 0) + 1
        nfes[str(nfe)] = nfes.get(str(nfe), 0) + 1
    print(f"{name}: {len(counts)} outcomes, NFE counts {nfes}", flush=True)
    return dict(name=name, prompt_ids=ids.tolist(), settings=kw, draws=n, counts=counts, nfe_counts=nfes)


# The official defaults the sampler's own must equal (DreamGenerationConfig's eps: the schedule's end), and the
# schedule they give: timesteps linspace(1, eps, steps + 1) and origin's move probabilities 1 - s/t (generation_utils.py
# _sample), for 8 steps. `--defaults-only` adds just these to an existing OUT_JSON.
official = gu.DreamGenerationConfig()
ts = torch.linspace(1, official.eps, 9)
DEFAULTS = dict(eps=official.eps, alg=official.alg, steps=official.steps, timesteps_8=ts.tolist(),
                p_transfer_8=[float(1 - ts[i + 1] / ts[i]) for i in range(7)] + [1.0])
if "--defaults-only" in sys.argv:
    data = json.load(open(OUT))
    data["defaults"] = DEFAULTS
    json.dump(data, open(OUT, "w"), indent=1)
    print("wrote defaults to", OUT, DEFAULTS)
    sys.exit(0)
T0 = [
    fixture("carry-top_k3", 1, 6, gen_length=8, steps=4, temperature=0.0, top_k=3, threshold=0.5),
    fixture("last-step-adds-forwards", 2, 5, gen_length=6, steps=2, temperature=0.0, top_k=3, threshold=0.9),
    fixture("top_p-tau0.3", 3, 6, gen_length=12, steps=4, temperature=0.0, top_p=0.9, threshold=0.3),
    fixture("no-filter-tau0.05", 4, 4, gen_length=8, steps=2, temperature=0.0, threshold=0.05),
    fixture("confidence-equals-tau", 5, 5, gen_length=6, steps=1, temperature=0.0, top_k=1, threshold=1.0),
    fixture("low-tau-fills-each-quota", 6, 5, gen_length=8, steps=4, temperature=0.0, top_k=2, threshold=0.01),
]
G = [] if "--t0-only" in sys.argv else [
    draws("T1-top_k3-tau0.4", 11, 4, DRAWS, gen_length=4, steps=2, temperature=1.0, top_k=3, threshold=0.4),
]
sha = hashlib.sha256(open(f"{CKPT}/model.safetensors", "rb").read()).hexdigest()
json.dump(dict(checkpoint_sha256=sha, torch=torch.__version__, transformers=__import__("transformers").__version__,
               generate=T0, draws=G, defaults=DEFAULTS), open(OUT, "w"), indent=1)
print("wrote", OUT)
