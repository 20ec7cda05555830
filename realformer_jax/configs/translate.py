r"""Merged attention vs the standard decoder on WEB -> BBE (realformer_jax/commands/translate.py).

    python -m experiments.translate --config=configs/translate.py        # 2 CPU cores, ~1 h
    python -m experiments.translate --config=configs/translate.py:gpu    # one GPU, larger

Post-LN encoder-decoders with DS-Init (the DS-Init paper's setting), the same recipe and
budget for both decoders ('standard': self-attention, cross-attention, FFN; 'merged': MAtt,
FFN), 3 seeds each. Any field can be changed with --config.a.b=v (tests/experiments/test_configs.py
runs both commands at toy size that way).
"""

from realformer_jax.seq2seq.config import default_translation_config


def get_config(arg: str = 'cpu'):
  config = default_translation_config()
  m, d, t, dec = config.model, config.data, config.train, config.decode
  x = config.experiment = type(config)()
  x.decoders = ('standard', 'merged')
  x.seeds = (0, 1, 2)
  x.speed_batch_size = 64  # the first N test sources, one timed decoding call
  x.speed_repeats = 5  # timed calls per decoder and search, interleaved
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.ln_placement, m.init = 'post', 'ds_init'
  if arg == 'cpu':
    # 2 shared CPU cores: XLA:CPU compiles each shape in ~15-60 s, and a 2,048-token step of
    # a d=128 model took ~2.5-3.5 s on the shared machine, too slow for 6 runs. So a narrow
    # model (d=64, 3 + 3 layers, 2,000 pieces), one bucket pair and 400 steps per run (~0.8M
    # padded target tokens, 0.57 of an epoch): ~1 h for the grid on the shared machine.
    m.hidden_size, m.num_heads, m.mlp_dim = 64, 4, 256
    m.num_layers = m.num_decoder_layers = 3
    m.max_len = 96
    m.dropout_rate = m.attention_dropout_rate = 0.0  # 0.57 epochs: nothing to regularise
    d.vocab_size, d.tokens_per_batch, d.bucket_lengths = 2000, 2048, (32, 64)
    t.num_train_steps, t.warmup_steps, t.learning_rate = 400, 40, 3e-3
    t.log_every_steps, t.eval_every_steps = 20, 200
    t.checkpoint_every_steps = 100  # ~4 min of a run on the shared machine (resume point)
  elif arg == 'gpu':
    # Transformer-base width, 6 + 6 layers, ~49M padded tokens (~34 epochs at the cpu runs'
    # 1.43M padded tokens an epoch; these buckets pad differently) per run. Sized
    # for one GPU, not yet run (no GPU was lent to the session that wrote it).
    m.hidden_size, m.num_heads, m.mlp_dim = 512, 8, 2048
    m.num_layers = m.num_decoder_layers = 6
    d.vocab_size, d.tokens_per_batch, d.bucket_lengths = 8000, 16384, (24, 40, 64, 96)
    t.num_train_steps, t.warmup_steps, t.learning_rate = 3000, 300, 7e-4
    t.log_every_steps, t.eval_every_steps = 100, 1000
    dec.batch_size = x.speed_batch_size = 128
  else:
    raise ValueError(f'configs/translate.py: unknown argument {arg!r} (cpu or gpu)')
  return config
