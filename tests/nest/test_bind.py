"""Binding params to checkpoint tensors by the names a `.linnet` source declares, nested loops
included: one tensor per layer and expert in a Hugging Face checkpoint, one per layer in a GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.compiler import check_file
from linnet.errors import LinnetError
from linnet.ir.specialize import param_shape, specialize
from linnet.nest.bind import bind_weights, checkpoint_pieces, expected_shapes, unbind_weights
from linnet.nest.errors import WeightsError

SOURCE = """\
arch experts_only

config {
  dim: int = 4
  ffn: int = 3
  layers: int = 2
  experts: int = 5
}

params {
  for l in layers {
    for e in experts {
      w_up: T[ffn, dim]
        from hf "layers.{l}.experts.{e}.up.weight"
        from gguf "blk.{l}.ffn_up_exps.weight"
      w_down: T[dim, ffn]
        from hf "layers.{l}.experts.{e}.down" .transpose()
        from gguf "blk.{l}.ffn_down_exps.weight"
    }
    router: T[experts, dim]
      from hf "layers.{l}.router.weight"
      from gguf "blk.{l}.ffn_gate_inp.weight"
  }
}

entry route<N>(x: T[N, dim]) -> T[N, experts] {
  return linear(x, router[0])
}
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("bind") / "experts_only.linnet"
    path.write_text(SOURCE)
    return specialize(check_file(path), {}, "exact")


def per_expert_checkpoint(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ckpt = {}
    for l in range(2):
        ckpt[f"layers.{l}.router.weight"] = torch.randn(5, 4, generator=g)
        for e in range(5):
            ckpt[f"layers.{l}.experts.{e}.up.weight"] = torch.randn(3, 4, generator=g)
            ckpt[f"layers.{l}.experts.{e}.down"] = torch.randn(3, 4, generator=g)  # stored [in, out]
    return ckpt


def test_types_stack_the_loops_outermost_first(spec):
    assert spec.params["w_up"].loops == ("l", "e")
    assert spec.params["w_up"].loop_var == "l"  # w_up[l] is one layer's experts
    assert str(spec.params["w_up"].type).replace(" ", "") == "T[layers,experts,ffn,dim]"


def test_each_format_names_its_own_pieces(spec):
    hf = checkpoint_pieces(spec, "hf")
    assert hf["w_up"][:3] == [((0, 0), "layers.0.experts.0.up.weight"), ((0, 1), "layers.0.experts.1.up.weight"),
                              ((0, 2), "layers.0.experts.2.up.weight")]
    assert len(hf["w_up"]) == 10 and hf["router"] == [((0,), "layers.0.router.weight"), ((1,), "layers.1.router.weight")]
    gguf = checkpoint_pieces(spec, "gguf")
    assert gguf["w_up"] == [((0,), "blk.0.ffn_up_exps.weight"), ((1,), "blk.1.ffn_up_exps.weight")]
    assert expected_shapes(spec, "hf")["layers.1.experts.4.down"] == ("w_down", (3, 4))
    assert expected_shapes(spec, "gguf")["blk.1.ffn_down_exps.weight"] == ("w_down", (5, 4, 3))


def test_per_expert_tensors_bind_as_a_stack(spec):
    ckpt = per_expert_checkpoint()
    params = bind_weights(spec, ckpt.__getitem__, "hf")
    want_up = torch.stack([torch.stack([ckpt[f"layers.{l}.experts.{e}.up.weight"] for e in range(5)]) for l in range(2)])
    want_down = torch.stack([torch.stack([ckpt[f"layers.{l}.experts.{e}.down"].T for e in range(5)]) for l in range(2)])
    assert torch.equal(params["w_up"], want_up)
    assert torch.equal(params["w_down"], want_down)
    assert params["w_up"].shape == (2, 5, 3, 4)


def test_both_formats_give_the_same_params(spec):
    """A GGUF holding each layer's experts in one tensor binds to what the per-expert files bind to."""
    hf = bind_weights(spec, per_expert_checkpoint().__getitem__, "hf")
    gguf_ckpt = {}
    for l in range(2):
        gguf_ckpt[f"blk.{l}.ffn_up_exps.weight"] = hf["w_up"][l].clone()
        gguf_ckpt[f"blk.{l}.ffn_down_exps.weight"] = hf["w_down"][l].clone()
        gguf_ckpt[f"blk.{l}.ffn_gate_inp.weight"] = hf["router"][l].clone()
    gguf = bind_weights(spec, gguf_ckpt.__getitem__, "gguf")
    assert all(torch.equal(hf[name], gguf[name]) for name in hf)


def test_unbind_returns_every_stored_tensor(spec):
    ckpt = per_expert_checkpoint(seed=3)
    params = bind_weights(spec, ckpt.__getitem__, "hf")
    back = dict(unbind_weights(spec, params, "hf"))
    assert back.keys() == ckpt.keys()
    assert all(torch.equal(back[name], ckpt[name]) for name in ckpt)


def test_a_misshapen_expert_is_named(spec):
    ckpt = per_expert_checkpoint()
    ckpt["layers.0.experts.2.up.weight"] = torch.zeros(4, 3)
    with pytest.raises(WeightsError, match=r"'layers.0.experts.2.up.weight' is \[4, 3\], but param `w_up` declares \[3, 4\]"):
        bind_weights(spec, ckpt.__getitem__, "hf")


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["f32", "bf16", "f16"]), seed=st.integers(0, 2**31 - 1),
       fmt=st.sampled_from(["hf", "gguf"]))
