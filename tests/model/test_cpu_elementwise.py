"""The one-pass CPU RMSNorm and rotary kernels against the PyTorch modules they stand in for."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import cpu_attention, cpu_elementwise
from elr_rl.model.layers import RMSNorm, Rotary

pytestmark = pytest.mark.skipif(cpu_attention.load() is None, reason="the CPU kernels cannot be built here")


def _kernels():
    return cpu_attention.load()


@pytest.mark.parametrize("shape", [(1, 1024), (7, 1024), (300, 1024), (2, 5, 256), (3, 100), (4, 8)])
def test_rms_norm_matches_the_module(shape):
    g = torch.Generator().manual_seed(sum(shape))
    norm = RMSNorm(shape[-1], eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_((1 + torch.randn(shape[-1], generator=g)).to(torch.bfloat16))
    x = (3 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
    x[0, ..., 0] = 0  # zeros and a row of large values
    x[-1] = (1e30 * torch.randn(shape[1:], generator=g)).to(torch.bfloat16)
    with torch.inference_mode():
        want = norm(x)
        got = _kernels().rms_norm_bf16(x, norm.weight, norm.eps)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    # Only the order of the fp32 sum of squares differs: a value may move by one bf16 unit, and rarely.
    diff = (got.float() - want.float()).abs()
    assert (diff > 0).sum().item() <= max(1, want.numel() // 10_000)
    assert (diff <= want.float().abs() * 2**-7).all()


@pytest.mark.parametrize("tokens,heads,dim,fraction", [(1, 16, 64, 1.0), (5, 4, 64, 1.0), (300, 16, 64, 1.0),
                                                       (9, 2, 64, 0.5), (3, 3, 64, 0.25), (6, 2, 128, 1.0),
                                                       (2, 8, 32, 1.0)])
def test_rotary_matches_the_module_exactly(tokens, heads, dim, fraction):
    g = torch.Generator().manual_seed(tokens * heads + dim)
    rot = Rotary(dim, 10_000.0, fraction)
    x = (4 * torch.randn(tokens, heads, dim, generator=g)).to(torch.bfloat16)
    positions = torch.randint(0, 5000, (tokens,), generator=g)
    with torch.inference_mode():
        cos, sin = rot._cos_sin(positions)
        want = rot._rotate(x, cos, sin)
        half = rot.rot // 2
        got = _kernels().rotary_bf16(x, cos.reshape(tokens, half).contiguous(), sin.reshape(tokens, half).contiguous(),
                                     rot.rot)
    assert torch.equal(got, want)


def test_fuse_routes_the_modules_and_falls_back_where_the_kernels_do_not_apply():
    from elr_rl.model import LoopedForCausalLM

    from tests.rollout.conftest import elr_config

    model = LoopedForCausalLM(elr_config()).to(torch.bfloat16)
    norms = [m for m in model.modules() if type(m) is RMSNorm]
    rotaries = [m for m in model.modules() if type(m) is Rotary and m.rot > 0]
    assert norms and rotaries
    assert cpu_elementwise.fuse(model) == len(norms) + len(rotaries)
    g = torch.Generator().manual_seed(0)
    norm, rot = norms[0], rotaries[0]
    d, hd = norm.weight.shape[0], 2 * rot.inv_freq.shape[0]
    x = torch.randn(6, d, generator=g).to(torch.bfloat16)
    q = torch.randn(6, 3, hd, generator=g).to(torch.bfloat16)
    with torch.inference_mode():
        cos, sin = rot._cos_sin(torch.arange(6))
        assert torch.equal(rot._rotate(q, cos, sin), Rotary._rotate(rot, q, cos, sin))
        assert (norm(x).float() - RMSNorm.forward(norm, x).float()).abs().max() <= 2**-6
        # fp32 inputs and 4-d (training) shapes take PyTorch's code
        assert torch.equal(norm(x.float()), RMSNorm.forward(norm, x.float()))
        q4 = q.unsqueeze(0)
        assert torch.equal(rot._rotate(q4, cos, sin), Rotary._rotate(rot, q4, cos, sin))
    # autograd: PyTorch's code, so gradients flow
    xg = x.float().requires_grad_()
    norm.float()(xg).sum().backward()
    assert xg.grad is not None
    assert cpu_elementwise.unfuse(model) == len(norms) + len(rotaries)
    assert "forward" not in vars(norm) and "_rotate" not in vars(rot)


def test_kernels_refuse_bad_input():
    k = _kernels()
    with pytest.raises(RuntimeError, match="bfloat16"):
        k.rms_norm_bf16(torch.randn(2, 8), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be"):
        k.rms_norm_bf16(torch.randn(2, 8).bfloat16(), torch.ones(4).bfloat16(), 1e-6)
    x = torch.randn(2, 3, 8).bfloat16()
    with pytest.raises(RuntimeError, match="cos and sin"):
        k.rotary_bf16(x, torch.ones(2, 3), torch.ones(2, 3), 8)
    with pytest.raises(RuntimeError, match="rot must be"):
        k.rotary_bf16(x, torch.ones(2, 4), torch.ones(2, 4), 7)
