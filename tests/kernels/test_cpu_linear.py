"""Linnet's CPU linear kernel against float64 matmuls: every shape the panels and row tiles can
meet (a last panel narrower than 16, row counts around the 6-row tile, the 12-row widening and
the 240-row block), each weight type, and the build itself."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.kernels import cpu_linear

pytestmark = pytest.mark.skipif(not cpu_linear.available(torch.float32), reason="Linnet's CPU kernel does not run here")

TYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(x: torch.Tensor, w: torch.Tensor, bias=None) -> np.ndarray:
    out = x.double() @ w.double().T
    return (out if bias is None else out + bias.double()).numpy()


def assert_product(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias=None):
    if cpu_linear.pairs(w.dtype, w.shape[1]):  # AVX-512 BF16 multiplies bf16 by bf16: x is rounded first
        x = x.bfloat16()
    want = reference(x, w, bias)
    # f32 accumulation over K terms: error within K ulps of the magnitudes summed
    scale = (x.double().abs() @ w.double().abs().T).numpy() + 1e-30
    assert np.all(np.abs(got.double().numpy() - want) <= 4 * x.shape[-1] * 2 ** -24 * scale)


@settings(max_examples=60, deadline=None)
@given(rows=st.sampled_from([1, 2, 5, 6, 7, 11, 12, 13, 17, 33, 64]), n=st.integers(1, 70), k=st.integers(1, 90),
       dtype=st.sampled_from(TYPES), seed=st.integers(0, 2 ** 31 - 1))
def test_matmul_is_the_product_for_any_shape_and_weight_type(rows, n, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g).to(dtype)
    before = w.clone()
    packed = cpu_linear.pack(w)
    assert torch.equal(w, before)  # a copy unless asked
    assert (packed.n, packed.k, packed.dtype, packed.table.count) == (n, k, dtype, -(-n // 16))
    got = cpu_linear.matmul(x, packed)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert_product(got, x, w)
    in_place = cpu_linear.pack(w, in_place=True)
    assert in_place.buffers[0].data_ptr() == w.data_ptr() or n < 16  # the panels are w's own memory
    assert torch.equal(cpu_linear.matmul(x, in_place), got)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_an_f32_out_keeps_the_sums_a_bf16_x_would_have_rounded(rows, bias):
    """out_dtype=f32 (a bf16 model's logits): the f32 sums as they are (within f32's bound of the
    product, which a bf16 rounding, 2^-9 relative, is not), and those sums rounded are x's type's output."""
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 96, generator=g).bfloat16(), torch.randn(40, 96, generator=g).bfloat16()
    b = torch.randn(40, generator=g).bfloat16() if bias else None
    packed = cpu_linear.pack(w)
    got = cpu_linear.matmul(x, packed, b, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (rows, 40)
    assert_product(got, x, w, b)
    assert not torch.equal(got, got.bfloat16().float())
    assert torch.equal(got.bfloat16(), cpu_linear.matmul(x, packed, b))


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 4), n=st.sampled_from([16, 32, 48, 20, 70]), k=st.integers(1, 40),
       dtype=st.sampled_from(TYPES), seed=st.integers(0, 2 ** 31 - 1))
def test_a_stack_packed_at_once_is_each_layer_packed(layers, n, k, dtype, seed):
    """pack_layers (one call for a stacked weight of whole panels) lays each layer out as `pack` does,
    in the stack's own memory, and each layer multiplies as its weight."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(layers, n, k, generator=g).to(dtype)
    x = torch.randn(3, k, generator=g)
    apart = w.clone()
    one_by_one = [cpu_linear.pack(layer, in_place=True) for layer in apart]
    stack = w.clone()
    at_once = cpu_linear.pack_layers(stack, in_place=True)
    assert len(at_once) == layers
    if n % 16 == 0:
        assert torch.equal(stack.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           apart.view(torch.int16 if dtype != torch.float32 else torch.int32))  # same bytes
        assert all(p.buffers[0].data_ptr() == layer.data_ptr() for p, layer in zip(at_once, stack))
    for l, (p, q) in enumerate(zip(at_once, one_by_one)):
        assert (p.n, p.k, p.dtype, p.table.count) == (q.n, q.k, q.dtype, q.table.count)
        got = cpu_linear.matmul(x, p)
        assert torch.equal(got, cpu_linear.matmul(x, q))
        assert_product(got, x, w[l])
    copies = cpu_linear.pack_layers(w, in_place=False)  # not given up: w is left as it was
    assert torch.equal(cpu_linear.matmul(x, copies[0]), cpu_linear.matmul(x, one_by_one[0]))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(100, 300), k=st.integers(1, 40), dtype=st.sampled_from(TYPES),
       threads=st.sampled_from([1, 2, 3]))