def test_numpy_binds_the_bits_torch_binds(tmp_path_factory, dtype, seed, fmt):
    """The JAX backend's numpy binding against torch's: the same values, rounded to T the same way,
    for f32 tensors of any bit pattern T can hold (ties, subnormals, both signs), with the
    transpose in place."""
    path = tmp_path_factory.getbasetemp() / "bind-numpy.linnet"
    path.write_text(SOURCE)
    spec_t = specialize(check_file(path), {"T": dtype}, "exact")
    rng = np.random.default_rng(seed)
    limit = 65504.0 if dtype == "f16" else 3.0e38  # a value past f16's range is no weight

    def tensor(shape):
        bits = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        return np.where(np.isfinite(values) & (np.abs(values) <= limit), values, np.float32(0.5))

    shapes = {name: shape for name, (_, shape) in expected_shapes(spec_t, fmt).items()}
    arrays = {name: tensor(shape) for name, shape in shapes.items()}
    ours = bind_weights(spec_t, arrays.__getitem__, fmt, framework="numpy")
    ref = bind_weights(spec_t, lambda n: torch.from_numpy(arrays[n].copy()), fmt)
    for name, want in ref.items():
        got = ours[name]
        assert got.shape == tuple(want.shape) and got.flags.c_contiguous
        width = {2: (np.int16, torch.int16), 4: (np.int32, torch.int32)}[got.itemsize]
        np.testing.assert_array_equal(got.view(width[0]), want.view(width[1]).numpy(), err_msg=name)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_torch_on_the_cpu_binds_what_torch_converts(tmp_path_factory, monkeypatch, dtype, split):
    """On the CPU a tensor goes into its place through numpy (and Linnet's bf16 rounding), each
    large one a share of its rows per core (`split`: every tensor here, SPLIT_BYTES lowered): the
    bits are torch's own `.to(T)` of the tensor, transposed as declared, for f32 tensors of any
    finite bit pattern (ties, subnormals, both signs) and for f16 and bf16 tensors stored so (bf16 is
    held as its bits in numpy, `bind.BF16_BITS`, through the transpose)."""
    from linnet.nest import checkpoint

    if split:
        monkeypatch.setattr(checkpoint, "SPLIT_BYTES", 8)
    path = tmp_path_factory.getbasetemp() / "bind-torch-cpu.linnet"
    path.write_text(SOURCE)
    spec_t = specialize(check_file(path), {"T": dtype}, "fast")  # (exact numerics hold f32 whatever T)
    types = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    rng = np.random.default_rng(7)
    limit = 65504.0 if dtype == "f16" else 3.0e38

    def tensor(shape, stored):
        values = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
        values = np.where(np.isfinite(values) & (np.abs(values) <= limit), values, np.float32(0.5))
        return torch.from_numpy(values).to(stored)  # (f16 and bf16: a checkpoint stored in T)

    for stored in {torch.float32, torch.bfloat16, types[dtype]}:  # (bf16 into f32 or f16: torch's copy)
        shapes = {name: shape for name, (_, shape) in expected_shapes(spec_t, "hf").items()}
        ckpt = {name: tensor(shape, stored) for name, shape in shapes.items()}
        ours = bind_weights(spec_t, lambda n: ckpt[n].clone(), "hf")
        bits = {2: torch.int16, 4: torch.int32}[types[dtype].itemsize]
        for name, pieces in checkpoint_pieces(spec_t, "hf").items():
            for index, stored_name in pieces:
                want = ckpt[stored_name].to(types[dtype])
                if name == "w_down":  # `.transpose()`
                    want = want.T
                got = ours[name][index]
                assert got.dtype == types[dtype] and torch.equal(got.view(bits), want.contiguous().view(bits)), \
                    stored_name


