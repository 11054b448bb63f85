"""Linnet's own compute kernels, for where the libraries torch and XLA call leave speed behind on the CPU.

- `build`: compiles the C sources on first use with the system compiler, caches them, and holds
  the one check of whether they run here (`runs_here`).
- `panels`: the layout linear weights are packed in, for both runtimes.
- `cpu_linear`: linears over weights packed in panels (torch, through ctypes).
- `cpu_attention`: attention of tokens that each read one cache row (torch, through ctypes).
- `xla_kernels`: the same two as XLA FFI handlers, for JAX's CPU backend.
- `gguf_blocks`: GGUF's quantized blocks decoded to f32 when a checkpoint is read (plain C, any CPU).
"""