def test_one_row_reads_any_count_of_panels(n, k, dtype, threads):
    # a decode step's row, the threads' runs of panels ending anywhere
    x, w = torch.randn(1, k), torch.randn(n, k).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_linear.matmul(x, cpu_linear.pack(w))
    finally:
        torch.set_num_threads(before)
    assert_product(got, x, w)


@settings(max_examples=30, deadline=None)
@given(rows=st.sampled_from([1, 6, 13, 40]), ns=st.lists(st.integers(1, 40), min_size=1, max_size=4),
       k=st.integers(1, 50), dtype=st.sampled_from(TYPES))
def test_joined_weights_give_their_products_side_by_side(rows, ns, k, dtype):
    x = torch.randn(rows, k)
    ws = [torch.randn(n, k).to(dtype) for n in ns]
    joined = cpu_linear.PanelWeight.join([cpu_linear.pack(w) for w in ws])
    assert joined.n == sum(ns)
    got = cpu_linear.matmul(x, joined)
    assert_product(got, x, torch.cat(ws))


@pytest.mark.parametrize("dtype", TYPES)
def test_many_rows_cross_the_row_blocks(dtype):
    x, w = torch.randn(487, 40), torch.randn(37, 40).to(dtype)  # two full 240-row blocks and 7 rows
    assert_product(cpu_linear.matmul(x, cpu_linear.pack(w)), x, w)


def test_batched_strided_and_low_precision_inputs():
    w, bias = torch.randn(24, 32), torch.randn(24)
    packed = cpu_linear.pack(w)
    x = torch.randn(3, 4, 64)[..., ::2]  # [3, 4, 32], not contiguous
    got = cpu_linear.matmul(x, packed, bias)
    assert got.shape == (3, 4, 24)
    assert_product(got.reshape(12, 24), x.reshape(12, 32), w, bias)
    xb = x.to(torch.bfloat16)
    got = cpu_linear.matmul(xb, packed, bias)
    assert got.dtype == torch.bfloat16  # one rounding of the f32 sum, bias included
    want = torch.from_numpy(reference(xb.reshape(12, 32), w, bias)).float()
    # within one bf16 rounding, plus the f32 sum's own error where the terms cancel
    scale = (xb.reshape(12, 32).double().abs() @ w.double().abs().T + bias.double().abs()).float()
    assert torch.all((got.reshape(12, 24).float() - want).abs() <= 2 ** -8 * want.abs() + 4 * 33 * 2 ** -24 * scale)


@pytest.mark.parametrize("k", [64, 63])
def test_a_bf16_weight_multiplies_bf16_rows_as_they_are(k):
    # on AVX-512 BF16 an even K is packed in pairs and read by VDPBF16PS; an odd K, or another CPU,
    # widens both to f32: either way the sum of exact products, rounded once to bf16
    x, w = torch.randn(29, k).bfloat16(), torch.randn(45, k).bfloat16()
    got = cpu_linear.matmul(x, cpu_linear.pack(w))
    assert got.dtype == torch.bfloat16
    want = torch.from_numpy(reference(x, w)).float()
    scale = (x.double().abs() @ w.double().abs().T).float()
    assert torch.all((got.float() - want).abs() <= 2 ** -8 * want.abs() + 4 * k * 2 ** -24 * scale)


