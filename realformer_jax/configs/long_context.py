r"""BERT-Base RealFormer on one sequence of a million tokens, split over the devices' sequence axis.

    python -m experiments.train --config=configs/long_context.py --workdir=DIR

(on 8 GPUs; whether it fits and how fast, estimated on any machine: the experiments.compile
command of docs/training.md, "Long sequences"). Argument: `tokens` = the sequence length
(default 1,048,576 = 2^20). One sequence per step, the length split over every device
(`mesh.shape=(1,1,1,-1)`: ring attention, realformer_jax/kernels/score_paths/ring_attention.py), so
the
length must divide by the device count. residual_carry='qk': every layer's queries and keys
instead of the [H, L, L] score sum (48 TiB a layer at 2^20 tokens), bfloat16 compute, each
layer rematerialised, rotary positions (no position table to size: RoPE sees relative offsets
only), 15% of the tokens predicted. Otherwise configs/bert.py's Base recipe. The weak-scaling
table in docs/performance.md is this config at 131,072 tokens per device on 1, 2, 4 and 8
H200s (estimated).
"""

from realformer_jax.configs import bert, parse_arg


def get_config(arg: str = ''):
  args = parse_arg(arg, {'tokens': str(2**20)})
  tokens = int(args['tokens'])
  config = bert.get_config('size=base,ln=realformer')
  config.model.position_embedding = 'rope'
  config.model.max_len = tokens
  config.model.residual_carry = 'qk'
  config.model.dtype = 'bfloat16'
  config.model.remat_policy = 'full'
  config.model.scan_unroll = 1  # a rolled scan: compile time flat in depth
  config.data.max_len = tokens
  config.data.max_predictions = -(-tokens * 15 // 100)
  config.train.global_batch_size = 1
  config.train.grad_accum_steps = 1
  config.mesh.shape = (1, 1, 1, -1)
  return config
