"""The GPT presets: shapes, parameter counts and the FLOPs formula the MFU metric uses."""

from dataclasses import replace

import pytest
import torch

from torchkube.trainer.model import GPT, PRESETS, cross_entropy_loss, pad_vocab


def test_gpt2_preset_is_124m_parameters() -> None:
    with torch.device("meta"):
        model = GPT(replace(PRESETS["gpt2"], vocab_size=50304, block_size=1024))
    assert round(model.num_params(non_embedding=False) / 1e6) == 124
    # PaLM / nanoGPT: 6N + 12·L·H·Q·T ≈ 0.86 GFLOP per token at T = 1024 (perf-targets §1)
    assert model.flops_per_token(1024) == pytest.approx(0.86e9, rel=0.02)


def test_tiny_model_forward_and_loss() -> None:
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=pad_vocab(257), block_size=32))
    idx = torch.randint(0, 257, (3, 32))
    logits = model(idx)
    assert logits.shape == (3, 32, 320)
    loss = cross_entropy_loss(logits, torch.randint(0, 257, (3, 32)))
    assert abs(loss.item() - torch.log(torch.tensor(320.0)).item()) < 0.5  # near-uniform at init
    loss.backward()
    assert model.lm_head.weight.grad is model.wte.weight.grad  # tied


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=64, block_size=16)).eval()
    idx = torch.randint(0, 64, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % 64
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[0, :10], b[0, :10]) and not torch.equal(a[0, 10:], b[0, 10:])


@pytest.mark.slow
def test_the_compiled_loss_is_the_eager_loss() -> None:
    """A compiled model's loss (one fused pass over the logits) computes what the eager one
    does, with its gradients, and under no_grad at another batch size (evaluation)."""
    from torchkube.trainer.workload import next_token_loss

    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=320, block_size=32))
    tokens = torch.randint(0, 320, (3, 33), generator=torch.Generator().manual_seed(1))
    batch = (tokens[:, :-1], tokens[:, 1:])
    losses, grads = [], []
    for compiled in (False, True):
        model.zero_grad()
        loss = next_token_loss(compiled)(model, batch)
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.lm_head.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(grads[1], grads[0])
    with torch.no_grad():
        half = (batch[0][:2], batch[1][:2])
        torch.testing.assert_close(
            next_token_loss(True)(model, half), next_token_loss(False)(model, half)
        )