@settings(max_examples=40, deadline=None)
@given(rows=st.sampled_from([3, 15, 16, 17, 31, 32, 33, 47, 64, 65, 300]), n=st.integers(1, 80),
       k=st.sampled_from([32, 64, 96, 576]), bf16_rows=st.booleans(), threads=st.sampled_from([1, 2, 3]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_bf16_pairs_over_many_rows_are_the_product(rows, n, k, bf16_rows, threads, seed):
    # where AMX tiles run (K a multiple of 32, from 3 rows): whole and zero-padded 16-row tiles, a
    # last panel narrower than 16, an odd count of panels a thread; bf16 rows get bf16 sums rounded
    # as the tiles are stored, f32 rows f32 sums
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g).bfloat16()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_linear.matmul(x.bfloat16() if bf16_rows else x, cpu_linear.pack(w))
    finally:
        torch.set_num_threads(before)
    if not bf16_rows:
        assert_product(got, x, w)
        return
    assert got.dtype == torch.bfloat16
    xb = x.bfloat16()
    want = torch.from_numpy(reference(xb, w)).float()
    scale = (xb.double().abs() @ w.double().abs().T).float()
    assert torch.all((got.float() - want).abs() <= 2 ** -8 * want.abs() + 4 * k * 2 ** -24 * scale)


def cpu_flags() -> set:
    with open("/proc/cpuinfo") as f:
        return set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())


def test_the_kernels_take_the_cpus_instruction_sets_up_to_the_cap():
    flags, cap = cpu_flags(), (os.environ.get("LINNET_CPU_ISA") or "amx").lower()  # read in any case
    # each level needs the ones below it; AMX needs Linux's leave too (arch_prctl, Linux 5.16 on)
    held = [{"avx2", "fma", "f16c"} <= flags, "avx512f" in flags,
            {"avx512bw", "avx512vl", "avx512_bf16"} <= flags,
            {"amx_tile", "amx_bf16"} <= flags and tile_registers_granted()]
    levels = ("avx2", "avx512", "avx512_bf16", "amx")
    reached = 0
    while reached < levels.index(cap) + 1 and held[reached]:
        reached += 1
    assert cpu_linear.isa() == (levels[reached - 1] if reached else None)


def tile_registers_granted() -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    arch_prctl, req_xcomp_perm, xtiledata = 158, 0x1023, 18  # x86-64's syscall number, asm/prctl.h
    return libc.syscall(arch_prctl, req_xcomp_perm, xtiledata) == 0


def test_pairs_are_the_kernels_rule_for_bf16_of_even_k():
    # (isa() is checked against /proc/cpuinfo above; pairs must follow it)
    assert not cpu_linear.pairs(torch.float32, 64) and not cpu_linear.pairs(torch.float16, 64)
    assert not cpu_linear.pairs(torch.bfloat16, 63)
    assert cpu_linear.pairs(torch.bfloat16, 64) == (cpu_linear.isa() in ("avx512_bf16", "amx"))


@pytest.mark.parametrize("dtype", TYPES)
def test_no_rows_give_no_rows(dtype):
    for x in (torch.empty(0, 32), torch.empty(0, 32, dtype=torch.bfloat16)):
        got = cpu_linear.matmul(x, cpu_linear.pack(torch.randn(24, 32).to(dtype)))
        assert got.shape == (0, 24) and got.dtype == x.dtype


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_product(threads):
    x, w = torch.randn(9, 50), torch.randn(100, 50)
    packed = cpu_linear.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = cpu_linear.matmul(x, packed)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, cpu_linear.matmul(x, packed))  # each output is one thread's sum, in one order


def test_the_kernel_builds_from_source_into_a_fresh_cache(tmp_path):
    # a clean process with an empty cache: builds, loads, multiplies; a second process reuses the file
    code = ("import torch; from linnet.kernels import cpu_linear as c; w = torch.eye(20); "
            "assert torch.equal(c.matmul(torch.arange(40.).reshape(2, 20), c.pack(w)), torch.arange(40.).reshape(2, 20))")
    env = dict(os.environ, LINNET_CACHE=str(tmp_path))
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert len(list((tmp_path / "kernels").glob("cpu_kernels-*.so"))) == 1
    assert not list((tmp_path / "kernels").glob("tmp*"))


