r"""A masked-LM corpus prepared once, ahead of training:

    python -m experiments.prepare_data --config=configs/tiny.py \
        --config.data.train_files='corpus/train-*.txt' --config.data.eval_files=corpus/eval.txt

The command is realformer_jax/commands/prepare_data.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-prepare`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.prepare()
