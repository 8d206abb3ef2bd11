"""Data: the byte tokenizer, the Dyck-n completion task, and domain-tagged corpora packed into
BOS-led rows for training and held-out evaluation."""
from smelt_interp.data.corpora import (
    BUILTIN_SOURCES,
    Corpus,
    Document,
    DomainMixture,
    arith_documents,
    code_documents,
    dyck_documents,
    encode_documents,
    load_corpus,
    load_source,
)
from smelt_interp.data.dyck import (
    DyckExample,
    DyckSpec,
    build_example,
    closing_sequence,
    complete,
    complete_many,
    exact_match_accuracy,
    is_balanced,
    iter_packed_rows,
    make_dataset,
    packed_rows,
    random_prefix,
    random_word,
)
from smelt_interp.data.split import HELDOUT_FRACTION, split_of
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer

__all__ = [
    "ByteTokenizer", "BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE",
    "DyckSpec", "DyckExample", "build_example", "closing_sequence", "is_balanced",
    "random_word", "random_prefix", "make_dataset", "packed_rows", "iter_packed_rows",
    "complete", "complete_many", "exact_match_accuracy",
    "Document", "Corpus", "DomainMixture", "load_source", "load_corpus", "encode_documents",
    "dyck_documents", "arith_documents", "code_documents", "BUILTIN_SOURCES",
    "split_of", "HELDOUT_FRACTION",
]
