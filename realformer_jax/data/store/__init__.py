"""What data preparation keeps in `data.data_dir`, and how it stays whole: the packed train
split (packed_store: a memory-mapped array of token ids), the sidecars that let every derived
cache file notice damage and be rebuilt (cache_integrity), and the lock that lets processes
share one cache entry (cache_lock; files are published with realformer_jax/atomic_files.py,
as the trainer's are)."""
