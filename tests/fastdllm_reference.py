"""A plain, independent re-implementation of Fast-dLLM's LLaDA sampling (NVlabs/Fast-dLLM `llada/generate.py` and
the cache handling of its `llada/model/modeling_llada.py`), for tests of dllm_ais's sampler. Nothing here calls the
package's sampler or its model forward: the reference reads an LLaDAModelLM's weights and runs its own transformer.

As Fast-dLLM writes it: batch 1, no padding; the cache is a list of per-layer (keys before RoPE, values); a forward
with `past_key_values` and no `replace_position` concatenates the cached keys with the fed ones (RoPE over all key
positions 0..key_len-1, queries at the last query_len positions); with `replace_position` it overwrites the cached
slots in place and rotates the queries at positions [end - query_len, end). `get_transfer_index` proposes the argmax
of the full logits (the mask token included: the reference asserts it never commits one, since the package's sampler
never proposes it) with its full-softmax probability as confidence; `threshold` keeps the top one and every other
one >= threshold. NFE counts forward calls, as Fast-dLLM's functions return it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ReferenceLLaDA:
    """LLaDA forward over an LLaDAModelLM's weights, with Fast-dLLM's past_key_values / replace_position."""

    def __init__(self, model):
        t = model.model.transformer
        self.config = model.config
        self.wte = t.wte.weight
        self.ln_f = t.ln_f.weight
        self.head = t.ff_out.weight
        self.blocks = [{name: getattr(b, name).weight for name in ("attn_norm", "q_proj", "k_proj", "v_proj",
                                                                     "attn_out", "ff_norm", "ff_proj", "up_proj",
                                                                     "ff_out")} for b in t.blocks]

    def _norm(self, x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps) * w.float()).to(x.dtype)

    def _rope_tables(self, n, device):
        dim = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
        freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.sin()[None, None], emb.cos()[None, None]  # [1, 1, n, D]

    @staticmethod
    def _rotate(t, sin, cos):
        B, nh, T, hs = t.shape
        x1, x2 = t.float().view(B, nh, T, 2, hs // 2).unbind(dim=-2)
        return (t.float() * cos + torch.cat((-x2, x1), dim=-1) * sin).to(t.dtype)

    def __call__(self, x, past_key_values=None, use_cache=False, replace_position=None):
        """x [1, Tq] -> (logits [1, Tq, V], present: list of (k, v) [1, H, key_len, D] per layer or None)."""
        h = F.embedding(x, self.wte)
        H, D = self.config.n_heads, self.config.head_dim
        present = [] if use_cache else None
        for i, w in enumerate(self.blocks):
            B, T, C = h.shape
            a = self._norm(h, w["attn_norm"])
            q, k, v = (F.linear(a, w[n]).view(B, T, H, D).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
            end = None
            if past_key_values is not None:
                past_k, past_v = past_key_values[i]
                if replace_position is None:
                    k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)
                else:
                    idx = replace_position.nonzero(as_tuple=True)[1]
                    past_k[:, :, idx] = k
                    past_v[:, :, idx] = v
                    k, v = past_k, past_v
                    end = int(idx.max()) + 1
            if use_cache:
                present.append((k, v))
            q_len, key_len = q.shape[-2], k.shape[-2]
            sin, cos = self._rope_tables(key_len, x.device)
            q_end = key_len if end is None else end
            q = self._rotate(q, sin[:, :, q_end - q_len:q_end], cos[:, :, q_end - q_len:q_end])
            k = self._rotate(k, sin, cos)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=False)
            h = h + F.linear(att.transpose(1, 2).reshape(B, T, C), w["attn_out"])
            m = self._norm(h, w["ff_norm"])
            h = h + F.linear(F.silu(F.linear(m, w["ff_proj"])) * F.linear(m, w["up_proj"]), w["ff_out"])
        return F.linear(self._norm(h, self.ln_f), self.head), present


def get_num_transfer_tokens(mask_index, steps):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    num = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num[i, :remainder[i]] += 1
    return num


def get_transfer_index(logits, mask_index, x, num_transfer_tokens, threshold, mask_id):
    """Temperature 0, low_confidence remasking."""
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -torch.inf)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer[j, select] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select[k]] < threshold:
                    transfer[j, select[k]] = False
    assert not (x0[transfer] == mask_id).any(), "Fast-dLLM would commit the mask token here"
    return x0, transfer


def _canvas(prompt, gen_length, mask_id):
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt
    return x


@torch.no_grad()
def generate(model, prompt, steps, gen_length, block_length, mask_id, threshold=None):
    """Fast-dLLM's `generate` at T = 0: prompt [1, P] -> (canvas [1, P + L], nfe)."""
    x = _canvas(prompt, gen_length, mask_id)
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    P, nfe = prompt.shape[1], 0
    for b in range(num_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        num = get_num_transfer_tokens(x[:, s:e] == mask_id, steps)
        i = 0
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits, _ = model(x)
            mask_index[:, e:] = 0
            x0, transfer = get_transfer_index(logits, mask_index, x, num[:, i] if threshold is None else None,
                                              threshold, mask_id)
            x[transfer] = x0[transfer]
            i += 1
            if (x[:, s:e] == mask_id).sum() == 0:
                break
    return x, nfe


@torch.no_grad()
def generate_with_prefix_cache(model, prompt, steps, gen_length, block_length, mask_id, threshold=None):
    x = _canvas(prompt, gen_length, mask_id)
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    P, nfe = prompt.shape[1], 0
    for b in range(num_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        num = get_num_transfer_tokens(x[:, s:e] == mask_id, steps)
        logits, past = model(x, use_cache=True)
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, transfer = get_transfer_index(logits, mask_index, x, num[:, 0] if threshold is None else None, threshold,
                                          mask_id)
        x[transfer] = x0[transfer]
        past = [(k[:, :, :s], v[:, :, :s]) for k, v in past]
        nfe += 1
        i = 1
        while True:
            nfe += 1
            mask_index = x[:, s:] == mask_id
            mask_index[:, block_length:] = 0
            logits, _ = model(x[:, s:], past_key_values=past, use_cache=True)
            x0, transfer = get_transfer_index(logits, mask_index, x[:, s:], num[:, i] if threshold is None else None,
                                              threshold, mask_id)
            x[:, s:][transfer] = x0[transfer]
            if (x[:, s:e] == mask_id).sum() == 0:
                break
            i += 1
    return x, nfe


@torch.no_grad()
def generate_with_dual_cache(model, prompt, steps, gen_length, block_length, mask_id, threshold=None):
    x = _canvas(prompt, gen_length, mask_id)
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    P, nfe = prompt.shape[1], 0
    for b in range(num_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        num = get_num_transfer_tokens(x[:, s:e] == mask_id, steps)
        logits, past = model(x, use_cache=True)
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, transfer = get_transfer_index(logits, mask_index, x, num[:, 0] if threshold is None else None, threshold,
                                          mask_id)
        x[transfer] = x0[transfer]
        nfe += 1
        i = 1
        replace_position = torch.zeros_like(x, dtype=torch.bool)
        replace_position[:, s:e] = 1
        while True:
            nfe += 1
            mask_index = x[:, s:e] == mask_id
            logits, _ = model(x[:, s:e], past_key_values=past, use_cache=True, replace_position=replace_position)
            x0, transfer = get_transfer_index(logits, mask_index, x[:, s:e], num[:, i] if threshold is None else None,
                                              threshold, mask_id)
            x[:, s:e][transfer] = x0[transfer]
            if (x[:, s:e] == mask_id).sum() == 0:
                break
            i += 1
    return x, nfe


GENERATORS = {"none": generate, "prefix": generate_with_prefix_cache, "dual": generate_with_dual_cache}
"""SamplerConfig.cache -> the Fast-dLLM function it reproduces."""
