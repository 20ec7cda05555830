"""jax's cuDNN flash attention (GPU): attention.py. This file is the backend's record.

One static scale and no dropout of ours, so post / pre attention without attention dropout
(attention.py says why)."""

from realformer_jax.kernels.backends.registry import Backend

BACKEND = Backend(
  name='cudnn',
  attention_impl='cudnn',
  platform='gpu',
  attention=f'{__name__}.attention',
  call='cudnn_attention',
  hlo_calls=('__cudnn$fmha',),
  residual=False,
  dropout=False,
)
