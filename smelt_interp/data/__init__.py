"""Data: the byte tokenizer, the Dyck-n completion task, and domain-tagged corpora packed into
BOS-led rows for training and held-out evaluation.

    tokenizer   ByteTokenizer and the special ids (PAD, BOS, EOS)
    documents   Document and the hash-based train / held-out split
    dyck        the Dyck language, the completion task format and its datasets
    trigger     trigger tasks: rows where a copy head is needed only after a trigger byte
    sources     load_source: built-in sources (BUILTIN_SOURCES) and user files (user_files)
    packing     documents and examples packed into fixed-length rows
    corpora     Corpus and DomainMixture: per-domain, per-split views and training batches
    bpe         byte-level BPE (HF tokenizers) beside the byte tokenizer; tokenizer identity
    shards      the token shard format: header, document index, writer, memory-mapped reader
    prepare     text files, folders, JSONL and Parquet into shards (python -m smelt_interp.data)
"""
