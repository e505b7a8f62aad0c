"""Record tests/fixtures/dream_generate.json from Dream's official code (run OUTSIDE this repository's environment).

Setup: the scratch folder of scripts/record_dream_fixture.py (SCRATCH/venv with torch 2.13.0, transformers 4.46.3,
safetensors; SCRATCH/dream_hubpos = NVlabs/Fast-dLLM `dream/model/` with the hub's position_ids restored).
Run: OMP_NUM_THREADS=1 SCRATCH/venv/bin/python scripts/record_dream_generate.py SCRATCH CKPT_DIR OUT_JSON
(options: `--draws N`, default 20000; `--t0-only`: the T = 0 generations only; `--batched-only`: no one-row-per-call
threshold draws).

- Uncached: generation_utils.DreamGenerationMixin.diffusion_generate (the hub `diffusion_generate`).
- Cached: generation_utils_block (Fast-dLLM's), bound as Fast-dLLM's eval.py binds it.
- The mask token's logit is set to -inf by a forward hook on lm_head (our sampler's one departure: it never proposes
  the mask id), so both sides sample the same law.
- Padded uncached fixtures use dream_hubpos (Fast-dLLM's modeling copy with the hub's position_ids restored on
  uncached forwards; Fast-dLLM's copy overwrites them with arange).
- Every selection torch.topk call is checked for an exact tie at the k boundary (or at the top); fixtures must be
  tie-free, since torch.topk breaks ties arbitrarily.
"""

import hashlib
import json
import sys
import types

import torch

sys.path.insert(0, sys.argv[1])
from dream_hubpos import generation_utils as gu  # noqa: E402
from dream_hubpos import generation_utils_block as gub  # noqa: E402
from dream_hubpos.configuration_dream import DreamConfig  # noqa: E402
from dream_hubpos.modeling_dream import DreamModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

torch.set_num_threads(1)
CKPT, OUT = sys.argv[2], sys.argv[3]
DRAWS = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 20000

config = DreamConfig.from_pretrained(CKPT)
config._attn_implementation = "sdpa"
model = DreamModel(config)
state = load_file(f"{CKPT}/model.safetensors")
missing, unexpected = model.load_state_dict(state, strict=False)
assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
if "lm_head.weight" in missing:
    model.tie_weights()
model = model.float().eval()
MASK, V = config.mask_token_id, config.vocab_size
PAD = config.pad_token_id
model.generation_config = gu.DreamGenerationConfig(mask_token_id=MASK, pad_token_id=PAD,
                                                   eos_token_id=config.eos_token_id,
                                                   bos_token_id=getattr(config, "bos_token_id", None))


def no_mask(_module, _inputs, out):
    out = out.clone()
    out[..., MASK] = -torch.inf
    return out


model.lm_head.register_forward_hook(no_mask)
NFE = [0]
model.register_forward_pre_hook(lambda *_: NFE.__setitem__(0, NFE[0] + 1))
TIES = [0]
_topk = torch.topk


def checked_topk(x, k, *args, **kwargs):
    out = _topk(x, k, *args, **kwargs)
    if x.shape[-1] != V and k >= 1:  # a selection over positions, not a top_k filter over the vocabulary
        srt = torch.sort(x, dim=-1, descending=True).values
        fin = torch.isfinite(srt)
        if k < x.shape[-1]:
            TIES[0] += int(((srt[..., k - 1] == srt[..., k]) & fin[..., k]).sum())
        if x.shape[-1] > 1:
            TIES[0] += int(((srt[..., 0] == srt[..., 1]) & fin[..., 1]).sum())
    return out


torch.topk = checked_topk
UNCACHED = (gu.DreamGenerationMixin.diffusion_generate, gu.DreamGenerationMixin._sample)
CACHED = (gub.DreamGenerationMixin.diffusion_generate, gub.DreamGenerationMixin._sample)


def bind(pair):
    model.diffusion_generate = types.MethodType(pair[0], model)
    model._sample = types.MethodType(pair[1], model)


def prompts(seed, B, P, pad_left=()):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(V) if t not in (MASK, PAD, config.eos_token_id)])
    ids = allowed[torch.randint(len(allowed), (B, P), generator=g)]
    mask = torch.ones(B, P, dtype=torch.long)
    for b, n in enumerate(pad_left):
        ids[b, :n] = PAD
        mask[b, :n] = 0
    return ids, mask


def run(kind, ids, mask, seed=0, **kw):
    bind(UNCACHED if kind == "none" else CACHED)
    NFE[0] = 0
    TIES[0] = 0
    torch.manual_seed(seed)
    L = kw.pop("gen_length")
    # transformers 4.46's PretrainedConfig carries legacy generation defaults (top_k=50, top_p=1.0) that
    # diffusion_generate reads through DreamGenerationConfig.from_model_config: pass both explicitly
    kw.setdefault("top_k", None)
    kw.setdefault("top_p", None)
    extra = {}
    if kind != "none":
        extra = dict(block_length=kw.pop("block_length"), dual_cache=kind == "dual",
                     threshold=kw.pop("threshold", 0.9))
    out = model.diffusion_generate(ids, attention_mask=mask if bool((mask == 0).any()) else None,
                                   max_new_tokens=L, output_history=False, return_dict_in_generate=True, **kw, **extra)
    return out.sequences[:, ids.shape[1]:], NFE[0], TIES[0]


