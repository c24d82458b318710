"""AsyncTForCausalLM in PyTorch: the Qwen3 layout with async attention, UClipNorm everywhere
and Peri-LN (docs/DESIGN.md §5). Parameter names match the checkpoint's tensor names."""
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn


class UClipNorm(nn.Module):
    """y = w * clamp(x * rsqrt(mean(x^2) + eps), -clip, clip), computed in fp32 like HF's RMSNorm."""

    def __init__(self, size, eps, clip):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.clip = eps, clip

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x.clamp(-self.clip, self.clip)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, positions, theta):
    """Neox RoPE on x [B, H, L, D] at positions [L]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def async_attention(q, k, v, alpha, sigma, gamma, window, scale):
    """Causal async attention (docs/DESIGN.md §2). q [B, Hq, L, D]; k, v [B, Hkv, L, D]; alpha, sigma,
    gamma [Hq] fp32. Computed in fp32; no normalisation of any kind."""
    hq, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1).float()
    v = v.repeat_interleave(hq // hkv, dim=1).float()
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * scale          # [B, H, L, L]
    r = s.clamp_min(0)
    # A[j] = (1/W) sum_{t<W} R[j-t], with R = 0 left of key 0.
    a = sum(F.pad(r, (t, 0))[..., : r.shape[-1]] for t in range(window)) / window
    shape = (1, -1, 1, 1)
    p = gamma.view(shape) * (alpha.view(shape) * (s - sigma.view(shape) * a)).clamp(0, 1)
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    p = p.masked_fill(~causal, 0.0)
    return torch.matmul(p, v).to(q.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.hq, self.hkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.hq * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, h, bias=False)
        self.q_norm = UClipNorm(self.d, c["rms_norm_eps"], c["uclip_value"])
        self.k_norm = UClipNorm(self.d, c["rms_norm_eps"], c["uclip_value"])
        self.gate_alpha = nn.Parameter(torch.ones(self.hq))
        self.gate_sigma = nn.Parameter(torch.ones(self.hq))
        self.gate_gamma = nn.Parameter(torch.ones(self.hq))
        self.window, self.theta = c.get("attn_pool_window", 3), c["rope_theta"]

    def forward(self, x, positions):
        b, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, length, self.hq, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, length, self.hkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.hkv, self.d).transpose(1, 2)
        q, k = rope(q, positions, self.theta), rope(k, positions, self.theta)
        o = async_attention(q, k, v, self.gate_alpha.float(), self.gate_sigma.float(),
                            self.gate_gamma.float(), self.window, 1.0 / math.sqrt(self.d))
        return self.o_proj(o.transpose(1, 2).reshape(b, length, self.hq * self.d))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        norm = lambda: UClipNorm(c["hidden_size"], c["rms_norm_eps"], c["uclip_value"])
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.attn_output_layernorm, self.mlp_output_layernorm = norm(), norm()
        self.self_attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x, positions):
        # Peri-LN: each block's output is normalised before the residual add.
        h = x + self.attn_output_layernorm(self.self_attn(self.input_layernorm(x), positions))
        return h + self.mlp_output_layernorm(self.mlp(self.post_attention_layernorm(h)))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = UClipNorm(c["hidden_size"], c["rms_norm_eps"], c["uclip_value"])

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions)
        return self.norm(x)


class AsyncTForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Model(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if config.get("tie_word_embeddings", True):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids):
        """Logits [B, L, vocab] for input_ids [B, L]."""
        return self.lm_head(self.model(input_ids))

    @torch.no_grad()
    def generate_greedy(self, input_ids, steps):
        ids = input_ids
        for _ in range(steps):
            ids = torch.cat([ids, self(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids[:, input_ids.shape[1]:]


def load_asynct(directory, dtype=torch.bfloat16, device="cuda"):
    """Loads an AsyncT checkpoint directory written by asynct (or any with the same names)."""
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if config.get("architectures", [""])[0] != "AsyncTForCausalLM":
        raise ValueError(f"{directory}: not an AsyncTForCausalLM checkpoint")
    model = AsyncTForCausalLM(config)
    index = os.path.join(directory, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    state = {}
    for name in files:
        state.update(load_file(os.path.join(directory, name)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.get("tie_word_embeddings", True))]
    if missing or unexpected:
        raise ValueError(f"{directory}: missing {missing}, unexpected {unexpected}")
    model = model.to(device=device, dtype=dtype)
    for layer in model.model.layers:  # the gate parameters stay fp32
        for p in ("gate_alpha", "gate_sigma", "gate_gamma"):
            getattr(layer.self_attn, p).data = getattr(layer.self_attn, p).data.float()
    return model.eval()