def test_numpy_names_a_type_it_may_not_cast(spec, tmp_path):
    """Without cast_dtype, numpy arrays in f16 widen into an f32 module exactly; f32 ones into bf16 round, and
    are refused by name."""
    arrays = {name: t.numpy().astype(np.float16) for name, t in per_expert_checkpoint().items()}
    widened = bind_weights(spec, arrays.__getitem__, "hf", cast_dtype=False, framework="numpy")
    assert widened["w_up"].dtype == np.float32
    assert np.array_equal(widened["w_up"][0, 0], arrays["layers.0.experts.0.up.weight"].astype(np.float32))
    path = tmp_path / "experts_only.linnet"
    path.write_text(SOURCE)
    spec_bf16 = specialize(check_file(path), {"T": "bf16"}, "fast")
    arrays = {name: t.numpy() for name, t in per_expert_checkpoint().items()}
    with pytest.raises(WeightsError, match=r"'layers.0.experts.0.up.weight' is f32, but param `w_up` is bf16"):
        bind_weights(spec_bf16, arrays.__getitem__, "hf", cast_dtype=False, framework="numpy")


RANGED = """\
arch dense_then_experts

config {
  dim: int = 4
  layers: int = 3
  first_dense: int = 1
}

params {
  for l in first_dense:layers {
    router: T[4, dim]
      from hf "layers.{l}.router.weight" .unpermute_rope(1, 4)
  }
}

entry route<N>(x: T[N, dim]) -> T[N, 4] {
  return linear(x, router[layers - first_dense - 1])
}
"""


def test_a_ranged_loop_stacks_its_layers_from_its_start(tmp_path):
    """`for l in a:b` stacks b - a tensors named from `{l}` = a: DeepSeek's expert layers after its
    dense first one; binding and unbinding (the transform undone) go through the same names."""
    path = tmp_path / "dense_then_experts.linnet"
    path.write_text(RANGED)
    spec = specialize(check_file(path), {}, "exact")
    assert param_shape(spec, "router") == (2, 4, 4)
    pieces = checkpoint_pieces(spec, "hf")["router"]
    assert pieces == [((0,), "layers.1.router.weight"), ((1,), "layers.2.router.weight")]
    ckpt = {f"layers.{l}.router.weight": torch.randn(4, 4) for l in (1, 2)}
    params = bind_weights(spec, ckpt.__getitem__)
    assert torch.equal(params["router"][1], ckpt["layers.2.router.weight"][[0, 2, 1, 3]])  # pairs to halves
    assert {name: t.tolist() for name, t in unbind_weights(spec, params)} == {k: v.tolist() for k, v in ckpt.items()}
    path.write_text(RANGED.replace("first_dense: int = 1", "first_dense: int = 4"))  # past the end
    with pytest.raises(LinnetError, match="negative"):
        specialize(check_file(path), {}, "exact")


SPLIT = """\
arch split_rows

config {
  dim: int = 3
  heads: int = 2
  keys: int = 2
  values: int = 3
}

params {
  for l in 2 {
    wk: T[heads, dim, keys]
      from hf "layers.{l}.kv.weight" .split_heads(heads, keys + values, 0, keys) .transpose(1, 2)
    wv: T[heads, values, dim]
      from hf "layers.{l}.kv.weight" .split_heads(heads, keys + values, keys, keys + values)
  }
}

entry both<N>(x: T[N, dim]) -> T[N, heads, values] {
  return expert_linear(x, wv[0], zeros(N, heads, dtype=i32)) + wk[1].sum(axis=2).unsqueeze(0)[:, :, 0:1]
}
"""