@pytest.mark.parametrize("damage", ["cut", "empty", "garbage"])
def test_a_damaged_library_in_the_cache_is_built_again(tmp_path, damage):
    # a copy of the cache that stopped partway: loading the cut library killed the process (SIGBUS, in
    # a subprocess here for that); an empty or garbled one warned and left the kernels off for good.
    # The "compiler" copies a library built before, so that nothing is compiled.
    from linnet.kernels import gguf_blocks

    if gguf_blocks._library() is None:
        pytest.skip("the gguf_blocks library is not built here")
    built = Path(gguf_blocks._library()._name)
    cc = compiler(tmp_path, f'for a; do [ "$prev" = -o ] && out=$a; prev=$a; done; cp {built} "$out"')
    code = ("import sys, ctypes; from linnet.kernels import build; "
            "lib = build.shared_library('gguf_blocks', ['gguf_blocks.c'], ('-ffp-contract=off',)); "
            "assert lib is not None and lib.linnet_gguf_block(8) != 0; print(lib._name)")
    env = dict(os.environ, LINNET_CACHE=str(tmp_path / "cache"), CC=cc)
    target = Path(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                 text=True).stdout.strip())
    whole = target.read_bytes()
    target.write_bytes({"cut": whole[:len(whole) // 2], "empty": b"", "garbage": b"\x7fELF" + b"\0" * 60}[damage])
    ran = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert target.read_bytes() == whole


def test_linnet_cpu_kernels_0_turns_the_kernel_off():
    code = "import torch; from linnet.kernels import cpu_linear as c; assert not c.available(torch.float32)"
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LINNET_CPU_KERNELS="0"), check=True)


def test_a_missing_compiler_falls_back_with_a_warning(tmp_path):
    code = ("import torch, warnings; from linnet.kernels import cpu_linear as c\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); assert not c.available(torch.float32)\n"
            "assert any('could not be built' in str(m.message) and 'no-such-cc (the CC environment variable) "
            "does not run: No such file' in str(m.message) for m in w), [str(m.message) for m in w]")
    env = dict(os.environ, LINNET_CACHE=str(tmp_path), CC=str(tmp_path / "no-such-cc"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def compiler(folder, script: str) -> str:
    """A stand-in C compiler: a shell script, for CC."""
    cc = folder / "cc"
    cc.write_text(f"#!/bin/sh\n{script}\n")
    cc.chmod(0o755)
    return str(cc)


def test_a_failed_build_warns_with_its_first_error_and_keeps_the_compilers_output(tmp_path):
    # gcc ends a diagnostic with a caret line: the warning quotes the error itself, and the whole
    # output is saved where the warning says
    cc = compiler(tmp_path, "printf 'k.c: In function f:\\nk.c:3:5: error: unknown type name T\\n    3 | T x;\\n"
                            "      |     ^\\n' >&2; exit 1")
    code = ("import torch, warnings; from linnet.kernels import cpu_linear as c\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); assert not c.available(torch.float32)\n"
            "print([str(m.message) for m in w if 'could not be built' in str(m.message)][0])")
    env = dict(os.environ, LINNET_CACHE=str(tmp_path), CC=cc)
    said = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    log = tmp_path / "kernels" / "cpu_kernels-build.log"
    assert "(k.c:3:5: error: unknown type name T; the compiler's output: " + str(log) + ")" in said, said
    assert log.read_text().splitlines()[-2:] == ["    3 | T x;", "      |     ^"]


def test_an_assembler_without_amx_builds_the_kernels_without_it(tmp_path):
    # a compiler whose assembler rejects AMX's tile instructions (binutils before 2.36): the library
    # is built again without them, and bf16 pairs stay on VDPBF16PS rather than every kernel being lost
    cc = compiler(tmp_path, "case \"$*\" in *-DLINNET_NO_AMX*) exec gcc \"$@\";; esac\n"
                            "echo \"Error: no such instruction: tileloadd\" >&2; exit 1")
    code = ("import torch, warnings; from linnet.kernels import cpu_linear as c\n"
            "with warnings.catch_warnings():\n"
            "    warnings.simplefilter('error'); assert c.available(torch.float32) and c.isa() != 'amx'\n"
            "x, w = torch.randn(40, 64).bfloat16(), torch.randn(24, 64).bfloat16()\n"
            "got, want = c.matmul(x, c.pack(w)).float(), (x.double() @ w.double().T).float()\n"
            "assert torch.allclose(got, want, rtol=2 ** -7, atol=1e-3)")
    env = dict(os.environ, LINNET_CACHE=str(tmp_path / "cache"), CC=cc)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_a_link_failure_is_said_by_its_missing_symbol():
    from linnet.kernels import build

    output = ("/usr/bin/ld: /tmp/cc1.o: in function `f':\nk.c:(.text+0x9): undefined reference to `g'\n"
              "collect2: error: ld returned 1 exit status\n")
    said = build._compiler_says("probe", output)
    assert said.startswith("k.c:(.text+0x9): undefined reference to `g'"), said
