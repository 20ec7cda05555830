"""What data preparation keeps in `data.data_dir`, and how it stays whole: the packed train
split (packed_store: a memory-mapped array of token ids), the sidecars that let every derived
cache file notice damage and be rebuilt (cache_integrity), and the lock and atomic write that
let processes share one cache entry (cache_lock; the trainer's run files use its atomic write
too)."""
