"""The inputs probes run on: right-padded token batches from `--data` (dyck, code, arith, a
prepared shards folder's held-out rows, or a PATH of text/JSONL, via smelt_interp.data) or one
`--prompt`, in-context Dyck prompts with their
answer spans, and held-out associative-recall rows (data.assoc_recall) for the case study's
`--task`.

Text (`--data` documents and `--prompt`) is encoded with the checkpoint's own tokenizer (BPE when
it carries one, else bytes), and token labels are decoded with it. In-context Dyck prompts are
text too: a BPE model is given the same prompts as a byte model, encoded with its tokenizer, and
their answer spans carried from characters to its tokens (data.dyck_tokens, which says what a
position means when a token holds several brackets or crosses an answer's boundary; a tokenizer
that crosses one is refused in one ProbeError line). Associative-recall rows are built from
trigger ids in byte space, so on a BPE model they are refused in one line (ProbeError); a probe
that needs them does not apply to that model.

Dyck words, in `--data dyck` documents and in the prompts alike, follow one `DyckSpec`: the
spec the checkpoint was trained on (its held-out distribution) when the command line probes a
checkpoint, else the data package's default; prompts cap the word length so that every
demonstration and the query fit the model's context, and come from one named held-out draw
(data.dyck.heldout_draw: the test draw unless a caller asks for the validation draw)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from smelt_interp.config import ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.data.bpe import Tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.computed_recall import ComputedRecallSpec
from smelt_interp.data.corpora import Corpus
from smelt_interp.data.dyck import DyckExample, DyckSpec, dyck_max_len
from smelt_interp.data.dyck_draws import TEST, heldout_draw
from smelt_interp.data.dyck_tokens import can_pose_dyck, encode_examples
from smelt_interp.data.packing import pack_once
from smelt_interp.data.shards import ShardSet, heldout_mix, is_prepared_folder
from smelt_interp.data.sources import BUILTIN_SOURCES, dyck_documents, load_source
from smelt_interp.data.tokenizer import PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.provenance import TASK_DYCK, TASK_RECALL, TASKS

RECALL_ROWS = TASK_RECALL  # `data` naming held-out rows of the checkpoint's recall task


HOOKS_PER_VISIT = 8  # activations a probe may capture per visit (q, k, v, z, writes, residuals)


def probe_bytes(
    cfgs: Sequence[ModelConfig], n_seqs: int, seq_len: int, n_demo_counts: int, batch_size: int
) -> int:
    """An estimate of the memory a probe run needs: the token rows (`--data` rows and the Dyck
    prompts, with the text they are packed from), per-token statistics of every row at every
    visit and head, and one forward batch's captured activations."""
    rows = n_seqs * (1 + n_demo_counts)
    tokens = rows * seq_len * 16  # int64 ids and about as many bytes of source text
    per_token = max(len(c.schedule) * c.n_heads for c in cfgs) * 8
    batch = min(batch_size, rows) * seq_len * HOOKS_PER_VISIT * 4
    activations = batch * max(len(c.schedule) * max(c.d_model, seq_len) for c in cfgs)
    return tokens + rows * seq_len * per_token + activations


def lengths_of(tokens: torch.Tensor) -> torch.Tensor:
    """Valid length of each right-padded row: the position of its first PAD (or the width)."""
    is_pad = tokens == PAD_ID
    first = torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), tokens.shape[1])
    return first.long()