def fixture(name, kind, seed, B, P, pad_left, **kw):
    ids, mask = prompts(seed, B, P, pad_left)
    settings = dict(kw)
    comp, nfe, ties = run(kind, ids, mask, **dict(kw))
    assert not bool((comp == MASK).any()), name
    print(f"{name}: nfe={nfe} ties={ties} {comp.tolist()}", flush=True)
    return dict(name=name, cache=kind, prompt_ids=ids.tolist(), prompt_mask=mask.tolist(), settings=settings,
                completion=comp.tolist(), nfe=nfe, ties=ties)


def draws(name, kind, seed, P, n, sequential=False, **kw):
    ids, mask = prompts(seed, 1, P)
    counts = {}
    if sequential:
        for i in range(n):
            comp, _, _ = run(kind, ids, mask, seed=1000 + i, **dict(kw))
            key = " ".join(map(str, comp[0].tolist()))
            counts[key] = counts.get(key, 0) + 1
    else:
        comp, _, _ = run(kind, ids.expand(n, -1).clone(), mask.expand(n, -1).clone(), seed=7, **dict(kw))
        for row in comp.tolist():
            key = " ".join(map(str, row))
            counts[key] = counts.get(key, 0) + 1
    print(f"{name}: {len(counts)} outcomes", flush=True)
    return dict(name=name, cache=kind, prompt_ids=ids.tolist(), settings=kw, draws=n, counts=counts)


T0 = [
    fixture("maskgit_plus-steps=L-top_p", "none", 1, 2, 6, (), gen_length=8, steps=8, alg="maskgit_plus",
            temperature=0.0, top_p=0.95),
    fixture("topk_margin-top_p-top_k", "none", 2, 2, 5, (), gen_length=8, steps=4, alg="topk_margin",
            temperature=0.0, top_p=0.9, top_k=40),
    fixture("entropy-padded-top_k", "none", 3, 3, 6, (0, 2, 4), gen_length=10, steps=5, alg="entropy",
            temperature=0.0, top_k=20),
    fixture("maskgit_plus-padded", "none", 4, 2, 5, (3, 0), gen_length=6, steps=3, alg="maskgit_plus",
            temperature=0.0),
    fixture("prefix-entropy", "prefix", 5, 2, 5, (), gen_length=12, steps=9, alg="entropy", temperature=0.0,
            block_length=4, top_p=0.9),
    fixture("dual-entropy", "dual", 6, 1, 5, (), gen_length=12, steps=6, alg="entropy", temperature=0.0,
            block_length=4),
    fixture("prefix-threshold", "prefix", 7, 1, 5, (), gen_length=12, steps=12, alg="confidence_threshold",
            temperature=0.0, block_length=4, top_k=3, threshold=0.42),
    fixture("dual-threshold", "dual", 8, 1, 5, (), gen_length=12, steps=12, alg="confidence_threshold",
            temperature=0.0, block_length=4, top_k=3, threshold=0.4),
]
G = [] if "--t0-only" in sys.argv else [
    draws("maskgit_plus-T1-top_k3", "none", 11, 4, DRAWS, gen_length=3, steps=3, alg="maskgit_plus",
          temperature=1.0, top_k=3),
    draws("origin-T0.8-top_k3", "none", 12, 4, DRAWS, gen_length=3, steps=2, alg="origin", temperature=0.8,
          top_k=3),
    draws("entropy-alg_temp0.5-top_k3", "none", 13, 4, DRAWS, gen_length=3, steps=3, alg="entropy",
          temperature=1.0, top_k=3, alg_temp=0.5),
    draws("topk_margin-top_p0.7-top_k3", "none", 14, 4, DRAWS, gen_length=3, steps=2, alg="topk_margin",
          temperature=1.5, top_p=0.7, top_k=3),
    draws("prefix-entropy-T1-top_k2", "prefix", 15, 4, DRAWS, gen_length=4, steps=4, alg="entropy",
          temperature=1.0, top_k=2, block_length=2),
]
if "--t0-only" not in sys.argv and "--batched-only" not in sys.argv:  # one row per call: slow (~0.1 s a call)
    G.append(draws("dual-threshold-T1-top_k2", "dual", 16, 4, DRAWS, sequential=True, gen_length=4, steps=4,
                   alg="confidence_threshold", temperature=1.0, top_k=2, block_length=2, threshold=0.55))
sha = hashlib.sha256(open(f"{CKPT}/model.safetensors", "rb").read()).hexdigest()
json.dump(dict(checkpoint_sha256=sha, torch=torch.__version__, transformers=__import__("transformers").__version__,
               generate=T0, draws=G), open(OUT, "w"), indent=1)
print("wrote", OUT)
