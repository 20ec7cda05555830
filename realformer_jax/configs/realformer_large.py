r"""RealFormer-Large: Post-LN + residual attention, the paper's recipe (see configs/bert.py).

python -m experiments.train --config=configs/realformer_large.py --workdir=DIR
"""

from realformer_jax.configs import bert


def get_config():
  return bert.get_config('size=large,ln=realformer')
