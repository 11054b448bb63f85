"""The JAX runner's count of XLA compilations (`runners._xla_compiles`, what `stats.compiles` and
"no compile after warmup" read): an executable read back from JAX's persistent compilation cache
is timed by JAX as a compile, but is not one."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from linnet.serve.runners import _xla_compiles

    before = _xla_compiles()
    jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.ones(7)).block_until_ready()
    print(_xla_compiles() - before)
""")


def test_an_executable_read_from_the_persistent_cache_is_no_compile(tmp_path):
    # two processes over one cache: the first compiles (and writes the cache), the second reads it back
    counts = [subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                             timeout=300, check=True).stdout.split()[-1] for _ in range(2)]
    assert int(counts[0]) >= 1 and counts[1] == "0"  # (the jit, and jnp.ones' own executables)
    assert any(tmp_path.iterdir())  # (the second run's 0 is a read, not a cache left unused)