def test_two_params_split_one_stored_tensor_and_export_it_whole(tmp_path):
    """`.split_heads` reads a stored tensor's rows head by head: DeepSeek's kv_b_proj, each head's key
    rows then its value rows, as two params (the keys transposed). Both are checked against the one
    stored shape, bound from it, and written back as it was; a card taking only some rows cannot be."""
    path = tmp_path / "split_rows.linnet"
    path.write_text(SPLIT)
    spec = specialize(check_file(path), {}, "exact")
    assert expected_shapes(spec, "hf")["layers.0.kv.weight"][1] == (10, 3)
    ckpt = {f"layers.{l}.kv.weight": torch.randn(10, 3) for l in range(2)}
    params = bind_weights(spec, ckpt.__getitem__)
    per_head = ckpt["layers.1.kv.weight"].reshape(2, 5, 3)
    assert torch.equal(params["wk"][1], per_head[:, :2].transpose(1, 2))
    assert torch.equal(params["wv"][1], per_head[:, 2:])
    assert {name: t.tolist() for name, t in unbind_weights(spec, params)} == {k: v.tolist() for k, v in ckpt.items()}
    path.write_text(SPLIT.replace("keys + values, keys, keys + values)", "keys + values, keys, keys + values - 1)")
                    .replace("T[heads, values, dim]", "T[heads, values - 1, dim]").replace("T[N, heads, values]",
                                                                                          "T[N, heads, values - 1]"))
    spec = specialize(check_file(path), {}, "exact")
    with pytest.raises(WeightsError, match=r"no param takes rows \[4\] of its heads' 5 \(`.split_heads`\)"):
        list(unbind_weights(spec, bind_weights(spec, ckpt.__getitem__)))


def test_a_param_declared_f32_reads_16_bit_weights_without_a_cast(tmp_path):
    """A param declared f32 whatever T (DeepSeek's router, as transformers keeps it) binds a bf16 or f16
    checkpoint's tensor exactly, widened, with no cast_dtype asked; a T param of another type is still
    refused without it."""
    path = tmp_path / "router.linnet"
    path.write_text(RANGED.replace("router: T[4, dim]", "router: f32[4, dim]")
                    .replace("return linear(x, router[layers - first_dense - 1])",
                             "return linear(x as f32, router[layers - first_dense - 1]) as T"))
    spec = specialize(check_file(path), {"T": "bf16"}, "fast")
    for dtype in (torch.bfloat16, torch.float16):
        ckpt = {f"layers.{l}.router.weight": torch.randn(4, 4).to(dtype) for l in (1, 2)}
        params = bind_weights(spec, ckpt.__getitem__, cast_dtype=False)
        assert params["router"].dtype == torch.float32
        assert torch.equal(params["router"][0], ckpt["layers.1.router.weight"][[0, 2, 1, 3]].float())
    path.write_text(RANGED)
    spec = specialize(check_file(path), {"T": "bf16"}, "fast")
    with pytest.raises(WeightsError, match="pass cast_dtype=True"):
        bind_weights(spec, {f"layers.{l}.router.weight": torch.randn(4, 4) for l in (1, 2)}.__getitem__,
                     cast_dtype=False)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=3), block=st.integers(1, 40),
       seed=st.integers(0, 2**31), use_torch=st.booleans())
def test_infinities_in_f16_are_counted_block_by_block(shape, block, seed, use_torch):
    """`bind._infinities`, which reads a param a block of rows at a time, counts its +-inf as
    numpy's isinf does, whatever the shape and block (NaN is not inf)."""
    from linnet.nest.bind import _infinities

    rng = np.random.default_rng(seed)
    values = rng.normal(0, 1e4, size=shape).astype(np.float16)
    values[rng.random(size=shape) < 0.2] = np.inf
    values[rng.random(size=shape) < 0.1] = -np.inf
    values[rng.random(size=shape) < 0.1] = np.nan
    want = int(np.isinf(values).sum())
    got = _infinities(torch.from_numpy(values), torch.int16, block) if use_torch else \
        _infinities(values, np.int16, block)
    assert got == want
