"""A captioning decoder on an audio encoder's frames (Cacophony stage 2 auxiliary, CaptionStew).

A small transformer decoder (pre-norm blocks: self-attention, cross-attention to the encoder's
frame features ``(B, T, D)``, MLP) over a caller's tokenizer: :class:`WordVocabulary` (a
word-level vocabulary built from captions, saved as plain JSON) or :class:`PretrainedTokens`
(wraps a Hugging Face tokenizer such as the text tower's). Token sequences are
``[BOS] w1 .. wn [EOS] [PAD]..``; the decoder reads ``tokens[:, :-1]`` and predicts
``tokens[:, 1:]``.

Decoding modes (``decoding``):

- ``autoregressive``: causal self-attention, teacher forcing, next-token cross-entropy
  (Cacophony Eq. 2, CaptionStew Eq. 2).
- ``parallel`` (CapPa, Tschannen et al. 2023; CaptionStew Eq. 3): every input token is replaced
  by ``[MASK]`` and the causal mask is removed, so each token is predicted from the audio alone.
  Inputs are always ``max_tokens`` long, the length decoding uses, so no position is unseen.
- ``alternate``: parallel with probability ``parallel_ratio``, else autoregressive, drawn from a
  generator per step (``alternate_per="step"``) or per example (``"example"``: CaptionStew's
  "a random fraction of each minibatch uses standard autoregression while the remainder use
  parallel decoding"). CapPa trains 75% of examples in parallel; 0.75 is the default.

:func:`caption_loss` returns the mean token cross-entropy (padding ignored);
:meth:`CaptionDecoder.generate` decodes greedily (autoregressive) or, for a parallel-trained
decoder, in parallel: one all-[MASK] pass, optionally refined by mask-predict passes
(Ghazvininejad et al. 2019). The paper
weight of the captioning loss beside the contrastive one is ``lambda_cap = 1`` (Cacophony
Sec. IV-A); CaptionStew's decoder is BART-base sized (6 layers, 768-d).

For training (``train.model.caption_decoder``): :func:`tokenizer_for` gives the settings'
tokenizer (``vocabulary: captions``: :func:`fixed_size_vocabulary`, whose size does not depend on
the data, so a checkpoint's model is rebuilt from its config before its words are read back) and
:func:`build_decoder` the decoder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal, Protocol

import torch
from torch import nn

from trainer.text import MAX_CHARS_PER_TOKEN

PARALLEL_RATIO = 0.75  # CapPa: share of parallel-prediction examples
Decoding = Literal["autoregressive", "parallel", "alternate"]


class Tokenizer(Protocol):
    """What the decoder needs from a tokenizer: special ids, a size, text <-> ids."""

    pad_id: int
    bos_id: int
    eos_id: int
    mask_id: int
    size: int

    def encode(self, text: str) -> list[int]: ...  # ids without BOS / EOS

    def decode(self, ids: list[int]) -> str: ...  # stops at EOS, skips special ids


SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")


def words_of(text: str) -> list[str]:
    """Lower-case words (with inner apostrophes) and single punctuation marks, in order."""
    return _WORD.findall(text.lower())


class WordVocabulary:
    """A word-level vocabulary: the five :data:`SPECIALS` (ids 0-4), then words.

    :meth:`build` counts words over captions; :meth:`save` / :meth:`load` use plain JSON
    ``{"kind": "words", "words": [...]}`` (every entry, specials first). Unknown words encode to
    ``[UNK]``. :meth:`decode` joins words with spaces and attaches punctuation to the word before.
    """

    def __init__(self, words: list[str]):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"vocabulary: must start with {SPECIALS}")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary: repeated entries")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.pad_id, self.bos_id, self.eos_id, self.mask_id, self.unk_id = range(len(SPECIALS))

    @property
    def size(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, captions: list[str], min_count: int = 1, max_words: int | None = None) -> WordVocabulary:
        """Words seen at least ``min_count`` times, most frequent first (ties alphabetical),
        at most ``max_words`` of them."""
        counts: dict[str, int] = {}
        for caption in captions:
            for w in words_of(caption):
                counts[w] = counts.get(w, 0) + 1
        ranked = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS), key=lambda w: (-counts[w], w))
        return cls([*SPECIALS, *ranked[:max_words]])

    def encode(self, text: str) -> list[int]:
        return [self.index.get(w, self.unk_id) for w in words_of(text)]

    def decode(self, ids: list[int]) -> str:
        out: list[str] = []
        for i in ids:
            if i == self.eos_id:
                break
            if i < len(SPECIALS) and i != self.unk_id:
                continue
            w = self.words[i]
            if out and len(w) == 1 and not w.isalnum():
                out[-1] += w
            else:
                out.append(w)
        return " ".join(out)

    def as_dict(self) -> dict:
        """The JSON form ``{"kind": "words", "words": [...]}`` (what :meth:`save` writes, and a checkpoint's config holds)."""
        return {"kind": "words", "words": list(self.words)}

    @classmethod
    def from_dict(cls, data, where: str = "vocabulary") -> WordVocabulary:
        """The inverse of :meth:`as_dict`; ``where`` names the source in the error."""
        if not isinstance(data, dict) or data.get("kind") != "words" or not isinstance(data.get("words"), list):
            raise ValueError(f"vocabulary: {where} is not a word vocabulary file")
        return cls([str(w) for w in data["words"]])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), ensure_ascii=False, indent=0) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> WordVocabulary:
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))


