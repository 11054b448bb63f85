"""Linnet's own compute kernels, for where the libraries torch and XLA call leave speed behind.

`cpu_linear`: the CPU matmul for linear weights (C, built on first use with the system compiler).
"""
