"""The Llama (llama.py), its hand-written autograd functions for the element-wise work (fused_ops.py)
and their fused float32 CPU kernels (cpu_kernels.py, cpu_kernels.c)."""