class PretrainedTokens:
    """A Hugging Face tokenizer as a :class:`Tokenizer`: BOS / EOS are its CLS / SEP (or BOS /
    EOS) tokens, and it must have a pad and a mask token (BERT and RoBERTa tokenizers do)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        ids = {"bos": bos, "eos": eos, "pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id}
        if any(v is None for v in ids.values()):
            raise ValueError(
                f"tokens: {type(tokenizer).__name__} lacks special tokens {sorted(k for k, v in ids.items() if v is None)}"
            )
        self.bos_id, self.eos_id, self.pad_id, self.mask_id = ids["bos"], ids["eos"], ids["pad"], ids["mask"]
        self.size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()


def encode_captions(tokenizer: Tokenizer, captions: list[str], max_tokens: int) -> torch.Tensor:
    """Captions -> ``(B, S)`` long ``[BOS] ids [EOS] [PAD]..``; S is the longest row, at most
    ``max_tokens + 1`` (captions are cut to ``max_tokens - 1`` ids so that EOS is kept; the text
    first to ``max_tokens * MAX_CHARS_PER_TOKEN`` characters, so a caption of megabytes costs
    bounded memory)."""
    chars = max_tokens * MAX_CHARS_PER_TOKEN
    rows = [[tokenizer.bos_id, *tokenizer.encode(c[:chars])[: max_tokens - 1], tokenizer.eos_id] for c in captions]
    out = torch.full((len(rows), max(len(r) for r in rows)), tokenizer.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


class DecoderBlock(nn.Module):
    """Pre-norm: ``x += self_attn(norm(x), mask)``; ``x += cross_attn(norm(x), memory)``; ``x += mlp(norm(x))``."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.q, self.kv, self.cross_proj = (
            nn.LayerNorm(dim),
            nn.Linear(dim, dim),
            nn.Linear(dim, 2 * dim),
            nn.Linear(dim, dim),
        )
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn, dim))
        self.drop = nn.Dropout(dropout)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)  # (B, H, n, Dh)

    def _attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        out = nn.functional.scaled_dot_product_attention(
            self._heads(q), self._heads(k), self._heads(v), attn_mask=mask, dropout_p=p
        )
        return out.transpose(1, 2).flatten(2)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor | None, memory_mask: torch.Tensor | None
    ) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.drop(self.proj(self._attend(q, k, v, self_mask)))
        k, v = self.kv(memory).chunk(2, dim=-1)
        x = x + self.drop(self.cross_proj(self._attend(self.q(self.norm2(x)), k, v, memory_mask)))
        return x + self.drop(self.mlp(self.norm3(x)))


