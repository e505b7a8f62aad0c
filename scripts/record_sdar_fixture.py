"""Record tests/fixtures/sdar_tiny/ from SDAR's official code (run OUTSIDE this repository's environment).

Setup (SCRATCH = /work/scratch/sdar): a virtual environment SCRATCH/venv with torch 2.13.0 (CPU), transformers 4.52.4
(the version modeling_sdar.py was generated from and config.json names), einops, safetensors; SCRATCH/official =
JetAstra/SDAR@c2041a8 `generate.py` and `training/model/SDAR-4B-Chat/{modeling,configuration}_sdar.py` (package
`sdar_hub`; its training-loss module, which needs Triton, replaced by a stub: training is not run); SCRATCH/stubs =
flash-attn's two inference calls replaced by their exact eager equivalents (`rms_norm_fn`: float32 normalise and scale,
cast once; `flash_attn_func(causal=False)`: softmax attention over every key, GQA by head groups).
Run: PYTHONPATH=SCRATCH/official:SCRATCH/stubs OMP_NUM_THREADS=1 SCRATCH/venv/bin/python
     scripts/record_sdar_fixture.py OUT_DIR [--draws N] [--no-draws | --draw-setting I]
(`--draw-setting I [--seed S]`: only draw setting I, written to OUT_DIR/draws_I_S.json, so settings and seeds run
in parallel processes; the fixture's `draws` list holds each setting's counts summed over its files.)

Writes OUT_DIR/{config.json, generation_config.json, model.safetensors, logits.safetensors, generate.json}.
- logits: canvases through the official SDARForCausalLM in eval mode: block-causal whole canvases (generate.py's
  prefill call), cached block forwards (prefill with store_kv, then a block with store_kv=False, as
  block_diffusion_generate calls them), prompts of several lengths one per call (our padded batches compare row by
  row), and the two-stream [x_t | x_0] forward under the official `block_attn_mask` / `block_diff_mask` (the training
  mask; run through the eval branch's SDPA call, which takes any boolean mask) with its mask.
- generate: block_diffusion_generate at T = 0 (the official greedy: temperature 1, top_k 1) for each strategy, with
  NFE (forward calls, counted by a pre-hook); seeded T > 0 runs (torch.manual_seed(seed)); and `draws` counts of
  completions at T > 0. The mask token's logit is set to -inf by a forward hook on lm_head in every generation (our
  sampler never proposes the mask id). `stable_ties`: the static strategy's greedy runs again with torch.topk's
  order among exact ties replaced by the lower slot first (ours). Every torch.topk call on a block's confidences is
  checked: `ties` counts exact ties at the k-th finite value, `overwrites` counts calls whose k exceeded the masked
  slots (the official code then overwrites k − m non-mask slots; we do not).
"""

import json
import sys

import torch

sys.setrecursionlimit(10000)
import generate as official  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from sdar_hub.configuration_sdar import SDARConfig  # noqa: E402
from sdar_hub.modeling_sdar import SDARForCausalLM, block_attn_mask  # noqa: E402

torch.set_num_threads(1)
OUT = sys.argv[1]
DRAWS = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 20000
V, MASK, EOS, BOS = 300, 297, 296, 295
CONFIG = dict(architectures=["SDARForCausalLM"], auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
              "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}, attention_bias=False, attention_dropout=0.0,
              attn_implementation="flex_attention", bos_token_id=BOS, eos_token_id=EOS, block_size=4,
              mask_token_id=MASK, fuse_cross_entropy=True, head_dim=32, hidden_act="silu", hidden_size=64,
              initializer_range=0.02, intermediate_size=128, max_position_embeddings=512, max_window_layers=2,
              model_type="sdar", num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2, rms_norm_eps=1e-6,
              rope_scaling=None, rope_theta=500.0, sliding_window=None, tie_word_embeddings=False,
              torch_dtype="float32", transformers_version="4.52.4", use_cache=False, use_sliding_window=False,
              vocab_size=V)


def build_model():
    config = SDARConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "auto_map")})
    config._attn_implementation = "sdpa"
    model = SDARForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * (2 * torch.rand(p.shape, generator=g) - 1))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


model = build_model()
with open(f"{OUT}/config.json", "w") as f:
    json.dump(CONFIG, f, indent=2, sort_keys=True)
with open(f"{OUT}/generation_config.json", "w") as f:
    json.dump({"bos_token_id": BOS, "eos_token_id": [EOS], "pad_token_id": EOS}, f, indent=2)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{OUT}/model.safetensors",
          metadata={"format": "pt"})


def tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(V) if t not in (MASK, EOS)])
    return allowed[torch.randint(len(allowed), (n,), generator=g)]


