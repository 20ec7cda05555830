r"""BERT-style masked-LM pretraining at the RealFormer paper's sizes, with its recipe.

    python -m experiments.train --config=configs/bert.py:size=large,ln=realformer --workdir=DIR

Argument: `size` = small | base | large | xlarge (layers/hidden/heads/FFN 4/512/8/2048,
12/768/12/3072, 24/1024/16/4096, 36/1536/24/6144), `ln` = post | pre | realformer.

Recipe (RealFormer paper; docs/design.md §5): AdamW, peak learning rate 1e-4, weight decay
0.01 (not on biases and norm scales), 10k warmup steps then linear decay to 0 at 1M steps,
dropout 0.1, sequence length 512, batch 512 (xLarge 256), a 30K vocabulary; RealFormer xLarge
uses the running mean of the residual scores. RealFormer reuses Post-LN's hyperparameters.

Data: the embedded `bible_web` corpus by default, so the command runs anywhere. For the paper's
Wikipedia + BookCorpus, prepare them as a TFDS array_record dataset and set e.g.
    --config.data.dataset=wikipedia/20230601.en --config.data.data_dir=/data/tfds \
    --config.data.eval_split='train[:1000]' --config.data.train_split='train[1000:]'
With the embedded corpus, which is too small for 30522 unigram pieces, the tokenizer gets the
largest vocabulary the corpus supports (a note says so; data.fit_vocab_to_corpus) and the model
keeps the paper's 30522-row table; give a real vocabulary with --config.data.vocab_file=vocab.txt
(a BERT WordPiece file: ids then match Hugging Face BERT checkpoints) or a SentencePiece .model.

Memory: the global batch stays the paper's; train.grad_accum_steps='auto' splits it into the
fewest microbatches whose compiled step fits each device (realformer_jax/train/build.py: resolve;
the choice is logged), rematerialising every layer if even one sequence does not fit otherwise.
Sharding: data parallel over every device by default (xLarge: FSDP); FSDP is
--config.mesh.shape='(1,-1,1)', adding tensor parallelism e.g. '(1,-1,4)'. Large and xLarge
rematerialise each layer (remat_policy='full'); see the note at the end of get_config.
"""

from realformer_jax.configs import parse_arg
from realformer_jax.train import default_config

# layers, hidden, heads, FFN.
SIZES = {
  'small': (4, 512, 8, 2048),
  'base': (12, 768, 12, 3072),
  'large': (24, 1024, 16, 4096),
  'xlarge': (36, 1536, 24, 6144),
}
LN_PLACEMENTS = ('post', 'pre', 'realformer')


def get_config(arg: str = ''):
  args = parse_arg(arg, {'size': 'base', 'ln': 'post'})
  size, ln = args['size'], args['ln']
  if size not in SIZES:
    raise ValueError(f'config arg size={size!r}: must be one of {", ".join(SIZES)}')
  if ln not in LN_PLACEMENTS:
    raise ValueError(f'config arg ln={ln!r}: must be one of {", ".join(LN_PLACEMENTS)}')
  layers, hidden, heads, mlp = SIZES[size]

  config = default_config()
  config.model.num_layers = layers
  config.model.hidden_size = hidden
  config.model.num_heads = heads
  config.model.mlp_dim = mlp
  config.model.max_len = 512
  config.model.ln_placement = ln
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.model.running_mean = size == 'xlarge' and ln == 'realformer'

  config.data.vocab_size = 30522  # BERT's uncased 30K word-piece vocabulary size
  config.data.max_len = 512
  config.data.max_predictions = 80  # 15% of 512, rounded up as BERT does

  config.train.global_batch_size = 256 if size == 'xlarge' else 512
  config.train.num_train_steps = 1_000_000
  config.train.warmup_steps = 10_000
  config.train.learning_rate = 1e-4
  config.train.weight_decay = 0.01
  config.train.clip_grad_norm = 1.0
  config.train.log_every_steps = 100
  config.train.eval_every_steps = 10_000
  config.train.checkpoint_every_steps = 10_000
  config.train.keep_checkpoints = 3
  config.train.grad_accum_steps = 'auto'

  if size in ('large', 'xlarge'):
    # Same numbers, less memory: for Large on 8 devices (64 sequences each), XLA's estimate of
    # temporaries per device is 151 GiB without remat and 40 GiB with (5.6 GiB with
    # --config.train.grad_accum_steps=8 on top); `none` is faster where memory allows.
    config.model.remat_policy = 'full'
  else:
    # A fully unrolled scan: same stacked params and numbers, without the per-layer weight
    # slices and activation stacking copies of a rolled loop (~10% of a Base step on CPU,
    # benchmarks/README.md); compile time grows with depth instead (Base: ~13 s vs ~9 s).
    config.model.scan_unroll = config.model.num_layers
  if size == 'xlarge':  # 1B params + AdamW moments (16 GB) do not fit replicated
    config.mesh.shape = (1, -1, 1)
  return config