def data_batch(
    spec: str,
    n_seqs: int,
    seq_len: int,
    seed: int = 0,
    dyck: DyckSpec | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, seq_len], lengths [n]) packed from `spec`: a builtin source's held-out
    documents (never seen in training; Dyck words drawn from `dyck`, default DyckSpec()), the
    held-out rows of a prepared shards folder (its tokenizer must be `tokenizer`; the last row
    of each domain may be right-padded) or every document under another PATH, as bytes or
    `tokenizer`'s ids. Rows start with BOS; only the last may be right-padded."""
    if n_seqs < 1 or seq_len < 2:
        raise DataError(f"need --n-seqs >= 1 and --seq-len >= 2, got {n_seqs} and {seq_len}")
    wanted = n_seqs * seq_len
    if spec in BUILTIN_SOURCES:
        # about 10% of documents are held out; load enough that they fill the batch
        n_docs = max(200, wanted // 10)
        if spec == "dyck":
            docs = dyck_documents(n_docs, seed=seed, spec=dyck)
        else:
            docs = load_source(
                spec, seed=seed, n_docs=n_docs, max_bytes=max(2_000_000, 20 * wanted)
            )
        tokens = Corpus(docs).heldout_batches(spec, n_seqs, seq_len, tokenizer)
    elif is_prepared_folder(spec):
        expect = tokenizer_hash(tokenizer_json(tokenizer or ByteTokenizer()))
        tokens = heldout_mix(ShardSet(spec, expect_hash=expect), seq_len, n_seqs)
    else:
        docs = load_source(spec, seed=seed)
        tokens = pack_once(docs, n_seqs, seq_len, tokenizer)
    return tokens, lengths_of(tokens)


def dyck_prompts(
    n_per_count: int,
    demos: Sequence[int],
    max_seq_len: int,
    seed: int = 0,
    max_len: int | None = None,
    spec: DyckSpec | None = None,
    draw: str = TEST,
) -> list[DyckExample]:
    """`n_per_count` held-out in-context examples for each demonstration count in `demos`,
    words of the named draw (data.dyck.DRAWS) of `spec` (default DyckSpec()) cut to fit
    `max_seq_len` (or `max_len`)."""
    spec = spec or DyckSpec()
    examples: list[DyckExample] = []
    for n_demos in demos:
        longest = dyck_max_len(max_seq_len, n_demos, spec.max_len) if max_len is None else max_len
        if longest < spec.min_len:
            raise ProbeError(
                f"{n_demos} Dyck demonstrations do not fit the model's max_seq_len "
                f"{max_seq_len}; use fewer with --demos"
            )
        try:
            examples += heldout_draw(
                draw,
                n_per_count,
                dataclasses.replace(spec, max_len=longest),
                n_demos=n_demos,
                seed=seed + 1000 * n_demos,
            )
        except DataError as exc:  # a small model's short words leave no room for both draws
            raise ProbeError(
                f"{exc}; at max_seq_len {max_seq_len} with {n_demos} demonstrations, use "
                "--draw validation, fewer prompts or fewer demonstrations"
            ) from None
    return examples


@dataclass(frozen=True)
class ProbeRequest:
    """What a caller asks the probes to run on, typed: the command line builds one from its flags
    (probes.cli.request_from_args), the dashboard directly; probes.session.make_inputs turns it
    into ProbeInputs for the checkpoints at hand. `seq_len` None: min(256, the models'
    max_seq_len); `task` None: the first checkpoint's own task; `draw`: the held-out draw Dyck
    prompts come from."""

    data: str = "dyck"
    n_seqs: int = 16
    seq_len: int | None = None
    demos: tuple[int, ...] = (0, 1, 2, 4)
    task: str | None = None
    seed: int = 0
    draw: str = TEST
    batch_size: int = DEFAULT_BATCH
    chunk: int = DEFAULT_CHUNK
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None


def prompt_batch(
    text: str, tokenizer: Tokenizer, max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [1, T], lengths [1]): BOS and `text` in `tokenizer`'s ids. An empty prompt, text
    the tokenizer cannot encode, or more than `max_seq_len` tokens is a ProbeError line."""
    if not text:
        raise ProbeError("the prompt is empty")
    ids = tokenizer.encode(text)  # TokenizerError (one line) for text it cannot encode
    if len(ids) > max_seq_len:
        raise ProbeError(
            f"the prompt is {len(ids)} tokens long (with BOS); the model allows {max_seq_len}"
        )
    return torch.tensor([ids], dtype=torch.long), torch.tensor([len(ids)], dtype=torch.long)


def ids_batch(ids: Sequence[int], max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [1, T], lengths [1]) of a row given as token ids, as it is: no BOS is added (the
    ids are the row). Ids outside the vocabulary are the model's TokenError when it runs."""
    if not ids:
        raise ProbeError("--prompt-ids is empty")
    if not all(0 <= int(i) < 2**63 for i in ids):  # torch.tensor's int64 holds no more
        raise ProbeError("--prompt-ids holds an id outside 0..2**63-1, of no vocabulary")
    if len(ids) > max_seq_len:
        raise ProbeError(f"the row is {len(ids)} tokens long; the model allows {max_seq_len}")
    return torch.tensor([list(ids)], dtype=torch.long), torch.tensor([len(ids)], dtype=torch.long)


def is_byte_tokenizer(tokenizer: Tokenizer) -> bool:
    return isinstance(tokenizer, ByteTokenizer)


@dataclass
class ProbeInputs:
    """What the command line asked to probe on: rows of `data`, Dyck prompts with each count
    in `demos` of demonstrations, Dyck words drawn from `dyck` (the prompts' from its held-out
    `draw`), held-out associative-recall rows of `assoc_recall`, and the case study's `task`
    (None: `trained_task`, the checkpoint's); built lazily, shared by all models. Text is
    encoded, and labels decoded, with `tokenizer` (the models'); `prompt`, when given, is the
    one row `batch` holds."""

    data: str = "dyck"
    n_seqs: int = 16
    seq_len: int = 256
    seed: int = 0
    demos: tuple[int, ...] = (0, 1, 2, 4)
    max_seq_len: int = 512
    dyck: DyckSpec = field(default_factory=DyckSpec)
    assoc_recall: AssocRecallSpec = field(default_factory=AssocRecallSpec)
    computed_recall: ComputedRecallSpec = field(default_factory=ComputedRecallSpec)
    computed_row_len: int | None = None  # the row length the checkpoint trained it at, if known
    task: str | None = None
    trained_task: str = TASK_DYCK
    draw: str = TEST
    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, lengths) of `prompt_ids` or `prompt` when given; else of `data`: held-out
        associative-recall rows for RECALL_ROWS (the rows a recall checkpoint is measured on),
        else data_batch's rows in the models' tokenizer."""
        if "batch" not in self._cache:
            if self.prompt_ids is not None:
                self._cache["batch"] = ids_batch(self.prompt_ids, self.max_seq_len)
            elif self.prompt is not None:
                self._cache["batch"] = prompt_batch(self.prompt, self.tokenizer, self.max_seq_len)
            elif self.data == RECALL_ROWS:
                rows = self.recall_rows()
                self._cache["batch"] = (rows, lengths_of(rows))
            else:
                self._cache["batch"] = data_batch(
                    self.data, self.n_seqs, self.seq_len, self.seed, self.dyck, self.tokenizer
                )
        return self._cache["batch"]

    @property
    def has_batch(self) -> bool:
        """Whether `batch` has been built (a probe read it)."""
        return "batch" in self._cache

    def token_labels(self, row: int = 0) -> list[str]:
        """The labels of `batch`'s row `row` (its valid tokens), decoded by the models'
        tokenizer: a BPE model's tokens as text, a byte model's bytes."""
        tokens, lengths = self.batch()
        return self.tokenizer.token_labels(tokens[row, : int(lengths[row])].tolist())

    def require_bytes(self, what: str) -> None:
        """Refuse, in one ProbeError line, rows spelled in bytes for a model of another
        tokenizer: their positions (triggers) are byte positions."""
        if not is_byte_tokenizer(self.tokenizer):
            raise ProbeError(
                f"{what} are spelled in bytes, and this model's tokenizer is BPE "
                f"({self.tokenizer.vocab_size} ids); probe it on text with --data or --prompt"
            )

    def dyck_examples(self) -> list[DyckExample]:
        """The in-context Dyck prompts (dyck_prompts) in the models' tokens: ids and answer
        spans in BPE tokens for a BPE model (data.dyck_tokens), bytes otherwise."""
        if not can_pose_dyck(self.tokenizer):
            raise ProbeError(
                "this model's folder has no tokenizer.json, and in-context Dyck prompts are "
                "text; give its other probes rows as token ids (--prompt-ids)"
            )
        if "dyck" not in self._cache:
            drawn = dyck_prompts(
                self.n_seqs, self.demos, self.max_seq_len, self.seed, spec=self.dyck, draw=self.draw
            )
            try:
                self._cache["dyck"] = encode_examples(drawn, self.tokenizer)
            except DataError as exc:
                raise ProbeError(str(exc)) from None
        return self._cache["dyck"]

    @property
    def case_task(self) -> str:
        """The case study's task: `task` when asked for, else the checkpoint's."""
        task = self.task or self.trained_task
        if task not in TASKS:
            raise ProbeError(f"unknown case-study task {task!r}; the tasks are dyck, assoc_recall")
        return task

    def recall_rows(self) -> torch.Tensor:
        """`n_seqs` held-out associative-recall rows [n_seqs, seq_len] of `assoc_recall`."""
        self.require_bytes("associative-recall rows")
        if "assoc_recall" not in self._cache:
            self._cache["assoc_recall"] = recall_rows(
                self.n_seqs, self.seq_len, self.seed, split="heldout", spec=self.assoc_recall
            )
        return self._cache["assoc_recall"]
