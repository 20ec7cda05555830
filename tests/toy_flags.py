"""The toy flags that shrink each entry point's documented command to a few seconds of CPU: the
paper sizes keep their depth, head counts, LN placement, remat, scan unrolling, vocabulary and
'auto' accumulation, and shrink only width, sequence length, batch and step count. Used by the
tests that start the commands of the configs, the README and the docs."""

# hidden 48 divides into every paper size's heads (8, 12, 16, 24).
TRAIN_TOY_FLAGS = {
  'model.hidden_size': 48,
  'model.mlp_dim': 96,
  'model.max_len': 32,
  'data.max_len': 32,
  'data.max_predictions': 5,
  'data.eval_batches': 1,
  'train.global_batch_size': 8,
  'train.num_train_steps': 2,
  'train.stop_at_step': 1,
  'train.warmup_steps': 1,
  'train.log_every_steps': 1,
  'train.eval_every_steps': 1,
  'train.checkpoint_every_steps': 1,
}
FINETUNE_TOY_FLAGS = {
  'model.hidden_size': 32,
  'model.num_heads': 2,
  'model.mlp_dim': 64,
  'data.max_len': 48,
  'data.max_examples': 16,
  'data.max_query_len': 8,
  'data.doc_stride': 16,
  'train.global_batch_size': 8,
  'finetune.num_epochs': 1,
  'train.log_every_steps': 1,
}
TRANSLATE_TOY_FLAGS = {
  'model.hidden_size': 32,
  'model.mlp_dim': 64,
  'model.max_len': 48,
  'model.num_layers': 2,
  'model.num_decoder_layers': 2,
  'data.vocab_size': 300,
  'data.bucket_lengths': '(32,)',
  'data.tokens_per_batch': 256,
  'data.max_pairs': 64,
  'train.num_train_steps': 2,
  'train.warmup_steps': 1,
  'train.log_every_steps': 1,
  'train.eval_every_steps': 1,
  'decode.batch_size': 16,
  'decode.beam_size': 2,
  'experiment.seeds': '(0,1)',
  'experiment.speed_batch_size': 16,
  'experiment.speed_repeats': 1,
}
# Entry point -> toy flags. A config documenting a command of another entry point fails
# test_configs.py (test_every_documented_entry_point_has_toy_flags) until it is added here.
TOY_FLAGS = {
  'experiments.train': TRAIN_TOY_FLAGS,
  'experiments.finetune': FINETUNE_TOY_FLAGS,
  'experiments.translate': TRANSLATE_TOY_FLAGS,
}
# Entry point -> plain flags that keep a run's outputs in its test directory (DIR).
TOY_ARGS = {'experiments.translate': ['--out=DIR/out', '--workdirs=DIR/runs']}
# What a finished toy run prints, per entry point.
EXPECTED_OUTPUT = {
  'experiments.train': 'final eval MLM accuracy',
  'experiments.finetune': 'final eval',
  'experiments.translate': '## Decoding speed',
}