def choose_parallel(
    batch: int,
    decoding: Decoding,
    parallel_ratio: float = PARALLEL_RATIO,
    generator: torch.Generator | None = None,
    per: Literal["step", "example"] = "step",
) -> torch.Tensor:
    """Which rows of a batch train in parallel mode: ``(B,)`` bool. ``autoregressive``: none;
    ``parallel``: all; ``alternate``: one draw ``U < parallel_ratio`` from ``generator`` for the
    whole batch (``per="step"``) or one per row (``per="example"``)."""
    if decoding == "autoregressive":
        return torch.zeros(batch, dtype=torch.bool)
    if decoding == "parallel":
        return torch.ones(batch, dtype=torch.bool)
    if decoding != "alternate":
        raise ValueError(f"captioner: unknown decoding {decoding!r}; use autoregressive, parallel or alternate")
    if per == "step":
        return (torch.rand(1, generator=generator) < parallel_ratio).expand(batch).clone()
    if per == "example":
        return torch.rand(batch, generator=generator) < parallel_ratio
    raise ValueError(f"captioner: alternate_per must be step or example, not {per!r}")


class CaptionDecoder(nn.Module):
    """Caption tokens given frame features.

    ``CaptionDecoder(tokenizer, feature_dim, dim, depth, heads, ffn, max_tokens, dropout,
    decoding, parallel_ratio, alternate_per)``: ``feature_dim`` is the encoder frames' width D
    (projected to ``dim``); ``max_tokens`` bounds the predicted tokens (EOS included).
    ``forward(inputs (B, S), features (B, T, D), causal (B,) bool, feature_mask (B, T) bool
    True = valid frame | None)`` -> logits ``(B, S, vocab)``. Output layer tied to the token embedding.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        feature_dim: int,
        *,
        dim: int = 256,
        depth: int = 2,
        heads: int = 4,
        ffn: int = 1024,
        max_tokens: int = 32,
        dropout: float = 0.1,
        decoding: Decoding = "autoregressive",
        parallel_ratio: float = PARALLEL_RATIO,
        alternate_per: Literal["step", "example"] = "step",
    ):
        super().__init__()
        choose_parallel(1, decoding, parallel_ratio, torch.Generator(), alternate_per)  # refuses unknown modes now
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self.decoding, self.parallel_ratio, self.alternate_per = decoding, parallel_ratio, alternate_per
        self.memory_proj = nn.Linear(feature_dim, dim)
        self.embed = nn.Embedding(tokenizer.size, dim)
        self.positions = nn.Parameter(torch.zeros(1, max_tokens, dim))
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads, ffn, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.positions, std=0.02)

    def forward(
        self, inputs: torch.Tensor, features: torch.Tensor, causal: torch.Tensor, feature_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, s = inputs.shape
        if s > self.max_tokens:
            raise ValueError(f"captioner: {s} input tokens, more than max_tokens={self.max_tokens}")
        x = self.embed(inputs) + self.positions[:, :s]  # (B, S, d)
        memory = self.memory_proj(features.to(x.dtype))  # (B, T, d)
        lower = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        self_mask = lower | ~causal.to(x.device).view(b, 1, 1, 1)  # (B, 1, S, S), True = may attend
        memory_mask = None if feature_mask is None else feature_mask.to(x.device).view(b, 1, 1, -1)
        for block in self.blocks:
            x = block(x, memory, self_mask, memory_mask)
        return self.norm(x) @ self.embed.weight.T  # (B, S, vocab)

    def training_inputs(self, tokens: torch.Tensor, parallel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens (B, S)`` from :func:`encode_captions` and ``parallel (B,)`` -> decoder inputs
        and targets. Autoregressive rows read ``tokens[:, :-1]``; parallel rows read ``[MASK]``
        only. With any parallel row both are padded to ``max_tokens``."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if parallel.any():
            pad = self.max_tokens - targets.shape[1]
            inputs = nn.functional.pad(inputs, (0, pad), value=self.tokenizer.pad_id)
            targets = nn.functional.pad(targets, (0, pad), value=self.tokenizer.pad_id)
            inputs = torch.where(parallel.to(inputs.device).unsqueeze(1), torch.full_like(inputs, self.tokenizer.mask_id), inputs)
        return inputs, targets

    @torch.no_grad()
    def greedy_tokens(self, features: torch.Tensor, max_len: int, feature_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy autoregressive decoding: from BOS, append the causal decoder's argmax until every
        row has emitted EOS or ``max_len`` tokens exist. Features ``(B, T, D)`` -> ids ``(B, <= max_len)``
        (no BOS; rows that ended early are filled with EOS)."""
        tok, b = self.tokenizer, features.shape[0]
        seq = torch.full((b, 1), tok.bos_id, dtype=torch.long, device=features.device)
        causal = torch.ones(b, dtype=torch.bool)
        done = torch.zeros(b, dtype=torch.bool, device=features.device)
        for _ in range(min(max_len, self.max_tokens)):
            nxt = self(seq, features, causal, feature_mask)[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.eos_id), nxt)
            seq, done = torch.cat([seq, nxt[:, None]], dim=1), done | (nxt == tok.eos_id)
            if done.all():
                break
        return seq[:, 1:]

    @torch.no_grad()
    def parallel_tokens(self, features: torch.Tensor, steps: int = 1, feature_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Iterative parallel decoding (mask-predict, Ghazvininejad et al. 2019). Features
        ``(B, T, D)`` -> ids ``(B, max_tokens)``.

        Pass 1: ``max_tokens`` ``[MASK]`` inputs (the parallel training length), no causal mask,
        argmax at every position. Each further pass ``k`` of ``steps`` re-masks the
        ``int(max_tokens * (steps - k) / steps)`` least confident positions and predicts them again
        from the rest. Parallel training shows all-[MASK] inputs only, so pass 1 is what the decoder
        was trained for; later passes read partly filled inputs it has not seen and may not help.
        """
        tok, b, n = self.tokenizer, features.shape[0], self.max_tokens
        causal = torch.zeros(b, dtype=torch.bool)
        inputs = torch.full((b, n), tok.mask_id, dtype=torch.long, device=features.device)
        probs, rows = self(inputs, features, causal, feature_mask).softmax(-1).max(-1)  # (B, n) each
        for step in range(1, steps):
            n_mask = int(n * (steps - step) / steps)
            if n_mask == 0:
                break
            remask = probs.topk(n_mask, dim=1, largest=False).indices  # (B, n_mask)
            new_probs, new_rows = self(rows.scatter(1, remask, tok.mask_id), features, causal, feature_mask).softmax(-1).max(-1)
            rows = rows.scatter(1, remask, new_rows.gather(1, remask))
            probs = probs.scatter(1, remask, new_probs.gather(1, remask))
        return rows

    def generate(
        self,
        features: torch.Tensor,
        max_len: int | None = None,
        method: Literal["greedy", "parallel"] | None = None,
        steps: int = 1,
        feature_mask: torch.Tensor | None = None,
    ) -> list[list[int]]:
        """Token ids per clip (no BOS, cut before the first EOS, at most ``max_len``) for features
        ``(B, T, D)``; ``tokenizer.decode`` turns them into text.

        ``method``: ``greedy`` (:meth:`greedy_tokens`; the default unless ``decoding`` is
        ``parallel``) or ``parallel`` (:meth:`parallel_tokens` with ``steps`` passes; the default
        for a parallel-trained decoder). ``max_len`` defaults to (and is capped at) ``max_tokens``.
        """
        max_len = min(max_len or self.max_tokens, self.max_tokens)
        method = method or ("parallel" if self.decoding == "parallel" else "greedy")
        if method == "greedy":
            rows = self.greedy_tokens(features, max_len, feature_mask)
        elif method == "parallel":
            rows = self.parallel_tokens(features, steps, feature_mask)
        else:
            raise ValueError(f"captioner: unknown generation method {method!r}; use greedy or parallel")
        eos = self.tokenizer.eos_id
        return [(row[: row.index(eos)] if eos in row else row)[:max_len] for row in rows.tolist()]

    def captions(self, features: torch.Tensor, **kwargs) -> list[str]:
        """:meth:`generate` decoded to strings with the decoder's tokenizer."""
        return [self.tokenizer.decode(ids) for ids in self.generate(features, **kwargs)]


def caption_loss(
    decoder: CaptionDecoder,
    features: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    feature_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean token cross-entropy of ``decoder`` on ``tokens (B, S)`` (from :func:`encode_captions`)
    given frame features ``(B, T, D)``; padding targets are ignored. The rows decoded in parallel
    are chosen by :func:`choose_parallel` from the decoder's ``decoding``, ``parallel_ratio`` and
    ``alternate_per`` with ``generator``. Returns a scalar (float32)."""
    parallel = choose_parallel(tokens.shape[0], decoder.decoding, decoder.parallel_ratio, generator, decoder.alternate_per)
    tokens = tokens.to(features.device)
    inputs, targets = decoder.training_inputs(tokens, parallel)
    logits = decoder(inputs, features, ~parallel, feature_mask)
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=decoder.tokenizer.pad_id)


CAPTION_VOCABULARY = "captions"  # train.model.caption_decoder.vocabulary: a word vocabulary of the training texts


def fixed_size_vocabulary(texts: list[str] | None, words: int) -> WordVocabulary:
    """A :class:`WordVocabulary` of exactly ``len(SPECIALS) + words`` entries: the ``words`` most frequent
    words of ``texts`` (None: none yet), the rest ``[unusedK]`` entries that no text encodes to.

    Its size depends on ``words`` only, so a model built before the texts are read (a detector
    loading a checkpoint) has the shape of the one trained on them; the trained words come from
    the checkpoint's config.
    """
    built = WordVocabulary.build(list(texts or []), max_words=words)
    return WordVocabulary([*built.words, *(f"[unused{i}]" for i in range(len(SPECIALS) + words - built.size))])


def tokenizer_for(settings, texts: list[str] | None = None) -> Tokenizer:
    """The decoder's tokenizer for ``train.model.caption_decoder`` ``settings``: ``vocabulary: captions``
    gives :func:`fixed_size_vocabulary` of ``texts``; any other value names a local Hugging Face
    tokenizer folder (or the offline text model), wrapped as :class:`PretrainedTokens`."""
    if settings.vocabulary == CAPTION_VOCABULARY:
        return fixed_size_vocabulary(texts, settings.vocabulary_words)
    from transformers import AutoTokenizer

    from trainer.text import resolve_model_path

    try:
        return PretrainedTokens(AutoTokenizer.from_pretrained(resolve_model_path(settings.vocabulary)))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"captioner: cannot use {settings.vocabulary!r} as the decoder's tokenizer ({e}); set "
            f"train.model.caption_decoder.vocabulary to {CAPTION_VOCABULARY} or a local tokenizer folder"
        ) from None


def build_decoder(settings, feature_dim: int, tokenizer: Tokenizer) -> CaptionDecoder:
    """A :class:`CaptionDecoder` as ``train.model.caption_decoder`` ``settings`` describe it, reading
    frame features of width ``feature_dim``."""
    s = settings
    return CaptionDecoder(
        tokenizer,
        feature_dim,
        dim=s.dim,
        depth=s.depth,
        heads=s.heads,
        ffn=s.ffn,
        max_tokens=s.max_tokens,
        dropout=s.dropout,
        decoding=s.decoding,
        parallel_ratio=s.parallel_ratio,
        alternate_per=s.alternate_per,
    )
