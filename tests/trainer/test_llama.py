"""The Llama/Mistral-family model: the published shapes, and each piece against what it must
compute — RMSNorm, rotary embeddings, grouped-query attention, the sliding window."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from torchkube.trainer.llama import (
    PRESETS,
    Llama,
    LlamaConfig,
    RMSNorm,
    apply_rope,
    rope_frequencies,
    rope_tables,
)
from torchkube.trainer.model import cross_entropy_loss


def tiny(**changes: object) -> Llama:
    torch.manual_seed(0)
    return Llama(replace(PRESETS["llama-tiny"], vocab_size=64, **changes)).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("preset", "vocab", "published"),
    [
        ("llama-7b", 32000, 6_738_415_616),  # Llama 2 7B
        ("llama3-8b", 128256, 8_030_261_248),  # Llama 3 8B
        ("mistral-7b", 32000, 7_241_732_096),  # Mistral 7B v0.1
        ("llama-1b", 128256, 1_235_814_400),  # Llama 3.2 1B (tied embedding)
    ],
)
def test_presets_have_the_published_parameter_counts(
    preset: str, vocab: int, published: int
) -> None:
    with torch.device("meta"):
        model = Llama(replace(PRESETS[preset], vocab_size=vocab))
    assert sum(p.numel() for p in model.parameters()) == published


def test_flops_count_the_window_a_query_sees() -> None:
    """6·N + 12·L·H·Q·T with T capped at Mistral's window; an untied input embedding is a
    lookup, not a matmul, so it is not in N."""
    with torch.device("meta"):
        llama = Llama(replace(PRESETS["llama-7b"], vocab_size=32000))
        mistral = Llama(replace(PRESETS["mistral-7b"], vocab_size=32000))
    c = llama.config
    attention = 12 * c.n_layers * c.n_heads * c.head_size
    n = llama.num_params()
    assert n == 6_738_415_616 - 32000 * 4096
    assert llama.flops_per_token(4096) == 6 * n + attention * 4096
    assert llama.flops_per_token(8192) - llama.flops_per_token(4096) == attention * 4096
    assert mistral.flops_per_token(8192) == mistral.flops_per_token(4096)  # window 4096


def test_rms_norm_matches_torch() -> None:
    norm = RMSNorm(16, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 16)
    expected = F.rms_norm(x, (16,), norm.weight, eps=1e-5)
    torch.testing.assert_close(norm(x), expected)


def test_rotary_scores_depend_only_on_the_distance() -> None:
    """q·k after rotation at positions (m, n) is the same for every pair with m − n fixed."""
    config = LlamaConfig(dim=64, n_heads=4, n_kv_heads=4)
    cos, sin = rope_tables(config, 32, torch.device("cpu"))
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q.view(1, 1, 1, 16), cos[m], sin[m])
        kn = apply_rope(k.view(1, 1, 1, 16), cos[n], sin[n])
        return float((qm * kn).sum())

    assert score(7, 3) == pytest.approx(score(20, 16), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)
    assert score(5, 5) == pytest.approx(float(q @ k), abs=1e-4)  # no distance, no rotation


def test_llama3_rope_scaling_slows_only_the_low_frequencies() -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = LlamaConfig(dim=4096, n_heads=32, rope_theta=500000.0)
    plain = rope_frequencies(config, torch.device("cpu"))
    scaled = rope_frequencies(replace(config, rope_scaling=scaling), torch.device("cpu"))
    wavelen = 2 * torch.pi / plain
    short, long = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert short.any() and long.any()
    torch.testing.assert_close(scaled[short], plain[short])
    torch.testing.assert_close(scaled[long], plain[long] / 8)
    middle = ~(short | long)
    assert ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()


def test_grouped_query_attention_shares_each_kv_head_with_its_group() -> None:
    """Two query heads per key/value head equal multi-head attention whose key and value
    heads are those heads repeated, each next to itself (Hugging Face's ``repeat_kv``)."""
    gqa = tiny()
    mha = Llama(replace(gqa.config, n_kv_heads=4)).eval()
    state = gqa.state_dict()
    d = gqa.config.head_size
    for name in list(state):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = state[name].view(2, d, -1)
            state[name] = heads.repeat_interleave(2, dim=0).reshape(4 * d, -1)
    mha.load_state_dict(state)
    idx = torch.randint(0, 64, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(gqa(idx), mha(idx))


def test_attention_is_causal_and_mistral_sees_only_its_window() -> None:
    """One layer: a token changes the logits from its own position on, and with a window of
    w only the next w − 1 positions after it."""
    idx = torch.randint(0, 64, (1, 32))
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % 64
    for model, last in ((tiny(n_layers=1), 32), (tiny(n_layers=1, sliding_window=6), 16)):
        with torch.no_grad():
            differs = (model(idx) - model(changed)).abs().amax(dim=-1)[0] > 1e-6
        assert differs.nonzero().flatten().tolist() == list(range(10, last)), model.config


def test_tied_head_shares_the_embedding() -> None:
    model = tiny(tie_embeddings=True).train()
    assert model.lm_head.weight is model.embed_tokens.weight
    idx = torch.randint(0, 64, (2, 17))
    loss = cross_entropy_loss(model(idx[:, :-1]), idx[:, 1:])
    assert abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5  # near-uniform
    loss.backward()
    assert model.lm_head.weight.grad is model.embed_tokens.weight.grad
