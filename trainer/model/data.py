"""Training data: the built-in synthetic corpus and memory-mapped token files.

Update ``s`` consumes global sequences ``s*G .. s*G+G-1`` (G = batch.global_batch), the same ones for any
layout; a data-parallel replica takes its contiguous slice of them. Sequence ``i`` is a pure function of
(corpus, i), so no rank needs to receive data from another.

Token file format (made by ``python -m trainer.model.data make``): ``NAME.bin`` holds the tokens as little-endian
uint16 (vocab <= 65,536) or uint32, back to back; ``NAME.json`` beside it holds
``{"dtype": "uint16", "vocab_size": 256, "n_tokens": N, "tokenizer": "bytes"}``. Sequence i is the
window of seq_len + 1 tokens starting at (i x seq_len) mod (n_tokens - seq_len - 1).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from trainer.config import SyntheticData, TokenFileData


class SyntheticCorpus:
    """A fixed random bigram language: each token has a few likely successors.

    The best achievable loss is the chain's conditional entropy (printed by ``entropy()``), well under
    ln(vocab), so a model's loss really falls over a few hundred steps, and every sequence is a pure
    function of (seed, index).
    """

    def __init__(self, vocab_size: int, seed: int, successors: int = 4) -> None:
        rng = np.random.default_rng(seed)
        logits = np.full((vocab_size, vocab_size), -8.0)
        for tok in range(vocab_size):
            nxt = rng.choice(vocab_size, size=min(successors, vocab_size), replace=False)
            logits[tok, nxt] = rng.normal(2.0, 1.0, size=len(nxt))
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        self.probs = probs / probs.sum(axis=1, keepdims=True)
        self.cum = np.cumsum(self.probs, axis=1)
        self.seed = seed
        self.vocab_size = vocab_size

    def entropy(self) -> float:
        """Conditional entropy (nats) under the uniform start: a floor for the loss."""
        p = self.probs
        return float(-(p * np.log(p)).sum(axis=1).mean())

    def sequences(self, start: int, count: int, length: int) -> np.ndarray:
        out = np.empty((count, length), dtype=np.int64)
        draws = np.stack([np.random.default_rng([self.seed, start + j]).random(length) for j in range(count)])
        out[:, 0] = (draws[:, 0] * self.vocab_size).astype(np.int64)
        for t in range(1, length):
            rows = self.cum[out[:, t - 1]]
            out[:, t] = np.minimum((rows < draws[:, t:t + 1]).sum(axis=1), self.vocab_size - 1)
        return out


class TokenFile:
    def __init__(self, path: str | Path, vocab_size: int) -> None:
        path = Path(path)
        header_path = path.with_suffix(".json")
        if not path.exists() or not header_path.exists():
            raise ValueError(f"data.path={str(path)!r}: need {path.name} and {header_path.name} (make them with "
                             f"python -m trainer.model.data make)")
        header = json.loads(header_path.read_text())
        if header["vocab_size"] > vocab_size:
            raise ValueError(f"data.path: the file's vocab_size {header['vocab_size']} exceeds model.vocab_size "
                             f"{vocab_size}")
        self.tokens = np.memmap(path, dtype=np.dtype(header["dtype"]).newbyteorder("<"), mode="r")

    def sequences(self, start: int, count: int, length: int) -> np.ndarray:
        span = len(self.tokens) - length
        if span <= 0:
            raise ValueError(f"data.path: the file holds {len(self.tokens)} tokens, fewer than one sequence")
        stride = length - 1
        return np.stack([np.asarray(self.tokens[(i * stride) % span:(i * stride) % span + length], dtype=np.int64)
                         for i in range(start, start + count)])


def open_corpus(data: SyntheticData | TokenFileData, vocab_size: int) -> SyntheticCorpus | TokenFile:
    if isinstance(data, TokenFileData):
        return TokenFile(data.path, vocab_size)
    return SyntheticCorpus(vocab_size, data.seed)


def replica_batch(corpus: SyntheticCorpus | TokenFile, step: int, global_batch: int, dp: int, dp_rank: int,
                  seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of this replica for update ``step``: [global_batch / dp, seq_len] each."""
    per_replica = global_batch // dp
    seqs = corpus.sequences(step * global_batch + dp_rank * per_replica, per_replica, seq_len + 1)
    t = torch.from_numpy(seqs)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def make_token_file(inputs: list[Path], out: Path) -> dict:
    """Byte-level tokenisation of text files into the token file format (vocab 256)."""
    data = b"".join(p.read_bytes() for p in inputs)
    if not data:
        raise ValueError("the input files are empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.frombuffer(data, dtype=np.uint8).astype("<u2").tofile(out)
    header = {"dtype": "uint16", "vocab_size": 256, "n_tokens": len(data), "tokenizer": "bytes"}
    out.with_suffix(".json").write_text(json.dumps(header))
    return header


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.model.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    make = sub.add_parser("make", help="tokenise text files (bytes) into NAME.bin + NAME.json")
    make.add_argument("--out", type=Path, required=True, help="output .bin path")
    make.add_argument("inputs", type=Path, nargs="+", help="text files")
    args = parser.parse_args(argv)
    header = make_token_file(args.inputs, args.out)
    print(f"wrote {args.out} ({header['n_tokens']} tokens) and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
