"""A Llama/Mistral-family decoder in one readable file, beside the GPT of ``model.py``.

Config first, then the modules in reading order: RMSNorm, rotary embeddings, grouped-query
attention (with Mistral's optional sliding window), the SwiGLU MLP, the block, the model.
Module and parameter names are Hugging Face's ``LlamaForCausalLM`` / ``MistralForCausalLM``
names without their leading ``model.``, and the rotary embedding uses the same (rotate-half)
layout of the query and key features, so published weights load by name and unchanged
(``weights.py``). The tensor-parallel plan, which names these modules, sits at the end.
"""

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)


@dataclass
class LlamaConfig:
    """Shape of the model; Hugging Face's ``config.json`` names are in the comments."""

    vocab_size: int = 32000  # vocab_size
    dim: int = 4096  # hidden_size
    n_layers: int = 32  # num_hidden_layers
    n_heads: int = 32  # num_attention_heads
    n_kv_heads: int = 32  # num_key_value_heads; fewer than n_heads: grouped-query attention
    head_dim: int | None = None  # head_dim; unset: dim // n_heads
    ffn_dim: int = 11008  # intermediate_size
    norm_eps: float = 1e-5  # rms_norm_eps
    rope_theta: float = 10000.0  # rope_theta
    rope_scaling: dict | None = None  # rope_scaling: Llama 3.1's long-context frequencies
    max_seq_len: int = 4096  # max_position_embeddings
    sliding_window: int | None = None  # sliding_window: Mistral's attention span
    tie_embeddings: bool = False  # tie_word_embeddings

    @property
    def head_size(self) -> int:
        return self.head_dim or self.dim // self.n_heads


# From tiny (tests) to 7B-class; the published models' shapes, vocabulary set by the data.
PRESETS: dict[str, LlamaConfig] = {
    "llama-tiny": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128),
    "mistral-tiny": LlamaConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, sliding_window=16
    ),
    "llama-small": LlamaConfig(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024),
    # Llama 3.2 1B
    "llama-1b": LlamaConfig(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        rope_theta=500000.0,
        tie_embeddings=True,
    ),
    # Llama 2 7B (multi-head attention)
    "llama-7b": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008),
    # Llama 3 8B
    "llama3-8b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, rope_theta=500000.0
    ),
    # Mistral 7B v0.1 (grouped-query attention, 4096-token sliding window)
    "mistral-7b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, sliding_window=4096
    ),
}


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32 whatever the input."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_frequencies(config: LlamaConfig, device: torch.device) -> torch.Tensor:
    """Rotation speed of each feature pair; Llama 3.1's scaling slows the low frequencies down
    for long contexts (``rope_scaling.rope_type: llama3``)."""
    d = config.head_size
    inv_freq = 1.0 / config.rope_theta ** (
        torch.arange(0, d, 2, device=device, dtype=torch.float32) / d
    )
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    mid = (wavelen <= old_context / low) & (wavelen >= old_context / high)
    return torch.where(mid, blended, scaled)


def rope_tables(
    config: LlamaConfig, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles (T × head size), computed per forward: a few
    thousand numbers, and no buffer to restore when a model is materialised from meta."""
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(t, rope_frequencies(config, device))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + d/2) feature pair of ``x`` (B × heads × T × d) by its angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def sliding_window_mask(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """Causal attention limited to the last ``window`` positions, self included (Mistral)."""
    i = torch.arange(seq_len, device=device)
    distance = i[:, None] - i[None, :]
    return (distance >= 0) & (distance < window)


class Attention(nn.Module):
    """Grouped-query self-attention: ``n_kv_heads`` key/value heads, each shared by
    ``n_heads / n_kv_heads`` query heads. Under tensor parallelism each rank holds a slice
    of the heads, so the head count is read from the projections' output, not the config."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        d = config.head_size
        self.head_dim = d
        self.q_proj = nn.Linear(config.dim, config.n_heads * d, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.n_heads * d, config.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (
            proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) · up(x))``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One pre-norm block; the unit FSDP shards, activation checkpointing recomputes and
    torch.compile compiles."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Token embedding, a stack of blocks, a final norm and the output head (tied to the
    embedding when the config says so, as in Llama 3.2 1B)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.init_weights(torch.initial_seed())

    def init_weights(self, seed: int) -> None:
        """Every parameter its :meth:`initial_value` (nothing to do on the meta device)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not p.is_meta:
                    p.copy_(self.initial_value(name, p.shape, seed, p.device))

    def initial_value(
        self, name: str, shape: torch.Size, seed: int, device: torch.device
    ) -> torch.Tensor:
        """A parameter's initial value, a function of the seed and its name alone, so that a
        sharded model that fills each shard from it (``weights.init_sharded``) starts from
        the same weights as this one. N(0, 0.02) for matrices, ones for norms; the
        projections into the residual stream scaled by 1/sqrt(2 · layers), as for the GPT,
        so the stream stays O(1)."""
        if name.endswith("norm.weight"):
            return torch.ones(shape, device=device)
        std = 0.02
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= math.sqrt(2 * self.config.n_layers)
        digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
        generator = torch.Generator(device).manual_seed(int.from_bytes(digest[:7], "little"))
        return torch.empty(shape, device=device).normal_(0.0, std, generator=generator)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position of ``idx`` (batch × time)."""
        _, t = idx.shape
        cos, sin = rope_tables(self.config, t, idx.device)
        window = self.config.sliding_window
        mask = sliding_window_mask(t, window, idx.device) if window and window < t else None
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin, mask)
        return self.lm_head(self.norm(x))

    def num_params(self) -> int:
        """Parameters that take part in a matmul: all but an untied input embedding, which is
        a lookup (a tied one counts once, as the output head)."""
        n = sum(p.numel() for p in self.parameters())
        return n if self.config.tie_embeddings else n - self.embed_tokens.weight.numel()

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6·N + 12·L·H·Q·T as for the GPT (PaLM appendix B), with T
        the positions a query sees: at most the sliding window."""
        c = self.config
        span = min(seq_len, c.sliding_window or seq_len)
        return 6 * self.num_params() + 12 * c.n_layers * c.n_heads * c.head_size * span


def tensor_parallel_plan(config: LlamaConfig, tensor: int) -> dict[str, ParallelStyle]:
    """Megatron-style tensor parallelism with sequence parallelism, by module name.

    Attention and MLP split their heads and hidden features over the ``tensor`` ranks:
    q/k/v, gate and up projections column-wise, o and down projections row-wise, so each
    sub-layer costs one all-gather in and one reduce-scatter out. Between them the residual
    stream and the norms are split along the sequence (``Shard(1)``), so the activations
    there take 1/tensor of the memory, and the norms' scales stay replicated. The embedding
    is split by vocabulary rows, the output head by vocabulary columns, whose logits are
    gathered (replicated) for the loss.
    """
    for name, count in (
        ("num_attention_heads", config.n_heads),
        ("num_key_value_heads", config.n_kv_heads),
        ("intermediate_size", config.ffn_dim),
    ):
        if count % tensor:
            raise ValueError(f"{name} ({count}) is not divisible by parallelism.tensor ({tensor})")
    block = {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None),
            desired_input_layouts=(Replicate(), None, None, None),
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }
    return {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        **{f"layers.*.{name}": style for name, style in block.items()},
        "norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
