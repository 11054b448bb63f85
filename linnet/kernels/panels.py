"""The layout Linnet's CPU linear kernel reads weights in, which both runtimes pack them into
(`cpu_linear.pack` for torch, `xla_kernels.pack` for JAX): panels of 16 output columns, each K
rows of 16 values (cpu_linear.c); on a CPU with AVX-512 BF16 a bf16 panel of even K holds them
in pairs of K instead (`linnet_panel_pairs`, which the library answers)."""

PANEL = 16  # output columns a panel: two AVX2 vectors

# The column a bf16 panel row holds at each of its 16 places (cpu_linear.c's BF16_PLACES): the
# order in which unpacking a row with zeros widens it. f32 and f16 rows hold their columns in order.
BF16_PLACES = (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)


def places(dtype) -> list:
    """The column each place of a panel row of `dtype` (a torch or numpy type) holds."""
    return list(BF16_PLACES) if str(dtype) in ("torch.bfloat16", "bfloat16") else list(range(PANEL))


def arranged(panels, dtype, pairs: bool):
    """panels [..., K, 16] (a numpy array or torch tensor; each row's 16 columns in order) laid out as
    the kernel reads them: in pairs of K (pair-row j: each column's values at 2j and 2j + 1 side by
    side; K even), or each row's columns in `places(dtype)`."""
    if not pairs:
        return panels[..., places(dtype)]
    *lead, k, width = panels.shape
    return panels.reshape(*lead, k // 2, 2, width).swapaxes(-1, -2).reshape(*lead, k, width)