def block_mask(T, Lb):
    nb = T // Lb
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(Lb, 0).repeat_interleave(Lb, 1)
    return m.unsqueeze(0)  # [1, T, T] as generate.py builds it


logits = {}
with torch.no_grad():
    # whole canvases (prefill call): tokens with some masks, block 4 and 8
    for i, (T, Lb) in enumerate(((12, 4), (16, 8), (8, 4))):
        x = tokens(10 + i, T)[None]
        x[0, T // 2 + 1::2] = MASK
        logits[f"canvas{i}_ids"] = x
        logits[f"canvas{i}_block"] = torch.tensor(Lb)
        logits[f"canvas{i}_logits"] = model(x, attention_mask=block_mask(T, Lb),
                                            position_ids=torch.arange(T)[None]).logits
    # cached: prompts of several lengths, prefill of their full blocks, then the next block (with the prompt tail)
    for i, P in enumerate((3, 8, 11, 5)):
        Lb = 4
        prompt = tokens(20 + i, P)
        nb = (P + 8 + Lb - 1) // Lb
        x = torch.full((1, nb * Lb), MASK)
        x[0, :P] = prompt
        x[0, P + 1] = tokens(40 + i, 1)  # one committed slot in the block
        full = (P // Lb) * Lb
        cache = official.DynamicCache()
        am = block_mask(nb * Lb, Lb)
        pos = torch.arange(nb * Lb)[None]
        if full:
            model(x[:, :full], attention_mask=am[:, :full, :full], position_ids=pos[:, :full], past_key_values=cache,
                  use_cache=True, store_kv=True)
        blk = slice(full, full + Lb)
        out = model(x[:, blk], attention_mask=am[:, blk, :full + Lb], position_ids=pos[:, blk],
                    past_key_values=cache, use_cache=True, store_kv=False).logits
        logits[f"cached{i}_ids"] = x
        logits[f"cached{i}_prompt_length"] = torch.tensor(P)
        logits[f"cached{i}_block_logits"] = out
        logits[f"cached{i}_uncached_logits"] = model(x[:, :full + Lb], attention_mask=am[:, :full + Lb, :full + Lb],
                                                     position_ids=pos[:, :full + Lb]).logits
    # two-stream training forward: [x_t | x_0] under block_attn_mask, positions twice
    for i, (n, Lb) in enumerate(((12, 4), (16, 8))):
        x0 = tokens(60 + i, n)[None]
        xt = x0.clone()
        xt[0, torch.randperm(n, generator=torch.Generator().manual_seed(70 + i))[: n // 2]] = MASK
        mask = block_attn_mask([torch.tensor([n])], Lb, "cpu")  # [1, 2n, 2n]
        pos = torch.arange(n)[None]
        out = model(torch.cat([xt, x0], 1), attention_mask=mask[:, None], position_ids=torch.cat([pos, pos], 1)).logits
        logits[f"two_stream{i}_noisy"], logits[f"two_stream{i}_clean"] = xt, x0
        logits[f"two_stream{i}_block"] = torch.tensor(Lb)
        logits[f"two_stream{i}_mask"] = mask[0]
        logits[f"two_stream{i}_logits"] = out[:, :n]
save_file({k: v.contiguous() for k, v in logits.items()}, f"{OUT}/logits.safetensors")


def no_mask(_module, _inputs, out):
    out = out.clone()
    out[..., MASK] = -torch.inf
    return out


model.lm_head.register_forward_hook(no_mask)
NFE, TIES, OVER = [0], [0], [0]
model.register_forward_pre_hook(lambda *_: NFE.__setitem__(0, NFE[0] + 1))
_topk = torch.topk


STABLE = [False]


def checked_topk(x, k, *args, **kwargs):
    k = int(k)
    if x.dim() == 1:  # a block's confidences (generate.py:164, 177), not a top_k filter over the vocabulary
        finite = int(torch.isfinite(x).sum())
        OVER[0] += int(k > finite)
        srt = torch.sort(x[torch.isfinite(x)], descending=True).values
        if 0 < k < len(srt):
            TIES[0] += int(srt[k - 1] == srt[k])
        if STABLE[0]:  # exact ties to the lower slot (ours) instead of torch.topk's arbitrary order
            values, order = torch.sort(x, descending=True, stable=True)
            return values[:k], order[:k]
    return _topk(x, k, *args, **kwargs)


torch.topk = checked_topk


def run(prompt, seed=0, **kw):
    NFE[0] = TIES[0] = OVER[0] = 0
    torch.manual_seed(seed)
    x = official.block_diffusion_generate(model, {"input_ids": prompt[None]}, MASK, **kw)
    return x[0, len(prompt):].tolist(), NFE[0], TIES[0], OVER[0]


def record(prompt_seed, P, seed=0, **kw):
    prompt = tokens(prompt_seed, P)
    out, nfe, ties, over = run(prompt, seed, **kw)
    return dict(prompt=prompt.tolist(), seed=seed, settings=kw, completion=out, nfe=nfe, ties=ties, overwrites=over)


generations, seeded, draws, stable = [], [], [], []
STRATS = ("low_confidence_static", "low_confidence_dynamic", "sequential")
only = int(sys.argv[sys.argv.index("--draw-setting") + 1]) if "--draw-setting" in sys.argv else None
with torch.no_grad():
    for strategy in STRATS if only is None else ():
        for P in (8, 6, 3, 1):
            for Lb, S, L in ((4, 4, 8), (4, 2, 12), (8, 3, 16)):
                kw = dict(gen_length=L, block_length=Lb, denoising_steps=S, temperature=1.0, top_k=1,
                          remasking_strategy=strategy, confidence_threshold=0.9, stopping_criteria_idx=None)
                rec = record(100 + P, P, **kw)
                generations.append(rec)
                stop = rec["completion"][min(5, len(rec["completion"]) - 1)]  # a token it writes: stop on it
                generations.append(record(100 + P, P, **{**kw, "stopping_criteria_idx": [stop]}))
        if strategy == "low_confidence_static":  # greedy confidences are all 1: torch.topk's tie order decides
            STABLE[0] = True
            for P in (8, 6, 3, 1):
                for Lb, S, L in ((4, 4, 8), (4, 2, 12), (8, 3, 16)):
                    stable.append(record(100 + P, P, gen_length=L, block_length=Lb, denoising_steps=S,
                                         temperature=1.0, top_k=1, remasking_strategy=strategy,
                                         confidence_threshold=0.9, stopping_criteria_idx=None))
            STABLE[0] = False
        for P, temp, top_k, top_p, tau in ((6, 1.0, 3, 1.0, 0.45), (4, 0.7, 0, 1.0, 0.05), (3, 1.0, 4, 0.7, 0.5)):
            for seed in range(3):
                kw = dict(gen_length=8, block_length=4, denoising_steps=2, temperature=temp, top_k=top_k,
                          top_p=top_p, remasking_strategy=strategy, confidence_threshold=tau)
                seeded.append(record(200 + P, P, seed=seed, **kw))
    # (strategy, prompt length, top_k, top_p, τ, steps): no setting lets a quota exceed the masks left (dynamic with
    # one token per step), where the official code would overwrite committed slots and sample another law
    DRAW_SETTINGS = (("low_confidence_static", 4, 3, 1.0, 0.9, 2), ("low_confidence_dynamic", 2, 2, 1.0, 0.6, 4))
    if "--no-draws" not in sys.argv:
        for i, (strategy, P, top_k, top_p, tau, steps) in enumerate(DRAW_SETTINGS):
            if only is not None and i != only:
                continue
            prompt = tokens(300 + P, P)
            kw = dict(gen_length=4, block_length=4, denoising_steps=steps, temperature=1.0, top_k=top_k, top_p=top_p,
                      remasking_strategy=strategy, confidence_threshold=tau)
            counts, nfes, over = {}, {}, 0
            seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
            torch.manual_seed(seed)
            for _ in range(DRAWS):  # one row per call: generate.py:89 allocates a batch-1 canvas
                NFE[0] = OVER[0] = 0
                x = official.block_diffusion_generate(model, {"input_ids": prompt[None]}, MASK, **kw)
                key = " ".join(map(str, x[0, P:].tolist()))
                counts[key] = counts.get(key, 0) + 1
                nfes[NFE[0]] = nfes.get(NFE[0], 0) + 1
                over += OVER[0]
            draws.append(dict(prompt=prompt.tolist(), settings=kw, draws=DRAWS, counts=counts, nfe=nfes,
                              overwrites=over, seed=seed))
            print(strategy, len(counts), "distinct", nfes, "overwrites", over, flush=True)

import transformers  # noqa: E402

if only is not None:
    with open(f"{OUT}/draws_{only}_{draws[0]['seed']}.json", "w") as f:
        json.dump(draws[0], f)
    sys.exit(0)

with open(f"{OUT}/generate.json", "w") as f:
    json.dump(dict(torch=torch.__version__, transformers=transformers.__version__, generate=generations,
                   stable_ties=stable, seeded=seeded, draws=draws), f)
print(len(generations), "generations,", len(seeded), "seeded,", len(draws), "draw settings")
