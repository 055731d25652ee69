"""Optimizers (AdamW over torch's fused kernel, L-BFGS), their parameter groups, and the
learning-rate schedule."""
