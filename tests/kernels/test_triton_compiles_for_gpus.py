"""Linnet's Triton kernels compile for the GPUs they are for (Ampere, sm_80; Hopper, sm_90), through
Triton's whole GPU pipeline to a cubin, with no GPU: what the interpreter's tests cannot show (the
shapes tl.dot takes, types, layouts, shared memory: a kernel that takes more than the GPU gives a
program is refused at its first launch). Run in a process of its own, without the
interpreter (TRITON_INTERPRET, which tests/conftest.py sets, changes what triton.jit makes)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm80_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "tests.kernels.test_triton_compiles_for_gpus"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == 2 * 20, done.stdout  # 20 kernels (as `kernels` lists them), 2 targets


def signature(fn, pointers: dict, floats=(), wide=(), **constexprs) -> tuple:
    """(signature, constexprs) of `fn` as a launch gives them: pointers' element types as given, the
    other arguments i32 (f32 for `floats`, i64 for `wide`), constexprs' values."""
    types = {}
    for name in fn.arg_names:
        types[name] = ("constexpr" if name in constexprs else pointers.get(name)
                       or ("fp32" if name in floats else "i64" if name in wide else "i32"))
    return types, constexprs


def kernels(triton_attention, triton_ops):
    """(name, kernel, signature, constexprs) for the launches a Llama 3.1 8B step makes (bf16 and
    f16; f32 caches; sinks; one split and several), and gpt-oss-like ones."""
    out = []
    for t in ("bf16", "fp16"):
        p = "*" + t
        for splits, sinks in ((1, False), (3, False), (10, True)):
            part = "*fp32" if splits > 1 else p
            out.append((f"decode split {t} splits={splits} sinks={sinks}", triton_attention._decode_split, *signature(
                triton_attention._decode_split, dict(q_ptr=p, k_ptr=p, v_ptr=p, used_ptr="*i32", sinks_ptr=p, out_ptr=p,
                                                     partial_ptr=part, lse_ptr=part), floats=("scale_log2",),
                GROUP=4 if not sinks else 8, BLOCK_G=16, HEAD_DIM=128 if not sinks else 64,
                BLOCK_D=128 if not sinks else 64, BLOCK_N=64, SPLITS=splits, HAS_SINKS=sinks, EXACT_DOT=False)))
        out.append((f"decode combine {t}", triton_attention._decode_combine, *signature(
            triton_attention._decode_combine, dict(partial_ptr="*fp32", lse_ptr="*fp32", sinks_ptr=p, out_ptr=p),
            HEAD_DIM=128, BLOCK_D=128, SPLITS=3, BLOCK_S=4, HAS_SINKS=True)))
        out.append((f"rmsnorm {t}", triton_ops._rmsnorm, *signature(
            triton_ops._rmsnorm, dict(x_ptr=p, w_ptr=p, out_ptr=p), floats=("eps",), BLOCK=4096)))
        out.append((f"rope {t}", triton_ops._rope, *signature(
            triton_ops._rope, dict(x_ptr=p, pos_ptr="*i32", table_ptr="*fp32", out_ptr=p), BLOCK_H=32, BLOCK_HALF=64)))
        out.append((f"silu_mul {t}", triton_ops._silu_mul, *signature(
            triton_ops._silu_mul, dict(a_ptr=p, b_ptr=p, out_ptr=p), BLOCK=triton_ops.WRITE_BLOCK)))
        for two in (True, False):
            out.append((f"put_rows {t} two={two}", triton_ops._put_rows, *signature(
                triton_ops._put_rows, dict(state_ptr=p, a_ptr="*i32", b_ptr="*i32", value_ptr=p), wide=("offset",),
                HAS_B=two, BLOCK=triton_ops.WRITE_BLOCK)))
    # f32 caches (exact products): Llama's heads, and Gemma 3's of 256
    p = "*fp32"
    for d in (128, 256):
        out.append((f"decode split fp32 head_dim={d}", triton_attention._decode_split, *signature(
            triton_attention._decode_split, dict(q_ptr=p, k_ptr=p, v_ptr=p, used_ptr="*i32", sinks_ptr=p, out_ptr=p,
                                                 partial_ptr=p, lse_ptr=p), floats=("scale_log2",),
            GROUP=4, BLOCK_G=16, HEAD_DIM=d, BLOCK_D=d, BLOCK_N=64, SPLITS=2, HAS_SINKS=False, EXACT_DOT=True)))
    return out


# A program's most shared memory (CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability", opted in): 163 KB on compute capability 8.0, 227 KB on 9.0
SHARED_BYTES = {80: 163 * 1024, 90: 227 * 1024}


def launch_options(triton_attention, kernel, types: dict, constexprs: dict, capability: int) -> dict:
    """The compile options a launch on that GPU gives the kernel: `_decode_split`'s stages, for its
    shared memory."""
    if kernel is not triton_attention._decode_split:
        return {}
    itemsize = 4 if types["k_ptr"] == "*fp32" else 2
    return {"num_stages": triton_attention.stages(SHARED_BYTES[capability], constexprs["BLOCK_D"], itemsize)}


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from linnet.kernels import triton_attention, triton_ops

    failed = 0
    for capability in (80, 90):
        target = GPUTarget("cuda", capability, 32)
        for name, kernel, types, constexprs in kernels(triton_attention, triton_ops):
            try:
                options = launch_options(triton_attention, kernel, types, constexprs, capability)
                compiled = triton.compile(ASTSource(fn=kernel, signature=types, constexprs=constexprs), target=target,
                                          options=options)
                shared = compiled.metadata.shared
                if shared > SHARED_BYTES[capability]:  # what Triton's launch refuses (OutOfResources)
                    raise RuntimeError(f"{shared} bytes of shared memory, past the {SHARED_BYTES[capability]} a "
                                       f"program has")
                print(f"ok  sm_{capability} {name}")
            except Exception as e:  # the GPU compiler's refusal, named
                failed += 1
                print(f"FAIL sm_{capability} {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
